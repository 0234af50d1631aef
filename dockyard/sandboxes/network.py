"""The network of a sandbox whose task allows it (Harbor's `allow_internet`): outbound connections only,
never this machine itself.

Sharing the host's network namespace (what `allow_internet` used to mean) hands the agent every
listener on the host's loopback, its abstract unix sockets and the trainer's own ports. Instead, as
root, such a sandbox gets a network namespace of its own:

- slirp4netns joins it to the outside in user mode: the sandbox's connections leave as this
  machine's own, the host's loopback is not mapped in (`--disable-host-loopback`), and nothing on
  the host listens for the sandbox;
- an nftables rule inside the namespace, set before any command of the sandbox runs, refuses every
  address of this machine (listeners bound to 0.0.0.0 would otherwise answer on them) and the
  slirp gateway; the sandbox's commands have no capabilities there, so they cannot change it;
- abstract unix sockets belong to a network namespace, so the host's are out of reach;
- DNS goes to slirp's forwarder (10.0.2.3).

Every command of the sandbox joins this namespace (bubblewrap under `nsenter --net`, podman with
`--network ns:`). Without root (no `ip netns`, and slirp4netns needs the tun device) a task that asks
for the network is refused by name rather than given the host's network.
"""

from __future__ import annotations

import ipaddress
import json
import os
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path

from dockyard.sandboxes.base import SandboxError
from dockyard.sandboxes.owners import owner_token
from dockyard.sandboxes.user_namespaces import in_new_namespace

PREFIX = "dockyard-"
GATEWAY, DNS = "10.0.2.2", "10.0.2.3"
TOOLS = {"ip": "iproute2", "slirp4netns": "slirp4netns", "nft": "nftables", "nsenter": "util-linux"}


def missing_tools() -> list[str]:
    return [f"{tool} ({package})" for tool, package in TOOLS.items() if shutil.which(tool) is None]


def host_addresses() -> tuple[list[str], list[str]]:
    """This machine's own IPv4 and IPv6 addresses, loopback and link-local left out (inside the
    namespace those are the sandbox's own)."""
    out = subprocess.run(["ip", "-j", "addr"], capture_output=True, text=True, timeout=10).stdout
    v4, v6 = [], []
    for interface in json.loads(out or "[]"):
        for entry in interface.get("addr_info", []):
            address = ipaddress.ip_address(entry["local"])
            if address.is_loopback or address.is_link_local:
                continue
            (v4 if address.version == 4 else v6).append(str(address))
    return v4, v6


def ruleset(v4: list[str], v6: list[str]) -> str:
    lines = ["table inet dockyard_sandbox {", "  chain output {",
             "    type filter hook output priority 0; policy accept;",
             f"    ip daddr {{ {', '.join([GATEWAY, *v4])} }} reject"]
    if v6:
        lines.append(f"    ip6 daddr {{ {', '.join(v6)} }} reject")
    return "\n".join(lines + ["  }", "}", ""])


