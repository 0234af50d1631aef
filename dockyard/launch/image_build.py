"""`dockyard image build`: the dockyard image (containers/dockyard.Containerfile) built without any
container registry, cached by the hash of what went in, and written in the forms the runtimes take.

    base (mmdebstrap, tools/build_base_image.sh) -> podman build of this checkout's dockyard
      -> <output>/<key>/bundle/{config.json, rootfs}   slurm_oci (cluster.container.image=<output>/<key>)
      -> localhost/dockyard:<key>                       podman
      -> <output>/<key>/dockyard.sqsh                   pyxis / enroot, where `enroot` is installed
      -> <output>/<key>/dockyard.sif                    apptainer, where `apptainer` is installed
      -> <output>/<key>/forms.txt                       the commands of the forms whose tools are missing

The key hashes the Containerfile, every file of dockyard's source and of llama.cpp's tools that goes
in, the base image's id,
the extras and the build arguments: the same checkout on the same base is built once per machine
(CI builds it once per run), a changed file builds anew. The build machine's pip settings (local
wheel folders, index mirrors, constraints, CA bundle) are passed to the build's RUN steps.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dockyard.errors import DockyardError

REPO = Path(__file__).resolve().parents[2]
CONTAINERFILE = REPO / "containers" / "dockyard.Containerfile"
BASE = "localhost/dockyard-base:bookworm"
TAG = "localhost/dockyard"
PODMAN = ["podman", "--runtime", "runc"]
ULIMITS = ["--ulimit", "nofile=20000:20000", "--ulimit", "nproc=4096:4096"]
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
DONE = "complete"
LOCK_TIMEOUT_S = 3600.0


class ImageError(DockyardError):
    label = ""
    exit_status = 1


def _run(cmd: list[str], what: str, log: Path | None = None, timeout: float = 3600) -> str:
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if log is not None:
        with open(log, "a") as out:
            out.write(f"$ {' '.join(cmd)}\n{result.stdout}{result.stderr}\n")
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
        raise ImageError(f"{what} failed (exit {result.returncode}){f'; log {log}' if log else ''}\n{tail}")
    return result.stdout


def _source_files() -> list[Path]:
    files = [REPO / "pyproject.toml", REPO / "README.md"]
    for path in sorted((REPO / "dockyard").rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and not path.name.endswith((".pyc", ".pyo")):
            files.append(path)
    return files


# what of llama.cpp `dockyard export gguf` runs (gguf_export.py): the converter with its modules and
# the quantizer, copied from the build machine's prepared folder (tools/prepare_llama_cpp.sh, which
# tools/install.sh runs: the same Debian as the image's base) rather than compiled again in the build
LLAMA_CPP_PARTS = ("convert_hf_to_gguf.py", "conversion", "gguf-py", "LICENSE", "build/bin/llama-quantize",
                   "build/bin/llama-simple")


def llama_cpp_files(say=lambda m: None) -> list[tuple[Path, Path]]:
    """(file on this machine, path in the build context) of llama.cpp's tools; prepared first if missing."""
    from dockyard.io.gguf_export import GGUFExportError, llama_cpp

    try:
        folder = llama_cpp()[0].parent
    except GGUFExportError:
        say("dockyard image build: preparing llama.cpp's tools (tools/prepare_llama_cpp.sh: PyPI, cmake, g++)")
        _run(["bash", str(REPO / "tools" / "prepare_llama_cpp.sh"), str(REPO / ".cache" / "llama.cpp")],
             "tools/prepare_llama_cpp.sh")
        folder = REPO / ".cache" / "llama.cpp"
    files = []
    for part in LLAMA_CPP_PARTS:
        path = folder / part
        if not path.exists():
            raise ImageError(f"{path} is missing from the prepared llama.cpp (run tools/prepare_llama_cpp.sh again)")
        found = sorted(p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts) \
            if path.is_dir() else [path]
        files += [(file, Path("llama.cpp") / file.relative_to(folder)) for file in found]
    return files


def context_files(say=lambda m: None) -> list[tuple[Path, Path]]:
    """Everything the build context holds: dockyard's source and llama.cpp's tools."""
    return [(path, path.relative_to(REPO)) for path in _source_files()] + llama_cpp_files(say)


