"""Root inside the sandbox (env.sandbox.agent_user, sandboxes/user_namespaces.py): the agent and the
task's solution are uid 0 in a user namespace of their own, on the task's built image, as in a
Terminal-Bench or Harbor container; the tests still run on the image's own tools.

tests/envs/root_attacks/ holds one Harbor task whose honest solution needs root (it installs a command
in /usr/local/bin and writes /etc) and, in attacks/, solutions that use root against the grader instead:
each replaces, shadows or hooks into the tests' own tools (python3, the standard library, pytest, the
loader). Every attack must score 0 and be named in the notes, in bubblewrap and podman; the honest
solution scores 1. With the verifier's restoring switched off (tried by hand, docs/agents.md) every
attack scored 1."""

import shutil
import time
from dataclasses import replace
from pathlib import Path

import pytest

from dockyard.config.schema.env import SandboxConfig
from dockyard.envs.terminal_tasks import load_task
from dockyard.envs.terminal_trial import oracle_agent, run_trial, sandbox_spec
from dockyard.sandboxes.base import SandboxError
from dockyard.sandboxes.factory import SandboxFactory
from dockyard.sandboxes.processes import live_processes, of_uid_range
from dockyard.sandboxes.user_namespaces import BLOCK
from dockyard.waiting import wait_until
from tests.envs.conftest import BASE
from tests.envs.test_task_images import needs_builder
from tests.sandboxes.test_guards import check_network_reaches_out_but_not_this_machine, needs_network_tools

ROOT_TASK = Path(__file__).parent / "root_attacks" / "task"
ATTACKS = Path(__file__).parent / "root_attacks" / "attacks"
KINDS = ["bubblewrap", "podman"]
# what each attack's verdict must name (restored: the image's version is back; left out: an addition)
NAMED = {"python-replaced": "restored for the tests (the agent changed or removed the tests' tools): /usr/bin/python3",
         "python-on-path": "left out for the tests: /usr/local/bin/python3",
         "stdlib-patched": "restored for the tests (the agent changed or removed the tests' tools): /usr/lib/python3.11/argparse.py",
         "etc-sitecustomize": "/etc/python3.11/sitecustomize.py",
         "pth-added": "left out for the tests: /usr/local/lib/python3.11/dist-packages/zz-grade.pth",
         "entry-point-plugin": "passall-1.0.dist-info/entry_points.txt, which the agent added (registers a pytest plugin)",
         "pytest-patched": "/usr/lib/python3/dist-packages/pytest/__init__.py",
         "ld-preload": "left out for the tests: /etc/ld.so.preload"}


def factory(kind: str, cache: Path, **settings) -> SandboxFactory:
    return SandboxFactory(SandboxConfig(type=kind, task_images="build", default_base_image=BASE, image_cache=str(cache),
                                        command_exec_timeout_s=120, max_concurrent=2, **settings))


def with_solution(script: Path, where: Path) -> Path:
    task = where / script.stem
    where.mkdir(exist_ok=True)
    shutil.copytree(ROOT_TASK, task)
    shutil.copy2(script, task / "solution" / "solve.sh")
    return task


@needs_builder
@pytest.mark.parametrize("kind", KINDS)
def test_root_attacks_on_the_tests_tools_score_zero_and_the_honest_root_solution_one(kind, base_image, open_folder):
    sandboxes = factory(kind, open_folder / "cache")
    honest = load_task(ROOT_TASK)
    image = sandboxes.task_image(honest.name, honest.dockerfile, honest.build_context)
    result = run_trial(honest, sandboxes.create, oracle_agent, image=image)
    assert result.error is None and result.reward == 1.0, (result.notes, result.agent_output, result.test_output)
    assert result.suspicious == [] and not any("restored" in n or "left out" in n for n in result.notes), result.notes
    for script in sorted(ATTACKS.glob("*.sh")):
        task = load_task(with_solution(script, open_folder / kind))
        attack = run_trial(task, sandboxes.create, oracle_agent, image=image)
        assert attack.error is None and attack.reward == 0.0, (script.stem, attack.notes, attack.test_output[-2000:])
        assert any(NAMED[script.stem] in note for note in attack.notes), (script.stem, attack.notes)
        assert attack.tests_ran in ("pytest", "reward file"), (script.stem, attack.tests_ran)


