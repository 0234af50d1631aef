"""What dockyard takes from the official SWE-bench harness, the `swebench` package (extra `swe`).

Version 4.1.0 is pinned: it is the last release that carries the harness's per-repository
specifications (MAP_REPO_VERSION_TO_SPECS: Python version, packages, install, pre-install and test
commands per repository and version); 5.x moved them into new dataset columns (image, eval_script,
log_parser) that the published SWE-bench rows do not have. From it dockyard uses, unchanged:
- the specification of a row's repository and version;
- its test directives (`get_test_directives`: the new names of the files the test patch touches,
  without data files, django's as module paths);
- its per-repository log parsers (MAP_REPO_TO_PARSER), fed either the test run's output (django's
  runtests.py, sympy's bin/test) or, for pytest repositories, a `-rA` summary written from the record
  pytest itself left (pytest_record.py), so nothing the code under test prints can pay;
- its grading (`get_eval_tests_report`, `get_resolution_status`), so that resolved means what it means
  on the leaderboard: every FAIL_TO_PASS test passes and every PASS_TO_PASS test still passes.
What it does not do here is fetch: requirements and environment files are read from the repository
store (swe_tasks.RepoStore), not from raw.githubusercontent.com, and environments are images built
by podman (swe_environments.py), not conda in docker.
"""

from __future__ import annotations

import functools
import re
from typing import Callable

from dockyard.errors import DockyardError

# pytest's own statuses, in the words of the harness's log parsers
class HarnessMissing(DockyardError, ValueError):
    """The `swe` extra is not installed: the whole task set, not one row, cannot be scored."""


RECORD_TO_HARNESS = {"passed": "PASSED", "failed": "FAILED", "error": "ERROR", "skipped": "SKIPPED",
                     "xfailed": "XFAIL", "xpassed": "XPASS"}
INSTALL_HINT = "pip install -e '.[swe]' (the official SWE-bench harness, swebench==4.1.0)"


@functools.cache
def _harness():
    """The harness's modules, imported once (importing swebench.harness loads docker and modal too)."""
    try:
        from swebench.harness import constants, grading, log_parsers
        from swebench.harness.test_spec import python as test_spec_python
    except ImportError as err:
        raise HarnessMissing(f"SWE-bench rows are scored with the official harness's logic: {INSTALL_HINT} "
                           f"({err})") from None
    return constants, grading, log_parsers, test_spec_python


def available() -> bool:
    try:
        _harness()
        return True
    except ValueError:
        return False


def spec_for(repo: str, version: str | None) -> dict | None:
    """The harness's specification of `repo` at `version`, or None when the harness has none."""
    constants = _harness()[0]
    return constants.MAP_REPO_VERSION_TO_SPECS.get(repo, {}).get(str(version)) if version else None


def known_versions(repo: str) -> list[str]:
    return sorted(_harness()[0].MAP_REPO_VERSION_TO_SPECS.get(repo, {}))


def test_directives(row: dict) -> list[str]:
    """What the harness passes to the test command: from the test patch, test files only, new names."""
    return list(_harness()[3].get_test_directives(row))


def requirement_paths(repo: str) -> list[str]:
    return list(_harness()[0].MAP_REPO_TO_REQS_PATHS.get(repo, []))


def environment_file_paths(repo: str) -> list[str]:
    return list(_harness()[0].MAP_REPO_TO_ENV_YML_PATHS.get(repo, []))


def clean_requirements(text: str) -> str:
    return _harness()[3].clean_requirements(text)


def repo_install(repo: str) -> str | None:
    """A command the harness runs for every version of `repo` before pre_install (MAP_REPO_TO_INSTALL)."""
    return _harness()[0].MAP_REPO_TO_INSTALL.get(repo)


def log_parser(repo: str) -> Callable[[str], dict[str, str]] | None:
    parser = _harness()[2].MAP_REPO_TO_PARSER.get(repo)
    return None if parser is None else (lambda log: parser(log, None))


def summary_from_record(statuses: dict[str, str]) -> str:
    """pytest's record as the `-rA` short summary the harness's pytest parsers read."""
    return "\n".join(f"{RECORD_TO_HARNESS.get(status, status.upper())} {test}" for test, status in statuses.items())


def runs_pytest(test_command: str) -> bool:
    return re.search(r"(^|[\s/;&|])(py\.test|pytest)(\s|$)|-m pytest\b", test_command) is not None


def grade(fail_to_pass: list[str], pass_to_pass: list[str], statuses: dict[str, str]) -> tuple[dict, str]:
    """The harness's report ({FAIL_TO_PASS: {success, failure}, PASS_TO_PASS: ...}) and resolution
    (RESOLVED_FULL, RESOLVED_PARTIAL, RESOLVED_NO) for statuses in the parsers' words."""
    constants, grading = _harness()[0], _harness()[1]
    report = grading.get_eval_tests_report(statuses, {constants.FAIL_TO_PASS: fail_to_pass,
                                                      constants.PASS_TO_PASS: pass_to_pass})
    return report, grading.get_resolution_status(report)
