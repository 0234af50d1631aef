"""The sandbox interface every environment uses: a workspace where an agent's commands run.

A Sandbox is one workspace with a life: create (its files placed, its working directory set),
run commands with a timeout (each a fresh process, like `docker exec`), open a persistent shell
session (state such as the current directory and variables survives between commands, as in the
terminal an agent drives), copy files in and out, destroy. Backends differ in how a command is
wrapped (`wrap`), and in what they set up and tear down; timeouts, output caps, process-tree kills
and the shell protocol live here once.

Every command runs with a clean environment (only PATH, HOME, LANG, TERM and the task's own ENV
lines), and its output is capped (`SandboxLimits.output_bytes`): a command that prints forever is
read to the end of its time and kept to its first and last bytes.
"""

from __future__ import annotations

import abc
import os
import secrets
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from dockyard.errors import ComponentError

PROXY_KEYS = {"http_proxy", "https_proxy", "no_proxy", "all_proxy"}
HOST_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
CA_KEYS = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "PIP_CERT")   # python's ssl and uv, requests, pip
BASE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8",
            "TERM": "dumb"}


class SandboxError(ComponentError, RuntimeError):
    """A sandbox could not be created, used or destroyed; the message names it."""


PROCESS_MEMORY_MB = 2048   # each process's address space, where no cgroup caps the sandbox


@dataclass(frozen=True)
class SandboxLimits:
    """Caps on what one sandbox may use. memory_mb and file_size_mb apply per process (RLIMIT_AS,
    RLIMIT_FSIZE; memory_mb unset: see process_memory_mb), max_processes to the sandbox's own user
    (RLIMIT_NPROC), cpu_time_s per process.
    sandbox_memory_mb caps the whole sandbox where a cgroup can be made (root; podman: the container),
    workspace_mb / workspace_inodes its writable folders together (a sized tmpfs, as root), tmp_mb and
    shm_mb its /tmp (and /var/tmp) and /dev/shm."""

    command_timeout_s: float = 600.0
    memory_mb: int | None = None
    max_processes: int = 256
    file_size_mb: int = 1024
    cpu_time_s: int = 600
    open_files: int = 1024
    output_bytes: int = 64 * 1024
    sandbox_memory_mb: int = 4096
    workspace_mb: int = 2048
    workspace_inodes: int = 200_000
    tmp_mb: int = 512
    shm_mb: int = 64

    def process_memory_mb(self, sandbox_capped: bool) -> int | None:
        """Each process's address-space cap: memory_mb where set; unset, none where a cgroup caps the
        whole sandbox's memory (`sandbox_capped`) and 2048 MB where nothing else does. Address space is
        not memory: a JVM reserves 1 GiB of class space at start and uv's threads their stacks, so under
        2 GiB `java -version` failed and `uvx` failed now and then ("failed to initialize global rayon
        pool": a published task's test harness, under load)."""
        if self.memory_mb is not None:
            return self.memory_mb
        return None if sandbox_capped else PROCESS_MEMORY_MB

    def prlimit(self, sandbox_capped: bool) -> list[str]:
        """`prlimit` options setting these caps on the process it runs (and its children)."""
        mb = 1024 * 1024
        memory = self.process_memory_mb(sandbox_capped)
        return [*([f"--as={memory * mb}"] if memory else []), f"--nproc={self.max_processes}",
                f"--fsize={self.file_size_mb * mb}", f"--cpu={self.cpu_time_s}", f"--nofile={self.open_files}"]


@dataclass
class CommandResult:
    exit_code: int | None          # None when the command was killed at its timeout
    output: str                    # stdout and stderr interleaved, capped
    seconds: float
    timed_out: bool = False
    truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


