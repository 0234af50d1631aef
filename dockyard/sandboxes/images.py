"""Task images: a task's Dockerfile built for real with podman, once, and kept.

`env.sandbox.task_images: build` makes every task with a Dockerfile run on its own image, built by
`podman build` (buildah: Docker's own parsing of continuations, comments, heredocs, ARG, COPY
--chown, USER, SHELL, multi-stage), so RUN lines take effect in both sandbox kinds: podman runs the
image, bubblewrap runs on the image's root folder exported next to it.

What goes in is what a registry-less machine can give: every `FROM` of a published base is mapped
through `env.sandbox.base_images` (`{"ubuntu:24.04": "localhost/dockyard-base:bookworm"}`) to an image
already in the local store; a base neither mapped nor there takes `env.sandbox.default_base_image`.
Each substitution is announced in the task's notes. Nothing is pulled (`--pull=never`); RUN lines get this machine's
network (the Debian and PyPI registries here) and its CA bundle at the place Debian's tools read it.

The cache key is the hash of the rewritten Dockerfile, every file of the build context (path, mode,
bytes) and the id of each base image: the same task on the same bases is built once per machine, and a
changed file or base builds anew. Images are tagged `localhost/dockyard-task:<key>`; exported roots
live in `env.sandbox.image_cache/<key>/rootfs`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from dockyard.sandboxes.base import HOST_CA_BUNDLE, SandboxError
from dockyard.sandboxes.podman import PODMAN, podman_command

TAG_PREFIX = "localhost/dockyard-task"
BUILD_TIMEOUT_S = 3600.0
# root here lacks CAP_SYS_RESOURCE: podman's default rlimits cannot be set (containers-lab.md)
BUILD_ULIMITS = ["--ulimit", "nofile=20000:20000", "--ulimit", "nproc=4096:4096"]


class ImageBuildError(SandboxError):
    """A task image could not be built; the message names the task, the line or base, and the log."""


@dataclass
class TaskImage:
    tag: str
    key: str
    workdir: str                                   # the image's WORKDIR ("/" when it sets none, as Docker)
    env: dict[str, str]                            # the image's ENV, PATH included
    user: str                                      # the image's USER ("" = root)
    rootfs: Path | None = None                     # exported root folder (bubblewrap), when asked for
    notes: list[str] = field(default_factory=list)
    built_now: bool = False
    seconds: float = 0.0
    services: dict[str, "TaskImage"] = field(default_factory=dict)   # a task's compose services' images, by name


# --- the Dockerfile's FROM lines ------------------------------------------------------------

def logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, instruction) as Docker reads them: comment lines go before continuations
    are joined (an indented `# ...` inside a continued RUN does not end it), blank lines too."""
    escape = "\\"
    lines, current, start = [], "", 0
    directives = True
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if directives:
            match = re.match(r"#\s*escape\s*=\s*(\S)\s*$", stripped, re.IGNORECASE)
            if match:
                escape = match.group(1)
                continue
            if not re.match(r"#\s*\w+\s*=", stripped):
                directives = False
        if stripped.startswith("#") or (current and not stripped):
            continue
        if not current:
            start = number
        if stripped.endswith(escape):
            current += raw.rstrip()[:-1] + " "
            continue
        if current or stripped:
            lines.append((start, (current + raw).strip()))
        current = ""
    if current.strip():
        lines.append((start, current.strip()))
    return lines


def _substitute(value: str, args: dict[str, str]) -> str:
    def one(match: re.Match) -> str:
        name, op, word = match.group(1) or match.group(4), match.group(2), match.group(3) or ""
        have = args.get(name, "")
        if op == ":-":
            return have or word
        if op == ":+":
            return word if have else ""
        return have
    return re.sub(r"\$\{(\w+)(?:(:[-+])([^}]*))?\}|\$(\w+)", one, value)


