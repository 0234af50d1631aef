"""A live desktop in a sandbox, driven from the host.

A desktop must live in one long-lived process tree: a sandbox that starts a fresh namespace per
command (bubblewrap) could not reach its X server from the next command. So the desktop is one
command of the sandbox, the controller (guest/desktop_guest.py, run by the sandbox's own
/usr/bin/python3), which starts Xvfb, the buses and the window manager and then does everything the
episode needs inside that tree: screenshots, the accessibility tree, actions, set-up steps, the
evaluator's commands and file reads. The host talks to it over the command's stdin and stdout, one
JSON line each way; every request has a timeout and a request that gets no answer ends the desktop
with an error naming what it waited for.

The sandbox's caps and guards apply to the desktop as to any command (its user, process and memory
limits, no network, a read-only system); the controller itself is placed read-only.
"""

from __future__ import annotations

import base64
import json
import queue
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from dockyard.sandboxes.base import Sandbox, SandboxError, kill_tree

GUEST = Path(__file__).parent / "guest"
GUEST_INSIDE = "/dockyard-desktop"
RUNTIME_INSIDE = "/run/user/1000"
PYTHON = "/usr/bin/python3"   # the system's: the desktop's Debian packages (PIL, pyatspi) are its modules


class DesktopError(SandboxError):
    """A desktop did not come up, stopped answering, or refused a request; the message names it."""


def missing_programs() -> list[str]:
    """The desktop's programs that this machine's /usr lacks (the host view the sandboxes run on)."""
    import shutil
    wanted = {"Xvfb": "xvfb", "openbox": "openbox", "xdotool": "xdotool", "wmctrl": "wmctrl",
              "xdpyinfo": "x11-utils", "dbus-daemon": "dbus-daemon"}
    missing = [package for program, package in wanted.items() if shutil.which(program) is None]
    if not Path("/usr/libexec/at-spi-bus-launcher").exists():
        missing.append("at-spi2-core")
    if not Path(PYTHON).exists():
        missing.append("python3")
    return missing


class DesktopSession:
    """One desktop in `sandbox`: start() brings it up (or raises DesktopError), request() asks it."""

    def __init__(self, sandbox: Sandbox, width: int = 1280, height: int = 720, start_timeout_s: float = 60.0,
                 request_timeout_s: float = 60.0):
        self.sandbox, self.width, self.height = sandbox, width, height
        self.start_timeout_s, self.request_timeout_s = start_timeout_s, request_timeout_s
        self.name = sandbox.spec.name
        self.process: subprocess.Popen | None = None
        self._replies: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self.start_seconds = 0.0

    def start(self) -> "DesktopSession":
        started = time.monotonic()
        self.sandbox.copy_in(GUEST, GUEST_INSIDE, read_only=True)
        try:   # OSWorld's runtime folder, where its tasks find the session bus; a sandbox that cannot make it
            with tempfile.TemporaryDirectory() as empty:   # gets the bus in its /tmp instead
                self.sandbox.copy_in(Path(empty), RUNTIME_INSIDE)
        except SandboxError:
            pass
        self.process = self.sandbox._spawn([PYTHON, "-I", f"{GUEST_INSIDE}/desktop_guest.py"],
                                           self.sandbox.environment(), None, subprocess.PIPE)
        threading.Thread(target=self._read, daemon=True).start()
        try:
            self.request("start", wait_s=self.start_timeout_s + 5, width=self.width, height=self.height,
                         home=self.sandbox.workdir, timeout_s=self.start_timeout_s)
        except DesktopError as err:
            self.close()
            why = str(err).removeprefix(f"{self.name}: ").removeprefix("start: ")
            raise DesktopError(f"{self.name}: the desktop did not come up: {why}") from None
        self.start_seconds = time.monotonic() - started
        return self

    def _read(self) -> None:
        for line in self.process.stdout:
            self._replies.put(line)
        self._replies.put(None)

    def request(self, op: str, wait_s: float | None = None, **args) -> dict:
        """Send one request; its answer (DesktopError if it failed, did not come in time, or the
        controller is gone)."""
        timeout = self.request_timeout_s if wait_s is None else wait_s
        with self._lock:
            if self.process is None or self.process.poll() is not None:
                raise DesktopError(f"{self.name}: the desktop is not running ({op})")
            try:
                self.process.stdin.write((json.dumps({"op": op, **args}) + "\n").encode())
                self.process.stdin.flush()
            except (BrokenPipeError, OSError):
                raise DesktopError(f"{self.name}: the desktop's controller is gone ({op})") from None
            deadline = time.monotonic() + timeout
            while True:
                try:
                    line = self._replies.get(timeout=max(deadline - time.monotonic(), 0.01))
                except queue.Empty:
                    self._kill()
                    raise DesktopError(f"{self.name}: the desktop gave no answer to {op} within {timeout:.0f} s; "
                                       "it was stopped") from None
                if line is None:
                    raise DesktopError(f"{self.name}: the desktop's controller ended during {op}")
                try:
                    reply = json.loads(line)
                    break
                except ValueError:   # not a reply (a stray line before the controller took its pipe)
                    continue
        if not reply.get("ok"):
            raise DesktopError(f"{self.name}: {op}: {reply.get('error')}")
        return reply

    # --- what episodes use ----------------------------------------------------------------------

    def screenshot(self) -> bytes:
        return base64.b64decode(self.request("screenshot")["png"])

    def a11y_tree(self, max_nodes: int = 3000, timeout_s: float = 20.0) -> dict:
        return self.request("a11y_tree", wait_s=timeout_s + 10, max_nodes=max_nodes, timeout_s=timeout_s)

    def act(self, actions: list[dict]) -> None:
        self.request("act", actions=actions)

    def run(self, command, shell: bool = False, timeout_s: float = 60.0, max_bytes: int = 1 << 20) -> dict:
        return self.request("run", wait_s=timeout_s + 10, command=command, shell=shell, timeout_s=timeout_s,
                            max_bytes=max_bytes)

    def read_file(self, path: str, max_bytes: int = 64 << 20) -> bytes | None:
        reply = self.request("read_file", path=path, max_bytes=max_bytes)
        return None if reply.get("missing") else base64.b64decode(reply["data"])

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def _kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            kill_tree(self.process)
            self.process.wait()
            self.sandbox._finished(self.process, killed=True, shell=True)

    def close(self) -> None:
        if self.alive():
            try:
                self.process.stdin.write(b'{"op": "stop"}\n')
                self.process.stdin.flush()
                self.process.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self._kill()
