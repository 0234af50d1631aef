"""The osworld environment: OSWorld's task format and metrics, the two action spaces read on the host, and
desktops in real sandboxes (Xvfb, openbox, AT-SPI, the shipped tasks' applications) driven by the
shipped tasks' scripted oracles, the no-op agent, and an agent that attacks its grader."""

import base64
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dockyard.config.schema.env import EnvConfig
from dockyard.desktop.actions import ActionError, Screen, parse_pyautogui, parse_reply
from dockyard.desktop.session import DesktopError, DesktopSession, missing_programs
from dockyard.envs import osworld_metrics as metrics
from dockyard.envs.osworld import OSWorldEnvironment
from dockyard.envs.osworld_tasks import OSWorldTaskError, load_task, load_tasks
from dockyard.sandboxes.base import SandboxSpec
from tests.conftest import REPO

TASKS = REPO / "tasks" / "osworld"
SCREEN = Screen(1280, 720)
needs_desktop = pytest.mark.skipif(bool(missing_programs()) or shutil.which("bwrap") is None,
                                   reason=f"the desktop's packages are missing: {missing_programs()}")


# --- actions: parsed on the host, never run ---------------------------------------------------------

def test_pyautogui_code_becomes_checked_records():
    code = ("import pyautogui\nimport time\npyautogui.click(100, 200)\npyautogui.typewrite('ls\\n', interval=0.1)\n"
            "pyautogui.hotkey('ctrl', 's')\npyautogui.press(['down', 'enter'], presses=2)\ntime.sleep(0.5)\n"
            "pyautogui.scroll(-3, x=10, y=20)\npyautogui.dragTo(300, 400, duration=1, button='left')\n"
            "pyautogui.rightClick(5, 6)\npyautogui.keyDown('shift')\npyautogui.keyUp('shift')")
    assert parse_pyautogui(code, SCREEN) == [
        {"kind": "click", "x": 100, "y": 200, "clicks": 1, "button": "left"},
        {"kind": "type", "text": "ls\n"},
        {"kind": "hotkey", "keys": ["ctrl", "s"]},
        {"kind": "keys", "keys": ["Down", "Return", "Down", "Return"]},
        {"kind": "sleep", "seconds": 0.5},
        {"kind": "scroll", "x": 10, "y": 20, "dy": -3},
        {"kind": "drag", "x": 300, "y": 400, "button": "left"},
        {"kind": "click", "x": 5, "y": 6, "clicks": 1, "button": "right"},
        {"kind": "key_down", "key": "shift"},
        {"kind": "key_up", "key": "shift"},
    ]


@pytest.mark.parametrize("code, named", [
    ("import os\nos.system('touch /tmp/owned')", "only `import pyautogui` and `import time`"),
    ("__import__('os').system('touch /tmp/owned')", "is not allowed"),
    ("exec(\"open('/tmp/owned', 'w')\")", "exec is not allowed"),
    ("x = 5\npyautogui.click(x, 5)", "each line must be one call"),
    ("for i in range(3):\n    pyautogui.click(1, 1)", "each line must be one call"),
    ("pyautogui.click(open('/etc/passwd').read(), 1)", "arguments must be literals"),
    ("pyautogui.screenshot('/tmp/x.png')", "pyautogui.screenshot is not allowed"),
    ("pyautogui.click(5000, 10)", "x=5000 is off the 1280x720 screen"),
    ("pyautogui.press('notakey')", "unknown key 'notakey'"),
    ("pyautogui.click(1, 2, button='sideways')", "button must be left, middle or right"),
    ("time.sleep(600)", "seconds must be from 0 to 10"),
    ("pyautogui.click(1, 2,", "does not parse"),
])
def test_anything_beyond_the_allow_list_is_refused_by_name_and_never_runs(code, named, tmp_path):
    with pytest.raises(ActionError, match=named.replace("(", r"\(").replace(")", r"\)").replace("`", ".")):
        parse_pyautogui(code, SCREEN)
    assert not Path("/tmp/owned").exists()