@dataclass
class SandboxSpec:
    """What a task asks of its sandbox: files to place in the working directory, the directory the
    shell starts in, environment variables (a Dockerfile's WORKDIR, COPY and ENV lines)."""

    workdir: str = "/app"
    files: list[tuple[Path, str]] = field(default_factory=list)   # (host path, path inside) copied at creation
    env: dict[str, str] = field(default_factory=dict)
    name: str = "sandbox"
    run: list[str] = field(default_factory=list)   # Dockerfile RUN lines: run at creation where a backend builds images
    network: bool = False   # only a task that says so (Harbor's allow_internet) gets the host's network
    verifier_network: bool = False   # the tests get the network (env.verifier_allow_internet), the agent not unless `network`
    image: str | None = None     # a built task image (images.py): podman runs it
    rootfs: Path | None = None   # the same image as a root folder: bubblewrap runs on it
    services: list["ServiceSpec"] = field(default_factory=list)   # compose services beside it (podman only)


@dataclass
class ServiceSpec:
    """A docker-compose service beside the task's container: its built image, run with its own files in a
    container of its own that shares the sandbox's network (reachable as `name`), for the whole trial."""

    name: str
    image: str
    env: dict[str, str] = field(default_factory=dict)
    command: list[str] = field(default_factory=list)   # over the image's CMD
    workdir: str | None = None
    health: "HealthCheck | None" = None   # compose's healthcheck: the agent starts once it passes


@dataclass(frozen=True)
class HealthCheck:
    argv: list[str]          # run inside the service's container
    interval_s: float = 30.0
    timeout_s: float = 30.0
    retries: int = 3
    start_period_s: float = 0.0

    @property
    def deadline_s(self) -> float:
        """How long compose would keep trying before calling the service unhealthy."""
        return self.start_period_s + self.retries * (self.interval_s + self.timeout_s)


def copy_host_path(source: Path, target: Path) -> None:
    """A host file or folder copied to host path `target`, links kept as links."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if source.is_dir():
        shutil.copytree(source, target, dirs_exist_ok=True, symlinks=True)
    else:
        shutil.copy2(source, target)


def make_read_only(path: Path, write_bits: int) -> None:
    """Clear `write_bits` on a file or a whole folder; everyone may read (and enter folders)."""
    for each in [path, *(path.rglob("*") if path.is_dir() else [])]:
        if not each.is_symlink():
            each.chmod(each.stat().st_mode & ~write_bits | 0o444 | (0o111 if each.is_dir() else 0))


class OutputCapture:
    """A command's output as it streams in, kept to its first and last `cap // 2` bytes: what is held
    does not grow with what the command prints."""

    def __init__(self, cap: int):
        self.half = max(cap // 2, 1)
        self.head, self.tail, self.total = bytearray(), bytearray(), 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self.half - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data[-self.half:]
            del self.tail[:-self.half]

    def kept(self) -> bytes:
        return bytes(self.head + self.tail)

    def text(self) -> tuple[str, bool]:
        left_out = self.total - len(self.head) - len(self.tail)
        middle = f"\n[... {left_out} bytes of output left out ...]\n" if left_out else ""
        return self.head.decode(errors="replace") + middle + self.tail.decode(errors="replace"), left_out > 0


def _read_chunks(stream, sink) -> None:
    """Feed a pipe to `sink` in chunks of at most 64 KiB until it ends (a line without a newline is
    never read whole)."""
    read = stream.read1 if hasattr(stream, "read1") else stream.read
    while chunk := read(65536):
        sink(chunk)


def kill_tree(process: subprocess.Popen) -> None:
    """SIGKILL the process's whole group (it was started as a session leader)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        process.kill()
    except ProcessLookupError:
        pass