def normalise_ref(ref: str) -> str:
    """`ubuntu` and `docker.io/library/ubuntu:latest` are one name (a digest is kept as written)."""
    name = ref.strip()
    if "@" not in name and ":" not in name.rsplit("/", 1)[-1]:
        name += ":latest"
    first = name.split("/", 1)[0]
    if "/" not in name:
        name = "docker.io/library/" + name
    elif "." not in first and ":" not in first and first != "localhost":
        name = "docker.io/" + name
    return name


# published image families whose Dockerfiles count on more than the Debian base gives: `FROM python:...`
# runs `python` and `pip install` (tools/build_base_image.sh makes DEFAULT-python for them)
FAMILY_SUFFIXES = {"docker.io/library/python": "-python"}


def family_base(asked: str, default: str | None, in_store) -> str | None:
    """The default base for `asked`: its family's flavour of the default where there is one here."""
    if default is None:
        return None
    repository = normalise_ref(asked).rsplit(":", 1)[0].split("@")[0]
    suffix = FAMILY_SUFFIXES.get(repository)
    return default + suffix if suffix and in_store(default + suffix) else default


@dataclass
class BaseChoice:
    asked: str
    used: str
    line: int


def rewrite_froms(text: str, dockerfile: Path, base_images: dict[str, str], default: str | None,
                  in_store) -> tuple[str, list[BaseChoice]]:
    """The Dockerfile with each external FROM mapped to a local image (stage names left alone), and
    what was asked and used. ImageBuildError names a base that is neither mapped nor in the store."""
    mapping = {normalise_ref(k): v for k, v in base_images.items()}
    args: dict[str, str] = {}
    stages: set[str] = set()
    choices: list[BaseChoice] = []
    replacements: dict[int, tuple[str, str]] = {}
    for number, line in logical_lines(text):
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "ARG" and not choices:    # ARGs before the first FROM are FROM's variables
            name, _, value = rest.strip().partition("=")
            args[name.strip()] = value.strip().strip('"').strip("'")
        if keyword != "FROM":
            continue
        words = [w for w in rest.split() if not w.startswith("--")]
        if not words:
            raise ImageBuildError(f"{dockerfile}:{number}: FROM without an image")
        written = words[0]
        asked = _substitute(written, args)
        if len(words) >= 3 and words[1].lower() == "as":
            stages.add(words[2].lower())
        if asked.lower() in stages - ({words[2].lower()} if len(words) >= 3 else set()) or asked == "scratch":
            continue
        used = mapping.get(normalise_ref(asked))
        if used is None and in_store(asked):
            used = asked
        if used is None:
            used = family_base(asked, default, in_store)
        if used is None:
            raise ImageBuildError(
                f"{dockerfile}:{number}: FROM {asked}: not in this machine's image store and not mapped in "
                "env.sandbox.base_images (nothing is pulled; map it to a local base, or set "
                "env.sandbox.default_base_image, e.g. to the one tools/build_base_image.sh builds)")
        if not in_store(used):
            raise ImageBuildError(f"{dockerfile}:{number}: FROM {asked} maps to {used}, which is not in this machine's "
                                  "image store (env.sandbox.base_images / default_base_image; tools/build_base_image.sh builds one)")
        choices.append(BaseChoice(asked, used, number))
        if used != asked:
            replacements[number] = (written, used)
    if not replacements:
        return text, choices
    out = text.splitlines(keepends=True)
    for number, (written, used) in replacements.items():
        out[number - 1] = out[number - 1].replace(written, used, 1)
    return "".join(out), choices


# --- heredocs (BuildKit syntax; the buildah of Debian 12's podman does not read them) ----------

_HEREDOC = re.compile(r"<<(-?)([\"']?)([A-Za-z_][A-Za-z0-9_]*)\2")
_INSTRUCTION = re.compile(r"^\s*(RUN|COPY|ADD)\s", re.IGNORECASE)


def _b64(body: str) -> str:
    import base64
    return base64.b64encode(body.encode()).decode()


