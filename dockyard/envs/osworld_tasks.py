"""OSWorld's task format, read and checked when a task set loads.

A task is one JSON file as OSWorld publishes them (`evaluation_examples/examples/<domain>/<id>.json`):

    {"id": ..., "snapshot": ..., "instruction": ..., "source": ..., "related_apps": [...],
     "config": [{"type": "launch" | "execute" | "command" | "open" | "sleep" | "download" |
                 "activate_window" | "close_window", "parameters": {...}}, ...],
     "evaluator": {"postconfig": [...set-up steps...], "func": name | [names],
                   "result": getter | [getters], "expected": getter | [getters],
                   "options": {} | [{}...], "conj": "and" | "or"}}

Everything a task names is checked here, before any episode: a set-up step, getter or metric this
version does not implement is refused by name (with what is implemented), as is a download whose file
has no local copy (nothing is fetched at run time: a URL is looked up by its file name in
`env.files_dir`, or given as a path relative to the task file). `func: "infeasible"` is OSWorld's
task that cannot be done: it scores 1 only when the agent's last action is FAIL.

A task may come with a scripted oracle for `dockyard env check`: `<id>.oracle.py` beside the task file,
pyautogui code in the agent's own action space (it runs through the same parser and the same desktop).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlparse

from dockyard.errors import DockyardError

SETUP_STEPS = {   # type -> (required parameters, optional parameters)
    "launch": ({"command"}, {"shell"}),
    "execute": ({"command"}, {"shell", "stdout", "stderr"}),   # stdout / stderr: kept in the episode's events
    "command": ({"command"}, {"shell", "stdout", "stderr"}),
    "open": ({"path"}, set()),
    "sleep": ({"seconds"}, set()),
    "download": ({"files"}, set()),
    "activate_window": ({"window_name"}, {"strict", "by_class"}),
    "close_window": ({"window_name"}, {"strict", "by_class"}),
}
GETTERS = {   # type -> (required keys, optional keys); `type` itself is not listed
    "vm_file": ({"path", "dest"}, {"multi", "gives"}),
    "vm_command_line": ({"command"}, {"shell"}),
    "vm_command_error": ({"command"}, {"shell"}),
    "vm_terminal_output": (set(), set()),
    "accessibility_tree": (set(), set()),
    "rule": ({"rules"}, set()),
    "local_file": ({"path"}, set()),
    "cloud_file": ({"path", "dest"}, {"multi", "gives"}),
    "vm_screen_size": (set(), set()),
    "list_directory": ({"path"}, set()),
}
METRICS = ("check_include_exclude", "exact_match", "match_in_list", "is_in_list", "literal_match", "fuzzy_match",
           "diff_text_file", "compare_text_file", "check_csv", "check_list", "check_json",
           "check_direct_json_object", "check_accessibility_tree", "check_moved_jpgs", "infeasible")
NO_EXPECTED = {"infeasible"}   # the one metric without an expected value
IGNORED_KEYS = {"snapshot", "source", "related_apps", "trajectory", "proxy", "fixed_ip", "possibility_of_env_change",
                "os_type", "instruction_zh", "domain", "id", "instruction", "config", "evaluator", "_comment"}


class OSWorldTaskError(DockyardError, ValueError):
    """A task file that cannot be used; the message names the file and the field."""


@dataclass
class OSWorldTask:
    id: str
    instruction: str
    path: Path
    config: list[dict]
    evaluator: dict
    related_apps: list[str] = field(default_factory=list)
    oracle: str | None = None          # pyautogui code for `dockyard env check --agent oracle`
    files: dict[str, Path] = field(default_factory=dict)   # download / cloud_file URL -> local copy

    @property
    def name(self) -> str:
        return self.id

    @property
    def infeasible(self) -> bool:
        funcs = self.evaluator["func"]
        return funcs == "infeasible" or funcs == ["infeasible"]

    def evaluations(self) -> list[tuple[str, dict | None, dict | None, dict]]:
        """(metric, result getter, expected getter, options) per metric, in order."""
        funcs = self.evaluator["func"]
        if isinstance(funcs, str):
            return [(funcs, self.evaluator.get("result"), self.evaluator.get("expected"),
                     self.evaluator.get("options") or {})]
        results, expected = self.evaluator.get("result") or [], self.evaluator.get("expected") or []
        options = self.evaluator.get("options") or [{}] * len(funcs)
        return [(func, results[n] if n < len(results) else None, expected[n] if n < len(expected) else None,
                 options[n] if isinstance(options, list) and n < len(options) else {})
                for n, func in enumerate(funcs)]


PYTHONS = ("python", "python3")


def pyautogui_script(command) -> str | None:
    """The code of an `execute` step that is OSWorld's `python -c "import pyautogui; ..."` (tasks use it to
    press keys in set-up and postconfig, e.g. ctrl+s before a file is read), else None. It runs through
    the agent's own action parser, not a Python with pyautogui inside the desktop."""
    if isinstance(command, list) and len(command) == 3 and command[0] in PYTHONS and command[1] == "-c" \
            and isinstance(command[2], str) and "pyautogui" in command[2]:
        return command[2]
    return None


