"""Per-row environments for published SWE-bench rows, made from the official harness's specification
of the row's repository and version (swe_harness.py) into cached podman images (sandboxes/images.py).

The harness's three layers, rebuilt without conda, docker or a registry:
1. a Python image: the base (env.sandbox.default_base_image, by default the Debian 12 image of
   tools/build_base_image.sh) with the interpreter the specification names. Debian's own python3.11 is
   in the base; other versions come from this machine's pyenv installs ($PYENV_ROOT/versions/X.Y.Z),
   copied into the image at the same path (their libpython is found there). A version this machine
   does not have is substituted by the nearest one it has, announced in the row's notes, or the row is
   refused by name (env.python_versions: nearest | exact).
2. an environment image per (repository, version): a venv at /opt/testbed-env with the specification's
   `packages` (a requirements file read from the repository at the row's environment_setup_commit, an
   environment.yml whose conda and pip dependencies are installed from PyPI, or a list of conda packages
   installed from PyPI under the same names) and `pip_packages`;
3. an instance image per row: the repository at base_commit in /testbed, the harness's repository
   install command, pre_install and install commands and the root-only eval_commands (django's locale)
   run there as root, then the harness's commit of what set-up changed, so that the agent's diff is its
   own work. The test run gets the specification's `export` lines.
Each layer is cached by the hash of its Dockerfile and files (images.py), so a row is built once per
machine and a row of the same repository and version shares the first two layers.
"""

from __future__ import annotations

import os
import re
import shlex
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from dockyard.envs import swe_harness
from dockyard.envs.swe_tasks import TESTBED, RepoStore, SweTask, SweTaskError
from dockyard.sandboxes.base import HOST_CA_BUNDLE
from dockyard.sandboxes.images import ImageBuilder, TaskImage
from dockyard.sandboxes.owners import owner_token
from dockyard.sandboxes.reaping import SWE_BUILD_PREFIX

VENV = "/opt/testbed-env"
SYSTEM_PYTHON = ("3.11", "/usr/bin/python3.11")   # Debian 12's, in the base image
DEFAULT_BASE = "localhost/dockyard-base:bookworm"
PYTHON_POLICIES = ("nearest", "exact")
PIP = f"PIP_CERT={HOST_CA_BUNDLE} PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore python -m pip"
_EXPORT = re.compile(r"^export\s+([A-Za-z_][A-Za-z0-9_]*)=(.*)$")


@dataclass
class RowEnvironment:
    image: TaskImage
    test_env: dict[str, str]          # the specification's `export` lines, for the test run
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0              # building (or finding) the three images


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version))


