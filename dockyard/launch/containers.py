"""cluster.container: every step of the job (trainer tasks, rollout and teacher servers) in a container.

Each runtime gets the same thing to run: the image's Python started guarded (launch/startup_guard.py)
through `dockyard.launch.container_entry`, which keeps only the variables that belong in the step
(container_entry.py) and recovers the per-task ones a runtime drops. What differs is how the runtime
is asked:

    slurm_oci     srun --container=<job folder>/oci/<component>   (a bundle per component, made at submit)
    pyxis         srun --container-image=IMAGE --container-mounts=... --container-workdir=...
    apptainer     srun ... apptainer exec --bind ... --pwd ... IMAGE  <command>
    charliecloud  srun ... ch-run -b SRC:DST ... -c DIR <job folder>/charliecloud/<component> -- <command>
                  (the image's root linked per component, with the mounts' targets made: ch-run binds only
                  onto folders that exist in the image, and cannot make them in a read-only one)
    podman        srun ... <podman_step.sh> run --rm --network=host ... IMAGE <command>

The submit folder, the job folder, the run's log and checkpoint folders, and the Slurm client's
configuration and munge socket (the driver starts server steps and requeues the job from inside) are
mounted at their own paths, so every path of the config means the same inside and out.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from dockyard.config.constraints.containers import parse_mount
from dockyard.config.errors import Problem
from dockyard.config.field_reads import ENV as FIELD_READS
from dockyard.config.schema import MasterConfig
from dockyard.errors import DockyardError

COMPONENTS = ("trainer", "rollout", "teacher")
HOST_FILES = ("/etc/hosts", "/etc/resolv.conf", "/etc/passwd", "/etc/group")
MUNGE_SOCKET_FOLDER = "/run/munge"


# what of a shared configuration folder the Slurm clients read (slurm.conf names the others)
SLURM_CONFIG_FILES = ("slurm.conf", "gres.conf", "cgroup.conf", "topology.conf", "plugstack.conf", "oci.conf",
                      "acct_gather.conf", "job_container.conf")


def slurm_config_folder() -> Path:
    """Where the Slurm clients read their configuration: SLURM_CONF's folder where it is set."""
    conf = os.environ.get("SLURM_CONF")
    return Path(conf).parent if conf else Path("/etc/slurm")


def slurm_client_paths() -> list[Path]:
    """The host paths a Slurm client inside a container needs: the configuration folder (only its Slurm
    files where SLURM_CONF sits directly in /etc or /: the folder would hide the image's own) and munge's
    socket folder."""
    folder = slurm_config_folder()
    paths = [folder / name for name in SLURM_CONFIG_FILES] if folder in (Path("/"), Path("/etc")) else [folder]
    return [path for path in (*paths, Path(MUNGE_SOCKET_FOLDER)) if path.exists()]
# the wrapper runs on the node, outside any container: the driver (inside the trainer's container)
# renders the servers' steps with the submit host's path, which the job carries in this variable
PODMAN_STEP_VARIABLE = "DOCKYARD_PODMAN_STEP"
SUBMIT_DIR_VARIABLE = "DOCKYARD_SUBMIT_DIR"


class ContainerError(DockyardError):
    label = "cluster.container"
    exit_status = 2


@dataclass(frozen=True)
class Mount:
    source: str
    target: str
    read_only: bool = False

    @classmethod
    def parse(cls, text: str, where: str) -> "Mount":
        parsed = parse_mount(text)
        if parsed is None:
            raise ContainerError(f"{where}: {text!r} is not SRC:DST or SRC:DST:ro with absolute paths (no '..' in DST)")
        return cls(*parsed)

    def spec(self) -> str:
        return f"{self.source}:{self.target}" + (":ro" if self.read_only else "")