class UserNetwork:
    """One sandbox's network namespace, its slirp4netns and its rule; `close` removes all three."""

    def __init__(self, sandbox_name: str, ready_timeout_s: float = 30.0, owner=None, offline: bool = False):
        """owner: a UserNamespace (user_namespaces.py) the network namespace is to belong to (a podman
        container with root inside joins it from that user namespace, which may only join its own).
        offline: loopback only (no slirp4netns, no way out): a namespace that the task's container and its
        compose services share and that outlives a restart of the container."""
        self.offline = offline
        if offline:
            self._make_offline(sandbox_name, owner, ready_timeout_s)
            return
        if os.geteuid() != 0:
            raise SandboxError(f"{sandbox_name}: the task allows the network (allow_internet), which a sandbox gets "
                               "only when dockyard runs as root (its own network namespace and slirp4netns, with this "
                               "machine's addresses closed); run as root, or leave such tasks out")
        missing = missing_tools()
        if missing:
            raise SandboxError(f"{sandbox_name}: the task allows the network (allow_internet), which needs "
                               f"{', '.join(missing)}: `apt-get install slirp4netns nftables` (tools/install.sh does)")
        self.name = f"{PREFIX}{owner_token()}-{secrets.token_hex(4)}"
        self.path = Path("/run/netns") / self.name
        self.slirp: subprocess.Popen | None = None
        self.resolv = Path(tempfile.mkstemp(prefix="dockyard-resolv-")[1])
        self.resolv.write_text(f"nameserver {DNS}\n")
        self.resolv.chmod(0o644)
        try:
            if owner is None:
                _ip("netns", "add", self.name)
            else:
                _owned_namespace(self.path, owner, ready_timeout_s)
            read, write = os.pipe()
            self.slirp = subprocess.Popen(["slirp4netns", "--configure", "--mtu=65520", "--disable-host-loopback",
                                           f"--ready-fd={write}", "--netns-type=path", str(self.path), "tap0"],
                                          pass_fds=(write,), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                          start_new_session=True)
            os.close(write)
            ready = _read_with_timeout(read, ready_timeout_s)
            if ready != b"1":
                error = self.slirp.stderr.read().decode(errors="replace") if self.slirp.poll() is not None else ""
                raise SandboxError(f"{sandbox_name}: slirp4netns did not bring the sandbox's network up within "
                                   f"{ready_timeout_s:.0f} s {error.strip()[-300:]}")
            rules = subprocess.run(["ip", "netns", "exec", self.name, "nft", "-f", "-"], input=ruleset(*host_addresses()),
                                   capture_output=True, text=True, timeout=30)
            if rules.returncode != 0:
                raise SandboxError(f"{sandbox_name}: the sandbox network's rule could not be set: {rules.stderr.strip()}")
        except BaseException:
            self.close()
            raise

    def _make_offline(self, sandbox_name: str, owner, timeout_s: float) -> None:
        self.name = f"{PREFIX}{owner_token()}-{secrets.token_hex(4)}"
        self.path = Path("/run/netns") / self.name
        self.slirp = None
        self.resolv = Path(tempfile.mkstemp(prefix="dockyard-resolv-")[1])   # no name server: nothing to reach
        self.resolv.chmod(0o644)
        try:
            if owner is None:
                _ip("netns", "add", self.name)
            else:
                _owned_namespace(self.path, owner, timeout_s)
            up = subprocess.run(["nsenter", f"--net={self.path}", "--", "ip", "link", "set", "lo", "up"],
                                capture_output=True, text=True, timeout=30)
            if up.returncode != 0:
                raise SandboxError(f"{sandbox_name}: the loopback of its network namespace did not come up: "
                                   f"{up.stderr.strip()[-300:]}")
        except BaseException:
            self.close()
            raise

    def enter_prefix(self) -> list[str]:
        """argv prefix that runs a command in this namespace (as root, before dropping to the sandbox's user)."""
        return ["nsenter", f"--net={self.path}", "--"]

    def close(self) -> None:
        if self.slirp is not None and self.slirp.poll() is None:
            self.slirp.kill()
            self.slirp.wait()
        if self.path.exists():
            _ip("netns", "delete", self.name, check=False)
        self.resolv.unlink(missing_ok=True)


def _ip(*args: str, check: bool = True) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise SandboxError(f"ip {' '.join(args)} failed: {result.stderr.strip()}")


def _read_with_timeout(fd: int, timeout_s: float) -> bytes:
    import select

    try:
        ready, _, _ = select.select([fd], [], [], timeout_s)
        return os.read(fd, 1) if ready else b""
    finally:
        os.close(fd)


def leftover_namespaces() -> list[str]:
    """Network namespaces of sandboxes on this machine (reaping: their names carry the owner's token)."""
    folder = Path("/run/netns")
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(PREFIX)) if folder.is_dir() else []


def remove_namespace(name: str) -> None:
    """A dead trainer's namespace: its slirp4netns (whose command line names it) and the namespace."""
    subprocess.run(["pkill", "-KILL", "-f", f"slirp4netns .*/run/netns/{name} "], capture_output=True, timeout=10)
    _ip("netns", "delete", name, check=False)


def _owned_namespace(path: Path, owner, timeout_s: float) -> None:
    """A network namespace made inside `owner`'s user namespace, kept by a bind of it at `path` (as
    `ip netns add` keeps its own)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    maker = subprocess.Popen([*owner.enter_prefix(), "unshare", "--net", "--", "sleep", "60"], stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:   # nsenter, then unshare, then sleep: the last is in the new namespace
        in_new_namespace(maker, "net", timeout_s, "a network namespace in the sandbox's user namespace")
        bound = subprocess.run(["mount", "--bind", f"/proc/{maker.pid}/ns/net", str(path)], capture_output=True,
                               text=True, timeout=30)
        if bound.returncode != 0:
            raise SandboxError(f"could not keep the sandbox's network namespace at {path}: {bound.stderr.strip()}")
    finally:
        maker.kill()
        maker.wait()