def pip_settings() -> tuple[dict[str, str], list[str]]:
    """The build machine's pip settings as build arguments, and the local folders they name (mounted)."""
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    settings: dict[str, str] = {}
    for line in out.splitlines():
        key, _, value = line.partition("=")
        name = key.split(".", 1)[-1].strip()
        settings.setdefault(name, value.strip().strip("'\""))
    for name in ("find-links", "extra-index-url", "constraint", "cert"):
        variable = "PIP_" + name.upper().replace("-", "_")
        if os.environ.get(variable):
            settings[name] = os.environ[variable]
    args = {"PIP_" + name.upper().replace("-", "_"): settings[name]
            for name in ("find-links", "extra-index-url", "constraint", "cert") if settings.get(name)}
    folders = []
    for value in args.values():
        for word in value.split():
            path = word.removeprefix("file://").rstrip("/")
            if path.startswith("/") and Path(path).exists():
                # a local index's pages link to files beside it (<root>/simple -> <root>/files)
                folders.append(str(Path(path).parent) if Path(path).name == "simple" else path)
    return args, sorted(set(folders))


def cache_key(base_id: str, extras: str, build_args: dict[str, str], files: list[tuple[Path, Path]]) -> str:
    digest = hashlib.sha256()
    digest.update(CONTAINERFILE.read_bytes())
    for path, inside in files:
        digest.update(str(inside).encode() + b"\0" + path.read_bytes() + b"\0")
    digest.update(json.dumps([base_id, extras, sorted(build_args.items())]).encode())
    return digest.hexdigest()[:24]


def _bundle_spec(tag: str, rootfs: Path) -> dict:
    """runc's default spec made fit for Slurm's OCI mode (containers-lab.md): host network, PIDs and
    host name shared between het components; no terminal; the image's environment and folder."""
    with tempfile.TemporaryDirectory() as folder:
        _run(["runc", "spec", "-b", folder], "runc spec")
        spec = json.loads((Path(folder) / "config.json").read_text())
    inspect = json.loads(_run(PODMAN + ["image", "inspect", tag], "podman image inspect"))[0]
    config = inspect.get("Config") or {}
    spec.pop("hostname", None)
    spec["linux"]["namespaces"] = [n for n in spec["linux"]["namespaces"]
                                   if n["type"] not in ("pid", "network", "uts")]
    spec["process"].update(terminal=False, env=config.get("Env") or [], cwd=config.get("WorkingDir") or "/",
                           args=["/bin/true"])
    spec["root"] = {"path": "rootfs", "readonly": True}
    return spec


def build_image(output: Path, base: str = BASE, extras: str = "plane", force: bool = False,
                say=lambda m: print(m, file=sys.stderr, flush=True)) -> Path:
    """The image folder <output>/<key> (built now or found), with its forms. One build at a time per
    output folder: a second caller waits, then finds the first one's image in the cache."""
    import fcntl

    try:
        Path(output).mkdir(parents=True, exist_ok=True)
        lock = open(Path(output) / ".build.lock", "w")
    except OSError as err:
        raise ImageError(f"--output {output}: cannot make the image folder there ({err.strerror})") from None
    with lock:
        deadline, said = time.monotonic() + LOCK_TIMEOUT_S, False
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise ImageError(f"another build into {output} held {lock.name} for {LOCK_TIMEOUT_S:.0f} s; "
                                     "is one still running?") from None
                if not said:
                    say(f"dockyard image build: another build into {output} is running; waiting for it "
                        f"(up to {LOCK_TIMEOUT_S:.0f} s)")
                    said = True
                time.sleep(2)
        return _build_image(output, base, extras, force, say)


