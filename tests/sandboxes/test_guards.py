"""The sandboxes' guards against a policy that attacks its grader or its trainer (issue: honest rewards),
each in bubblewrap and podman, each failing when its guard is removed: output floods against the
trainer's memory, sized folders, the whole sandbox's memory, the network a task may have, a trainer
killed with SIGKILL, links planted for the trainer's copies, forged end markers, the uid range."""

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from dockyard.config.schema.env import SandboxConfig
from dockyard.sandboxes.base import SandboxError, SandboxLimits, SandboxSpec
from dockyard.sandboxes.bubblewrap import BubblewrapSandbox, bwrap_path
from dockyard.sandboxes.network import missing_tools
from dockyard.sandboxes.podman import PodmanSandbox, podman_path
from dockyard.sandboxes.processes import live_processes, of_user
from dockyard.sandboxes.users import UidLease, uid_range_problem
from dockyard.waiting import wait_until
from tests.conftest import REPO

ROOT = os.geteuid() == 0
BACKENDS = [pytest.param(BubblewrapSandbox, id="bubblewrap", marks=pytest.mark.skipif(
                bwrap_path() is None, reason="bubblewrap is not installed (tools/install.sh)")),
            pytest.param(PodmanSandbox, id="podman", marks=pytest.mark.skipif(
                podman_path() is None, reason="podman is not installed (tools/install.sh)"))]
needs_root = pytest.mark.skipif(not ROOT, reason="sized workspaces, cgroups, user ids and networks need root")
needs_network_tools = pytest.mark.skipif(not ROOT or bool(missing_tools()),
                                         reason=f"user-mode networking needs root and {missing_tools()}")

FLOOD = """
import resource, sys, time
sys.path.insert(0, {repo!r})
from dockyard.sandboxes.base import SandboxLimits, SandboxSpec
from dockyard.sandboxes.bubblewrap import BubblewrapSandbox
from dockyard.sandboxes.podman import PodmanSandbox
Sandbox = {{"bubblewrap": BubblewrapSandbox, "podman": PodmanSandbox}}[sys.argv[1]]
with Sandbox(SandboxSpec(workdir="/app"), SandboxLimits(command_timeout_s=120, output_bytes=4096)) as box:
    shell = box.shell()
    shell.run("true")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.monotonic()
    # 400 MB on one line, no newline: a line reader would hold all of it
    result = shell.run("head -c 400000000 /dev/zero | tr '\\\\0' a; echo; echo done")
    fresh = box.run("head -c 400000000 /dev/zero | tr '\\\\0' b")
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print({{"grown_kb": after - before, "kept": len(result.output), "truncated": result.truncated,
           "ends": result.output[-5:], "fresh_kept": len(fresh.output), "seconds": time.monotonic() - started}})
"""