@needs_builder
def test_a_podman_init_slow_to_start_its_child_still_keeps_the_container_between_commands(base_image, open_folder,
                                                                                         monkeypatch, tmp_path):
    """The container lives while its init's `sleep infinity` does; each command's leftovers end with it. An
    init that had not started that child when the sandbox looked (a loaded machine) got it ended as the
    agent's after the first command, and the next one met "container state improper" (seen in CI)."""
    import dockyard.sandboxes.podman as podman_module

    slow_init = tmp_path / "slow-init"
    # a delay with no process of its own (an external `sleep` would be the child the sandbox sees)
    slow_init.write_text('#!/bin/sh\n[ "$1" = -- ] && shift\ni=0\nwhile [ $(( i += 1 )) -lt 300000 ]; do :; done\n'
                         '"$@" &\nwait\n')
    slow_init.chmod(0o755)
    which = shutil.which
    monkeypatch.setattr(podman_module.shutil, "which", lambda name, *a, **k: str(slow_init) if name == "catatonit"
                        else which(name, *a, **k))
    sandboxes = factory("podman", open_folder / "cache")
    task = load_task(ROOT_TASK)
    sandbox = sandboxes.create(sandbox_spec(task, sandboxes.task_image(task.name, task.dockerfile, task.build_context)))
    try:
        assert sandbox.run("echo one").output.strip() == "one"
        wait_until(lambda: "sleep infinity" in sandbox.run("ps -eo args").output, 30, "the init's child to start")
        time.sleep(0.5)
        assert sandbox.run("echo two").output.strip() == "two"
        assert sandbox.run("echo three").output.strip() == "three"
    finally:
        sandbox.destroy()


@needs_builder
@pytest.mark.parametrize("kind", KINDS)
def test_root_inside_is_a_container_root_over_its_own_block_of_ids(kind, base_image, open_folder):
    sandboxes = factory(kind, open_folder / "cache")
    task = load_task(ROOT_TASK)
    sandbox = sandboxes.create(sandbox_spec(task, sandboxes.task_image(task.name, task.dockerfile, task.build_context)))
    try:
        shown = sandbox.run("id -u; whoami; echo x > /etc/made-by-root && echo wrote-etc; mkdir /srv/new && echo mkdir; "
                            "su -s /bin/sh nobody -c 'id -u'; setpriv --reuid=42 --regid=42 --clear-groups id -u; "
                            "mount -t tmpfs none /mnt 2>/dev/null && echo mounted || echo no-mount; grep CapEff /proc/self/status")
        lines = shown.output.split("\n")
        assert lines[:7] == ["0", "root", "wrote-etc", "mkdir", "65534", "42", "no-mount"], shown.output
        assert int(lines[7].split()[1], 16) & (1 << 21) == 0   # a container root's capabilities: no CAP_SYS_ADMIN
        outside = sandbox.lease.uid
        assert (outside - 1_000_000_000) % BLOCK == 0   # a block of the default root_uid_range
        shell = sandbox.shell()
        shell.run("sleep 300 &")
        assert live_processes(of_uid_range(outside, outside + BLOCK - 1))   # root inside is the block outside
        sandbox.hand_over()
        # nothing of the agent's is left (podman: the container's own init and main process remain)
        left = set(live_processes(of_uid_range(outside, outside + BLOCK - 1)))
        assert left == (set(sandbox.container_pids) if kind == "podman" else set()), left
        changes = {c.path: c.kind for c in sandbox.system_changes().changes}
        assert changes.get("/etc/made-by-root") == "added" and changes.get("/srv/new") == "added", changes
        assert not any(p.startswith(("/tests", "/logs", "/verifier")) for p in changes), changes   # the sandbox's own mounts
    finally:
        sandbox.destroy()


@needs_builder
def test_agent_user_sandbox_keeps_the_unprivileged_user_and_root_needs_a_built_image(base_image, open_folder):
    sandboxes = factory("bubblewrap", open_folder / "cache", agent_user="sandbox")
    task = load_task(ROOT_TASK)
    result = run_trial(task, sandboxes.create, oracle_agent,
                       image=sandboxes.task_image(task.name, task.dockerfile, task.build_context))
    assert result.reward == 0.0 and "Read-only file system" in result.agent_output, result.agent_output
    with pytest.raises(SandboxError, match="env.sandbox.agent_user: root needs task_images: build"):
        SandboxFactory(SandboxConfig(type="bubblewrap", agent_user="root"))
    with pytest.raises(SandboxError, match=r"env.sandbox.root_uid_range: \[200000, 204095\] must hold at least one block"):
        factory("bubblewrap", open_folder / "cache", agent_user="root", root_uid_range=(200_000, 204_095))


@needs_builder
@needs_network_tools
@pytest.mark.parametrize("kind", KINDS)
def test_root_inside_with_the_network_reaches_out_but_never_this_machine_nor_its_rule(kind, base_image, open_folder):
    sandboxes = factory(kind, open_folder / "cache")
    task = load_task(ROOT_TASK)
    spec = sandbox_spec(task, sandboxes.task_image(task.name, task.dockerfile, task.build_context))
    check_network_reaches_out_but_not_this_machine(lambda network: sandboxes.create(replace(spec, network=network)))