def expand_heredocs(text: str) -> str:
    """`RUN <<EOF` scripts, `RUN cmd <<EOF` inputs and `COPY <<EOF path` files rewritten as plain RUN
    lines that write each body from base64 to a file first, so any builder runs them as BuildKit would."""
    lines, out, i = text.splitlines(), [], 0
    while i < len(lines):
        line = lines[i]
        match = _INSTRUCTION.match(line)
        markers = list(_HEREDOC.finditer(line)) if match else []
        if not markers:
            out.append(line)
            i += 1
            continue
        i += 1
        bodies = []
        for marker in markers:
            body = []
            while i < len(lines) and (lines[i].lstrip("\t") if marker.group(1) else lines[i]) != marker.group(3):
                body.append(lines[i].lstrip("\t") if marker.group(1) else lines[i])
                i += 1
            i += 1   # the delimiter
            bodies.append("\n".join(body) + "\n")
        keyword = match.group(1).upper()
        files = [f"/tmp/.dockyard-heredoc-{n}" for n in range(len(bodies))]
        writes = " && ".join(f"echo {_b64(b)} | base64 -d > {f}" for b, f in zip(bodies, files))
        cleanup = f"rm -f {' '.join(files)}"
        rest = line[match.end():]
        if keyword == "RUN":
            flags = re.match(r"((?:--\S+\s+)*)", rest).group(1)
            command = rest[len(flags):]
            if _HEREDOC.fullmatch(command.strip()):   # the body is the script: its shebang or the shell runs it
                run = (f"if head -c2 {files[0]} | grep -q '#!'; then chmod +x {files[0]} && {files[0]}; "
                       f"else sh -e {files[0]}; fi")
            else:                                     # each marker becomes the body on stdin
                for marker, name in zip(markers, files):
                    command = command.replace(marker.group(0), f"< {name}", 1)
                run = command.strip()
            out.append(f"RUN {flags}{writes} && ({run}); status=$?; {cleanup}; exit $status")
        else:   # COPY / ADD <<EOF target: a file with the body (relative to WORKDIR, as COPY)
            words = rest.split()
            chown = next((w.split("=", 1)[1] for w in words if w.startswith("--chown=")), None)
            chmod = next((w.split("=", 1)[1] for w in words if w.startswith("--chmod=")), None)
            target = [w for w in words if not w.startswith("--") and not _HEREDOC.fullmatch(w)][-1]
            steps = []
            for marker, body in zip(markers, bodies):
                path = target.rstrip("/") + "/" + marker.group(3) if target.endswith("/") or len(markers) > 1 else target
                steps.append(f"mkdir -p \"$(dirname {path})\" && echo {_b64(body)} | base64 -d > {path}"
                             + (f" && chown {chown} {path}" if chown else "") + (f" && chmod {chmod} {path}" if chmod else ""))
            out.append("RUN " + " && ".join(steps))
    return "\n".join(out) + "\n"


# --- the cache key ----------------------------------------------------------------------------

def _context_files(context: Path) -> list[Path]:
    ignore = context / ".dockerignore"
    patterns = [p.strip() for p in ignore.read_text().splitlines() if p.strip() and not p.startswith("#")] \
        if ignore.is_file() else []
    files = []
    for path in sorted(context.rglob("*")):
        relative = path.relative_to(context).as_posix()
        if patterns and any(Path(relative).match(p.lstrip("/")) or relative.startswith(p.strip("/") + "/")
                            for p in patterns if not p.startswith("!")):
            continue
        files.append(path)
    return files


def cache_key(dockerfile_text: str, context: Path, base_ids: list[str]) -> str:
    digest = hashlib.sha256()
    digest.update(dockerfile_text.encode())
    for base in base_ids:
        digest.update(b"\0base\0" + base.encode())
    for path in _context_files(context):
        info = path.lstat()
        digest.update(b"\0" + path.relative_to(context).as_posix().encode() + b"\0" + oct(info.st_mode).encode())
        if path.is_symlink():
            digest.update(os.readlink(path).encode())
        elif path.is_file():
            with open(path, "rb") as data:
                for chunk in iter(lambda: data.read(1 << 20), b""):
                    digest.update(chunk)
    return digest.hexdigest()[:24]