@pytest.mark.parametrize("kind", [p.id for p in BACKENDS])
def test_an_output_flood_does_not_grow_the_trainers_memory(kind):
    if (kind == "bubblewrap" and bwrap_path() is None) or (kind == "podman" and podman_path() is None):
        pytest.skip(f"{kind} is not installed")
    out = subprocess.run([sys.executable, "-c", FLOOD.format(repo=str(REPO)), kind], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    figures = eval(out.stdout.strip().splitlines()[-1])
    print(figures)
    assert figures["truncated"] and figures["kept"] < 4096 + 200 and figures["ends"].strip().endswith("done")
    assert figures["fresh_kept"] < 4096 + 200
    assert figures["grown_kb"] < 64 * 1024, figures   # the 400 MB went through, never into the trainer


@pytest.mark.parametrize("backend", BACKENDS)
def test_temporary_folders_are_sized_and_the_rest_of_the_root_is_closed(backend):
    limits = SandboxLimits(command_timeout_s=60, tmp_mb=8, shm_mb=4, file_size_mb=64)
    with backend(SandboxSpec(workdir="/app"), limits) as box:
        result = box.run("echo x > /tmp/mine && echo tmp-writable; head -c 20000000 /dev/zero > /tmp/big; "
                         "stat -c %s /tmp/big; head -c 20000000 /dev/zero > /dev/shm/big; stat -c %s /dev/shm/big; "
                         "echo x > /dev/planted")
        lines = result.output.splitlines()
        sizes = [int(line) for line in lines if line.isdigit()]
        assert sizes[0] <= 8 * 1024 * 1024 and sizes[1] <= 4 * 1024 * 1024, result.output
        assert "No space left on device" in result.output and "tmp-writable" in lines, result.output
        if isinstance(box, PodmanSandbox):   # a shared /tmp: everyone may write, nobody may remove another's
            assert box.run("stat -c %a /tmp /var/tmp").output.split() == ["1777", "1777"]
        # bubblewrap: /dev is read-only; podman: /dev belongs to root
        assert "/dev/planted: Read-only file system" in result.output or "/dev/planted: Permission denied" in result.output


@needs_root
@pytest.mark.parametrize("backend", BACKENDS)
def test_the_workspace_is_capped_in_size_and_in_files(backend):
    limits = SandboxLimits(command_timeout_s=60, workspace_mb=16, workspace_inodes=500, file_size_mb=64)
    with backend(SandboxSpec(workdir="/app"), limits) as box:
        written = box.run("head -c 40000000 /dev/zero > big")
        # its own command: podman exec forwards stdout and stderr apart, so head's error could come after
        size = box.run("stat -c %s big; rm big")
        assert "No space left" in written.output and int(size.output.split()[-1]) <= 16 * 1024 * 1024, \
            (written.output, size.output)
        files = box.run("for i in $(seq 1000); do touch f$i 2>/dev/null || { echo stopped at $i; break; }; done")
        assert "stopped at" in files.output and int(files.output.split()[-1]) < 500, files.output


@needs_root
@pytest.mark.parametrize("backend", BACKENDS)
def test_the_whole_sandbox_has_a_memory_cap(backend):
    limits = SandboxLimits(command_timeout_s=60, memory_mb=1024, sandbox_memory_mb=200)
    with backend(SandboxSpec(workdir="/app"), limits) as box:
        if isinstance(box, BubblewrapSandbox) and box.cgroup is None:
            pytest.skip("no writable memory cgroup on this machine")
        # three processes of 120 MB each, every one under the per-process cap, 360 MB together
        hold = "python3 -c 'import time; x = bytearray(120 * 1024 * 1024); x[::4096] = b\"1\" * len(x[::4096]); time.sleep(3); print(\"held\")'"
        result = box.run(f"({hold}) & ({hold}) & ({hold}) & wait; echo end", timeout_s=60)
        assert result.output.splitlines().count("held") < 3 and "Killed" in result.output, result.output


@needs_root
@pytest.mark.parametrize("backend", BACKENDS)
def test_where_the_whole_sandbox_is_capped_address_space_is_not(backend):
    # a JVM reserves 1 GiB of class space at start and uv its threads' stacks: under the old default
    # per-process RLIMIT_AS of 2 GiB `java -version` failed and uvx now and then; memory used is still capped
    limits = SandboxLimits(command_timeout_s=60, sandbox_memory_mb=200)
    with backend(SandboxSpec(workdir="/app"), limits) as box:
        if isinstance(box, BubblewrapSandbox) and box.cgroup is None:
            pytest.skip("no writable memory cgroup on this machine")
        reserve = box.run("python3 -c 'import mmap; m = mmap.mmap(-1, 3 << 30); print(\"reserved\", len(m))'")
        assert reserve.output.split() == ["reserved", str(3 << 30)], reserve.output
        use = box.run("python3 -c 'x = bytearray(400 * 1024 * 1024); x[::4096] = b\"1\" * len(x[::4096]); print(\"used\")'",
                      timeout_s=60)
        assert "used" not in use.output and use.exit_code == 137, use.output   # the cgroup's OOM kill
    assert SandboxLimits().process_memory_mb(sandbox_capped=False) == 2048   # where nothing caps the sandbox
    assert SandboxLimits(memory_mb=512).process_memory_mb(sandbox_capped=True) == 512   # as set


def _outside_host():
    """A host outside this machine: a network namespace behind a veth pair, with a TCP listener."""
    name = f"dytest-out-{secrets.token_hex(3)}"
    host_if, peer_if = f"dyo{secrets.token_hex(2)}", f"dyp{secrets.token_hex(2)}"
    commands = [["ip", "netns", "add", name], ["ip", "link", "add", host_if, "type", "veth", "peer", "name", peer_if],
                ["ip", "link", "set", peer_if, "netns", name], ["ip", "addr", "add", "198.51.100.1/24", "dev", host_if],
                ["ip", "link", "set", host_if, "up"],
                ["ip", "netns", "exec", name, "ip", "addr", "add", "198.51.100.2/24", "dev", peer_if],
                ["ip", "netns", "exec", name, "ip", "link", "set", peer_if, "up"],
                ["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"]]
    for command in commands:
        subprocess.run(command, check=True, capture_output=True, timeout=30)
    server = subprocess.Popen(["ip", "netns", "exec", name, sys.executable, "-c",
                               "import socket\ns = socket.create_server(('198.51.100.2', 8080))\n"
                               "while True:\n    c, _ = s.accept(); c.sendall(b'outside'); c.close()"])
    return name, host_if, server


@needs_network_tools
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_task_that_allows_the_network_gets_out_but_never_reaches_this_machine(backend):
    check_network_reaches_out_but_not_this_machine(
        lambda network: backend(SandboxSpec(workdir="/app", network=network), SandboxLimits(command_timeout_s=60)))


def check_network_reaches_out_but_not_this_machine(open_box) -> None:
    """open_box(network) -> a sandbox (a context manager) with or without a network: the allowed network
    reaches a host elsewhere but none of this machine's listeners, and its rule cannot be changed inside;
    without it nothing is reached (tests/envs/test_root_inside.py runs this on root-inside sandboxes)."""
    outside, host_if, outside_server = _outside_host()
    listeners = [socket.create_server(("127.0.0.1", 0)), socket.create_server(("0.0.0.0", 0))]
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    abstract_name = f"dockyard-test-{secrets.token_hex(4)}"
    abstract.bind("\0" + abstract_name)
    abstract.listen()
    host_ip = json.loads(subprocess.run(["ip", "-j", "-4", "route", "get", "1.1.1.1"], capture_output=True, text=True)
                         .stdout or "[{}]")[0].get("prefsrc", "198.51.100.1")
    probe = ("import socket, sys\nfor host, port in [(a.split(':')[0], int(a.split(':')[1])) for a in sys.argv[1:]]:\n"
             "    try:\n        s = socket.create_connection((host, port), timeout=3); print(host, port, 'OPEN', s.recv(16))\n"
             "    except OSError as e:\n        print(host, port, 'CLOSED', type(e).__name__)\n"
             f"u = socket.socket(socket.AF_UNIX)\ntry:\n    u.connect('\\0{abstract_name}'); print('abstract OPEN')\n"
             "except OSError as e:\n    print('abstract CLOSED', type(e).__name__)\n")
    targets = ["198.51.100.2:8080", f"127.0.0.1:{listeners[0].getsockname()[1]}",
               f"{host_ip}:{listeners[1].getsockname()[1]}", f"198.51.100.1:{listeners[1].getsockname()[1]}",
               f"10.0.2.2:{listeners[0].getsockname()[1]}"]
    try:
        with open_box(True) as box:
            box.copy_in(_write(probe), "/app/probe.py")
            seen = box.run(f"python3 probe.py {' '.join(targets)}").output
            if not box.run("command -v nft").ok:   # an image without nftables: this machine's, libraries and all
                box.copy_in(_host_program("nft"), "/app/hosttools")
            unprivileged = box.run("PATH=$PATH:/app/hosttools LD_LIBRARY_PATH=/app/hosttools nft flush ruleset; "
                                   "nft list ruleset; ip link set lo down").output
        with open_box(False) as closed:
            closed.copy_in(_write(probe), "/app/probe.py")
            offline = closed.run("python3 probe.py 198.51.100.2:8080").output
    finally:
        outside_server.kill()
        subprocess.run(["ip", "netns", "delete", outside], capture_output=True)
        subprocess.run(["ip", "link", "delete", host_if], capture_output=True)
        for listener in listeners:
            listener.close()
        abstract.close()
    lines = seen.splitlines()
    assert "198.51.100.2 8080 OPEN b'outside'" in lines, seen            # outbound: a host elsewhere answers
    for target in targets[1:]:                                           # this machine's listeners do not
        host, port = target.split(":")
        assert any(line.startswith(f"{host} {port} CLOSED") for line in lines), (target, seen)
    assert "abstract CLOSED ConnectionRefusedError" in lines, seen
    assert "Operation not permitted" in unprivileged, unprivileged       # the rule cannot be changed from inside
    assert "198.51.100.2 8080 CLOSED" in offline, offline                # without allow_internet: no network at all


def _host_program(name: str) -> Path:
    """A folder holding this machine's `name` and the shared libraries it links (ldd)."""
    folder = Path(tempfile.mkdtemp(prefix="dockyard-test-tools-"))
    program = shutil.which(name)
    shutil.copy2(program, folder / name)
    for line in subprocess.run(["ldd", program], capture_output=True, text=True, timeout=30).stdout.splitlines():
        parts = line.split("=>")
        library = parts[1].split("(")[0].strip() if len(parts) == 2 else ""
        if library.startswith("/"):
            shutil.copy2(library, folder / os.path.basename(library))
    return folder


def _write(text: str) -> Path:
    path = Path(f"/tmp/dockyard-probe-{secrets.token_hex(4)}.py")
    path.write_text(text)
    return path


TRAINER = """
import json, sys, time
sys.path.insert(0, {repo!r})
from dockyard.sandboxes.base import SandboxLimits, SandboxSpec
from dockyard.sandboxes.bubblewrap import BubblewrapSandbox
from dockyard.sandboxes.podman import PodmanSandbox
made = {{}}
boxes = []
if {podman}:
    box = PodmanSandbox(SandboxSpec(workdir="/app"), SandboxLimits())
    box.shell().run("(setsid sleep 1000 &) ; sleep 1001 &")
    made["container"], made["podman_uid"], made["podman_root"] = box.name, box.uid, str(box.host_root)
    boxes.append(box)
box = BubblewrapSandbox(SandboxSpec(workdir="/app", network={network}), SandboxLimits())
box.shell().run("sleep 1002 &")
made["bubblewrap_root"], made["bubblewrap_uid"] = str(box.host_root), box.uid
made["netns"] = box.network.name if box.network else None
made["cgroup"] = str(box.cgroup.path) if box.cgroup else None
boxes.append(box)
print(json.dumps(made), flush=True)
time.sleep(600)
"""


@needs_root
@pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap is not installed")
def test_a_trainer_killed_with_sigkill_leaves_nothing_the_next_one_does_not_reap():
    from dockyard.sandboxes.reaping import reap_leftovers

    podman, network = podman_path() is not None, not missing_tools()
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER.format(repo=str(REPO), podman=podman, network=network)],
                               stdout=subprocess.PIPE, text=True)
    made = json.loads(trainer.stdout.readline())
    trainer.send_signal(signal.SIGKILL)
    trainer.wait()
    # what the dead trainer left: its container with the agent's processes, folders, a network, a cgroup
    if podman:
        assert subprocess.run(["podman", "container", "exists", made["container"]]).returncode == 0
        assert live_processes(of_user(made["podman_uid"]))
    assert Path(made["bubblewrap_root"]).exists()
    removed = reap_leftovers()
    print(removed)
    if podman:
        assert subprocess.run(["podman", "container", "exists", made["container"]]).returncode == 1
        wait_until(lambda: not live_processes(of_user(made["podman_uid"])), 30, "the container's processes to end")
        assert not Path(made["podman_root"]).exists()
    assert not Path(made["bubblewrap_root"]).exists()
    assert not live_processes(of_user(made["bubblewrap_uid"]))
    if made["netns"]:
        assert not Path("/run/netns", made["netns"]).exists()
        assert not subprocess.run(["pgrep", "-f", made["netns"]], capture_output=True).stdout
    if made["cgroup"]:
        assert not Path(made["cgroup"]).exists()
    assert reap_leftovers() == []   # a live trainer's (this one's) things are never touched