def test_replies_blocks_specials_and_computer_13():
    assert parse_reply("I will click.\n```python\npyautogui.click(1, 2)\n```", "pyautogui", SCREEN).actions == \
        [{"kind": "click", "x": 1, "y": 2, "clicks": 1, "button": "left"}]
    assert parse_reply("```DONE```", "pyautogui", SCREEN).special == "DONE"
    assert parse_reply("It cannot be done.\nFAIL", "pyautogui", SCREEN).special == "FAIL"
    with pytest.raises(ActionError, match="no action"):
        parse_reply("I think I should click somewhere", "pyautogui", SCREEN)
    with pytest.raises(ActionError, match="must be the only block"):
        parse_reply("```python\npyautogui.click(1, 2)\n```\n```DONE```", "pyautogui", SCREEN)
    parsed = parse_reply('```\n[{"action_type": "CLICK", "x": 3, "y": 4, "num_clicks": 2}, '
                         '{"action_type": "TYPING", "text": "hi"}, {"action_type": "HOTKEY", "keys": ["ctrl", "c"]}]\n```',
                         "computer_13", SCREEN)
    assert parsed.actions == [{"kind": "click", "x": 3, "y": 4, "clicks": 2, "button": "left"},
                              {"kind": "type", "text": "hi"}, {"kind": "hotkey", "keys": ["ctrl", "c"]}]
    assert parse_reply('```{"action_type": "FAIL"}```', "computer_13", SCREEN).special == "FAIL"
    with pytest.raises(ActionError, match="unknown action_type 'RUN_SHELL'"):
        parse_reply('```{"action_type": "RUN_SHELL", "command": "id"}```', "computer_13", SCREEN)


# --- the task format ------------------------------------------------------------------------------

def _task(tmp_path: Path, **changes) -> Path:
    task = {"id": "t1", "instruction": "do it", "config": [{"type": "sleep", "parameters": {"seconds": 1}}],
            "evaluator": {"func": "exact_match", "result": {"type": "vm_command_line", "command": "echo hi"},
                          "expected": {"type": "rule", "rules": {"expected": "hi\n"}}}}
    task.update(changes)
    path = tmp_path / f"{task['id']}.json"
    path.write_text(json.dumps(task))
    return path


@pytest.mark.parametrize("changes, named", [
    ({"config": [{"type": "chrome_open_tabs", "parameters": {"urls_to_open": []}}]},
     "set-up step type 'chrome_open_tabs' is not supported"),
    ({"config": [{"type": "launch", "parameters": {"cmd": ["x"]}}]}, "launch needs parameters.command"),
    ({"evaluator": {"func": "compare_pdfs", "result": {"type": "vm_file", "path": "/a", "dest": "a"},
                    "expected": {"type": "rule", "rules": {}}}}, "metric 'compare_pdfs' is not supported"),
    ({"evaluator": {"func": "exact_match", "result": {"type": "chrome_history"},
                    "expected": {"type": "rule", "rules": {}}}}, "getter type 'chrome_history' is not supported"),
    ({"evaluator": {"func": "exact_match", "result": {"type": "vm_command_line", "command": "x"}}},
     "metric exact_match needs an `expected` getter"),
    ({"config": [{"type": "download", "parameters": {"files": [{"url": "https://example.org/f.xlsx",
                                                                 "path": "/home/user/f.xlsx"}]}}]},
     "https://example.org/f.xlsx has no local copy"),
    ({"instruction": ""}, "`instruction` must be a non-empty string"),
    ({"evaluator": {"func": ["exact_match"], "result": {"type": "vm_command_line", "command": "x"},
                    "expected": [{"type": "rule", "rules": {}}]}}, "evaluator.result must be a list too"),
])
def test_a_task_naming_what_is_not_implemented_is_refused_when_it_loads(tmp_path, changes, named):
    with pytest.raises(OSWorldTaskError, match=named.replace("(", r"\(").replace(".", r"\.").replace("`", ".")):
        load_task(_task(tmp_path, **changes))


def test_a_bad_file_is_noted_and_the_rest_of_the_set_loads(tmp_path):
    _task(tmp_path)
    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / "test_all.json").write_text(json.dumps({"os": ["t1"]}))   # OSWorld's index: skipped
    problems: list[str] = []
    tasks = load_tasks(tmp_path, problems=problems)
    assert [t.id for t in tasks] == ["t1"]
    assert len(problems) == 1 and "broken.json: not a readable JSON task" in problems[0]


def test_the_shipped_tasks_load_with_their_oracles():
    tasks = load_tasks(TASKS, TASKS / "files_dir")
    assert len(tasks) >= 12 and all(task.oracle for task in tasks)
    assert {app for task in tasks for app in task.related_apps} >= {"terminal", "mousepad", "pcmanfm", "settings"}


# --- metrics --------------------------------------------------------------------------------------

