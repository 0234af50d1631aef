"""A pytest plugin the verifier loads into the tests' own pytest (PYTEST_PLUGINS=dockyard_pytest_record):
it writes what pytest itself decided (each test's outcome, the session's exit status, the files of
every plugin and conftest.py that was loaded) to a folder only the verifier writes
(DOCKYARD_RECORDS). The grade comes from this record, never from the -rA summary a test or a
shadowed pytest could print.

It is copied into the sandbox under a random module name for each verification (so a configuration
file's `-p no:<name>` cannot aim at it) and runs under whatever Python and pytest the task's image
has: standard library only, nothing newer than Python 3.8 and pytest 6 offer.
"""

import json
import os
import sys
import time

_outcomes = {}
_collected = [0]


def _phase_outcome(report):
    if report.when == "call":
        if hasattr(report, "wasxfail"):
            return "xpassed" if report.passed else ("xfailed" if report.skipped else "failed")
        return report.outcome
    if report.failed:
        return "error"                                 # setup or teardown failed
    if report.skipped and report.when == "setup":
        return "xfailed" if hasattr(report, "wasxfail") else "skipped"
    return None


def pytest_runtest_logreport(report):
    outcome = _phase_outcome(report)
    if outcome is None or _outcomes.get(report.nodeid) == "error":
        return
    if report.nodeid in _outcomes and outcome not in ("error", "failed"):
        return
    _outcomes[report.nodeid] = outcome


def pytest_collectreport(report):
    if report.failed:
        _outcomes[report.nodeid or "<collection>"] = "error"


def pytest_collection_finish(session):
    _collected[0] = len(session.items)


def pytest_sessionfinish(session, exitstatus):
    folder = os.environ.get("DOCKYARD_RECORDS")
    if not folder:
        return
    files = set()
    for _, plugin in session.config.pluginmanager.list_name_plugin():
        path = getattr(plugin, "__file__", None)
        if path:
            files.add(os.path.abspath(path))
            files.add(os.path.realpath(path))
    inifile = getattr(session.config, "inipath", None) or getattr(session.config, "inifile", None)
    record = {"exitstatus": int(exitstatus), "collected": _collected[0], "tests": _outcomes,
              "plugins": sorted(files), "inifile": os.path.abspath(str(inifile)) if inifile else None,
              "python": sys.executable, "argv": list(sys.argv)}
    target = os.path.join(folder, "session-%d-%d.json" % (os.getpid(), time.time_ns()))
    with open(target + ".tmp", "w") as out:
        json.dump(record, out)
    os.replace(target + ".tmp", target)
