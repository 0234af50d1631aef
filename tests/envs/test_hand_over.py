"""Which files in the agent's folders the verifier made after the hand-over (dockyard/envs/hand_over.py):
the rules on real folders, each with the case that must stay the agent's."""

import os
import shutil
from pathlib import Path
from types import SimpleNamespace

from dockyard.envs import hand_over

SITE = ".tbench-testing/lib/python3.11/site-packages"


def _sandbox(workspace: Path):
    # hand_over.take reads only where the sandbox keeps the agent's folders on this machine
    return SimpleNamespace(writable_host_folders=lambda: {"/app": workspace}, workdir="/app",
                           spec=SimpleNamespace(rootfs=None))


def _write(path: Path, text: str = "x\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _install(site: Path, name: str, files: list[str], direct_url: str | None = None) -> None:
    """A distribution as an installer leaves it: its files, and a dist-info whose RECORD lists them."""
    for file in files:
        _write(site / file)
    info = site / f"{name}-1.0.dist-info"
    _write(info / "RECORD", "".join(f"{f},sha256=x,2\n" for f in files) + f"{info.name}/RECORD,,\n")
    if direct_url is not None:
        _write(info / "direct_url.json", direct_url)


def test_a_harness_environment_made_after_the_hand_over_is_the_verifiers(tmp_path):
    _write(tmp_path / "solution.py")
    left = hand_over.take(_sandbox(tmp_path), lambda path: False)
    assert left.distrust is None
    _install(tmp_path / SITE, "pytest", ["_pytest/main.py", "pytest/__init__.py"])
    assert left.made_by_verifier(f"/app/{SITE}/_pytest/main.py")
    assert not left.made_by_verifier("/app/solution.py")            # there at the hand-over
    assert not left.made_by_verifier(f"/tmp/{SITE}/_pytest/main.py")   # not one of the folders taken


def test_files_the_verifier_made_among_what_the_agent_left_stay_the_agents(tmp_path):
    agent_site = tmp_path / SITE
    _write(agent_site / "evil.pth", "import os\n")   # uv 0.9 keeps this when it reuses the folder
    _write(tmp_path / "pkg" / "old.py")
    left = hand_over.take(_sandbox(tmp_path), lambda path: False)
    _install(agent_site, "pytest", ["_pytest/main.py"])
    assert not left.made_by_verifier(f"/app/{SITE}/_pytest/main.py")   # its environment is the agent's
    _write(tmp_path / "pkg" / "new.py")
    assert not left.made_by_verifier("/app/pkg/new.py")   # beside the agent's files


def test_an_old_file_moved_below_a_new_folder_or_a_path_through_a_link_is_the_agents(tmp_path):
    _write(tmp_path / "plugin.py")
    (tmp_path / "real").mkdir()
    left = hand_over.take(_sandbox(tmp_path), lambda path: False)
    (tmp_path / "made").mkdir()
    os.rename(tmp_path / "plugin.py", tmp_path / "made" / "plugin.py")
    assert not left.made_by_verifier("/app/made/plugin.py")
    (tmp_path / "made" / "sub").mkdir()
    _write(tmp_path / "made" / "sub" / "fresh.py")
    assert left.made_by_verifier("/app/made/sub/fresh.py")
    os.symlink(tmp_path / "made", tmp_path / "via")   # a link made later, to a folder made later
    assert not left.made_by_verifier("/app/via/sub/fresh.py")


def test_a_distribution_installed_from_a_path_is_the_agents_code_under_a_new_name(tmp_path):
    left = hand_over.take(_sandbox(tmp_path), lambda path: False)
    site = tmp_path / SITE
    _install(site, "pytest", ["_pytest/main.py"])
    _install(site, "myplug", ["myplug/__init__.py"], direct_url='{"url": "file:///app/pkg", "dir_info": {}}')
    _write(site / "unlisted.py")
    assert left.made_by_verifier(f"/app/{SITE}/_pytest/main.py")
    assert not left.made_by_verifier(f"/app/{SITE}/myplug/__init__.py")   # uv pip install /app/pkg
    assert not left.made_by_verifier(f"/app/{SITE}/unlisted.py")          # no installer says where it came from


def test_what_would_steer_uv_is_named_unless_the_task_placed_it(tmp_path):
    _write(tmp_path / ".python-version", "/app/fake/python3\n")
    _write(tmp_path / "pyproject.toml", "[project]\nname = 'work'\n")
    left = hand_over.take(_sandbox(tmp_path), lambda path: False)
    assert left.interpreter_pin == "/app/.python-version" and left.project == "/app/pyproject.toml"
    _install(tmp_path / SITE, "pytest", ["_pytest/main.py"])
    assert left.made_by_verifier(f"/app/{SITE}/_pytest/main.py")   # both are turned off for the tests instead
    # the task's own, as the task placed them, are the task's choice
    left = hand_over.take(_sandbox(tmp_path), lambda path: path in ("/app/.python-version", "/app/pyproject.toml"))
    assert left.interpreter_pin is None and left.project is None
    # with root inside, one the agent wrote above the working folder counts too
    (tmp_path / "pyproject.toml").unlink()
    left = hand_over.take(_sandbox(tmp_path), lambda path: False, wrote=lambda path: path == "/pyproject.toml")
    assert left.project == "/pyproject.toml"


def test_a_walk_cut_short_means_nothing_made_later_is_trusted(tmp_path):
    tmp_path.joinpath(*["d"] * (hand_over.MAX_DEPTH + 2)).mkdir(parents=True)
    left = hand_over.take(_sandbox(tmp_path), lambda path: False)
    _install(tmp_path / SITE, "pytest", ["_pytest/main.py"])
    assert "could not be read whole" in left.distrust
    assert not left.made_by_verifier(f"/app/{SITE}/_pytest/main.py")


def test_start_up_hooks_the_agent_left_are_found_and_made_unreadable(tmp_path):
    site = tmp_path / ".venv" / "lib" / "python3.11" / "site-packages"
    _write(site / "zz_forge.pth", "import os; os.system('true')\n")
    _write(site / "paths.pth", "/app/src\n")                    # only adds a folder to sys.path
    _write(tmp_path / "lib" / "sitecustomize.py", "import os\n")
    _write(tmp_path / "notes" / "evil.pth", "import os\n")      # not in a site folder: Python never reads it
    left = hand_over.take(_sandbox(tmp_path), lambda path: False)
    assert left.start_hooks == ("/app/.venv/lib/python3.11/site-packages/zz_forge.pth", "/app/lib/sitecustomize.py")
    assert hand_over.disable_start_hooks(left) == list(left.start_hooks)
    info = (site / "zz_forge.pth").stat()
    assert (info.st_uid, info.st_mode & 0o7777) == (0, 0) and (site / "paths.pth").stat().st_mode & 0o444


def test_a_project_environment_is_the_agents_unless_it_is_the_images_as_built(tmp_path):
    workspace, image = tmp_path / "workspace", tmp_path / "image"
    _write(workspace / ".venv" / "pyvenv.cfg", "home = /usr/bin\n")
    sandbox = SimpleNamespace(writable_host_folders=lambda: {"/app": workspace}, workdir="/app",
                              spec=SimpleNamespace(rootfs=str(image)))
    assert hand_over.take(sandbox, lambda path: False).environment == "/app/.venv"   # the image has none
    _write(image / "app" / ".venv" / "pyvenv.cfg", "home = /usr/bin\n")
    assert hand_over.take(sandbox, lambda path: False).environment is None          # the image's, as built
    _write(workspace / ".venv" / "lib" / "x.pth", "import os\n")
    assert hand_over.take(sandbox, lambda path: False).environment == "/app/.venv"   # changed