def test_metrics_score_as_osworld_defines_them(tmp_path):
    table = tmp_path / "t.csv"
    table.write_text("name,age\nalice,30\nbob,25\n")
    settings = tmp_path / "s.json"
    settings.write_text(json.dumps({"theme": "dark", "size": 14.02, "tags": "a,b"}))
    assert metrics.check_include_exclude("all done", {"include": ["done"], "exclude": ["error"]}) == 1.0
    assert metrics.check_include_exclude("error: done", {"include": ["done"], "exclude": ["error"]}) == 0.0
    assert metrics.check_include_exclude(None, {"include": []}) == 0.0
    assert metrics.exact_match("hi\n", {"expected": "hi\n"}) == 1.0 and metrics.exact_match("hi", {"expected": "hi\n"}) == 0.0
    assert metrics.check_csv(str(table), {"expect": [{"name": "bob", "age": "25"}], "unexpect": [{"name": "eve"}]}) == 1.0
    assert metrics.check_csv(str(table), {"expect": [{"name": "bob", "age": "26"}]}) == 0.0
    assert metrics.check_csv(None, {"expect": []}) == 0.0
    assert metrics.check_list(str(table), {"expect": [r"^bob,25$"], "unexpect": ["eve"]}) == 1.0
    assert metrics.check_json(str(settings), {"expect": [{"key": ["theme"], "method": "eq", "ref": "dark"},
                                                         {"key": ["size"], "method": "approx:0.1", "ref": 14},
                                                         {"key": ["tags"], "method": "str_set_eq", "ref": ["b", "a"]},
                                                         {"key": ["theme"], "method": "re.I", "ref": "^DARK$"}]}) == 1.0
    assert metrics.check_json(str(settings), {"expect": [{"key": ["missing"], "method": "eq", "ref": 1}]}) == 0.0
    assert metrics.check_json(str(settings), {"unexpect": [{"key": ["theme"], "method": "eq", "ref": "dark"}]}) == 0.0
    left, right = tmp_path / "a.txt", tmp_path / "b.txt"
    left.write_text("Hello  World\n\n")
    right.write_text("hello world")
    assert metrics.compare_text_file(str(left), str(right)) == 0.0
    assert metrics.compare_text_file(str(left), str(right), ignore_blanks=True, ignore_case=True) == 1.0
    assert metrics.fuzzy_match("colour", {"expected": "color"}) == pytest.approx(0.909, abs=0.001)
    assert metrics.literal_match(["A", "b"], ["a", "b"], type="list", ignore_case=True) == 1.0
    tree = ('<desktop-frame xmlns:st="https://accessibility.ubuntu.example.org/ns/state"><application name="mousepad">'
            '<frame name="todo.txt - Mousepad" st:showing="true"><label name="x">Saved</label></frame></application>'
            '</desktop-frame>')
    assert metrics.check_accessibility_tree(tree, [{"xpath": "//frame[contains(@name, 'todo.txt')]"}]) == 1.0
    assert metrics.check_accessibility_tree(tree, [{"selectors": ["label"], "text": "Saved", "exact": True}]) == 1.0
    assert metrics.check_accessibility_tree(tree, [{"selectors": ["label[name='y']"]}]) == 0.0


# --- settings -------------------------------------------------------------------------------------

@pytest.mark.parametrize("extra, named", [
    ({"observation_type": "video"}, "env.observation_type: 'video' is not one of"),
    ({"action_space": "keyboard"}, "env.action_space: 'keyboard' is not one of"),
    ({"screen": {"width": 0, "height": 10}}, "env.screen.width: must be a positive"),
    ({"sleep_after_action_s": 100}, "env.sleep_after_action_s"),
    ({"sandbox": {"type": "none", "trusted": True}}, "env.sandbox.type: none cannot hold a desktop"),
    ({"zoom": 2}, "env.zoom: not an osworld setting"),
])
def test_settings_are_checked_by_name(extra, named):
    with pytest.raises(ValueError, match=named.replace(".", r"\.")):
        OSWorldEnvironment.check_settings(EnvConfig(name="osworld", agent="computer_use", **extra))


def test_the_preflight_refuses_an_agent_the_environment_does_not_work_with():
    from dockyard.config.loader import load_config
    from dockyard.preflight.components import _agent_setup

    cfg = load_config("grpo_osworld_local.yaml", ["models_dir=models", "env.agent=tool_calling"]).config
    assert [p.path for p in _agent_setup(cfg)] == ["env.agent"]
    assert _agent_setup(load_config("grpo_osworld_local.yaml", ["models_dir=models"]).config) == []


# --- desktops in sandboxes ------------------------------------------------------------------------

def _check(agent: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dockyard.cli", "env", "check", "--config", "grpo_osworld_local.yaml",
                           "--agent", agent, *args], capture_output=True, text=True, timeout=900, cwd=REPO)


@needs_desktop
def test_env_check_the_oracles_solve_every_shipped_task_and_the_noop_none():
    oracle = _check("oracle")
    assert oracle.returncode == 0, oracle.stdout + oracle.stderr
    assert "mean reward 1.00" in oracle.stdout
    noop = _check("noop")
    assert noop.returncode == 0, noop.stdout + noop.stderr
    assert "mean reward 0.00" in noop.stdout