@dataclass(frozen=True)
class StepContainer:
    """How one component's steps run: its runtime, image, mounts, working folder, passed-in names."""

    component: str
    runtime: str
    image: str
    mounts: tuple[Mount, ...]
    workdir: str
    env: tuple[str, ...]
    python: str
    gpus: bool = False
    root: str = ""   # what the runtime is given when it is not the image itself (charliecloud's linked root)

    # --- what the steps' command lines get ---------------------------------------------------

    def srun_flags(self, job_folder: Path) -> list[str]:
        """Flags of srun itself (runtimes Slurm drives)."""
        if self.runtime == "slurm_oci":
            return [f"--container={bundle_folder(job_folder, self.component)}"]
        if self.runtime == "pyxis":
            return [f"--container-image={self.image}",
                    f"--container-mounts={','.join(m.spec() for m in self.mounts)}",
                    f"--container-workdir={self.workdir}", "--no-container-mount-home"]
        return []

    def entry(self, guarded: bool = True) -> list[str]:
        """Inside the container: the image's Python through the environment filter; a trainer task
        starts with the stop signals blocked (startup_guard.py), a server does not (it must hear TERM)."""
        guard = ["env", "--block-signal=USR2", "--block-signal=TERM"] if guarded else []
        return guard + [self.python, "-m", "dockyard.launch.container_entry", f"--keep={','.join(self.env)}",
                        f"--name={self.component} in {self.runtime} {self.image}",
                        *(["--task-from-node"] if self.runtime == "slurm_oci" else []), "--"]

    def wrapper(self) -> list[str]:
        """The command that starts the container, for runtimes srun does not drive (before entry())."""
        if self.runtime == "apptainer":
            # --contain, not --containall: that adds a PID namespace, where the step is PID 1 and a
            # SIGTERM from scancel or a preemption is ignored
            binds = [arg for m in self.mounts for arg in ("--bind", m.spec())]
            return ["apptainer", "exec", "--contain", "--no-home", *(["--nv"] if self.gpus else []), *binds,
                    "--pwd", self.workdir, self.image]
        if self.runtime == "charliecloud":
            # ch-run binds read-write; GPUs need the host's driver libraries injected once (ch-fromhost --nvidia).
            # It stops when USER is unset (a batch environment may lack it). It passes the image's ENV only from
            # the image's /ch/environment (--set-env), which the job's root has (write_charliecloud_root); a
            # .sqfs is given as it is, with whatever it holds
            binds = [f"--bind={m.source}:{m.target}" for m in self.mounts]
            image_env = ["--set-env", "--env-no-expand"] if self.root else []
            return ["env", f"USER={_user()}", "ch-run", *binds, *image_env, f"--cd={self.workdir}",
                    self.root or self.image, "--"]
        if self.runtime == "podman":
            volumes = [arg for m in self.mounts for arg in ("--volume", m.spec())]
            devices = ["--device", "nvidia.com/gpu=all"] if self.gpus else []   # CDI (nvidia-ctk cdi generate)
            # passthrough: the container writes to the step's own output, not through the podman client, which
            # Slurm's TERM ends at once (the trainer's "saving" lines, then its stdout, went nowhere: it died on a
            # closed pipe before its checkpoint)
            return [podman_step(), "run", "--rm", "--log-driver=passthrough", "--network=host", "--ipc=host", "--pid=host",
                    "--ulimit=nofile=20000:20000", "--ulimit=nproc=4096:4096", "--env-host", *devices,
                    *volumes, "--workdir", self.workdir, self.image]
        return []

    def server_command(self, argv: list[str]) -> list[str]:
        """A server step's program (argv[0] a Python, as outside) as it runs in this container; USR2 (the
        trainer's warning, which Slurm sends every step) ignored from before exec, as outside."""
        return self.wrapper() + self.entry(guarded=False) + [
            "bash", "-c", 'trap "" USR2; exec "$@"', "dockyard-server", self.python, *argv[1:]]

    def python_words(self) -> str:
        """submitit's `python` (a shell word list): the trainer tasks' interpreter, in the container."""
        return " ".join(shlex.quote(word) for word in self.wrapper() + self.entry() + [self.python])


def _user() -> str:
    import getpass

    try:
        return os.environ.get("USER") or getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())


def podman_step() -> str:
    return os.environ.get(PODMAN_STEP_VARIABLE) or str(Path(__file__).with_name("podman_step.sh"))


def _merged(cfg, component: str) -> dict:
    top, own = cfg.cluster.container, getattr(cfg.cluster.container, component)
    return {key: getattr(own, key) if getattr(own, key) is not None else getattr(top, key)
            for key in ("runtime", "image", "mounts", "env")}


def submit_folder() -> Path:
    """The folder dockyard-submit ran in; inside the job, where it said it was."""
    return Path(os.environ.get(SUBMIT_DIR_VARIABLE) or Path.cwd()).absolute()