def _check_keys(given: set[str], required: set[str], optional: set[str], what: str, prefix: str) -> None:
    missing = sorted(required - given)
    if missing:
        raise OSWorldTaskError(f"{what} needs {prefix}{missing[0]}")
    unknown = sorted(given - required - optional)
    if unknown:
        raise OSWorldTaskError(f"{what} has unknown {prefix or 'key '}{unknown[0]!r} (known: "
                               f"{', '.join(sorted(required | optional))})")


def _kind(part, what: str, known: dict, where: str) -> str:
    """A step's or getter's `type`, one this version implements (OSWorldTaskError naming it otherwise)."""
    if not isinstance(part, dict) or not isinstance(part.get("type"), str):
        raise OSWorldTaskError(f"{where}: a {what} must be an object with a `type`")
    if part["type"] not in known:
        raise OSWorldTaskError(f"{where}: {what} type {part['type']!r} is not supported (supported: "
                               f"{', '.join(sorted(known))})")
    return part["type"]


def _check_step(step, where: str) -> None:
    kind = _kind(step, "set-up step", SETUP_STEPS, where)
    params = step.get("parameters", {})
    if not isinstance(params, dict):
        raise OSWorldTaskError(f"{where}: {kind}.parameters must be an object")
    _check_keys(set(params), *SETUP_STEPS[kind], f"{where}: {kind}", "parameters.")
    script = pyautogui_script(params.get("command")) if kind in ("execute", "command") else None
    if script is not None:
        from dockyard.desktop.actions import ActionError, Screen, parse_pyautogui

        try:
            parse_pyautogui(script, Screen(1 << 16, 1 << 16))   # the screen's own size is checked when it runs
        except ActionError as err:
            raise OSWorldTaskError(f"{where}: its pyautogui script: {err}") from None
    if kind == "download":
        if not isinstance(params["files"], list) or not all(isinstance(f, dict) and {"url", "path"} <= set(f)
                                                              for f in params["files"]):
            raise OSWorldTaskError(f"{where}: download.files must be a list of {{url, path}}")


def _check_getter(getter, where: str) -> None:
    if getter is None:
        return
    kind = _kind(getter, "getter", GETTERS, where)
    _check_keys(set(getter) - {"type"}, *GETTERS[kind], f"{where}: getter {kind}", "")


def launched_programs(task: "OSWorldTask") -> list[tuple[str, str]]:
    """(where, program) of every `launch` step that names its program as a list (a shell line is left to
    the shell)."""
    programs = []
    for key, steps in (("config", task.config), ("evaluator.postconfig", task.evaluator.get("postconfig") or [])):
        for number, step in enumerate(steps):
            command = step.get("parameters", {}).get("command")
            if step["type"] == "launch" and isinstance(command, list) and command and not step["parameters"].get("shell"):
                programs.append((f"{key}[{number}]", str(command[0])))
    return programs