@needs_desktop
@pytest.mark.skipif(shutil.which("podman") is None, reason="podman is not installed")
def test_the_desktop_runs_in_podman_too():
    for agent, mean in (("oracle", "1.00"), ("noop", "0.00")):
        result = _check(agent, "--tasks", str(TASKS / "os" / "terminal-hello-file.json"), "env.sandbox.type=podman")
        assert result.returncode == 0 and f"mean reward {mean}" in result.stdout, result.stdout + result.stderr


@pytest.fixture
def environment():
    return OSWorldEnvironment(EnvConfig(name="osworld", agent="computer_use", files_dir=str(TASKS / "files_dir"),
                                        sandbox={"type": "bubblewrap", "creation_timeout_s": 60,
                                                 "command_exec_timeout_s": 30}))


def _typed(episode, command: str) -> None:
    from dockyard.agents.tool_format import Action

    episode.execute(Action("tool", name="computer", arguments={"actions": [{"kind": "type", "text": command + "\n"},
                                                                           {"kind": "sleep", "seconds": 1.5}]}))


@needs_desktop
def test_an_agent_cannot_forge_its_grade(environment, tmp_path):
    """From the desktop's own terminal, the agent (1) puts a fake gsettings first on a PATH set in its
    shell's rc file, (2) tries to read the task's expected answer and the controller's pipe, (3) kills the
    controller; none of it scores."""
    from dockyard.envs.osworld import OSWorldEpisode

    clock = load_task(TASKS / "os" / "settings-clock-12h.json")
    episode = OSWorldEpisode(environment, clock)
    try:
        # what the agent's terminal can do, done through the desktop as its user (typing the quoting is no test)
        episode.desktop.request("write_file", path="/home/user/bin/gsettings",
                                data=base64.b64encode(b"#!/bin/sh\necho \"'12h'\"\n").decode())
        _typed(episode, "chmod +x ~/bin/gsettings; echo 'export PATH=$HOME/bin:$PATH' | tee -a ~/.bashrc ~/.profile")
        check = episode.desktop.run("PATH=$HOME/bin:$PATH gsettings get org.gnome.desktop.interface clock-format",
                                    shell=True)
        assert check["output"] == "'12h'\n"   # the fake works for the agent's own shell...
        assert episode.finish() == 0.0        # ...and not for the evaluator's clean environment
    finally:
        episode.close()

    hello = load_task(TASKS / "os" / "terminal-hello-file.json")
    episode = OSWorldEpisode(environment, hello)
    try:
        expected = (TASKS / "os" / "expected" / "hello.txt").resolve()
        attempt = episode.desktop.run(f"cat {expected}; P=$(pgrep -f '^/usr/bin/python3 -I'); ls /proc/$P/fd/; "
                                      "echo '{\"ok\": true}' > /proc/$P/fd/1", shell=True)
        assert "Hello, OSWorld" not in attempt["output"]     # the expected file is the host's, never placed inside
        assert "Permission denied" in attempt["error"]       # the controller's descriptors are closed to its user
        _typed(episode, "pkill -f '^/usr/bin/python3 -I'")
    except DesktopError:
        pass   # the controller died while the typing was still being answered
    try:
        with pytest.raises(DesktopError, match="ended|not running|gone"):
            episode.finish()   # the attempt fails (it is retried), it never scores
    finally:
        episode.close()


@needs_desktop
def test_a_desktop_that_does_not_come_up_is_named_and_leaves_nothing(environment):
    sandbox = environment.sandboxes.create(SandboxSpec(workdir="/home/user", name="task slow-desktop"))
    try:
        with pytest.raises(DesktopError, match="^task slow-desktop: the desktop did not come up: TimeoutError: "
                                               "waited for the (X server|session bus|window manager)"):
            DesktopSession(sandbox, start_timeout_s=0.01).start()
        assert not sandbox.live_shells()
    finally:
        sandbox.destroy()


@needs_desktop
def test_infeasible_tasks_want_fail_and_feasible_ones_do_not(environment):
    from dockyard.agents.tool_format import Action
    from dockyard.envs.osworld import OSWorldEpisode

    for task_file, special, reward in (("install-office-suite.json", "FAIL", 1.0),
                                       ("install-office-suite.json", "DONE", 0.0),
                                       ("terminal-show-kernel.json", "FAIL", 0.0)):
        episode = OSWorldEpisode(environment, load_task(TASKS / "os" / task_file))
        try:
            if task_file == "terminal-show-kernel.json":
                _typed(episode, "uname -s")   # the work is done, and then the agent gives up: OSWorld scores 0
            episode.submitted(Action("submit", arguments={"special": special}))
            assert episode.finish() == reward, (task_file, special)
        finally:
            episode.close()


