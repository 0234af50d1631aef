"""podman sandboxes: one container per sandbox, commands through `podman exec`.

The container's root is `env.sandbox.image` when set (it must be in the local image store:
`podman pull` or `podman load` it first; nothing is pulled at run time), else the host view that
bubblewrap gives: an empty root with this machine's /usr and /etc bound read-only. Either way:
- no network (`--network none`; a task that allows the network gets user-mode networking with this
  machine closed, network.py), no capabilities for the sandbox's user, no new privileges;
- commands run as a user id of the sandbox's own (the same leases as bubblewrap's), so the image's
  system folders and everything root-owned are read-only to them; the working directory is theirs;
- what the agent can write is bounded: as root the working directory is a host tmpfs of the
  sandbox's own (workspace_mb, workspace_inodes; an image's files there are copied into it), /tmp
  and /var/tmp are tmpfs of tmp_mb (mode 1777), /dev/shm is shm_mb, and any other folder of an
  image that everyone could write is closed at creation; nothing the agent writes lands in podman's
  storage on the host's disk;
- caps: `--pids-limit` (max_processes), `--memory` (sandbox_memory_mb, for the whole container, where
  the cgroup memory controller allows it), `ulimit -v` per process (memory_mb; unset, only where
  --memory cannot take effect: SandboxLimits.process_memory_mb), `--ulimit` for file
  size, CPU time, open files and processes;
- a task's Dockerfile: COPY/ADD sources are copied in, ENV and WORKDIR set, and its RUN lines run at
  creation, as root, in order, without network (the image build, done in the container: the task's
  base image itself is not pulled). A RUN line that fails fails the sandbox's creation, named.
Files go in and out of the working directory as host copies that follow no link (as root), else with
`podman cp`. Every container is labelled with its trainer's owner token; a trainer that starts
removes the containers of one that is gone (reaping.py). The sandbox's processes are its users'
(from the host, as root): ended for certain after a timed-out command, at hand_over and at destroy.
"""

from __future__ import annotations

import io
import os
import secrets
import shlex
import shutil
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

from dockyard.sandboxes import host_paths
from dockyard.sandboxes.base import HOST_CA_BUNDLE, Sandbox, SandboxError, SandboxLimits, SandboxSpec
from dockyard.sandboxes.cgroups import memory_controller
from dockyard.sandboxes.host_folders import BUILD_HINT, SYSTEM_FOLDERS, give_verifier_room, mount_tmpfs, unmount
from dockyard.sandboxes.network import UserNetwork
from dockyard.sandboxes.owners import owner_token
from dockyard.sandboxes.processes import end_processes, of_uid_range, of_user
from dockyard.sandboxes.user_namespaces import BLOCK, CONTAINER_CAPS, ImageRoot, SystemChanges, UserNamespace, \
    root_inside, root_lease
from dockyard.sandboxes.users import UidLease, uid_range, with_user_entries

PODMAN = ["podman", "--runtime", "runc"]   # crun is not in every distribution's podman; runc is
OWNER_LABEL = "dockyard.owner"
INIT_CHILD_TIMEOUT_S = 10.0
# what podman itself writes into a container's root (not the agent's changes)
PODMAN_FILES = ("/etc/mtab", "/etc/hosts", "/etc/hostname", "/etc/resolv.conf", "/run/.containerenv", "/run/podman-init")


def podman_path() -> str | None:
    return shutil.which("podman")


def podman_command(*args: str, timeout: float = 120, check: bool = True,
                   input: bytes | None = None) -> subprocess.CompletedProcess:
    """`podman --runtime runc ARGS`; SandboxError with its stderr's end when it fails (and `check`)."""
    result = subprocess.run([*PODMAN, *args], capture_output=True, timeout=timeout, input=input)
    if check and result.returncode != 0:
        raise SandboxError(f"podman {args[0]} failed ({result.returncode}): "
                           f"{result.stderr.decode(errors='replace').strip()[-500:]}")
    return result


