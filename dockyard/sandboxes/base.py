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

BASE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8",
            "TERM": "dumb"}


class SandboxError(RuntimeError):
    """A sandbox could not be created, used or destroyed; the message names it."""


@dataclass(frozen=True)
class SandboxLimits:
    """Caps on what one sandbox may use. memory_mb and file_size_mb apply per process (RLIMIT_AS,
    RLIMIT_FSIZE), max_processes to the sandbox's own user (RLIMIT_NPROC), cpu_time_s per process."""

    command_timeout_s: float = 600.0
    memory_mb: int = 2048
    max_processes: int = 256
    file_size_mb: int = 1024
    cpu_time_s: int = 600
    open_files: int = 1024
    output_bytes: int = 64 * 1024

    def prlimit(self) -> list[str]:
        """`prlimit` options setting these caps on the process it runs (and its children)."""
        mb = 1024 * 1024
        return [f"--as={self.memory_mb * mb}", f"--nproc={self.max_processes}",
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


class _CappedReader(threading.Thread):
    """Drains a pipe to its end, keeping the first and the last `cap // 2` bytes."""

    def __init__(self, stream, cap: int):
        super().__init__(daemon=True)
        self.stream, self.cap = stream, cap
        self.head, self.tail, self.total = bytearray(), bytearray(), 0

    def run(self) -> None:
        half = self.cap // 2
        while chunk := self.stream.read1(65536) if hasattr(self.stream, "read1") else self.stream.read(65536):
            self.total += len(chunk)
            room = half - len(self.head)
            if room > 0:
                self.head += chunk[:room]
                chunk = chunk[room:]
            if chunk:
                self.tail += chunk
                del self.tail[:-half]

    def text(self) -> tuple[str, bool]:
        truncated = self.total > len(self.head) + len(self.tail)
        middle = f"\n[... {self.total - len(self.head) - len(self.tail)} bytes of output left out ...]\n"
        body = self.head.decode(errors="replace") + (middle if truncated else "") + self.tail.decode(errors="replace")
        return body, truncated


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


def kill_user_processes(uid: int) -> None:
    """SIGKILL every process of `uid` (a sandbox's own user id), until none is left or 1 s has passed:
    a fork bomb's processes keep forking while they are killed."""
    for _ in range(20):
        if subprocess.run(["pkill", "-KILL", "-u", str(uid)], capture_output=True).returncode != 0:
            return   # nothing left to kill
        time.sleep(0.05)


class Sandbox(abc.ABC):
    kind: str = "sandbox"
    builds_images = False   # whether a task's RUN lines take effect (else they are reported as skipped)

    def __init__(self, spec: SandboxSpec, limits: SandboxLimits):
        self.spec, self.limits = spec, limits
        self.workdir = spec.workdir
        self._shells: list[ShellSession] = []
        self.destroyed = False

    # --- what a backend provides ------------------------------------------------------------

    @abc.abstractmethod
    def wrap(self, argv: list[str], env: dict[str, str], cwd: str | None = None) -> list[str]:
        """The host command line that runs argv inside the sandbox, in cwd (default: the workdir)."""

    @abc.abstractmethod
    def copy_in(self, source: Path, target: str, read_only: bool = False) -> None:
        """Copy a host file or folder to `target` (absolute, inside). Visible to commands started after.
        read_only: the sandbox's commands can read but not change or add to it (a task's tests)."""

    @abc.abstractmethod
    def copy_out(self, source: str, target: Path) -> None:
        """Copy `source` (absolute, inside) to a host path."""

    def _teardown(self) -> None:
        pass

    def on_timeout(self) -> None:
        """After a timed-out command's host process tree was killed (a backend whose commands outlive
        their client kills them here)."""

    def after_command(self) -> None:
        """After a fresh command ended (a backend whose commands can leave processes behind ends them)."""

    def after_shell_ended(self) -> None:
        """A shell session exited by itself (a command made it exit): before a new shell starts, what the
        old one left behind must be gone, or e.g. a fork bomb's dying processes would still hold the
        process limit and the new shell could not fork."""

    def live_shells(self) -> bool:
        return any(s.process is not None and s.process.poll() is None for s in self._shells)

    # --- shared behaviour -------------------------------------------------------------------

    def environment(self) -> dict[str, str]:
        return {**BASE_ENV, "HOME": self.workdir, **self.spec.env}

    def run(self, command: str, timeout_s: float | None = None, cwd: str | None = None,
            env: dict[str, str] | None = None) -> CommandResult:
        """`bash -c command` as a fresh process in the sandbox; killed with its whole tree at the timeout."""
        self._check_alive()
        timeout = self.limits.command_timeout_s if timeout_s is None else timeout_s
        argv = self.wrap(["bash", "-c", command], {**self.environment(), **(env or {})}, cwd)
        started = time.monotonic()
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   start_new_session=True, env=self._host_env())
        reader = _CappedReader(process.stdout, self.limits.output_bytes)
        reader.start()
        timed_out = False
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            kill_tree(process)
            process.wait()
            self.on_timeout()
        reader.join(timeout=10)
        self.after_command()
        output, truncated = reader.text()
        return CommandResult(None if timed_out else process.returncode, output, time.monotonic() - started,
                             timed_out, truncated)

    def shell(self) -> "ShellSession":
        """A persistent bash in the sandbox (the agent's terminal)."""
        self._check_alive()
        session = ShellSession(self)
        self._shells.append(session)
        return session

    def destroy(self) -> None:
        if self.destroyed:
            return
        for session in self._shells:
            session.close()
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


