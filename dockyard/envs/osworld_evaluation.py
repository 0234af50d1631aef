"""An OSWorld task's set-up steps, getters and evaluation, run against a live desktop (session.py).

The order is OSWorld's: `config` steps before the agent's first observation; after the episode the
evaluator's `postconfig` steps, then for each metric its result and expected getters and the metric;
`conj: and` (the default) stops at the first metric that scores 0 and averages the rest, `or` takes the
best. A feasible task whose agent ended with FAIL scores 0; an `infeasible` task scores 1 only then.

Every getter that reads the desktop (a file, a command's output, the accessibility tree) runs through the
desktop's controller, with a clean environment (no rc file or PATH the agent could have written), before
the sandbox is destroyed; expected values (`rule`, `local_file`, `cloud_file`) come from the task on the
host and are never placed where the agent could read them.
"""

from __future__ import annotations

import base64
import time
from pathlib import Path

from dockyard.desktop.observation import terminal_text
from dockyard.desktop.session import DesktopSession
from dockyard.envs.osworld_metrics import METRICS
from dockyard.desktop.actions import Screen, parse_pyautogui
from dockyard.envs.osworld_tasks import OSWorldTask, pyautogui_script
from dockyard.errors import DockyardError

MAX_SLEEP_S = 60.0
MAX_FILE_BYTES = 64 << 20


class EvaluationError(DockyardError, RuntimeError):
    """A set-up step or getter failed; the message names it (the attempt fails, or the verifier errs)."""


def run_steps(desktop: DesktopSession, steps: list[dict], task: OSWorldTask, events: list[dict],
              timeout_s: float, screen: tuple[int, int]) -> None:
    for number, step in enumerate(steps):
        kind, params = step["type"], step.get("parameters", {})
        where = f"task {task.id}: {kind} step {number}"
        try:
            if kind == "sleep":
                time.sleep(min(float(params["seconds"]), MAX_SLEEP_S))
            elif kind == "launch":
                desktop.request("launch", command=params["command"], shell=bool(params.get("shell", False)))
            elif kind in ("execute", "command") and pyautogui_script(params["command"]) is not None:
                desktop.act(parse_pyautogui(pyautogui_script(params["command"]), Screen(*screen)))
                events.append({"step": kind, "pyautogui": pyautogui_script(params["command"])})
            elif kind in ("execute", "command"):
                result = desktop.run(params["command"], shell=bool(params.get("shell", False)), timeout_s=timeout_s)
                events.append({"step": kind, "command": params["command"], "returncode": result.get("returncode"),
                               "output": result.get("output", "")[-2000:], "error": result.get("error", "")[-2000:]})
            elif kind == "open":
                desktop.request("open", path=params["path"])
            elif kind == "download":
                for entry in params["files"]:
                    data = Path(task.files[entry["url"]]).read_bytes()
                    desktop.request("write_file", path=entry["path"], data=base64.b64encode(data).decode())
            elif kind in ("activate_window", "close_window"):
                desktop.request("window", name=params["window_name"], strict=bool(params.get("strict", False)),
                                by_class=bool(params.get("by_class", False)), close=kind == "close_window")
        except Exception as err:
            raise EvaluationError(f"{where}: {err}") from err


def _getter(desktop: DesktopSession, getter: dict | None, task: OSWorldTask, folder: Path, screen: tuple[int, int],
            timeout_s: float):
    if getter is None:
        return None
    kind = getter["type"]
    if kind == "rule":
        return getter["rules"]
    if kind == "local_file":
        path = Path(getter["path"])
        return str(path if path.is_absolute() else task.path.parent / path)
    if kind == "cloud_file":
        paths = getter["path"] if getter.get("multi") else [getter["path"]]
        local = [str(task.files[url]) for url in paths]
        return _gives(local, getter) if getter.get("multi") else local[0]
    if kind in ("vm_command_line", "vm_command_error"):
        result = desktop.run(getter["command"], shell=bool(getter.get("shell", False)), timeout_s=timeout_s)
        if result.get("returncode") is None and kind == "vm_command_line":
            return None
        return result["output"] if kind == "vm_command_line" else result["error"]
    if kind == "vm_file":
        multi = bool(getter.get("multi"))
        paths = getter["path"] if multi else [getter["path"]]
        dests = getter["dest"] if multi else [getter["dest"]]
        local = []
        for path, dest in zip(paths, dests):
            data = desktop.read_file(path, MAX_FILE_BYTES)
            if data is None:
                local.append(None)
                continue
            target = folder / Path(dest).name
            target.write_bytes(data)
            local.append(str(target))
        return _gives(local, getter) if multi else local[0]
    if kind == "accessibility_tree":
        return desktop.a11y_tree()["xml"]
    if kind == "vm_terminal_output":
        return terminal_text(desktop.a11y_tree()["xml"])
    if kind == "list_directory":
        return desktop.request("list_directory", path=getter["path"])["tree"]
    if kind == "vm_screen_size":
        return {"width": screen[0], "height": screen[1]}
    raise EvaluationError(f"getter {kind!r} is not supported")   # load_task refuses it first


def _gives(values: list, getter: dict):
    gives = getter.get("gives")
    if gives is None:
        return values
    picked = [values[index] for index in gives]
    return picked[0] if len(picked) == 1 else picked


def evaluate(desktop: DesktopSession, task: OSWorldTask, last_action: str | None, folder: Path,
             screen: tuple[int, int], events: list[dict], timeout_s: float) -> float:
    """The task's score for the desktop as the agent left it."""
    if task.infeasible:
        return float(last_action == "FAIL")
    if last_action == "FAIL":
        events.append({"evaluation": "the agent said FAIL on a feasible task: 0"})
        return 0.0
    run_steps(desktop, task.evaluator.get("postconfig") or [], task, events, timeout_s, screen)
    conj = task.evaluator.get("conj", "and")
    scores = []
    for func, result_getter, expected_getter, options in task.evaluations():
        try:
            result = _getter(desktop, result_getter, task, folder, screen, timeout_s)
            expected = _getter(desktop, expected_getter, task, folder, screen, timeout_s)
        except EvaluationError:
            raise
        except Exception as err:
            raise EvaluationError(f"task {task.id}: getter for {func}: {err}") from err
        try:
            score = float(METRICS[func](result, expected, **options))
        except Exception as err:
            raise EvaluationError(f"task {task.id}: metric {func}: {type(err).__name__}: {err}") from err
        events.append({"metric": func, "score": score,
                       "result": result if isinstance(result, (str, type(None))) and len(result or "") < 2000
                       else f"<{type(result).__name__}>"})
        if conj == "and" and score == 0.0:
            return 0.0
        if conj == "or" and score == 1.0:
            return 1.0
        scores.append(score)
    return sum(scores) / len(scores) if conj == "and" else max(scores)