class Sandbox(abc.ABC):
    """A workspace with a life, used first by the agent, then by the verifier (`hand_over`)."""

    kind: str = "sandbox"
    builds_images = False   # whether a task's RUN lines take effect (else they are reported as skipped)
    network_at_hand_over = False   # whether the verifier can be given a network the agent did not have
    runs_services = False   # whether docker-compose services beside the task's container can run (podman)

    def __init__(self, spec: SandboxSpec, limits: SandboxLimits):
        if spec.services and not self.runs_services:
            raise SandboxError(f"{spec.name}: its docker-compose services beside the main one "
                               f"({', '.join(s.name for s in spec.services)}) run only in podman sandboxes, each in a "
                               f"container of its own; a {self.kind} sandbox is one set of processes "
                               "(env.sandbox.type: podman)")
        self.spec, self.limits = spec, limits
        self.workdir = spec.workdir
        self._shells: list[ShellSession] = []
        self.destroyed = False
        self.role = "agent"

    # --- what a backend provides ------------------------------------------------------------

    @abc.abstractmethod
    def wrap(self, argv: list[str], env: dict[str, str], cwd: str | None = None) -> list[str]:
        """The host command line that runs argv inside the sandbox, in cwd (default: the workdir)."""

    @abc.abstractmethod
    def copy_in(self, source: Path, target: str, read_only: bool = False) -> None:
        """Copy a host file or folder to `target` (absolute, inside). Visible to commands started after.
        read_only: the sandbox's commands can read but not change or add to it (a task's tests)."""

    @abc.abstractmethod
    def copy_out(self, source: str, target: Path, links: bool = False) -> None:
        """Copy `source` (absolute, inside) to a host path; links are not followed (a link there, or
        on the way, is refused; one inside a copied folder is left out, or made as a link with
        `links`, for a copy that only goes into another sandbox)."""

    def end_processes(self) -> None:
        """Every process the sandbox's commands started is gone, for certain (killed and waited for);
        SandboxError naming the sandbox if some cannot be ended."""

    def _become_verifier(self) -> None:
        """After the agent's processes are gone: the workspace changes hands to the verifier's user."""

    def agent_writable(self) -> list[str]:
        """Folders inside where the agent could write (the workspace, temporary folders): nothing of
        them may come first on the tests' PATH or sys.path."""
        return [self.workdir, "/tmp", "/var/tmp", "/dev/shm"]

    def writable_host_folders(self) -> dict[str, Path]:
        """inside folder -> host folder, for the agent-writable folders a backend keeps on the host
        (the grader walks them there instead of running a command inside)."""
        return {}

    def system_changes(self):
        """With root inside (user_namespaces.py): what the agent changed, added or removed in the image's
        root (a SystemChanges); None where the agent could write only its folders."""
        return None

    def revert_system(self, paths: list[str]) -> None:
        """With root inside, after hand_over: these paths get their image state back for the tests."""

    def _teardown(self) -> None:
        pass

    def _spawn(self, argv: list[str], env: dict[str, str], cwd: str | None, stdin) -> subprocess.Popen:
        """Start argv inside (a backend that follows its processes by their namespace overrides this)."""
        return subprocess.Popen(self.wrap(argv, env, cwd), stdin=stdin, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True, env=self._host_env())

    def _finished(self, process: subprocess.Popen, killed: bool, shell: bool) -> None:
        """After a command's or a shell's host process ended (killed: at its timeout or on close). A
        backend whose commands can leave processes behind ends them here."""

    def live_shells(self) -> bool:
        return any(s.process is not None and s.process.poll() is None for s in self._shells)

    # --- shared behaviour -------------------------------------------------------------------

    def environment(self) -> dict[str, str]:
        return {**BASE_ENV, "HOME": self.workdir, **self.spec.env, **self.network_env()}

    def network_env(self) -> dict[str, str]:
        """For commands that have a network: this machine's proxy settings, and its CA bundle where a
        backend binds it over the image's (the connections leave as this machine's own)."""
        network = getattr(self, "network", None)
        if network is None or getattr(network, "offline", False):
            return {}
        env = {key: value for key, value in os.environ.items() if key.lower() in PROXY_KEYS}
        if self.host_ca_bound():
            env.update({key: HOST_CA_BUNDLE for key in CA_KEYS})
        return env

    def host_ca_bound(self) -> bool:
        return False

    def run(self, command: str, timeout_s: float | None = None, cwd: str | None = None,
            env: dict[str, str] | None = None, replace_env: bool = False) -> CommandResult:
        """`bash -c command` as a fresh process in the sandbox; killed with its whole tree at the timeout.
        env adds to the sandbox's environment, or is the whole of it with replace_env."""
        self._check_alive()
        timeout = self.limits.command_timeout_s if timeout_s is None else timeout_s
        started = time.monotonic()
        process = self._spawn(["bash", "-c", command], dict(env or {}) if replace_env else
                              {**self.environment(), **(env or {})}, cwd, subprocess.DEVNULL)
        capture = OutputCapture(self.limits.output_bytes)
        reader = threading.Thread(target=_read_chunks, args=(process.stdout, capture.add), daemon=True)
        reader.start()
        timed_out = False
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            kill_tree(process)
            process.wait()
        reader.join(timeout=10)
        self._finished(process, timed_out, shell=False)
        output, truncated = capture.text()
        return CommandResult(None if timed_out else process.returncode, output, time.monotonic() - started,
                             timed_out, truncated)

    def shell(self) -> "ShellSession":
        """A persistent bash in the sandbox (the agent's terminal)."""
        self._check_alive()
        if self.role != "agent":
            raise SandboxError(f"{self.spec.name}: the agent's time is over; no shell is opened for the verifier")
        session = ShellSession(self)
        self._shells.append(session)
        return session

    def close_shells(self) -> None:
        for session in self._shells:
            session.close()

    def hand_over(self) -> None:
        """From the agent to the verifier: the agent's shells are closed and every process it started is
        gone for certain; from now on commands run as the verifier (a user the agent was not, where
        the backend has one) and no shell is opened."""
        self._check_alive()
        if self.role == "verifier":
            return
        self.close_shells()
        self.end_processes()
        self._become_verifier()
        self.role = "verifier"

    def open_to_verifier(self, folder: str) -> None:
        """After hand_over: a top-level folder placed read-only for the verifier (the task's /tests)
        becomes the verifier's to write, as published test scripts expect (`uv venv` in /tests, a score
        file beside the tests). It stays out of agent_writable(): the agent never had it."""
        if self.role != "verifier":
            raise SandboxError(f"{self.spec.name}: {folder} can be opened to the verifier only after hand_over")
        self._open_to_verifier(folder)

    def _open_to_verifier(self, folder: str) -> None:
        """Where the verifier is the files' owner anyway (type none), nothing to do."""

    def place(self, entries: list[tuple[Path, str, bool]]) -> None:
        """Several copy_in(source, target, read_only) at once (a backend where each copy is a round trip
        batches them)."""
        for source, target, read_only in entries:
            self.copy_in(source, target, read_only=read_only)

    def destroy(self) -> None:
        if self.destroyed:
            return
        self.close_shells()
        try:
            self.end_processes()
        finally:
            self._teardown()
            self.destroyed = True

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc) -> None:
        self.destroy()

    def _check_alive(self) -> None:
        if self.destroyed:
            raise SandboxError(f"{self.spec.name}: the sandbox was destroyed")

    def _host_env(self) -> dict[str, str]:
        """The environment of the wrapper process on the host: nothing of the trainer's."""
        return {"PATH": BASE_ENV["PATH"], "LANG": "C.UTF-8"}