def step_container(cfg, component: str, job_folder: Path | None = None) -> StepContainer | None:
    """The component's container, or None when its steps run in the submitting environment."""
    settings = _merged(cfg, component)
    if settings["runtime"] == "none":
        return None
    where = f"cluster.container{'.' + component if getattr(cfg.cluster.container, component).mounts else ''}.mounts"
    mounts = [Mount.parse(text, where) for text in settings["mounts"]]
    automatic = [submit_folder(), Path(cfg.logger.log_dir).absolute(),
                 Path(cfg.checkpointing.checkpoint_dir).absolute()]
    if job_folder is not None:
        automatic.append(Path(job_folder).absolute())
    # the Slurm client inside talks to slurmctld like the one outside: the same configuration (SLURM_CONF
    # passes in with the other SLURM_ variables), the same munge socket
    slurm_paths = slurm_client_paths()
    automatic += slurm_paths
    if settings["runtime"] == "slurm_oci":
        # runc binds nothing of the host's own (podman, apptainer and enroot bind these): node names must
        # resolve inside as outside (the driver reaches its servers by node name), the job's user be known
        automatic += [Path(p) for p in HOST_FILES if Path(p).exists()]
    # where the config's `imports:` modules are found (its folder, the submit folder): visible inside too
    automatic += [Path(f) for f in os.environ.get("DOCKYARD_IMPORT_PATH", "").split(os.pathsep) if f and Path(f).is_dir()]
    if os.environ.get(FIELD_READS):   # the suite's record of which settings the code reads, kept inside too
        automatic.append(Path(os.environ[FIELD_READS]))
    for path in automatic:
        if not any(_under(str(path), m.target) for m in mounts):
            read_only = str(path) in HOST_FILES or (path in slurm_paths and str(path) != MUNGE_SOCKET_FOLDER)
            mounts.append(Mount(str(path), str(path), read_only=read_only))
    workdir = cfg.cluster.container.workdir or str(submit_folder())
    image = settings["image"] or ""
    root = ""
    if settings["runtime"] == "charliecloud" and job_folder is not None and not _is_squashfs(image):
        root = str(charliecloud_folder(job_folder, component))
    return StepContainer(component, settings["runtime"], image, tuple(mounts), workdir,
                         tuple(settings["env"]), cfg.cluster.container.python, cfg.cluster.gpus_per_node > 0, root)


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


# --- slurm_oci: a bundle per component --------------------------------------------------------------


def bundle_folder(job_folder: Path, component: str) -> Path:
    return Path(job_folder).absolute() / "oci" / component


def image_rootfs(image: str) -> Path:
    """The root folder of an image folder `dockyard image build` wrote (or of a bundle given directly)."""
    folder = Path(image)
    return folder / "bundle" / "rootfs" if (folder / "bundle" / "rootfs").is_dir() else folder / "rootfs"


def _link_root(source: Path, target: Path) -> None:
    """The image's root as hard links (no space; the runtimes mount it read-only, so the image's files
    cannot be changed through them)."""
    made = subprocess.run(["cp", "-al", str(source), str(target)], capture_output=True, text=True)
    if made.returncode != 0:
        raise ContainerError(f"cannot link the image's root {source} into {target.parent} ({made.stderr.strip()}): "
                             "the job folder (cluster.slurm.folder) must be on the image's file system")


def write_bundle(container: StepContainer, job_folder: Path) -> Path:
    """The component's OCI bundle for `srun --container`: the image's config.json with this job's mounts
    and working folder, and its root file system as hard links to the image's (Slurm takes the root
    from BUNDLE/rootfs only, so one bundle per job; the links cost no space, the root is read-only so
    the image's files cannot be changed through them)."""
    source = image_rootfs(container.image)
    spec = json.loads((source.parent / "config.json").read_text())
    bundle = bundle_folder(job_folder, container.component)
    if bundle.exists():
        shutil.rmtree(bundle)
    bundle.mkdir(parents=True)
    _link_root(source, bundle / "rootfs")
    spec["root"] = {"path": "rootfs", "readonly": True}
    process = spec.setdefault("process", {})
    process["cwd"] = container.workdir
    process["terminal"] = False
    # the host's /dev/shm, not a fresh one: steps on one node hand weights over through it (refit by
    # shared memory, as outside)
    spec["mounts"] = [m for m in spec.get("mounts", []) if m.get("destination") not in
                      {mount.target for mount in container.mounts} | {"/dev/shm"}]
    spec["mounts"].append({"destination": "/dev/shm", "type": "bind", "source": "/dev/shm",
                           "options": ["rbind", "rw", "nosuid", "nodev"]})
    # the root is read-only: scratch space where programs expect it
    spec["mounts"] += [{"destination": path, "type": "tmpfs", "source": "tmpfs",
                        "options": ["nosuid", "nodev", "mode=1777"]} for path in ("/tmp", "/var/tmp")]
    spec["mounts"] += [{"destination": m.target, "type": "bind", "source": m.source,
                        "options": ["rbind", "ro" if m.read_only else "rw"]} for m in container.mounts]
    (bundle / "config.json").write_text(json.dumps(spec, indent=1))
    return bundle