# --- podman -------------------------------------------------------------------------------------

def in_store(image: str) -> bool:
    return shutil.which("podman") is not None and podman_command("image", "exists", image, check=False).returncode == 0


def image_id(image: str) -> str:
    return podman_command("image", "inspect", "--format", "{{.Id}}", image).stdout.decode().strip()


def image_config(tag: str) -> tuple[str, dict[str, str], str, list[str]]:
    """(WORKDIR, ENV, USER, ENTRYPOINT) of a built image, as Docker would start a container of it."""
    info = json.loads(podman_command("image", "inspect", tag).stdout)[0]
    config = info.get("Config") or {}
    env = dict(item.split("=", 1) for item in config.get("Env") or [] if "=" in item)
    return config.get("WorkingDir") or "/", env, config.get("User") or "", list(config.get("Entrypoint") or [])


def default_cache() -> Path:
    return Path("/var/cache/dockyard/task-images") if os.geteuid() == 0 else \
        Path.home() / ".cache" / "dockyard" / "task-images"


def closed_ancestor(path: Path) -> Path | None:
    """The first existing folder on the way to `path` that others may not enter (mode without o+x)."""
    for folder in [*reversed(path.absolute().parents), path.absolute()]:
        if folder.exists() and not folder.stat().st_mode & 0o001:
            return folder
    return None


