"""SWE-bench Pro's own test runners: each row's `run_script.sh` and `parser.py`, run the way the Pro
evaluation runs them (swe_bench_pro_eval.py in scaleapi/SWE-bench_Pro-os).

The published layout is a folder `run_scripts/<instance_id>/` holding
  run_script.sh  called with the row's `selected_test_files_to_run` joined by commas; it runs those
                 tests with whatever runner the repository uses (pytest, go test, jest, mocha...), from
                 /app, where Pro's images keep the repository;
  parser.py      called as `python parser.py stdout.log stderr.log output.json` on the run script's two
                 streams; it writes {"tests": [{"name": ..., "status": "PASSED" | "FAILED" | "SKIPPED" |
                 "ERROR"}]}.
A row is resolved when every fail_to_pass and pass_to_pass test is PASSED (the evaluation's rule).

What differs from the evaluation, and why: the parser runs in a fresh sandbox of its own on the two
logs alone, in Python's isolated mode, not in the container where the patch's code has just run (there
a patch could put a module of its own ahead of the standard library on the image's PYTHONPATH, or
leave a `python` of its own on PATH, and write the output.json itself). What the tests print is still
what the parser reads: a patch whose code prints result lines can forge them, as it can in the
evaluation (docs/environments.md).
"""

from __future__ import annotations

import json
import shlex
import tempfile
from dataclasses import dataclass
from pathlib import Path

from dockyard.envs.swe_tasks import SweTask, SweTaskError
from dockyard.sandboxes.base import SandboxError, SandboxSpec

SCRIPTS_IN_SANDBOX = "/dockyard-pro"
LOGS_IN_SANDBOX = "/dockyard-pro-logs"   # a folder the verifier copies out (not /tmp: sandbox-private)
STATUSES = ("PASSED", "FAILED", "SKIPPED", "ERROR")
LOG_LIMIT = 32 << 20   # the parser reads the last 32 MiB of each stream (a flooding test cannot grow the host's memory)


@dataclass(frozen=True)
class ProScripts:
    run_script: Path
    parser: Path


class RunScripts:
    """The run_scripts folder: env.run_scripts_dir, else `run_scripts/` beside the task file. A row with no
    folder of its own there is scored by pytest over its selected files (noted), unless the folder was
    named in the config: then the missing row is refused by name."""

    def __init__(self, folder: str | None):
        self.folder = Path(folder).resolve() if folder else None

    def folder_for(self, task: SweTask) -> Path:
        return self.folder or Path(task.task_file).resolve().parent / "run_scripts"

    def for_task(self, task: SweTask) -> ProScripts | None:
        if not task.is_pro:
            return None
        row_folder = self.folder_for(task) / task.instance_id
        scripts = ProScripts(row_folder / "run_script.sh", row_folder / "parser.py")
        present = [path.is_file() for path in (scripts.run_script, scripts.parser)]
        if all(present):
            return scripts
        if any(present) or self.folder is not None:
            missing = [str(path) for path, here in zip((scripts.run_script, scripts.parser), present) if not here]
            raise SweTaskError(f"{task.where}: its run script folder lacks {' and '.join(missing)} "
                               f"(env.run_scripts_dir; SWE-bench Pro's run_scripts/<instance_id>/ layout)")
        return None


def command(task: SweTask) -> str:
    """The evaluation's test step: the run script over the selected files, its two streams apart."""
    files = ",".join(task.test_files)
    return (f"bash {SCRIPTS_IN_SANDBOX}/run_script.sh {shlex.quote(files)} "
            f"> {LOGS_IN_SANDBOX}/stdout.log 2> {LOGS_IN_SANDBOX}/stderr.log")


def place_scripts(sandbox, scripts: ProScripts, scratch: Path) -> None:
    """The run script (read-only) and an empty folder for its two logs."""
    folder, logs = scratch / "pro-scripts", scratch / "pro-logs"
    folder.mkdir()
    logs.mkdir()
    (folder / "run_script.sh").write_bytes(scripts.run_script.read_bytes())
    sandbox.copy_in(folder, SCRIPTS_IN_SANDBOX, read_only=True)
    sandbox.copy_in(logs, LOGS_IN_SANDBOX)


def collect_logs(sandbox, scratch: Path) -> dict[str, bytes]:
    """The last LOG_LIMIT bytes of the run script's stdout.log and stderr.log (an absent one is empty)."""
    logs = {}
    for name in ("stdout.log", "stderr.log"):
        try:
            sandbox.copy_out(f"{LOGS_IN_SANDBOX}/{name}", scratch / name)
            with open(scratch / name, "rb") as stream:
                stream.seek(0, 2)
                stream.seek(max(0, stream.tell() - LOG_LIMIT))
                logs[name] = stream.read()
        except (SandboxError, OSError):
            logs[name] = b""
    return logs


def parse(sandboxes, task: SweTask, scripts: ProScripts, logs: dict[str, bytes], limit_s: float
          ) -> tuple[dict[str, str], str | None]:
    """Each test's status as the row's parser.py reads the logs, and why not when it could not."""
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch, "parse")
        folder.mkdir()
        (folder / "parser.py").write_bytes(scripts.parser.read_bytes())
        for name, data in logs.items():
            (folder / name).write_bytes(data)
        spec = SandboxSpec(workdir="/dockyard-parse", files=[(folder, "/dockyard-parse")],
                           name=f"task {task.instance_id}: parser.py")
        with sandboxes.create(spec) as sandbox:
            run = sandbox.run("python3 -I parser.py stdout.log stderr.log output.json", timeout_s=limit_s)
            sandbox.end_processes()
            try:
                sandbox.copy_out("/dockyard-parse/output.json", Path(scratch, "output.json"))
                text = Path(scratch, "output.json").read_text(errors="replace")
            except (SandboxError, OSError):
                text = None
    if text is None:
        how = "timed out" if run.timed_out else f"exit status {run.exit_code}"
        tail = " | ".join(run.output.strip().splitlines()[-3:])[-300:]
        return {}, f"the row's parser.py wrote no output.json ({how}: {tail})"
    return read_output(text)


def read_output(text: str) -> tuple[dict[str, str], str | None]:
    """output.json's tests as {name: status}; a malformed file is a reason, not statuses."""
    try:
        tests = json.loads(text)["tests"]
        statuses = {}
        for test in tests:
            name, status = test["name"], test["status"]
            if not isinstance(name, str) or status not in STATUSES:
                raise ValueError(f"a test entry {json.dumps(test)[:120]}")
            statuses[name] = status
        return statuses, None
    except (ValueError, KeyError, TypeError) as err:
        return {}, f"the row's parser.py wrote an output.json that is not {{\"tests\": [{{name, status}}]}} ({err})"


def grade(task: SweTask, statuses: dict[str, str]) -> tuple[list[str], list[str]]:
    """(the fail_to_pass tests that passed, the pass_to_pass tests that did not): resolved when the first
    is all of fail_to_pass and the second is empty; only PASSED counts (the evaluation's rule)."""
    passed = [name for name in task.fail_to_pass if statuses.get(name) == "PASSED"]
    broken = [name for name in task.pass_to_pass if statuses.get(name) != "PASSED"]
    return passed, broken