# --- charliecloud: a root per component --------------------------------------------------------------


def charliecloud_folder(job_folder: Path, component: str) -> Path:
    return Path(job_folder).absolute() / "charliecloud" / component


def _is_squashfs(image: str) -> bool:
    return image.endswith((".sqfs", ".squashfs"))


def charliecloud_source(image: str) -> Path:
    """The root of a directory image: an image folder of `dockyard image build` (bundle/rootfs), an OCI
    bundle (rootfs), or a Charliecloud image directory itself (ch-image, ch-convert)."""
    rootfs = image_rootfs(image)
    return rootfs if rootfs.is_dir() else Path(image)


def write_charliecloud_root(container: StepContainer, job_folder: Path) -> Path:
    """The component's root for ch-run: the image's, linked, with a folder (or an empty file, for a file's
    mount) at every mount's target. A target reached through a link of the image's is refused: making it
    would follow the link out of the copy."""
    root = charliecloud_folder(job_folder, container.component)
    if root.exists():
        shutil.rmtree(root)
    root.parent.mkdir(parents=True, exist_ok=True)
    _link_root(charliecloud_source(container.image), root)
    for mount in container.mounts:
        place = root
        parts = Path(mount.target).parts[1:]
        for index, part in enumerate(parts):
            place = place / part
            if place.is_symlink():
                raise ContainerError(f"mount {mount.spec()}: {'/' + '/'.join(parts[:index + 1])} is a link in the "
                                     f"image {container.image}; mount at the folder it points to")
            if place.exists():
                continue
            if index == len(parts) - 1 and Path(mount.source).is_file():
                place.touch()
            else:
                place.mkdir()
    _write_image_environment(container.image, root)
    return root


def _write_image_environment(image: str, root: Path) -> None:
    """ch-run --set-env reads the image's ENV from /ch/environment (NAME=VALUE lines), which ch-image
    writes and an image of `dockyard image build` lacks: made from its bundle's config.json (PATH left
    to the entry). An image's own file is kept."""
    target = root / "ch" / "environment"
    if target.exists() or target.is_symlink() or target.parent.is_symlink():
        return
    config = image_rootfs(image).parent / "config.json"
    env = json.loads(config.read_text()).get("process", {}).get("env", []) if config.is_file() else []
    target.parent.mkdir(exist_ok=True)
    target.write_text("".join(f"{line}\n" for line in env if not line.startswith("PATH=")))


def write_step_roots(containers: list[StepContainer | None], job_folder: Path) -> list[Path]:
    """What each component's runtime needs in the job folder before the job starts: a bundle for
    slurm_oci, a linked root for charliecloud (directory images); nothing for the others."""
    written = []
    for container in containers:
        if container is None:
            continue
        if container.runtime == "slurm_oci":
            written.append(write_bundle(container, job_folder))
        elif container.runtime == "charliecloud" and container.root:
            written.append(write_charliecloud_root(container, job_folder))
    return written


# --- preflight: before the queue ------------------------------------------------------------------

TIMEOUT_S = 30


def _oci_conf() -> Path:
    return slurm_config_folder() / "oci.conf"


def _srun_has_pyxis() -> bool:
    try:
        out = subprocess.run(["srun", "--help"], capture_output=True, text=True, timeout=TIMEOUT_S).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "--container-image" in out