class ShellSession:
    """One long-lived bash in a sandbox. Each command is sent with a random end marker that carries
    its exit status; the shell's state persists between commands. A command that outlives its
    timeout kills the session (its whole process tree) and the next command starts a fresh shell,
    saying so in its output: a hung foreground job cannot be interrupted reliably without a tty."""

    def __init__(self, sandbox: Sandbox):
        self.sandbox = sandbox
        self.process: subprocess.Popen | None = None
        self.restarted = 0

    def _start(self) -> None:
        argv = self.sandbox.wrap(["bash", "--noprofile", "--norc"], self.sandbox.environment())
        self.process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        start_new_session=True, env=self.sandbox._host_env())
        self._lines: list[bytes] = []
        self._cond = threading.Condition()
        threading.Thread(target=self._pump, args=(self.process,), daemon=True).start()

    def _pump(self, process: subprocess.Popen) -> None:
        for line in iter(process.stdout.readline, b""):
            with self._cond:
                self._lines.append(line)
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def run(self, command: str, timeout_s: float | None = None) -> CommandResult:
        self.sandbox._check_alive()
        note = ""
        if self.process is None or self.process.poll() is not None:
            if self.process is not None:
                self.restarted += 1
                note = "[the previous shell ended; this is a new shell]\n"
                self.sandbox.after_shell_ended()
            self._start()
        timeout = self.sandbox.limits.command_timeout_s if timeout_s is None else timeout_s
        marker = "__dockyard_done_" + secrets.token_hex(8)
        script = f"{command}\n__status=$?; printf '\\n{marker} %s\\n' \"$__status\"\n"
        started = time.monotonic()
        try:
            self.process.stdin.write(script.encode())
            self.process.stdin.flush()
        except (BrokenPipeError, OSError):
            pass
        cap = self.sandbox.limits.output_bytes
        collected, size, status = [], 0, None
        deadline = started + timeout
        with self._cond:
            while True:
                while self._lines:
                    line = self._lines.pop(0)
                    text = line.decode(errors="replace")
                    if text.startswith(marker):
                        status = int(text.split()[1])
                        break
                    size += len(line)
                    collected.append(line)
                    if len(collected) > 4 and size > 4 * cap:   # keep memory bounded while it prints
                        collected = collected[:2] + collected[-2:]
                if status is not None or self.process.poll() is not None and not self._lines:
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(timeout=min(remaining, 0.5))
        raw = b"".join(collected)
        if raw.endswith(b"\n"):
            raw = raw[:-1]   # the newline printed before the marker
        truncated = size > cap
        if truncated:
            raw = raw[: cap // 2] + f"\n[... {size - cap} bytes of output left out ...]\n".encode() + raw[-(cap // 2):]
        seconds = time.monotonic() - started
        if status is None:
            timed_out = time.monotonic() >= deadline
            self.close()
            tail = (f"\n[command timed out after {timeout:.0f} s; the shell was killed]" if timed_out
                    else "\n[the shell exited]")
            return CommandResult(None if timed_out else self.process.returncode, note + raw.decode(errors="replace") + tail,
                                 seconds, timed_out, truncated)
        return CommandResult(status, note + raw.decode(errors="replace"), seconds, False, truncated)

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            kill_tree(self.process)
            self.process.wait()
            self.sandbox.on_timeout()   # what the shell started inside goes with it