@needs_root
def test_a_user_id_is_handed_out_only_once_its_leftover_processes_are_gone():
    uid = 204_090
    leftover = subprocess.Popen(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "sleep", "300"])
    try:
        wait_until(lambda: live_processes(of_user(uid)), 10, "the stand-in leftover to start")
        lease = UidLease(uid, uid)
        try:
            assert lease.uid == uid and not live_processes(of_user(uid))
        finally:
            lease.release()
    finally:
        leftover.kill()
        leftover.wait()


def test_the_uid_range_is_checked_against_this_machines_users():
    nobody = 65534
    assert "nobody" in uid_range_problem(SandboxConfig(uid_range=(nobody - 50, nobody + 50)))
    assert "holds 8 ids; 64 are needed" in uid_range_problem(SandboxConfig(uid_range=(300_000, 300_007), max_concurrent=32))
    assert "not a range" in uid_range_problem(SandboxConfig(uid_range=(5, 1)))
    assert uid_range_problem(SandboxConfig()) is None
    from dockyard.sandboxes.factory import SandboxFactory

    with pytest.raises(SandboxError, match=r"env.sandbox.uid_range: \[65484, 65584\] overlaps ids this machine uses"):
        SandboxFactory(SandboxConfig(uid_range=(nobody - 50, nobody + 50)))