def test_a_published_pyautogui_step_is_read_by_the_action_parser(tmp_path):
    """OSWorld's tasks press keys in set-up and postconfig with `python -c "import pyautogui; ..."`: the
    script goes through the agent's parser (no Python with pyautogui inside), and one beyond it is refused
    when the task loads."""
    bad = {"type": "execute", "parameters": {"command": ["python", "-c", "import os; os.remove('/home/user/x')"]}}
    with pytest.raises(OSWorldTaskError, match=r"config\[0\]: its pyautogui script: only `import pyautogui`"):
        load_task(_task(tmp_path, config=[{"type": "execute", "parameters": {
            "command": ["python", "-c", "import pyautogui; import os; os.remove('/home/user/x')"]}}]))
    load_task(_task(tmp_path, config=[bad]))   # not a pyautogui script: an ordinary command the desktop runs


@needs_desktop
def test_postconfig_keys_save_the_editor_and_a_missing_application_is_named(environment, tmp_path):
    from dockyard.envs.osworld import OSWorldEpisode

    task = {"id": "save-by-postconfig", "instruction": "Type ok into the open note.", "config": [
        {"type": "execute", "parameters": {"command": "printf 'hi\\n' > ~/note.txt", "shell": True}},
        {"type": "open", "parameters": {"path": "/home/user/note.txt"}}],
        "evaluator": {"postconfig": [{"type": "execute", "parameters": {"command": [
            "python", "-c", "import pyautogui; import time; pyautogui.hotkey('ctrl', 's'); time.sleep(0.5);"]}}],
            "func": "check_include_exclude", "result": {"type": "vm_command_line", "command": "cat ~/note.txt",
                                                       "shell": True},
            "expected": {"type": "rule", "rules": {"include": ["ok"], "exclude": []}}}}
    (tmp_path / "save.json").write_text(json.dumps(task))
    episode = OSWorldEpisode(environment, load_task(tmp_path / "save.json"))
    try:
        _typed(episode, "ok")    # typed, never saved by the agent: the task's postconfig saves it
        assert episode.finish() == 1.0
    finally:
        episode.close()
    chrome = dict(task, id="needs-chrome", config=[{"type": "launch", "parameters": {"command": ["google-chrome"]}}])
    (tmp_path / "chrome.json").write_text(json.dumps(chrome))
    with pytest.raises(OSWorldTaskError, match=r"chrome.json: config\[0\] launches google-chrome, which the desktop "
                                               r"does not have"):
        environment.usable(load_task(tmp_path / "chrome.json"))


def test_a_desktop_image_keeps_the_package_list_and_an_apptainer_desktop_renders(monkeypatch):
    """apptainer cannot be installed here: the desktop's controller command on a cluster's image is
    checked as rendered, and the Apptainer definition installs exactly containers/desktop.packages."""
    from dockyard.sandboxes import apptainer as runtimes
    from dockyard.sandboxes.base import SandboxLimits

    listed = {line for line in (REPO / "containers" / "desktop.packages").read_text().splitlines()
              if line and not line.startswith("#")}
    definition = (REPO / "containers" / "desktop.def").read_text()
    installed = set(definition.split("--no-install-recommends", 1)[1].split("rm -rf", 1)[0].replace("\\", " ").split())
    assert listed <= installed, sorted(listed - installed)
    with pytest.raises(ValueError, match="env.sandbox.agent_user: auto would make the agent root"):
        OSWorldEnvironment.check_settings(EnvConfig(name="osworld", agent="computer_use", sandbox={
            "type": "podman", "image": "localhost/dockyard-desktop:bookworm"}))
    real = shutil.which
    monkeypatch.setattr(runtimes.shutil, "which", lambda name: "/usr/bin/apptainer" if name == "apptainer"
                        else real(name))
    config = EnvConfig(name="osworld", agent="computer_use", sandbox={"type": "apptainer", "image": "/images/desktop.sif",
                                                                      "agent_user": "sandbox"}).sandbox
    with runtimes.ApptainerSandbox(SandboxSpec(workdir="/home/user", name="task t"), SandboxLimits(),
                                   config=config) as box:
        box.copy_in(Path(__file__).parents[2] / "dockyard" / "desktop" / "guest", "/dockyard-desktop", read_only=True)
        argv = box.wrap(["/usr/bin/python3", "-I", "/dockyard-desktop/desktop_guest.py"], box.environment())
        start = argv.index("apptainer")
        assert argv[start:start + 3] == ["apptainer", "exec", "--containall"]   # its own pid and IPC namespaces
        assert ["--network", "none"] == argv[argv.index("--network"):argv.index("--network") + 2]
        binds = [argv[i + 1] for i, a in enumerate(argv) if a == "--bind"]
        assert f"{box.mounts['/dockyard-desktop']}:/dockyard-desktop:ro" in binds
        assert f"{box.mounts['/home/user']}:/home/user" in binds
        assert argv[-4:] == ["/images/desktop.sif", "/usr/bin/python3", "-I", "/dockyard-desktop/desktop_guest.py"]