class _ShellOutput:
    """The reading end of a shell session: a command's output up to its end marker, in bounded memory.
    The marker line is `\n<marker> <status>\n`; until it comes only its possible start is held back.
    Output that comes between commands (a background job's) is kept, capped, for the next one."""

    def __init__(self, cap: int):
        self.cap = cap
        self.changed = threading.Condition()
        self.capture = OutputCapture(cap)     # the running command's, or between commands
        self.mark: bytes | None = None
        self.window = b""
        self.status: int | None = None
        self.finished: OutputCapture | None = None   # the command's output once its marker came
        self.ended = False

    def expect(self, marker: str) -> None:
        with self.changed:
            carried = self.capture.kept()
            self.capture = OutputCapture(self.cap)
            self.capture.add(carried)
            self.mark, self.window, self.status, self.finished = f"\n{marker} ".encode(), b"", None, None

    def feed(self, chunk: bytes) -> None:
        with self.changed:
            if self.mark is None:
                self.capture.add(chunk)
                return
            data = self.window + chunk
            at = data.find(self.mark)
            if at < 0:
                keep = len(self.mark) - 1
                self.capture.add(data[:-keep] if len(data) > keep else b"")
                self.window = data[-keep:] if len(data) > keep else data
                return
            self.capture.add(data[:at])
            end = data.find(b"\n", at + len(self.mark))
            if end < 0 and len(data) - at < len(self.mark) + 24:
                self.window = data[at:]   # the status is still on its way
                return
            text = data[at + len(self.mark):end if end >= 0 else None]
            self.status = int(text) if text.strip().isdigit() else -1
            self.finished, self.capture = self.capture, OutputCapture(self.cap)
            self.capture.add(data[end + 1:] if end >= 0 else b"")
            self.mark, self.window = None, b""
            self.changed.notify_all()

    def close(self) -> None:
        with self.changed:
            self.ended = True
            self.changed.notify_all()

    def pump(self, stream) -> None:
        try:
            _read_chunks(stream, self.feed)
        finally:
            self.close()