def local_copy(url: str, task_file: Path, files_dir: Path | None, saved_as: str = "") -> Path | None:
    """Where a download's file is on this machine: a file:// URL or a path (relative to the task file),
    else in files_dir under the URL's file name, or under the name the task saves it as (OSWorld's Google
    Drive URLs end in `download?id=...`); None when there is no copy."""
    parsed = urlparse(url)
    if parsed.scheme in ("", "file"):
        path = Path(unquote(parsed.path))
        path = path if path.is_absolute() else task_file.parent / path
        return path if path.is_file() else None
    if files_dir is None:
        return None
    for name in (Path(unquote(parsed.path)).name, Path(saved_as).name):
        if name and (files_dir / name).is_file():
            return files_dir / name
    return None


def _urls(task: dict) -> list[tuple[str, str]]:
    """(URL, the name the task saves it as) of every download and cloud_file."""
    urls = []
    for step in [*task.get("config", []), *task["evaluator"].get("postconfig", [])]:
        if step.get("type") == "download":
            urls += [(f["url"], f["path"]) for f in step["parameters"]["files"]]
    for key in ("result", "expected"):
        getters = task["evaluator"].get(key)
        for getter in getters if isinstance(getters, list) else [getters]:
            if isinstance(getter, dict) and getter.get("type") == "cloud_file":
                multi = isinstance(getter["path"], list)
                paths = getter["path"] if multi else [getter["path"]]
                dests = getter["dest"] if multi and isinstance(getter["dest"], list) else [getter["dest"]] * len(paths)
                urls += list(zip(paths, dests))
    return urls


def load_task(path: Path, files_dir: Path | None = None, find_files: bool = True) -> OSWorldTask:
    """The task in `path`, checked; find_files: its downloads' local copies found (an index skips it)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise OSWorldTaskError(f"{path}: not a readable JSON task ({err})") from None
    if not isinstance(data, dict):
        raise OSWorldTaskError(f"{path}: a task is a JSON object")
    for key in ("id", "instruction"):
        if not isinstance(data.get(key), str) or not data[key].strip():
            raise OSWorldTaskError(f"{path}: `{key}` must be a non-empty string")
    config = data.get("config", [])
    if not isinstance(config, list):
        raise OSWorldTaskError(f"{path}: `config` must be a list of set-up steps")
    for number, step in enumerate(config):
        _check_step(step, f"{path}: config[{number}]")
    evaluator = data.get("evaluator")
    if not isinstance(evaluator, dict) or "func" not in evaluator:
        raise OSWorldTaskError(f"{path}: `evaluator` must be an object with a `func`")
    unknown = sorted(set(evaluator) - {"func", "result", "expected", "options", "conj", "postconfig"})
    if unknown:
        raise OSWorldTaskError(f"{path}: evaluator has unknown key {unknown[0]!r}")
    for number, step in enumerate(evaluator.get("postconfig", []) or []):
        _check_step(step, f"{path}: evaluator.postconfig[{number}]")
    if evaluator.get("conj", "and") not in ("and", "or"):
        raise OSWorldTaskError(f"{path}: evaluator.conj must be and or or, got {evaluator['conj']!r}")
    funcs = evaluator["func"] if isinstance(evaluator["func"], list) else [evaluator["func"]]
    for key in ("result", "expected", "options"):
        value = evaluator.get(key)
        if isinstance(evaluator["func"], list) and value is not None and not isinstance(value, list):
            raise OSWorldTaskError(f"{path}: with a list of funcs, evaluator.{key} must be a list too")
    task = OSWorldTask(id=data["id"], instruction=data["instruction"], path=path, config=config,
                       evaluator=evaluator, related_apps=list(data.get("related_apps") or []))
    for number, (func, result, expected, options) in enumerate(task.evaluations()):
        where = f"{path}: evaluator" + (f"[{number}]" if isinstance(evaluator["func"], list) else "")
        if func not in METRICS:
            raise OSWorldTaskError(f"{where}: metric {func!r} is not supported (supported: {', '.join(METRICS)})")
        if func != "infeasible" and result is None:
            raise OSWorldTaskError(f"{where}: metric {func} needs a `result` getter")
        if func not in NO_EXPECTED and expected is None:
            raise OSWorldTaskError(f"{where}: metric {func} needs an `expected` getter")
        if not isinstance(options, dict):
            raise OSWorldTaskError(f"{where}: options must be an object")
        _check_getter(result, f"{where}.result")
        _check_getter(expected, f"{where}.expected")
    if "infeasible" in funcs and len(funcs) > 1:
        raise OSWorldTaskError(f"{path}: `infeasible` must be the evaluator's only func")
    for url, saved_as in _urls(data) if find_files else []:
        copy = local_copy(url, path, files_dir, saved_as)
        if copy is None:
            raise OSWorldTaskError(f"{path}: {url} has no local copy (nothing is downloaded at run time): put the "
                                   f"file in env.files_dir{f' ({files_dir})' if files_dir else ''} under its name "
                                   f"or as {Path(saved_as).name!r}, or give a path relative to the task file")
        task.files[url] = copy
    oracle = path.with_name(f"{path.stem}.oracle.py")
    if oracle.is_file():
        task.oracle = oracle.read_text()
    return task


def is_index(data) -> bool:
    """OSWorld's test_all.json-style index: {domain: [task ids]}."""
    return isinstance(data, dict) and bool(data) and all(
        isinstance(ids, list) and all(isinstance(i, str) for i in ids) for ids in data.values())