def _build_image(output: Path, base: str, extras: str, force: bool, say) -> Path:
    if not CONTAINERFILE.is_file():
        raise ImageError(f"{CONTAINERFILE} is missing: `dockyard image build` runs from a dockyard checkout")
    if shutil.which("podman") is None:
        raise ImageError("podman is not installed (tools/install.sh installs it)")
    started = time.perf_counter()
    if subprocess.run(PODMAN + ["image", "exists", base]).returncode != 0:
        script = REPO / "tools" / "build_base_image.sh"
        say(f"dockyard image build: making the base {base} ({script.name}: mmdebstrap, no registry)")
        _run(["bash", str(script), base], f"building the base {base}")
    base_id = _run(PODMAN + ["image", "inspect", "--format", "{{.Id}}", base], "podman image inspect").strip()
    build_args, folders = pip_settings()
    files = context_files(say)
    key = cache_key(base_id, extras, build_args, files)
    folder = Path(output).absolute() / key
    tag = f"{TAG}:{key}"
    in_store = subprocess.run(PODMAN + ["image", "exists", tag]).returncode == 0   # the podman form, removable apart
    if (folder / DONE).is_file() and in_store and not force:
        say(f"dockyard image build: {folder} is there (cached: key {key}); {time.perf_counter() - started:.1f} s")
        _link_latest(folder)
        return folder
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    log = folder / "build.log"
    with tempfile.TemporaryDirectory() as context:
        for path, inside in files:
            target = Path(context) / inside
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
        volumes = [arg for path in folders for arg in ("--volume", f"{path}:{path}:ro")]
        if Path(CA_BUNDLE).is_file() and CA_BUNDLE not in folders:   # where TLS is intercepted, the host's verifies
            volumes += ["--volume", f"{CA_BUNDLE}:{CA_BUNDLE}:ro"]
        args = [arg for name, value in sorted(build_args.items()) for arg in ("--build-arg", f"{name}={value}")]
        if "PIP_FIND_LINKS" in build_args:
            args += ["--build-arg", "TORCH_INDEX="]   # the local wheel folder holds the CPU torch
        say(f"dockyard image build: building {tag} from {CONTAINERFILE.name} on {base} (log {log})")
        _run(PODMAN + ["build", "--pull=never", "--network=host", *ULIMITS, *volumes, *args,
                       *(["--no-cache"] if force else []),
                       "--build-arg", f"BASE={base}", "--build-arg", f"EXTRAS={extras}", "-t", tag,
                       "-f", str(CONTAINERFILE), context], f"podman build of {tag}", log)
    built_s = time.perf_counter() - started
    _write_bundle(tag, folder / "bundle", log)
    forms = _other_forms(tag, folder, log)
    size = int(_run(PODMAN + ["image", "inspect", "--format", "{{.Size}}", tag], "podman image inspect").strip())
    (folder / "image.json").write_text(json.dumps({"tag": tag, "key": key, "base": base, "base_id": base_id,
                                                   "extras": extras, "build_s": round(built_s, 1),
                                                   "size_bytes": size}, indent=1))
    (folder / DONE).write_text(tag + "\n")
    _link_latest(folder)
    say(f"dockyard image build: {tag} built in {built_s:.0f} s, {size / 1e9:.2f} GB; forms in {folder}: "
        f"bundle/ (slurm_oci), podman {tag}{''.join(', ' + f for f in forms)}; "
        f"{time.perf_counter() - started:.0f} s in all")
    return folder


def _write_bundle(tag: str, bundle: Path, log: Path) -> None:
    rootfs = bundle / "rootfs"
    rootfs.mkdir(parents=True)
    container = _run(PODMAN + ["create", tag, "/bin/true"], "podman create", log).strip()
    try:
        export = subprocess.Popen(PODMAN + ["export", container], stdout=subprocess.PIPE)
        untar = subprocess.run(["tar", "-x", "-C", str(rootfs)], stdin=export.stdout, capture_output=True, text=True)
        export.wait()
        if export.returncode or untar.returncode:
            raise ImageError(f"exporting {tag} into {rootfs} failed: {untar.stderr.strip()[-500:]}")
    finally:
        subprocess.run(PODMAN + ["rm", "-f", container], capture_output=True)
    (bundle / "config.json").write_text(json.dumps(_bundle_spec(tag, rootfs), indent=1))


def _other_forms(tag: str, folder: Path, log: Path) -> list[str]:
    """enroot's .sqsh and apptainer's .sif where their tools exist; their commands written otherwise."""
    made, missing = [], []
    commands = {"enroot": ["enroot", "import", "-o", str(folder / "dockyard.sqsh"), f"podman://{tag}"],
                "apptainer": ["apptainer", "build", str(folder / "dockyard.sif"),
                              f"oci-archive://{folder / 'dockyard.oci.tar'}"]}
    for tool, command in commands.items():
        if shutil.which(tool) is None:
            missing.append((tool, command))
            continue
        if tool == "apptainer":
            _run(PODMAN + ["save", "--format", "oci-archive", "-o", str(folder / "dockyard.oci.tar"), tag],
                 "podman save", log)
        _run(command, f"{tool} conversion", log)
        made.append(Path(command[3] if tool == "enroot" else command[2]).name)
    lines = ["# forms of this image whose tools are not installed here; run these where they are:"]
    for tool, command in missing:
        if tool == "apptainer":
            lines.append(f"podman save --format oci-archive -o {folder / 'dockyard.oci.tar'} {tag}")
        lines.append(" ".join(command))
    (folder / "forms.txt").write_text("\n".join(lines) + "\n")
    return made


def _link_latest(folder: Path) -> None:
    latest = folder.parent / "latest"
    if latest.is_symlink() or latest.exists():
        latest.unlink()
    latest.symlink_to(folder.name)