def test_a_download_finds_its_local_copy_by_its_name_or_the_name_it_is_saved_as(tmp_path):
    files = tmp_path / "files"
    files.mkdir()
    (files / "report.xlsx").write_text("x")
    (files / "photo.jpg").write_text("y")
    drive = {"type": "download", "parameters": {"files": [
        {"url": "https://drive.usercontent.google.com/download?id=1AbC&export=download", "path": "/home/user/photo.jpg"},
        {"url": "https://example.org/data/report.xlsx", "path": "/home/user/r.xlsx"}]}}
    task = load_task(_task(tmp_path, config=[drive]), files)
    assert sorted(path.name for path in task.files.values()) == ["photo.jpg", "report.xlsx"]
    (files / "photo.jpg").unlink()
    with pytest.raises(OSWorldTaskError, match="download\\?id=1AbC&export=download has no local copy .* or as "
                                               "'photo.jpg'"):
        load_task(_task(tmp_path, config=[drive]), files)


def test_the_controller_turns_records_into_xdotool_lists_and_commands_as_osworld_runs_them():
    from dockyard.desktop.guest.desktop_guest import shell_argv, xdotool

    assert xdotool({"kind": "type", "text": "ls -l\nexit\t"}) == [
        ["type", "--delay", "12", "--", "ls -l"], ["key", "--", "Return"], ["type", "--delay", "12", "--", "exit"],
        ["key", "--", "Tab"]]   # xdotool would type a newline as Linefeed, which GTK editors ignore
    assert xdotool({"kind": "click", "x": 5, "y": 6, "clicks": 2, "button": "right"}) == [
        ["mousemove", "--", "5", "6"], ["click", "--repeat", "2", "--delay", "80", "3"]]
    assert xdotool({"kind": "hotkey", "keys": ["ctrl", "shift", "t"]}) == [["key", "--", "ctrl+shift+t"]]
    assert xdotool({"kind": "scroll", "dy": -3, "dx": 2}) == [["click", "--repeat", "3", "5"],
                                                              ["click", "--repeat", "2", "7"]]
    assert shell_argv("echo hi | wc -c", False) == ["/bin/sh", "-c", "echo hi | wc -c"]
    assert shell_argv(["ls", "-l", "/home/user"], False) == ["ls", "-l", "/home/user"]
    assert shell_argv(["echo $0", "arg"], True) == ["/bin/sh", "-c", "echo $0", "arg"]


@needs_desktop
def test_what_published_os_tasks_lean_on_works(environment, tmp_path):
    """What OSWorld's own os tasks do, written the same way here: a script downloaded from a Drive URL to a
    path relative to the home folder and run; ctrl+alt+t pressed by a `python -c` pyautogui step and the
    terminal activated by its title; gsettings under DBUS_SESSION_BUS_ADDRESS=unix:path=/run/user/1000/bus;
    the result read as a list_directory tree and scored by check_moved_jpgs."""
    from dockyard.envs.osworld import OSWorldEpisode

    files = tmp_path / "files"
    files.mkdir()
    (files / "setup.sh").write_text("mkdir -p photos/a photos/b cpjpg\ntouch photos/a/x.jpg photos/b/y.jpg photos/b/z.png\n")
    bus = "export DBUS_SESSION_BUS_ADDRESS='unix:path=/run/user/1000/bus'\n"
    task = {"id": "published-shape", "instruction": "Copy every .jpg under ~/photos into ~/cpjpg.", "config": [
        {"type": "download", "parameters": {"files": [
            {"url": "https://drive.usercontent.google.com/download?id=1X&export=download", "path": "setup.sh"}]}},
        {"type": "execute", "parameters": {"command": "chmod +x setup.sh && ./setup.sh", "shell": True}},
        {"type": "execute", "parameters": {"command": bus + "gsettings set org.gnome.desktop.interface clock-format 12h",
                                           "shell": True}},
        {"type": "execute", "parameters": {"command": [
            "python", "-c", "import pyautogui; import time; pyautogui.click(960, 540); time.sleep(0.5); "
                            "pyautogui.hotkey('ctrl', 'alt', 't'); time.sleep(2)"]}},
        {"type": "activate_window", "parameters": {"window_name": "Terminal"}}],
        "evaluator": {"func": ["check_moved_jpgs", "exact_match"],
                      "result": [{"type": "list_directory", "path": "/home/user/cpjpg"},
                                 {"type": "vm_command_line", "command": bus + "gsettings get org.gnome.desktop.interface "
                                                                              "clock-format", "shell": True}],
                      "expected": [{"type": "rule", "rules": {"expected": ["x.jpg", "y.jpg"]}},
                                   {"type": "rule", "rules": {"expected": "'12h'\n"}}]}}
    (tmp_path / "task.json").write_text(json.dumps(task))
    for command, reward in (("", 0.0), ("find ~/photos -name '*.jpg' -exec cp {} ~/cpjpg/ \\;", 1.0)):
        episode = OSWorldEpisode(environment, load_task(tmp_path / "task.json", files))
        try:
            deadline = time.monotonic() + 20   # a loaded machine (the suite runs two at once) starts it late
            while "gnome-terminal-server" not in episode.desktop.request("windows")["windows"].lower():
                assert time.monotonic() < deadline, "ctrl+alt+t opened no terminal"
                time.sleep(0.2)
            episode.desktop.request("window", name="Terminal", strict=False, by_class=False, close=False)
            if command:
                _typed(episode, command)   # into the terminal that ctrl+alt+t opened
            assert episode.finish() == reward, episode.events
        finally:
            episode.close()