class ImageBuilder:
    """Builds task images on this machine (one build at a time: podman's storage lock serialises them
    anyway, and two threads must not build the same key twice)."""

    def __init__(self, base_images: dict[str, str], default_base: str | None, cache_dir: str | Path | None,
                 export_rootfs: bool, bound_by_users: bool = True):
        self.base_images, self.default_base = dict(base_images), default_base
        self.cache_dir = Path(os.path.expanduser(str(cache_dir or default_cache())))
        self.export_rootfs = export_rootfs
        self._lock = threading.Lock()
        # an unprivileged bubblewrap sandbox binds the exported root itself (root inside reaches it through
        # an overlay that dockyard mounts, which needs no way in for the sandbox's users)
        if export_rootfs and bound_by_users and os.geteuid() == 0:
            closed = closed_ancestor(self.cache_dir)
            if closed:
                raise ImageBuildError(f"env.sandbox.image_cache: {self.cache_dir} is below {closed}, which the "
                                      "sandboxes' users cannot pass through (bubblewrap runs on the root folders "
                                      "kept there); choose a folder everyone may enter")

    @staticmethod
    def problem() -> str | None:
        if shutil.which("podman") is None:
            return ("env.sandbox.task_images: build needs podman to build task images (`apt-get install podman "
                    "runc catatonit`), or set it to host")
        return None

    def image_for(self, name: str, dockerfile: Path, context: Path, rebuild: bool = False,
                  export: bool = True) -> TaskImage:
        """The task's image, built if missing; `rebuild`: built again from nothing (no layer reused);
        `export`: its root folder too, where the sandboxes run on one (a compose service's image is only
        ever run by podman)."""
        with self._lock:
            return self._image_for(name, dockerfile, context, rebuild, export)

    def _image_for(self, name: str, dockerfile: Path, context: Path, rebuild: bool, export: bool = True) -> TaskImage:
        started = time.monotonic()
        try:
            text = dockerfile.read_text()
        except (OSError, UnicodeDecodeError) as err:
            raise ImageBuildError(f"task {name}: cannot read {dockerfile}: {err}") from None
        rewritten, choices = rewrite_froms(expand_heredocs(text), dockerfile, self.base_images, self.default_base,
                                         in_store)
        key = cache_key(rewritten, context, [image_id(choice.used) for choice in choices])
        tag = f"{TAG_PREFIX}:{key}"
        folder = self.cache_dir / key
        built_now = rebuild or not in_store(tag)
        if built_now:
            (folder / "rootfs.complete").unlink(missing_ok=True)
            self._build(name, rewritten, dockerfile, context, tag, folder, rebuild)
        workdir, env, user, entrypoint = image_config(tag)
        rootfs = self._rootfs(tag, folder) if self.export_rootfs and export else None
        notes = [f"FROM {c.asked} built on {c.used}" for c in choices if c.asked != c.used]
        notes.append(f"image {'built' if built_now else 'cached'} ({key})")
        if entrypoint:   # a task whose services start there (a server, /etc/hosts entries) will miss them
            notes.append(f"the image's ENTRYPOINT {' '.join(entrypoint)[:80]} is not run: the sandbox runs the "
                         "agent's commands, not the container's")
        if user and user not in ("root", "0"):
            notes.append(f"the image's USER {user} is not who runs the commands: the sandbox's own user does")
        return TaskImage(tag, key, workdir, env, user, rootfs, notes, built_now, time.monotonic() - started)

    def _build(self, name: str, rewritten: str, dockerfile: Path, context: Path, tag: str, folder: Path,
               no_cache: bool) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o755)
        log = folder / "build.log"
        volumes = ["--volume", f"{HOST_CA_BUNDLE}:{HOST_CA_BUNDLE}:ro"] if os.path.isfile(HOST_CA_BUNDLE) else []
        with tempfile.NamedTemporaryFile("w", suffix=".Dockerfile", dir=folder, delete=False) as written:
            written.write(rewritten)
        try:
            with open(log, "w") as out:
                result = subprocess.run([*PODMAN, "build", "--pull=never", "--network=host", *BUILD_ULIMITS, *volumes,
                                         "--layers", *(["--no-cache"] if no_cache else []), "-t", tag, "-f", written.name, str(context)],
                                        stdout=out, stderr=subprocess.STDOUT, timeout=BUILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise ImageBuildError(f"task {name}: building {dockerfile} took over {BUILD_TIMEOUT_S:.0f} s (log: {log})") \
                from None
        finally:
            os.unlink(written.name)
        if result.returncode != 0:
            raise ImageBuildError(f"task {name}: building {dockerfile} failed: {failing_step(log.read_text())} "
                                  f"(whole log: {log})")

    def _rootfs(self, tag: str, folder: Path) -> Path:
        """The image's files as a root folder (bubblewrap binds its top-level folders read-only)."""
        rootfs, done = folder / "rootfs", folder / "rootfs.complete"
        if done.is_file():
            return rootfs
        shutil.rmtree(rootfs, ignore_errors=True)
        rootfs.mkdir(parents=True)
        container = podman_command("create", tag, "true").stdout.decode().strip()
        try:
            export = subprocess.Popen([*PODMAN, "export", container], stdout=subprocess.PIPE)
            untar = subprocess.run(["tar", "-x", "--numeric-owner", "-C", str(rootfs)], stdin=export.stdout,
                                   capture_output=True, timeout=BUILD_TIMEOUT_S)
            export.stdout.close()
            if export.wait(timeout=60) != 0 or untar.returncode != 0:
                raise ImageBuildError(f"exporting {tag} to {rootfs} failed: {untar.stderr.decode(errors='replace')[-300:]}")
        finally:
            podman_command("rm", "-f", container, check=False)
        rootfs.chmod(0o755)
        done.write_text(tag + "\n")
        return rootfs


def failing_step(log: str) -> str:
    """The build step that failed and its last output lines, one line for a table."""
    steps = re.findall(r"^STEP \d+/\d+: .*$", log, re.MULTILINE)
    tail = [line for line in log.strip().splitlines()[-4:] if line.strip()]
    where = steps[-1] if steps else "before the first step"
    return f"{where[:200]} -> {' | '.join(line.strip()[:200] for line in tail)}"