class ShellSession:
    """One long-lived bash in a sandbox. Each command runs as `{ command } </dev/null` followed, on the
    same input line, by a print of a random end marker with its exit status: bash has read the whole
    line before it runs the command, so the marker is not in any input the command could read, and
    the command's own output cannot end it early or change its status. The shell's state persists
    between commands. A command that outlives its timeout kills the session (its whole process
    tree) and the next command starts a fresh shell, saying so in its output: a hung foreground job
    cannot be interrupted reliably without a tty."""

    def __init__(self, sandbox: Sandbox):
        self.sandbox = sandbox
        self.process: subprocess.Popen | None = None
        self.output: _ShellOutput | None = None
        self.restarted = 0

    def _start(self) -> None:
        self.process = self.sandbox._spawn(["bash", "--noprofile", "--norc"], self.sandbox.environment(), None,
                                           subprocess.PIPE)
        self.output = _ShellOutput(self.sandbox.limits.output_bytes)
        threading.Thread(target=self.output.pump, args=(self.process.stdout,), daemon=True).start()

    def run(self, command: str, timeout_s: float | None = None) -> CommandResult:
        self.sandbox._check_alive()
        note = ""
        if self.process is None or self.process.poll() is not None:
            if self.process is not None:
                self.restarted += 1
                note = "[the previous shell ended; this is a new shell]\n"
                self.sandbox._finished(self.process, killed=False, shell=True)
            self._start()
        timeout = self.sandbox.limits.command_timeout_s if timeout_s is None else timeout_s
        marker = "__dockyard_done_" + secrets.token_hex(16)
        self.output.expect(marker)
        # `builtin :` first: a command that is only a comment still makes a group bash accepts
        script = (f"{{ builtin :; {command}\n}} </dev/null; __dockyard_status=$?; builtin trap - DEBUG RETURN; "
                  f"builtin printf '\\n%s %s\\n' {marker} \"$__dockyard_status\"\n")
        started = time.monotonic()
        try:
            self.process.stdin.write(script.encode())
            self.process.stdin.flush()
        except (BrokenPipeError, OSError):
            pass
        deadline = started + timeout
        output = self.output
        with output.changed:
            while output.status is None and not output.ended:
                if self.process.poll() is not None:   # the shell exited (a background job may hold its output)
                    output.changed.wait(timeout=0.05)
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                output.changed.wait(timeout=min(remaining, 0.5))
            status = output.status
            capture = output.finished if status is not None else output.capture
        text, truncated = capture.text()
        seconds = time.monotonic() - started
        if status is None:
            timed_out = self.process.poll() is None and time.monotonic() >= deadline
            if not timed_out:   # the shell ended: its output closed a moment before its process is reaped
                try:
                    self.process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
            exit_code = self.process.poll()
            self.close()
            tail = (f"\n[command timed out after {timeout:.0f} s; the shell was killed]" if timed_out
                    else "\n[the shell exited]")
            return CommandResult(None if timed_out else exit_code, note + text + tail, seconds, timed_out, truncated)
        return CommandResult(status, note + text, seconds, False, truncated)

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            kill_tree(self.process)
            self.process.wait()
            self.sandbox._finished(self.process, killed=True, shell=True)