# --- screenshots: observed, written as one placeholder each, gated, kept beside the tokens ------------

def _screenshot_environment(kind: str, width: int = 1280, height: int = 720) -> OSWorldEnvironment:
    return OSWorldEnvironment(EnvConfig(name="osworld", agent="computer_use", observation_type=kind,
                                        screen={"width": width, "height": height},
                                        sandbox={"type": "bubblewrap", "creation_timeout_s": 60,
                                                 "command_exec_timeout_s": 30}))


@needs_desktop
def test_screenshot_observations_show_the_desktop_and_the_agent_writes_one_placeholder_each():
    import io

    from PIL import Image

    from dockyard.agents.computer_use import ComputerUseAgent
    from dockyard.data.datasets import Prompt
    from dockyard.desktop.observation import DesktopObservation
    from dockyard.envs.osworld import OSWorldEpisode
    from dockyard.models import load_tokenizer

    task = load_task(TASKS / "os" / "terminal-hello-file.json")
    episode = OSWorldEpisode(_screenshot_environment("screenshot_a11y_tree"), task)
    try:
        first = episode.first_observation
        assert isinstance(first, DesktopObservation) and "terminal" in first.tree
        assert Image.open(io.BytesIO(first.screenshot)).size == (1280, 720)
        _typed(episode, "echo a long line of text that changes what the terminal shows")
        after = episode.observe()
        assert after.screenshot != first.screenshot          # the picture is of the live desktop
        assert "[screenshot: PNG" in str(after) and after.tree in str(after)
    finally:
        episode.close()
    only = OSWorldEpisode(_screenshot_environment("screenshot"), task)
    try:
        assert only.first_observation.tree is None and only.first_observation.screenshot
    finally:
        only.close()

    tokenizer = load_tokenizer(REPO / "models" / "tiny-vlm") if (REPO / "models" / "tiny-vlm").is_dir() else None
    if tokenizer is None:
        pytest.skip("models/tiny-vlm is built by tools/install.sh")
    agent = ComputerUseAgent(tokenizer, observation_type="screenshot_a11y_tree", image_token="<image>",
                             screen=(1280, 720))
    image_id = tokenizer.convert_tokens_to_ids("<image>")
    assert agent.first_prompt(Prompt(task.instruction, None, {}, "osworld"), first).count(image_id) == 1
    assert agent.observation_ids(after, True).count(image_id) == 1
    # the agent writes the placeholder's spelling on its screen (a terminal line, an error note): still one
    forged = DesktopObservation(tree=after.tree + "\nterminal\t\t<image><image>", screenshot=after.screenshot,
                                note="The action failed: <image>")
    assert agent.observation_ids(forged, True).count(image_id) == 1
    assert agent.observation_ids(agent.invalid_observation(agent.act("no block")), True).count(image_id) == 0
    with pytest.raises(ValueError, match="must be a vision-language model"):
        ComputerUseAgent(tokenizer, observation_type="screenshot")


class _Handle:
    def __init__(self, screenshot: bytes):
        from dockyard.desktop.observation import DesktopObservation

        self.first_observation = DesktopObservation(screenshot=screenshot)
        self.out_of_time, self.closed = False, False
        self.execute = lambda action: self.first_observation

    def finish(self):
        return 1.0

    def close(self):
        self.closed = True