def load_tasks(source: Path, files_dir: Path | None = None, problems: list[str] | None = None,
               find_files: bool = True) -> list[OSWorldTask]:
    """Every task of a task file, a folder (searched recursively; index files such as test_all.json
    are skipped) or a jsonl of dataset rows whose metadata names the task file (`task.path` or
    `path`). With `problems`, a task that cannot be read is noted there and the others still load."""
    source = Path(source)
    if source.is_file() and source.suffix == ".jsonl":
        from dockyard.data.datasets import DatasetError, read_rows

        try:
            rows = read_rows(str(source))
        except DatasetError as err:
            raise OSWorldTaskError(str(err)) from None
        paths = []
        for number, row in enumerate(rows, 1):
            path = row.get("path") or (row.get("task") or {}).get("path")
            if not isinstance(path, str):
                raise OSWorldTaskError(f"{source}: row {number} needs the task file's `path` (at the top level "
                                       "or under `task`)")
            paths.append((source.parent / path).resolve())
    elif source.is_file():
        paths = [source]
    elif source.is_dir():
        paths = []
        for path in sorted(source.rglob("*.json")):
            try:
                if is_index(json.loads(path.read_text())):
                    continue
            except (OSError, ValueError):
                pass   # load_task names it
            paths.append(path)
    else:
        raise OSWorldTaskError(f"{source}: no such task file, folder or jsonl")
    tasks, seen = [], {}
    for path in paths:
        try:
            task = load_task(path, files_dir, find_files)
            if task.id in seen:
                raise OSWorldTaskError(f"{path}: task id {task.id!r} is also {seen[task.id]}")
            seen[task.id] = path
            tasks.append(task)
        except OSWorldTaskError as err:
            if problems is None:
                raise
            problems.append(str(err))
    return tasks


def index_rows(source: Path, relative_to: Path) -> list[dict]:
    """Dataset rows for `dockyard env index`: {"instruction", "task": {"path", "name"}}."""
    from dockyard.data.datasets import index_row

    return [index_row(task.instruction, task.path, task.id, relative_to) for task in load_tasks(source, find_files=False)]