def runtime_problem(runtime: str) -> str | None:
    """Why the cluster (as this submit host sees it) does not offer the runtime, or None."""
    if runtime == "slurm_oci" and not _oci_conf().is_file():
        return f"Slurm's OCI support is not configured: no {_oci_conf()} (slurm/dev-cluster/start.sh writes one)"
    if runtime == "pyxis" and not _srun_has_pyxis():
        return "srun has no --container-image option: the pyxis plugin is not installed on this cluster"
    tools = {"apptainer": ("apptainer", "singularity"), "charliecloud": ("ch-run",), "podman": ("podman",)}
    if runtime in tools and not any(shutil.which(tool) for tool in tools[runtime]):
        return f"{' / '.join(tools[runtime])} is not on this host's PATH"
    return None


def image_problem(runtime: str, image: str) -> str | None:
    """Why the image cannot be used, or None (a registry reference pyxis pulls itself is not checked)."""
    if runtime == "slurm_oci":
        rootfs = image_rootfs(image)
        if not (rootfs.is_dir() and (rootfs.parent / "config.json").is_file()):
            return (f"{image} is not an image folder of `dockyard image build` (no bundle/config.json and "
                    "bundle/rootfs) nor an OCI bundle")
        if not os.access(rootfs, os.R_OK | os.X_OK):
            return f"{rootfs} cannot be read by this user"
        return None
    if runtime == "podman":
        try:
            found = subprocess.run(["podman", "--runtime", "runc", "image", "exists", image], capture_output=True,
                                   timeout=TIMEOUT_S).returncode == 0
        except (OSError, subprocess.SubprocessError):
            found = False
        return None if found else f"podman has no image {image} (dockyard image build makes localhost/dockyard:<key>)"
    if runtime == "charliecloud" and not _is_squashfs(image):
        source = charliecloud_source(image)
        if not (source / "bin").exists() or not (source / "etc").is_dir():
            return (f"{image} is neither an image folder of `dockyard image build`, a Charliecloud image "
                    "directory (a root with bin/ and etc/) nor a SquashFS image (.sqfs)")
        if not os.access(source, os.R_OK | os.X_OK):
            return f"{source} cannot be read by this user"
        return None
    looks_like_path = image.startswith(("/", "./", "../")) or image.endswith((".sqsh", ".sif"))
    if runtime == "pyxis" and not looks_like_path:
        return None
    path = Path(image)
    if not path.exists():
        return f"{image} does not exist"
    if not os.access(path, os.R_OK):
        return f"{image} cannot be read by this user"
    return None


def preflight_containers(cfg: MasterConfig, components: list[str], job_folder: Path) -> tuple[list[Problem], list[str]]:
    problems: list[Problem] = []
    notes: list[str] = []
    checked_runtimes: set[str] = set()
    for component in components:
        try:
            container = step_container(cfg, component, job_folder)
        except ContainerError as err:
            problems.append(Problem("cluster.container.mounts", str(err)))
            continue
        if container is None:
            continue
        own = getattr(cfg.cluster.container, component)
        field = f"cluster.container.{component}" if own.runtime or own.image else "cluster.container"
        if container.runtime not in checked_runtimes:
            checked_runtimes.add(container.runtime)
            why = runtime_problem(container.runtime)
            if why:
                problems.append(Problem(f"{field}.runtime", f"{container.runtime}: {why}"))
        why = image_problem(container.runtime, container.image)
        if why and Problem(f"{field}.image", why) not in problems:   # the components sharing one image: said once
            problems.append(Problem(f"{field}.image", why))
        mounts_field = f"cluster.container.{component}.mounts" if own.mounts is not None else "cluster.container.mounts"
        for mount in container.mounts:
            if not Path(mount.source).exists() and mount.source != str(job_folder.absolute()):
                problems.append(Problem(mounts_field, f"{mount.spec()}: the source {mount.source} does not exist"))
        model = Path(cfg.policy.model_name)
        if model.is_absolute() and model.exists() and not any(
                str(model) == m.target or str(model).startswith(m.target.rstrip("/") + "/") for m in container.mounts):
            problems.append(Problem(mounts_field, f"policy.model_name {model} is under no mount of the {component} "
                                    f"container: add {model.parent}:{model.parent}:ro (or a folder above it)"))
    if "pyxis" in checked_runtimes or "apptainer" in checked_runtimes:
        notes.append("pyxis / apptainer images: checked only as files here; the runtime reads them on the nodes")
    return problems, notes