@needs_root
def test_root_of_a_user_namespace_that_does_not_map_the_range_is_refused_by_name(tmp_path):
    """As in ch-run or rootless podman (one id mapped): no sandbox can give its files to the range, so
    the factory refuses before any task starts (it was chown's EINVAL as a traceback)."""
    probe = ("from dockyard.config.schema.env import SandboxConfig\n"
             "from dockyard.sandboxes.factory import SandboxFactory\n"
             "SandboxFactory(SandboxConfig())\n")
    done = subprocess.run(["unshare", "--user", "--map-root-user", sys.executable, "-c", probe], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "env.sandbox.uid_range: [200000, 204095] is not mapped in this process's user namespace (it maps ids 0-0" \
        in done.stderr, done.stderr
    from dockyard.sandboxes.users import unmapped_ids_problem

    (tmp_path / "uid_map").write_text("         0          0 4294967295\n")   # the host's own map
    assert unmapped_ids_problem(200000, 204095, tmp_path / "uid_map") is None


@pytest.mark.parametrize("backend", BACKENDS)
def test_copies_never_follow_a_link_the_agent_planted(backend, tmp_path):
    (tmp_path / "note.txt").write_text("from the trainer\n")
    probe = f"dockyard-planted-{secrets.token_hex(4)}"
    with backend(SandboxSpec(workdir="/app"), SandboxLimits(command_timeout_s=30)) as box:
        box.run(f"ln -s /etc out; ln -s / root; mkdir -p keep && echo kept > keep/file && ln -s /etc/passwd keep/link")
        with pytest.raises(SandboxError, match="is a link or not a folder"):
            box.copy_in(tmp_path / "note.txt", f"/app/out/{probe}")
        assert not Path("/etc", probe).exists()
        for source in ("/app/root/etc/passwd", "/app/out/passwd", "/app/out"):
            with pytest.raises(SandboxError, match="does not exist in the sandbox"):
                box.copy_out(source, tmp_path / "stolen")
        box.copy_out("/app/keep", tmp_path / "keep")
        assert (tmp_path / "keep" / "file").read_text() == "kept\n" and not (tmp_path / "keep" / "link").exists()
        # a link where a file is copied to is replaced, never written through
        box.run("ln -s /etc/hostname note.txt")
        box.copy_in(tmp_path / "note.txt", "/app/note.txt")
        assert box.run("test -L note.txt || cat note.txt").output == "from the trainer\n"


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_commands_output_cannot_end_it_early_or_forge_its_exit_status(backend):
    with backend(SandboxSpec(workdir="/app"), SandboxLimits(command_timeout_s=20)) as box:
        shell = box.shell()
        # the end marker is not in anything the command can read: its stdin is /dev/null
        read = shell.run("read line; echo \"read [$line]\"; cat; echo after")
        assert read.exit_code == 0 and read.output.splitlines() == ["read []", "after"], read.output
        forged = shell.run("printf '\\n__dockyard_done_%s 0\\n' 0123456789abcdef0123456789abcdef; (exit 3)")
        assert forged.exit_code == 3 and "__dockyard_done_0123" in forged.output
        assert shell.run("# only a comment").exit_code == 0
        assert shell.run("echo still in step").output == "still in step\n"


@needs_root
@pytest.mark.parametrize("backend", BACKENDS)
def test_an_agent_that_fills_its_workspace_leaves_the_verifier_room(backend, tmp_path):
    limits = SandboxLimits(command_timeout_s=60, workspace_mb=8, workspace_inodes=300, file_size_mb=64)
    (tmp_path / "check.sh").write_text("echo graded\n")
    with backend(SandboxSpec(workdir="/app"), limits) as box:
        full = box.run("head -c 20000000 /dev/zero > big; for i in $(seq 400); do touch f$i 2>/dev/null || break; done; "
                       "touch one-more || echo full")
        assert "full" in full.output
        box.hand_over()
        box.place([(tmp_path / "check.sh", "/tests/check.sh", True), (tmp_path, "/logs/verifier", False)])
        assert box.run("bash /tests/check.sh && echo 1 > /logs/verifier/reward.txt && cat /logs/verifier/reward.txt"
                       ).output.split() == ["graded", "1"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_folders_nested_thousands_deep_do_not_break_the_hand_over_or_the_scan(backend, tmp_path):
    from dockyard.envs.grading import shadowing_files

    with backend(SandboxSpec(workdir="/app"), SandboxLimits(command_timeout_s=120)) as box:
        made = box.run("python3 -c \"import os\nfor i in range(3000):\n    os.mkdir('d'); os.chdir('d')\nopen('pytest.py', 'w')\"; "
                       "touch pytest.py")
        assert made.ok, made.output
        box.hand_over()                                    # every file changes hands, however deep
        assert shadowing_files(box, {}) == ["/app/pytest.py"]   # the scan stops at its depth, without an error
        with pytest.raises(SandboxError, match="nested more than"):
            box.copy_out("/app/d", tmp_path / "deep")