def pyenv_pythons(root: str | None = None) -> dict[str, Path]:
    """"3.9" -> the newest pyenv install of 3.9 on this machine ($PYENV_ROOT or ~/.pyenv)."""
    root = Path(root or os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    found: dict[str, Path] = {}
    for prefix in sorted(root.glob("[0-9]*.*"), key=lambda p: _version_key(p.name)):
        minor = ".".join(prefix.name.split(".")[:2])
        if re.fullmatch(r"\d+\.\d+\.\d+", prefix.name) and (prefix / "bin" / f"python{minor}").is_file():
            found[minor] = prefix
    return found


def choose_python(wanted: str, have: dict[str, Path | None], policy: str, where: str) -> tuple[str, str | None]:
    """(the version used, a note when it is not the one asked for); refused by name under `exact`."""
    if wanted in have:
        return wanted, None
    if policy == "exact" or not have:
        raise SweTaskError(f"{where}: needs Python {wanted}, which this machine does not have (it has "
                           f"{', '.join(sorted(have, key=_version_key)) or 'none'}; env.python_versions: nearest "
                           "substitutes the nearest)")
    target = _version_key(wanted)
    nearest = min(have, key=lambda v: (abs(_version_key(v)[0] - target[0]) * 100 + abs(_version_key(v)[1] - target[1]),
                                       -_version_key(v)[1]))
    return nearest, f"needs Python {wanted}, which this machine does not have: built on Python {nearest} instead"


def conda_to_pip(spec: str) -> str | None:
    """One conda package spec as a pip requirement (`numpy=1.19` -> `numpy==1.19.*`); None for python/pip."""
    spec = spec.strip()
    name = re.split(r"[=<>!~ ]", spec, maxsplit=1)[0]
    if not name or name.lower() in ("python", "pip"):
        return None
    rest = spec[len(name):].strip()
    if re.fullmatch(r"=[^=<>!~]+", rest):
        rest = "==" + rest[1:] + ("" if rest.count(".") >= 2 else ".*")
    return name + rest


def requirements_from_environment_yml(text: str, where: str) -> list[str]:
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as err:
        raise SweTaskError(f"{where}: its environment.yml is not YAML ({err})") from None
    found = []
    for item in data.get("dependencies") or []:
        if isinstance(item, dict):
            found += [str(entry) for entry in item.get("pip") or []]
        elif isinstance(item, str):
            converted = conda_to_pip(item.split("::")[-1])
            if converted:
                found.append(converted)
    return found


class EnvironmentBuilder:
    """The three images of each row, built once (per process: remembered; per machine: images.py's cache)."""

    def __init__(self, images: ImageBuilder, repos: RepoStore, base_image: str | None, python_policy: str = "nearest",
                 rebuild: bool = False):
        self.images, self.repos = images, repos
        self.base_image = base_image or DEFAULT_BASE
        self.python_policy, self.rebuild = python_policy, rebuild
        self._done: dict[str, RowEnvironment] = {}
        self._rebuilt: set[tuple[str, str]] = set()   # with `rebuild`, each layer once per process
        self._lock = threading.Lock()

    @classmethod
    def for_config(cls, sandboxes, repos: RepoStore, env_config) -> "EnvironmentBuilder | None":
        """The builder a config asks for (env.sandbox.task_images: build), else None (rows on the sandbox's Python)."""
        if sandboxes is None or sandboxes.images is None:
            return None
        return cls(sandboxes.images, repos, env_config.sandbox.default_base_image,
                   (env_config.model_extra or {}).get("python_versions", "nearest"))

    def spec(self, task: SweTask) -> dict:
        version = task.row.get("version")
        spec = swe_harness.spec_for(task.repo, version)
        published = task.row.get("image_name") or task.row.get("image")
        if spec is None and published:   # SWE-smith, SWE-Gym and SWE-bench 5's rows name their own images
            raise SweTaskError(f"{task.where}: runs on its published image {published}, which this machine cannot "
                               "pull (no registry), and the SWE-bench harness has no specification for "
                               f"{task.repo} to build one from: rows with their own images are not supported yet")
        if spec is None:
            known = swe_harness.known_versions(task.repo)
            raise SweTaskError(f"{task.where}: the SWE-bench harness has no specification for {task.repo}"
                               + (f" version {version!r} (it knows {', '.join(known)})" if known else
                                  " (not one of its repositories)") + "; give the row a test_cmd and set "
                               "env.environments: host to run it on the sandbox's own Python")
        if "python" not in spec:
            raise SweTaskError(f"{task.where}: {task.repo} is not a Python repository of the harness; only Python "
                               "rows get per-row environments here")
        return spec

    def environment_for(self, task: SweTask) -> RowEnvironment:
        with self._lock:
            if task.instance_id not in self._done:
                self._done[task.instance_id] = self._build(task)
            return self._done[task.instance_id]

    def _build(self, task: SweTask) -> RowEnvironment:
        spec = self.spec(task)
        self.repos.checkout(task)   # a missing repository or commit fails the row before anything is built
        have: dict[str, Path | None] = {**pyenv_pythons(), SYSTEM_PYTHON[0]: None}
        version, note = choose_python(str(spec["python"]), have, self.python_policy, task.where)
        notes = [note] if note else []
        with tempfile.TemporaryDirectory(prefix=f"{SWE_BUILD_PREFIX}{owner_token()}-") as scratch:
            scratch = Path(scratch)
            python_tag, python = self._python_image(version, have[version], scratch)
            env_tag, env_notes = self._env_image(task, spec, python_tag, python, scratch)
            notes += env_notes
            image = self._instance_image(task, spec, env_tag, scratch)
        exports = {}
        for line in spec.get("eval_commands", []):
            match = _EXPORT.match(line.strip())
            if match:
                exports[match.group(1)] = " ".join(shlex.split(match.group(2)))
        notes += image.notes
        return RowEnvironment(image, exports, notes)

    def _image(self, name: str, dockerfile: str, context: Path, scratch: Path) -> TaskImage:
        path = scratch / f"{name.replace('/', '_')}.Dockerfile"
        path.write_text(dockerfile)
        again = self.rebuild and (dockerfile, str(context)) not in self._rebuilt
        self._rebuilt.add((dockerfile, str(context)))
        return self.images.image_for(name, path, context, rebuild=again)

    def _python_image(self, version: str, prefix: Path | None, scratch: Path) -> tuple[str, str]:
        if prefix is None:
            return self.base_image, SYSTEM_PYTHON[1]
        # pyenv's libpython is found by its absolute path: the install keeps its place (/root opened for it)
        lines = [f"FROM {self.base_image}", f"COPY . {prefix}/"]
        if str(prefix).startswith("/root/"):
            lines.append("RUN chmod o+x /root")
        image = self._image(f"python {prefix.name}", "\n".join(lines) + "\n", prefix, scratch)
        return image.tag, f"{prefix}/bin/python{version}"

    def _env_image(self, task: SweTask, spec: dict, python_tag: str, python: str, scratch: Path) -> tuple[str, list[str]]:
        context = scratch / "env"
        context.mkdir()
        notes, steps = [], []
        packages = str(spec.get("packages", "") or "").strip()
        if packages == "requirements.txt":
            (context / "requirements.txt").write_text(self._requirements(task))
            steps.append(f"{PIP} install -r /opt/testbed-spec/requirements.txt")
        elif packages == "environment.yml":
            text = self._repo_file(task, swe_harness.environment_file_paths(task.repo), "environment.yml")
            (context / "environment.txt").write_text("\n".join(requirements_from_environment_yml(text, task.where)) + "\n")
            steps.append(f"{PIP} install -r /opt/testbed-spec/environment.txt")
            notes.append("environment.yml's conda dependencies installed from PyPI under the same names")
        elif packages:
            wanted = [p for p in (conda_to_pip(word) for word in packages.split()) if p]
            if wanted:
                (context / "conda-packages.txt").write_text("\n".join(wanted) + "\n")
                steps.append(f"{PIP} install -r /opt/testbed-spec/conda-packages.txt")
                notes.append(f"conda packages installed from PyPI under the same names ({' '.join(wanted)})")
        if spec.get("pip_packages"):
            (context / "pip-packages.txt").write_text("\n".join(spec["pip_packages"]) + "\n")
            steps.append(f"{PIP} install -r /opt/testbed-spec/pip-packages.txt")
        # the harness's conda environments come with a recent pip; an old Python's own (3.6's 18.1) knows no
        # manylinux2014 wheels and would build from source what has a wheel
        lines = [f"FROM {python_tag}", "COPY . /opt/testbed-spec/", f"RUN {python} -m venv {VENV}",
                 f"ENV VIRTUAL_ENV={VENV} PATH={VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                 f"RUN {PIP} install --upgrade pip", *(f"RUN {step}" for step in steps)]
        image = self._image(f"{task.repo} {task.row.get('version')} environment", "\n".join(lines) + "\n", context, scratch)
        return image.tag, notes

    def _instance_image(self, task: SweTask, spec: dict, env_tag: str, scratch: Path) -> TaskImage:
        context = scratch / "instance"
        context.mkdir()
        # the repository travels as a bundle: its bytes depend only on the commits (a checkout's index
        # and logs carry times), so the same row keeps the same cache key
        self.repos.export(task, scratch / "export")
        self.repos.bundle(task, scratch / "export", context / "repo.bundle")
        commands = [c for c in [swe_harness.repo_install(task.repo), *spec.get("pre_install", []), spec.get("install"),
                                *(c for c in spec.get("eval_commands", []) if not _EXPORT.match(c.strip()))] if c]
        script = ["set -euxo pipefail",
                  f"git clone -q --branch main /opt/testbed-spec/repo.bundle {TESTBED}",
                  f"git -C {TESTBED} remote remove origin",
                  f"cd {TESTBED}", *(c.replace("python -m pip", PIP) for c in commands),
                  "git config --global user.email setup@swebench.config",
                  "git config --global user.name SWE-bench",
                  "git commit --allow-empty -qam SWE-bench"]
        (context / "setup.sh").write_text("\n".join(script) + "\n")
        lines = [f"FROM {env_tag}", "COPY repo.bundle setup.sh /opt/testbed-spec/",
                 "RUN bash /opt/testbed-spec/setup.sh && rm /opt/testbed-spec/repo.bundle", f"WORKDIR {TESTBED}"]
        return self._image(f"task {task.instance_id}", "\n".join(lines) + "\n", context, scratch)

    def _requirements(self, task: SweTask) -> str:
        """The harness's get_requirements, read from the repository store instead of GitHub: the first
        requirements file of the repository at environment_setup_commit, `-r` files inlined, `-e .`,
        comments and `.[test` lines left out."""
        paths = swe_harness.requirement_paths(task.repo)
        commit = task.row.get("environment_setup_commit") or task.base_commit
        text = self._repo_file(task, paths, "requirements file")
        path = next(p for p in paths if self.repos.read_at(task, commit, p) is not None)
        folder = os.path.dirname(path)
        skip = ("-e .", "#", ".[test")
        extra, own = [], []
        for line in text.splitlines():
            if line.strip().startswith("-r"):
                nested = self.repos.read_at(task, commit, os.path.normpath(os.path.join(folder, line.strip()[2:].strip())))
                extra += [x for x in (nested or "").splitlines() if not x.strip().startswith(skip)]
            elif not line.strip().startswith(skip):
                own.append(line)
        return swe_harness.clean_requirements("\n".join(extra + ["\n".join(own)])) + "\n"

    def _repo_file(self, task: SweTask, paths: list[str], what: str) -> str:
        commit = task.row.get("environment_setup_commit") or task.base_commit
        for path in paths:
            text = self.repos.read_at(task, commit, path)
            if text is not None:
                return text
        raise SweTaskError(f"{task.where}: the harness installs {task.repo} from its {what}, but none of "
                           f"{', '.join(paths) or '(no paths)'} is in the repository at {commit[:12]} "
                           "(environment_setup_commit)")