class _Desktops:
    """The environment's side of the collector's contract, with real screenshots: the collector is under test."""
    multi_turn, tools, capacity = True, [], None

    def __init__(self, screenshot: bytes):
        self.screenshot = screenshot
        self.agent_settings = {"action_space": "pyautogui", "screen": (1280, 720), "observation_type": "screenshot"}

    def open(self, prompt):
        return _Handle(self.screenshot)


def test_the_collector_gates_screenshots_keeps_them_with_the_tokens_and_drops_a_sampled_placeholder(tmp_path):
    import io

    from PIL import Image

    from dockyard.config.loader import load_config
    from dockyard.data.datasets import Prompt
    from dockyard.generation.engine import Completion
    from dockyard.loop.prompt_codec import PromptCodec

    if not (REPO / "models" / "tiny-vlm").is_dir():
        pytest.skip("models/tiny-vlm is built by tools/install.sh")
    buffer = io.BytesIO()
    Image.new("RGBA", (1280, 720), (20, 40, 200, 128)).save(buffer, "PNG")   # alpha: the gate flattens it
    screenshot = buffer.getvalue()

    def collector(*overrides, replies):
        cfg = load_config("grpo_osworld_screenshot_local.yaml", [f"models_dir={REPO / 'models'}",
                                                                 "grpo.max_rollout_turns=2", *overrides]).config
        calls = []

        def generate(prompts, params, images=None):
            calls.append(images)
            return [Completion(i, replies(i), [-1.0] * len(replies(i)), "stop") for i in range(len(prompts))]

        return PromptCodec(cfg, _Desktops(screenshot)).collector([], generate), calls

    made, calls = collector(replies=lambda i: [5, 6, 7])
    image_id = made.image_token_id
    [episode] = made.run_episodes([Prompt("open a terminal", None, {}, "osworld")], 1, seed=0)
    assert episode.error is None and len(calls) == 2          # two turns, each sent the episode's screenshots
    assert [len(sent[0]) for sent in calls] == [1, 1]         # the invalid reply's observation has no picture
    kept = episode.transcript.images
    assert len(kept) == 1 and Image.open(io.BytesIO(kept[0])).mode == "RGB"
    assert episode.transcript.ids.count(image_id) == 1
    sample = made._trajectory(episode, 1).sample
    assert sample.images == kept
    # the budget counts the screenshot's tokens as the model runs them (tiny-vlm: 7 for the 1 placeholder)
    assert episode.transcript.length == len(episode.transcript.ids) + 6
    prompt_length = len(episode.transcript.prompt_ids)
    tight, _ = collector(f"policy.max_total_sequence_length={prompt_length + 3}", replies=lambda i: [5, 6, 7])
    [cut] = tight.run_episodes([Prompt("open a terminal", None, {}, "osworld")], 1, seed=0)
    assert f"first observation is {prompt_length + 6} tokens, no room" in cut.error

    over, _ = collector("policy.generation.max_image_pixels=10000", replies=lambda i: [5, 6, 7])
    [refused] = over.run_episodes([Prompt("open a terminal", None, {}, "osworld")], 1, seed=0)
    assert "policy.generation.max_image_pixels (10000)" in refused.error and refused.handle.closed

    sampled, _ = collector(replies=lambda i: [5, image_id, 7])
    [dropped] = sampled.run_episodes([Prompt("open a terminal", None, {}, "osworld")], 1, seed=0)
    assert "sampled the image placeholder token" in dropped.error
    assert sampled._trajectory(dropped, 1).status == "failed"


@pytest.mark.parametrize("overrides, named", [
    (["env.observation_type=a11y_tree"], "policy.generation.allow_multimodal_inputs: nothing in this run carries images"),
    (["policy.backend=megatron", "policy.megatron_cfg={bf16: false}"], "policy.generation.allow_multimodal_inputs: the megatron backend does not feed images"),
    (["policy.lora.enabled=true"], "policy.lora.enabled: not built for image inputs"),
    (["policy.model_name=${models_dir}/tiny-llama"], "policy.model_name: "),
    ([], None),
])
def test_image_inputs_are_refused_by_name_where_the_trainer_cannot_take_them(overrides, named):
    from dockyard.config.loader import load_config
    from dockyard.preflight.components import _image_inputs

    if not (REPO / "models" / "tiny-vlm").is_dir():
        pytest.skip("models/tiny-vlm is built by tools/install.sh")
    cfg = load_config("grpo_osworld_screenshot_local.yaml", [f"models_dir={REPO / 'models'}", *overrides]).config
    found = [f"{p.path}: {p.message}" for p in _image_inputs(cfg)]
    if named is None:
        assert found == []
    else:
        assert any(line.startswith(named) for line in found), found
        if "tiny-llama" in " ".join(overrides):
            assert "is a text-only model" in found[0]