def _parents(path: str) -> list[str]:
    """The folders above a path, the top one first: /a/b/c.txt -> /a, /a/b."""
    parts = path.strip("/").split("/")[:-1]
    return ["/" + "/".join(parts[:i]) for i in range(1, len(parts) + 1)]


def _q(path: str) -> str:
    return shlex.quote(path)


class PodmanSandbox(Sandbox):
    kind = "podman"
    runs_services = True
    builds_images = True

    @classmethod
    def refuses(cls, config) -> str | None:
        if podman_path() is None:
            return "env.sandbox.type: podman is not installed here (`apt-get install podman runc catatonit`)"
        if not (shutil.which("catatonit") or os.path.exists("/usr/libexec/podman/catatonit")):
            return "env.sandbox.type: podman needs catatonit as the containers' init (`apt-get install catatonit`)"
        if config.image and podman_command("image", "exists", config.image, check=False).returncode != 0:
            return (f"env.sandbox.image: {config.image!r} is not in this machine's podman image store; "
                    "`podman pull` or `podman load` it first (nothing is pulled while a run starts)")
        return None

    def __init__(self, spec: SandboxSpec, limits: SandboxLimits, config=None):
        super().__init__(spec, limits)
        if podman_path() is None:
            raise SandboxError("podman is not installed (`apt-get install podman`)")
        self.image = spec.image or getattr(config, "image", None)
        self.uids = uid_range(config)
        self.name = f"dockyard-{secrets.token_hex(6)}"
        self.as_root = os.geteuid() == 0
        self.lease = self.verifier_lease = None
        self.root_dir: Path | None = None
        self.host_root: Path | None = None
        self.workspace: Path | None = None     # the working directory's host folder (as root)
        self.network: UserNetwork | None = None
        self.started = False
        # root inside (user_namespaces.py): the container runs on the image's root folder, idmapped under
        # an overlay of dockyard's, with ids 0-65535 mapped onto a leased block; self.uid is the block's first
        self.root_inside = self.as_root and root_inside(config, bool(self.image))
        self.namespace: UserNamespace | None = None
        self.image_root: ImageRoot | None = None
        self.init_pid: int | None = None
        self.container_pids: set[int | None] = set()   # root inside: the container's init and main process
        self.made_folders: list[str] = []   # folders a copy made outside the workspace, the sandbox user's (place)
        try:
            if self.root_inside:
                self.lease, self.namespace = root_lease(spec, config)
            else:
                self.lease = UidLease(*self.uids) if self.as_root else None
            self.uid = self.lease.uid if self.lease else os.geteuid()
            self.inside_uid = 0 if self.root_inside else self.uid
            if self.as_root:
                self.host_root = Path(tempfile.mkdtemp(prefix=f"dockyard-podman-{owner_token()}-"))
                mount_tmpfs(self.host_root, limits)
                self.workspace = self.host_root / "workspace"
                self.workspace.mkdir(mode=0o755)
                if self.root_inside:
                    self.image_root = ImageRoot(spec.rootfs, self.host_root, self.namespace)
                    image_files = Path(spec.rootfs) / self.workdir.lstrip("/")
                    if image_files.is_dir() and not image_files.is_symlink():
                        shutil.copytree(image_files, self.workspace, symlinks=True, dirs_exist_ok=True)
                elif self.image:
                    self._copy_image_workdir()
                host_paths.chown_tree(self.workspace, (self.uid, self.uid))
            if spec.network:   # with root inside, one of the container's own user namespace (network.py)
                self.network = UserNetwork(spec.name, owner=self.namespace)
            elif spec.services and self.as_root:   # shared with its services, and kept over a restart (restore)
                self.network = UserNetwork(spec.name, owner=self.namespace, offline=True)
            if self.as_root and not self.image:   # the host view's /etc is read-only: the entries are bound over it
                self._write_host_user_files()
            self._start()
            self._start_services()
            if self.as_root and self.image and not self.root_inside:
                self._add_user_entries()
            setup = [] if self.workspace else [f"mkdir -p {_q(self.workdir)} && chown {self.uid}:{self.uid} {_q(self.workdir)}"]
            if self.image and not self.root_inside:   # other folders of the image that everyone may write would be unbounded
                setup.append("find / -xdev -type d -perm -0002 ! -path /tmp ! -path /var/tmp ! -path '/proc/*' "
                             "-exec chmod o-w {} + 2>/dev/null; true")
            if setup:
                self._exec_root(" && ".join(setup))
            for source, target in spec.files:
                self.copy_in(source, target)
            for line in spec.run:
                result = self._exec_root(line, check=False, cwd=self.workdir)
                if result.returncode != 0:
                    raise SandboxError(f"{spec.name}: the Dockerfile's RUN {line!r} failed ({result.returncode}): "
                                       f"{result.stdout.decode(errors='replace')[-300:]}")
            if spec.run:   # what the RUN lines made in the working directory is the agent's
                self._own_workdir(self.uid)
        except BaseException:
            self.destroy()
            raise

    def host_ca_bound(self) -> bool:
        """With a network and an image, this machine's CA bundle is bound over the image's."""
        return self.network is not None and not self.network.offline and bool(self.image) \
            and os.path.isfile(HOST_CA_BUNDLE)

    def _users(self) -> list[tuple[str, int, str]]:
        users = [("sandbox", self.lease.uid, self.workdir)]
        if self.verifier_lease:
            users.append(("verifier", self.verifier_lease.uid, "/"))
        return users

    def _write_host_user_files(self) -> None:
        texts = [Path("/etc", name).read_text(errors="replace") for name in ("passwd", "group")]
        for name, text in zip(("passwd", "group"), with_user_entries(*texts, self._users())):
            path = self.host_root / f"etc-{name}"
            with open(path, "w") as out:   # in place: the container's bind of the file sees the new text
                out.write(text)
            path.chmod(0o644)

    def _add_user_entries(self) -> None:
        """The image's /etc/passwd and /etc/group with the sandbox's users added (whoami, getpass)."""
        if not self.image:
            self._write_host_user_files()
            return
        texts = [self._exec_root(f"cat /etc/{name} 2>/dev/null; true").stdout.decode(errors="replace")
                 for name in ("passwd", "group")]
        for name, text in zip(("passwd", "group"), with_user_entries(*texts, self._users())):
            result = subprocess.run([*PODMAN, "exec", "-i", "--user", "0", self.name, "sh", "-c",
                                     f"cat > /etc/{name}.dockyard && mv /etc/{name}.dockyard /etc/{name}"],
                                    input=text.encode(), capture_output=True, timeout=60)
            if result.returncode != 0:
                raise SandboxError(f"{self.spec.name}: could not add the sandbox's users to /etc/{name}: "
                                   f"{result.stderr.decode(errors='replace')[-200:]}")

    def _copy_image_workdir(self) -> None:
        """The image's files at the working directory, into the workspace that is bound over it."""
        mounted = podman_command("image", "mount", self.image).stdout.decode().strip()
        try:
            source = Path(mounted) / self.workdir.lstrip("/")
            if source.is_dir():
                shutil.copytree(source, self.workspace, symlinks=True, dirs_exist_ok=True)
        finally:
            podman_command("image", "unmount", self.image, check=False)

    def _start(self) -> None:
        mb = 1024 * 1024
        limits = ["--pids-limit", str(self.limits.max_processes), "--memory", f"{self.limits.sandbox_memory_mb}m",
                  "--ulimit", f"fsize={self.limits.file_size_mb * mb}:{self.limits.file_size_mb * mb}",
                  "--ulimit", f"cpu={self.limits.cpu_time_s}:{self.limits.cpu_time_s}",
                  "--ulimit", f"nofile={self.limits.open_files}:{self.limits.open_files}",
                  "--ulimit", f"nproc={self.limits.max_processes}:{self.limits.max_processes}",
                  "--shm-size", f"{self.limits.shm_mb}m"]
        tmp = f"rw,exec,size={self.limits.tmp_mb}m,mode=1777,notmpcopyup"
        network = ["--network", f"ns:{self.network.path}", "-v", f"{self.network.resolv}:/etc/resolv.conf:ro"] \
            if self.network else ["--network", "none"]
        if self.host_ca_bound():
            network += ["-v", f"{HOST_CA_BUNDLE}:{HOST_CA_BUNDLE}:ro"]
        # --init: catatonit as PID 1 reaps orphans (a killed fork bomb's zombies would hold the pids limit)
        # root inside gets a container root's capabilities (within its user namespace); otherwise root's
        # set-up steps only
        caps = ",".join(c.removeprefix("CAP_") for c in CONTAINER_CAPS) if self.root_inside else \
            "CHOWN,DAC_OVERRIDE,FOWNER,SETUID,SETGID"
        common = ["run", "-d", "--init", "--init-path", shutil.which("catatonit") or "/usr/libexec/podman/catatonit",
                  "--name", self.name, "--label", f"{OWNER_LABEL}={owner_token()}", *network, "--cap-drop", "ALL",
                  "--cap-add", caps, "--security-opt", "no-new-privileges", "--tmpfs", f"/tmp:{tmp}",
                  "--tmpfs", f"/var/tmp:{tmp}", *limits]
        for service in self.spec.services:   # compose's network resolves a service by its name
            common += ["--add-host", f"{service.name}:127.0.0.1"]
        if self.workspace is not None:
            common += ["-v", f"{self.workspace}:{self.workdir}"]
        for key, value in self.environment().items():
            common += ["--env", f"{key}={value}"]
        if self.image_root is not None:
            # the container joins the sandbox's own user namespace (its network namespace belongs to it)
            command = [*common, "--userns", f"ns:{self.namespace.path}", "--rootfs", str(self.image_root.merged),
                       "sleep", "infinity"]
        elif self.image:
            command = [*common, self.image, "sleep", "infinity"]
        else:
            self.root_dir = Path(tempfile.mkdtemp(prefix=f"dockyard-podman-{owner_token()}-root-"))
            self.root_dir.chmod(0o755)   # the container's / : its user must pass through it
            for folder in ("usr", "etc", "tmp", "proc", "dev", "sys", "run"):
                (self.root_dir / folder).mkdir()
            (self.root_dir / "tmp").chmod(0o1777)   # runc gives the tmpfs there the mode of the folder under it
            for link in ("bin", "lib", "lib64", "sbin"):
                if os.path.islink("/" + link):
                    (self.root_dir / link).symlink_to(os.readlink("/" + link))
            users = [] if self.host_root is None else \
                ["-v", f"{self.host_root}/etc-passwd:/etc/passwd:ro", "-v", f"{self.host_root}/etc-group:/etc/group:ro"]
            command = [*common, "-v", "/usr:/usr:ro", "-v", "/etc:/etc:ro", *users, "--rootfs", f"{self.root_dir}:O",
                       "sleep", "infinity"]
        # conmon stays in the folder podman started from, and writes an `oom` file there when the container's
        # memory cap kills a process: the sandbox's own folder, not the trainer's working directory
        result = subprocess.run([*PODMAN, *command], capture_output=True, timeout=120, cwd=self._conmon_folder())
        if result.returncode != 0:
            raise SandboxError(f"{self.spec.name}: podman could not start the container: "
                               f"{result.stderr.decode(errors='replace').strip()[-500:]}")
        self.started = True
        self._note_init()

    def _service_name(self, service) -> str:
        return f"{self.name}-{service.name}"

    def _start_services(self) -> None:
        """The task's docker-compose services: each from its own image in a container of its own (its files
        are out of the agent's reach), on the sandbox's network namespace, so the task reaches it at its
        name (an /etc/hosts entry) as compose's network would. Root of its own container, with the
        capabilities a service needs to drop to its user and nothing more; the sandbox's limits apply."""
        if not self.spec.services:
            return
        caps = "CHOWN,DAC_OVERRIDE,FOWNER,SETUID,SETGID,KILL,NET_BIND_SERVICE"
        for service in self.spec.services:
            command = ["run", "-d", "--name", self._service_name(service), "--label", f"{OWNER_LABEL}={owner_token()}",
                       "--network", f"ns:{self.network.path}" if self.network else f"container:{self.name}",
                       "--cap-drop", "ALL", "--cap-add", caps,
                       "--security-opt", "no-new-privileges", "--pids-limit", str(self.limits.max_processes),
                       "--memory", f"{self.limits.sandbox_memory_mb}m",
                       # root here may not raise rlimits (no CAP_SYS_RESOURCE): podman's defaults cannot be set
                       "--ulimit", f"nofile={self.limits.open_files}:{self.limits.open_files}",
                       "--ulimit", f"nproc={self.limits.max_processes}:{self.limits.max_processes}",
                       *(["--workdir", service.workdir] if service.workdir else [])]
            for key, value in service.env.items():
                command += ["--env", f"{key}={value}"]
            result = subprocess.run([*PODMAN, *command, service.image, *service.command], capture_output=True,
                                    timeout=120, cwd=self._conmon_folder())
            if result.returncode != 0:
                raise SandboxError(f"{self.spec.name}: podman could not start its service {service.name!r}: "
                                   f"{result.stderr.decode(errors='replace').strip()[-500:]}")
        for service in self.spec.services:
            if service.health is not None:
                self._wait_healthy(service)

    def _wait_healthy(self, service) -> None:
        """Compose's `depends_on: service_healthy`: the healthcheck, run in the service's container, passes
        before the agent starts; or the sandbox fails naming the service, within compose's own deadline."""
        health, name = service.health, self._service_name(service)
        deadline = time.monotonic() + health.deadline_s
        while True:
            try:
                check = subprocess.run([*PODMAN, "exec", name, *health.argv], capture_output=True,
                                       timeout=health.timeout_s)
                if check.returncode == 0:
                    return
                last = check.stdout.decode(errors="replace") + check.stderr.decode(errors="replace")
            except subprocess.TimeoutExpired:
                last = f"the check took over {health.timeout_s:.0f} s"
            if time.monotonic() >= deadline:
                logs = podman_command("logs", "--tail", "5", name, check=False)
                tail = (logs.stdout + logs.stderr).decode(errors="replace").strip()
                raise SandboxError(f"{self.spec.name}: its service {service.name!r} did not become healthy within "
                                   f"{health.deadline_s:.0f} s (healthcheck {' '.join(health.argv)[:120]!r}: "
                                   f"{' '.join(last.split())[-200:]}; its last lines: {' | '.join(tail.splitlines())[-300:]})")
            time.sleep(min(health.interval_s, 1.0))

    def _conmon_folder(self) -> str:
        if self.host_root is not None:
            return str(self.host_root)
        if self.root_dir is not None:
            return str(self.root_dir.parent)
        return tempfile.gettempdir()

    def _note_init(self) -> None:
        """The container's init (root inside): the one process of the block's ids that is not the agent's."""
        if self.root_inside:
            pid = podman_command("inspect", "--format", "{{.State.Pid}}", self.name).stdout.decode().strip()
            self.init_pid = int(pid) if pid.isdigit() else None
            # and its `sleep infinity`: the container lives while it does. The init may not have started it
            # yet (seen under load): a sandbox that took that moment would end it as the agent's with the
            # first command's leftovers, and the container with it ("container state improper")
            deadline = time.monotonic() + INIT_CHILD_TIMEOUT_S
            while True:
                try:
                    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
                except OSError:
                    children = []
                if children or time.monotonic() > deadline:
                    break
                time.sleep(0.02)
            if not children:
                raise SandboxError(f"{self.spec.name}: the container's init started no `sleep infinity` within "
                                   f"{INIT_CHILD_TIMEOUT_S:.0f} s")
            self.container_pids = {self.init_pid, *map(int, children)}

    def _exec_root(self, command: str, check: bool = True, cwd: str = "/") -> subprocess.CompletedProcess:
        result = subprocess.run([*PODMAN, "exec", "--user", "0", "--workdir", cwd, self.name, "sh", "-c", command],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
        if check and result.returncode != 0:
            raise SandboxError(f"{self.spec.name}: {command!r} failed in the container: "
                               f"{result.stdout.decode(errors='replace')[-300:]}")
        return result

    def _own_workdir(self, uid: int) -> None:
        if self.workspace is not None:
            host_paths.chown_tree(self.workspace, (uid, uid))
        else:
            self._exec_root(f"chown -R {uid}:{uid} {_q(self.workdir)}")

    # --- the interface ------------------------------------------------------------------------

    def wrap(self, argv: list[str], env: dict[str, str], cwd: str | None = None) -> list[str]:
        flags = []
        for key, value in env.items():
            flags += ["--env", f"{key}={value}"]
        # ulimit -v sets both limits: the command cannot raise it (a per-process cap, where memory_mb sets
        # one; --memory caps the container)
        memory = self.limits.process_memory_mb(sandbox_capped=memory_controller())
        capped = ["bash", "-c", f'ulimit -v {memory * 1024} && exec "$@"', "bash", *argv] if memory else argv
        return [*PODMAN, "exec", "-i", "--user", f"{self.inside_uid}:{self.inside_uid}", "--workdir", cwd or self.workdir, *flags,
                self.name, *capped]

    def _finished(self, process: subprocess.Popen, killed: bool, shell: bool) -> None:
        """A command's leftovers (background jobs, a fork bomb at the pids limit) end with it, as in
        bubblewrap, unless a shell session is open (its background jobs are the agent's); a killed
        command or shell takes every process of the sandbox's user with it."""
        if killed or not self.live_shells():
            self.end_processes()

    def end_processes(self) -> None:
        """From the host: as root each user id is the sandbox's own, so its processes are exactly the
        sandbox's (a container at its pids limit could not run a kill itself). As a normal user the
        container is restarted instead (its files stay, its processes go)."""
        if not self.started:
            return
        if not self.as_root:
            podman_command("restart", "-t", "0", self.name, check=False)
            return
        if self.root_inside:   # every process of the block's ids but the container's init
            block = of_uid_range(self.uid, self.uid + BLOCK - 1)
            end_processes(lambda pid: int(pid) not in self.container_pids and block(pid),
                          f"{self.spec.name} (podman sandbox {self.name})")
            return
        uids = [lease.uid for lease in (self.lease, self.verifier_lease) if lease is not None]
        if uids:
            end_processes(of_user(*uids), f"{self.spec.name} (podman sandbox {self.name})")

    def _become_verifier(self) -> None:
        if self.host_root is not None:
            give_verifier_room(self.host_root, self.limits)
        if self.lease is None or self.root_inside:
            return   # a normal user has no second user id to give the verifier (docs/agents.md); root inside: the tests run as root too
        self.verifier_lease = UidLease(*self.uids)
        self.uid = self.inside_uid = self.verifier_lease.uid
        self._own_workdir(self.uid)
        self._add_user_entries()

    def _open_to_verifier(self, folder: str) -> None:
        if self.image_root is not None:   # placed from the host as host root's: handed to root inside from there
            host = self.image_root.merged / folder.lstrip("/")
            host_paths.chown_tree(host, (self.uid, self.uid))
            subprocess.run(["chmod", "-R", "u+w", str(host)], check=True, capture_output=True, timeout=600)
            return
        self._exec_root(f"chown -R {self.inside_uid}:{self.inside_uid} {_q(folder)} && chmod -R u+w {_q(folder)}")

    # --- root inside: the image's root and what the agent changed in it ------------------------

    def system_changes(self) -> SystemChanges | None:
        """As the base; what podman writes into a container's root, and the sandbox's own mount points, are not
        the agent's."""
        if self.image_root is None:
            return None
        changes = self.image_root.changes()
        own = {self.workdir, "/tmp", "/var/tmp", "/dev", "/proc", "/sys", "/run", HOST_CA_BUNDLE, *PODMAN_FILES}
        changes.changes = [c for c in changes.changes
                           if not (c.kind == "added" and (c.path in own or (c.is_dir and any(
                               m.startswith(c.path.rstrip("/") + "/") for m in own))))]
        return changes

    def revert_system(self, paths: list[str]) -> None:
        """The container stops (nothing of the agent's is left running anyway), the paths get their image
        state back in the overlay, and it starts again on the same folders."""
        if self.image_root is None or not paths:
            return
        podman_command("stop", "-t", "0", self.name)
        self.image_root.revert(paths)
        started = subprocess.run([*PODMAN, "start", self.name], capture_output=True, timeout=120, cwd=self._conmon_folder())
        if started.returncode != 0:
            raise SandboxError(f"{self.spec.name}: podman could not start the container again after the restore: "
                               f"{started.stderr.decode(errors='replace').strip()[-300:]}")
        self._note_init()

    def writable_host_folders(self) -> dict[str, Path]:
        return {self.workdir: self.workspace} if self.workspace is not None else {}

    def agent_writable(self) -> list[str]:
        return [*super().agent_writable(), *self.made_folders]

    def _in_workspace(self, inside: str) -> str | None:
        """The path below the working directory, when `inside` is there and it is a host folder."""
        if self.workspace is None:
            return None
        if inside == self.workdir or inside.startswith(self.workdir.rstrip("/") + "/"):
            return os.path.relpath(inside, self.workdir)
        return None

    def copy_in(self, source: Path, target: str, read_only: bool = False) -> None:
        self._check_alive()
        source = Path(source)
        if not source.exists():
            raise SandboxError(f"{self.spec.name}: {source} does not exist (copying it to {target})")
        target = os.path.normpath(target if target.startswith("/") else os.path.join(self.workdir, target))
        relative = self._in_workspace(target)
        if read_only and (relative is not None or target == self.workdir or target.startswith(self.workdir.rstrip("/") + "/")):
            # its user owns the working directory, so it could replace a read-only file there
            raise SandboxError(f"{self.spec.name}: {target} is in {self.workdir}, which the sandbox can write; "
                               "read-only files need a folder of their own")
        if relative is not None:
            try:
                host_paths.copy_in(source, self.workspace, "" if relative == "." else relative, (self.uid, self.uid))
            except SandboxError as err:
                raise SandboxError(f"{self.spec.name}: copying to {target}: {err}") from None
            return
        self.place([(source, target, read_only)])

    def place(self, entries: list[tuple[Path, str, bool]]) -> None:
        """Every entry in one `podman cp` of a tar stream and one exec that sets owners and modes (each
        podman call is a round trip of a tenth of a second or more)."""
        self._check_alive()
        direct = [(s, t, r) for s, t, r in entries if self._in_workspace(os.path.normpath(t)) is not None]
        for source, target, read_only in direct:
            self.copy_in(source, target, read_only)
        rest = [(Path(s), os.path.normpath(t), r) for s, t, r in entries if (s, t, r) not in direct]
        if not rest:
            return
        if not self.image and self.image_root is None:   # the host view's /usr and /etc are bound read-only
            for _, target, _ in rest:
                if "/" + target.strip("/").split("/")[0] in SYSTEM_FOLDERS:
                    raise SandboxError(f"{self.spec.name}: cannot copy into {target} (a system folder of the sandbox); "
                                       f"{BUILD_HINT}")
        if self.image_root is not None:
            self._place_in_root(rest)
            return
        # the folders the copy makes for a writable file are the sandbox user's, as bubblewrap's are: in
        # Docker they are root's, and the agent is root there (a solution writes next to its input)
        parents = sorted({folder for _, target, read_only in rest if not read_only for folder in _parents(target)}
                         - {folder for _, target, read_only in rest if read_only for folder in _parents(target)})
        made = self._exec_root(f"for d in {' '.join(_q(p) for p in parents)}; do [ -e \"$d\" ] || echo \"$d\"; done"
                               ).stdout.decode(errors="replace").splitlines() if parents else []
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w") as tar:
            for source, target, _ in rest:
                if not source.exists():
                    raise SandboxError(f"{self.spec.name}: {source} does not exist (copying it to {target})")
                tar.add(source, arcname=target.lstrip("/"))
        podman_command("cp", "-", f"{self.name}:/", input=archive.getvalue())
        fixes = [f"chown {self.inside_uid}:{self.inside_uid} {_q(folder)}" for folder in made if folder]
        if self.role != "verifier":   # made for the verifier after the hand-over, they are its own
            self.made_folders += [folder for folder in made if folder and os.path.dirname(folder) not in made]
        for _, target, read_only in rest:
            fixes.append(f"chown -R 0:0 {_q(target)} && chmod -R a+rX,go-w {_q(target)}" if read_only
                         else f"chown -R {self.inside_uid}:{self.inside_uid} {_q(target)}")
        self._exec_root(" && ".join(fixes))

    def _place_in_root(self, entries: list[tuple[Path, str, bool]]) -> None:
        """Root inside: files go in through the overlay from the host, following no link; what stood at each
        target is replaced whole (the agent could make any folder, /verifier-records with forged records
        among them); read-only files are host root's, an id the sandbox's namespace does not map, so even
        its root cannot change them."""
        for source, target, read_only in entries:
            if not source.exists():
                raise SandboxError(f"{self.spec.name}: {source} does not exist (copying it to {target})")
            relative = target.lstrip("/")
            try:
                host_paths.remove(self.image_root.merged, relative)
                host_paths.copy_in(source, self.image_root.merged, relative, None if read_only else (self.uid, self.uid),
                                   clear_bits=0o022 if read_only else 0)
            except SandboxError as err:
                raise SandboxError(f"{self.spec.name}: copying to {target}: {err}") from None

    def copy_out(self, source: str, target: Path, links: bool = False) -> None:
        self._check_alive()
        source = os.path.normpath(source if source.startswith("/") else os.path.join(self.workdir, source))
        relative = self._in_workspace(source)
        if relative is not None:
            host_paths.copy_out(self.workspace, "" if relative == "." else relative, Path(target),
                                f"{self.spec.name}: {source}", links)
            return
        if self.image_root is not None:   # the container's root is dockyard's overlay: read it from the host
            host_paths.copy_out(self.image_root.merged, source.lstrip("/"), Path(target), f"{self.spec.name}: {source}",
                                links)
            return
        kind = self._exec_root(f"test -L {_q(source)} && echo link || (test -e {_q(source)} && echo ok)", check=False)
        if kind.stdout.decode().strip() != "ok":
            raise SandboxError(f"{self.spec.name}: {source} does not exist in the sandbox (or is a link)")
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        podman_command("cp", f"{self.name}:{source}", str(target))

    def _teardown(self) -> None:
        for service in self.spec.services:
            podman_command("rm", "-f", "-t", "0", self._service_name(service), check=False)
        podman_command("rm", "-f", "-t", "0", self.name, check=False)
        if self.network is not None:
            self.network.close()
        if self.image_root is not None:
            self.image_root.close()
        if self.namespace is not None:
            self.namespace.close()
        if self.root_dir is not None:
            shutil.rmtree(self.root_dir, ignore_errors=True)
        if self.host_root is not None:
            unmount(self.host_root)
            shutil.rmtree(self.host_root, ignore_errors=True)
        for lease in (self.lease, self.verifier_lease):
            if lease is not None:
                lease.release()
