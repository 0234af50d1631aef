"""Terminal tasks in the two published layouts, read into one `TerminalTask`.

Terminal-Bench 1 (a task folder):
    docker-compose.yaml  the main service's build (context, dockerfile), environment and working_dir;
                 Terminal-Bench's log volumes ignored; other services run beside it in podman (Sidecar)
    task.yaml        instruction, difficulty, max_agent_timeout_sec (360), max_test_timeout_sec (60),
                     parser_name (pytest), run_tests_in_same_shell, category, tags, author_name
    Dockerfile       FROM, WORKDIR, COPY, ENV, RUN ... (build context: the task folder)
    run-tests.sh     copied with tests/ into /tests after the agent finishes, run as
                     `bash /tests/run-tests.sh` with TEST_DIR=/tests; the pytest summary (-rA) decides:
                     resolved only if every test passed
    tests/           test_outputs.py and whatever the tests read
    solution.sh      what the oracle runs (or solution.yaml, a list of keystrokes)

Harbor / Terminal-Bench 2 (a task folder):
    task.toml        [metadata], [agent] timeout_sec, [verifier] timeout_sec, [environment] (cpus,
                     memory_mb, storage_mb, allow_internet, ...)
    instruction.md
    environment/Dockerfile   (build context: environment/); environment/docker-compose.yaml as for
                 Terminal-Bench 1, its main service named `main`
    tests/test.sh    copied into /tests after the agent finishes; writes /logs/verifier/reward.txt
                     (one number) or reward.json ({"reward": x}) within [0, 1] (or `[verifier]
                     reward_range = [low, high]`, this project's addition); a missing or bad one is a
                     verifier error (reward 0), as in Harbor
    solution/solve.sh

A task set is a folder of task folders or a jsonl index whose rows name task folders (`path`, or
`task.path`, relative to the index: the rows a training dataset reads) and may override `instruction`.
"""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from dockyard.errors import DockyardError
from dockyard.sandboxes.base import BASE_ENV, HealthCheck
from dockyard.sandboxes.images import expand_heredocs, logical_lines

TB1_AGENT_TIMEOUT_S, TB1_TEST_TIMEOUT_S = 360.0, 60.0
HARBOR_AGENT_TIMEOUT_S, HARBOR_TEST_TIMEOUT_S = 600.0, 600.0


class TaskFormatError(DockyardError, ValueError):
    """A task folder that does not follow its layout; the message names the file."""


@dataclass
class DockerfileSetup:
    """What a sandbox without an image builder honours of a Dockerfile: WORKDIR, COPY/ADD, ENV.
    RUN lines and the base image need a builder (podman); elsewhere they are skipped and listed."""

    image: str | None = None
    workdir: str | None = None        # None: the Dockerfile sets none (the sandbox's working_dir applies)
    copies: list[tuple[Path, str]] = field(default_factory=list)   # (host source, absolute target)
    env: dict[str, str] = field(default_factory=dict)
    run: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)                # instructions honoured nowhere here
    run_env: dict[str, str] = field(default_factory=dict)   # docker-compose `environment`: over a built image's ENV too
    run_workdir: str | None = None                          # docker-compose `working_dir`: over the image's WORKDIR


@dataclass
class TerminalTask:
    name: str
    folder: Path
    layout: str                       # "terminal-bench" or "harbor"
    instruction: str
    agent_timeout_s: float
    test_timeout_s: float
    setup: DockerfileSetup
    tests: list[tuple[Path, str]]     # copied read-only into /tests after the agent finishes
    test_command: str
    solution: Path | None             # copied to /solution for the oracle only
    dockerfile: Path | None
    metadata: dict = field(default_factory=dict)
    reward_range: tuple[float, float] = (0.0, 1.0)   # Harbor: a reward file outside it is a verifier error
    sidecars: list[Sidecar] = field(default_factory=list)   # docker-compose services beside the main one

    @property
    def build_context(self) -> Path | None:
        return self.dockerfile.parent if self.dockerfile else None


def _arguments(rest: str) -> list[str]:
    rest = rest.strip()
    if rest.startswith("["):
        try:
            return [str(item) for item in json.loads(rest)]
        except json.JSONDecodeError:
            pass
    return shlex.split(rest)


def _env_pairs(rest: str) -> dict[str, str]:
    parts = shlex.split(rest)
    if parts and "=" not in parts[0]:            # legacy form: ENV KEY value with spaces
        return {parts[0]: " ".join(parts[1:])}
    return dict(part.split("=", 1) for part in parts if "=" in part)


def _expand(value: str, env: dict[str, str]) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: env.get(m.group(1), m.group(0)), value)


def parse_dockerfile(path: Path, context: Path) -> DockerfileSetup:
    setup = DockerfileSetup()
    build_args: dict[str, str] = {}   # ARG defaults: variables of FROM (before it) and of later lines
    for _, line in logical_lines(expand_heredocs(path.read_text())):
        instruction, _, rest = line.partition(" ")
        keyword = instruction.upper()
        if keyword == "ARG":
            name, _, value = rest.strip().partition("=")
            build_args[name.strip()] = value.strip().strip('"').strip("'")
        elif keyword == "FROM":
            words = [w for w in rest.split() if not w.startswith("--")]
            setup.image = _expand(words[0], build_args) if words else None
        elif keyword == "WORKDIR":
            target = _expand(rest.strip(), {**build_args, **setup.env})
            setup.workdir = target if target.startswith("/") else str(Path(setup.workdir or "/", target))
        elif keyword == "ENV":
            # `$PATH` in an ENV line is the image's PATH: the standard one, as every sandbox starts with
            known = {"PATH": BASE_ENV["PATH"], **setup.env}
            setup.env.update({k: _expand(v, known) for k, v in _env_pairs(rest).items()})
        elif keyword in ("COPY", "ADD"):
            args = [a for a in _arguments(rest) if not a.startswith("--")]
            flags = [a for a in _arguments(rest) if a.startswith("--from")]
            if flags or len(args) < 2:
                setup.ignored.append(line)
                continue
            *sources, target = args
            target = _expand(target, {**build_args, **setup.env})
            if not target.startswith("/"):
                target = str(Path(setup.workdir or "/", target)) + ("/" if target.endswith("/") else "")
            for source in sources:
                matches = sorted(context.glob(source)) if any(c in source for c in "*?[") else [context / source]
                for match in matches:
                    if not match.exists():
                        raise TaskFormatError(f"{path}: {keyword} source {source!r} does not exist in {context}")
                    into_folder = target.endswith("/") or len(sources) > 1 or len(matches) > 1
                    destination = (target.rstrip("/") + "/" + match.name) if into_folder and match.is_file() else target.rstrip("/") or "/"
                    setup.copies.append((match, destination))
        elif keyword == "RUN":
            setup.run.append(rest)
        elif keyword in ("CMD", "ENTRYPOINT", "LABEL", "EXPOSE", "SHELL", "USER", "VOLUME", "HEALTHCHECK",
                         "STOPSIGNAL", "ONBUILD", "MAINTAINER"):
            setup.ignored.append(line)
        else:
            raise TaskFormatError(f"{path}: unknown Dockerfile instruction {instruction!r}")
    return setup


def _read_yaml(path: Path) -> dict:
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise TaskFormatError(f"{path}: not valid YAML ({err})") from None
    if not isinstance(data, dict):
        raise TaskFormatError(f"{path}: expected a mapping at the top level")
    return data


# Terminal-Bench 1's harness variables in docker-compose.yaml, as its harness sets them inside
TB1_COMPOSE_VARS = {"T_BENCH_TEST_DIR": "/tests", "T_BENCH_CONTAINER_LOGS_PATH": "/logs",
                    "T_BENCH_CONTAINER_AGENT_LOGS_PATH": "/agent-logs"}
COMPOSE_PLUMBING = {"image", "container_name", "command", "build", "environment", "working_dir", "volumes"}


SIDECAR_KEYS = {"image", "build", "environment", "command", "working_dir", "depends_on", "ports", "expose",
                "healthcheck", "container_name", "restart", "hostname"}


@dataclass
class Sidecar:
    """A docker-compose service beside the main one (a database, an API the task talks to): run from its
    own image in a container of its own that shares the sandbox's network, reachable by its name."""

    name: str
    dockerfile: Path | None = None    # `build:` (the image is built like the task's)
    context: Path | None = None
    image: str | None = None          # `image:` (through env.sandbox.base_images; nothing is pulled)
    env: dict[str, str] = field(default_factory=dict)
    command: list[str] = field(default_factory=list)   # `command:` over the image's CMD
    working_dir: str | None = None
    health: HealthCheck | None = None                  # `healthcheck:` (waited for before the agent starts)


@dataclass
class ComposeService:
    """What dockyard takes from a Terminal-Bench 1 docker-compose.yaml: the main service's build,
    environment and working_dir (its harness volumes are Terminal-Bench's own log folders), and the
    services beside it."""

    dockerfile: Path | None = None
    context: Path | None = None
    env: dict[str, str] = field(default_factory=dict)
    working_dir: str | None = None
    ignored: list[str] = field(default_factory=list)
    sidecars: list[Sidecar] = field(default_factory=list)


def read_compose(folder: Path) -> ComposeService | None:
    path = next((folder / n for n in ("docker-compose.yaml", "docker-compose.yml") if (folder / n).is_file()), None)
    if path is None:
        return None
    services = _read_yaml(path).get("services")
    if not isinstance(services, dict) or not services:
        raise TaskFormatError(f"{path}: `services` must name at least one service")
    main = next((name for name in ("client", "main") if name in services), None) or next(
        (name for name, spec in services.items() if isinstance(spec, dict) and "build" in spec), next(iter(services)))
    spec = services[main] or {}
    if not isinstance(spec, dict):
        raise TaskFormatError(f"{path}: service {main!r} must be a mapping")

    def expand(value: str) -> str:
        return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: TB1_COMPOSE_VARS.get(m.group(1) or m.group(2), m.group(0)),
                      str(value))

    service = ComposeService()
    service.context, service.dockerfile = _compose_build(path, main, spec)
    service.env = _compose_env(spec, expand)
    if spec.get("working_dir"):
        service.working_dir = expand(spec["working_dir"])
    service.sidecars = [_sidecar(path, name, services[name], expand) for name in sorted(set(services) - {main})]
    for volume in spec.get("volumes") or []:
        if "T_BENCH_" not in str(volume):
            raise TaskFormatError(f"{path}: service {main!r} mounts {volume!r}: volumes beside Terminal-Bench's log "
                                  "folders are not supported (COPY the files in the Dockerfile)")
    service.ignored = sorted(set(spec) - COMPOSE_PLUMBING)
    return service


def _compose_build(path: Path, name: str, spec: dict) -> tuple[Path | None, Path | None]:
    """(context, dockerfile) of a service's `build:`, or (None, None) without one."""
    build = spec.get("build")
    if isinstance(build, str):
        build = {"context": build}
    if not isinstance(build, dict):
        return None, None
    context = (path.parent / str(build.get("context", "."))).resolve()
    dockerfile = context / str(build.get("dockerfile", "Dockerfile"))
    if not dockerfile.is_file():
        raise TaskFormatError(f"{path}: service {name!r} builds {dockerfile}, which does not exist")
    return context, dockerfile


def _compose_env(spec: dict, expand) -> dict[str, str]:
    environment = spec.get("environment") or {}
    items = environment.items() if isinstance(environment, dict) else \
        [(e.split("=", 1) + [""])[:2] for e in environment if isinstance(e, str)]
    return {str(k): expand(v) for k, v in items if v is not None}


def _sidecar(path: Path, name: str, spec, expand) -> Sidecar:
    if not isinstance(spec, dict):
        raise TaskFormatError(f"{path}: service {name!r} must be a mapping")
    if not re.fullmatch(r"[a-zA-Z0-9][a-zA-Z0-9_.-]*", name):
        raise TaskFormatError(f"{path}: service name {name!r} is not a host name")
    unknown = sorted(set(spec) - SIDECAR_KEYS)
    if unknown:   # volumes shared with the main service, networks, privileges: not run half-way
        raise TaskFormatError(f"{path}: service {name!r} uses {', '.join(unknown)}, which a service beside the main "
                              f"one does not support here (supported: {', '.join(sorted(SIDECAR_KEYS))})")
    context, dockerfile = _compose_build(path, name, spec)
    image = spec.get("image") if dockerfile is None else None
    if dockerfile is None and not isinstance(image, str):
        raise TaskFormatError(f"{path}: service {name!r} has neither `build` nor `image`")
    command = spec.get("command") or []
    command = shlex.split(command) if isinstance(command, str) else [str(part) for part in command]
    return Sidecar(name, dockerfile, context, image, _compose_env(spec, expand), command,
                   expand(spec["working_dir"]) if spec.get("working_dir") else None,
                   _healthcheck(path, name, spec.get("healthcheck")))


def _duration_s(path: Path, name: str, value, default: float) -> float:
    """A compose duration (`2s`, `1m30s`, `500ms`) in seconds."""
    if value is None:
        return default
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", str(value))
    if not parts or "".join(n + u for n, u in parts) != str(value).replace(" ", ""):
        raise TaskFormatError(f"{path}: service {name!r}: healthcheck duration {value!r} is not like 2s or 1m30s")
    scale = {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6}
    return sum(float(n) * scale[u] for n, u in parts)


def _healthcheck(path: Path, name: str, spec) -> HealthCheck | None:
    if spec is None or (isinstance(spec, dict) and spec.get("disable")):
        return None
    if not isinstance(spec, dict) or "test" not in spec:
        raise TaskFormatError(f"{path}: service {name!r}: healthcheck needs a `test`")
    test = spec["test"]
    if isinstance(test, str):
        argv = ["/bin/sh", "-c", test]
    elif isinstance(test, list) and test and test[0] == "CMD" and len(test) > 1:
        argv = [str(part) for part in test[1:]]
    elif isinstance(test, list) and len(test) == 2 and test[0] == "CMD-SHELL":
        argv = ["/bin/sh", "-c", str(test[1])]
    elif isinstance(test, list) and test == ["NONE"]:
        return None
    else:
        raise TaskFormatError(f"{path}: service {name!r}: healthcheck test {test!r} is not a string, "
                              "[CMD, ...], [CMD-SHELL, ...] or [NONE]")
    retries = spec.get("retries", 3)
    if not isinstance(retries, int) or retries < 1:
        raise TaskFormatError(f"{path}: service {name!r}: healthcheck retries must be a positive integer")
    return HealthCheck(argv, _duration_s(path, name, spec.get("interval"), 30.0),
                       _duration_s(path, name, spec.get("timeout"), 30.0), retries,
                       _duration_s(path, name, spec.get("start_period"), 0.0))


def _load_tb1(folder: Path) -> TerminalTask:
    meta = _read_yaml(folder / "task.yaml")
    for key in ("instruction",):
        if not isinstance(meta.get(key), str) or not meta[key].strip():
            raise TaskFormatError(f"{folder / 'task.yaml'}: `{key}` is required (a non-empty string)")
    parser = meta.get("parser_name", "pytest")
    if parser != "pytest":
        raise TaskFormatError(f"{folder / 'task.yaml'}: parser_name {parser!r} is not supported (pytest only)")
    run_tests = folder / "run-tests.sh"
    if not run_tests.is_file():
        raise TaskFormatError(f"{folder}: run-tests.sh is missing")
    tests = [(run_tests, "/tests/run-tests.sh")]
    if (folder / "tests").is_dir():
        tests += [(path, "/tests/" + path.name) for path in sorted((folder / "tests").iterdir())]
    solution = next((p for p in (folder / "solution.sh", folder / "solution.yaml") if p.is_file()), None)
    compose = read_compose(folder)
    dockerfile = compose.dockerfile if compose and compose.dockerfile else folder / "Dockerfile"
    context = compose.context if compose and compose.context else folder
    setup = parse_dockerfile(dockerfile, context) if dockerfile.is_file() else DockerfileSetup()
    if compose:   # the main service's environment and working_dir apply over the Dockerfile's
        setup.env.update(compose.env)
        setup.run_env = dict(compose.env)
        setup.workdir = compose.working_dir or setup.workdir
        setup.run_workdir = compose.working_dir
        setup.ignored += [f"docker-compose {key}" for key in compose.ignored]
    return TerminalTask(
        name=folder.name, folder=folder, layout="terminal-bench", instruction=meta["instruction"].strip(),
        agent_timeout_s=float(meta.get("max_agent_timeout_sec", TB1_AGENT_TIMEOUT_S)),
        test_timeout_s=float(meta.get("max_test_timeout_sec", TB1_TEST_TIMEOUT_S)),
        setup=setup, tests=tests, test_command="bash /tests/run-tests.sh", solution=solution,
        dockerfile=dockerfile if dockerfile.is_file() else None,
        metadata={k: meta[k] for k in ("difficulty", "category", "tags", "author_name") if k in meta},
        sidecars=compose.sidecars if compose else [])


def _load_harbor(folder: Path) -> TerminalTask:
    path = folder / "task.toml"
    try:
        meta = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise TaskFormatError(f"{path}: not valid TOML ({err})") from None
    instruction_file = folder / "instruction.md"
    if not instruction_file.is_file() or not instruction_file.read_text().strip():
        raise TaskFormatError(f"{folder}: instruction.md is missing or empty")
    test_sh = folder / "tests" / "test.sh"
    if not test_sh.is_file():
        raise TaskFormatError(f"{folder}: tests/test.sh is missing")
    tests = [(p, "/tests/" + p.name) for p in sorted((folder / "tests").iterdir())]
    environment = folder / "environment"
    dockerfile = environment / "Dockerfile"
    setup = parse_dockerfile(dockerfile, environment) if dockerfile.is_file() else DockerfileSetup()
    compose = read_compose(environment)   # Harbor merges it over its own `main` service
    if compose:
        setup.env.update(compose.env)
        setup.run_env = dict(compose.env)
        setup.workdir = compose.working_dir or setup.workdir
        setup.run_workdir = compose.working_dir
        setup.ignored += [f"docker-compose {key}" for key in compose.ignored]
    solution = folder / "solution" / "solve.sh"
    reward_range = meta.get("verifier", {}).get("reward_range", [0.0, 1.0])
    if not (isinstance(reward_range, list) and len(reward_range) == 2
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in reward_range)
            and reward_range[0] < reward_range[1]):
        raise TaskFormatError(f"{path}: [verifier] reward_range must be [low, high] with low < high, got {reward_range!r}")
    return TerminalTask(
        name=folder.name, folder=folder, layout="harbor", instruction=instruction_file.read_text().strip(),
        agent_timeout_s=float(meta.get("agent", {}).get("timeout_sec", HARBOR_AGENT_TIMEOUT_S)),
        test_timeout_s=float(meta.get("verifier", {}).get("timeout_sec", HARBOR_TEST_TIMEOUT_S)),
        setup=setup, tests=tests, test_command="bash /tests/test.sh",
        solution=solution if solution.is_file() else None, dockerfile=dockerfile if dockerfile.is_file() else None,
        metadata={**meta.get("metadata", {}), "environment": meta.get("environment", {})},
        reward_range=(float(reward_range[0]), float(reward_range[1])), sidecars=compose.sidecars if compose else [])


def load_task(folder: str | Path) -> TerminalTask:
    folder = Path(folder)
    if (folder / "task.yaml").is_file():
        return _load_tb1(folder)
    if (folder / "task.toml").is_file():
        return _load_harbor(folder)
    raise TaskFormatError(f"{folder}: neither task.yaml (Terminal-Bench) nor task.toml (Harbor) is there")


def _load_or_note(folder: Path, problems: list[str] | None) -> TerminalTask | None:
    try:
        return load_task(folder)
    except (TaskFormatError, OSError, UnicodeDecodeError) as err:
        if problems is None:
            raise TaskFormatError(str(err)) from None
        problems.append(f"{folder.name}: {' '.join(str(err).split())}")
        return None


def load_tasks(source: str | Path, problems: list[str] | None = None) -> list[TerminalTask]:
    """Every task of a folder of task folders, or of a jsonl index (rows: {"path": ..., "instruction"?}).
    With `problems`, a task that cannot be read is noted there (its folder name and why) and left out
    instead of failing the whole set."""
    source = Path(source)
    if source.is_file() and source.suffix == ".jsonl":
        from dockyard.data.datasets import DatasetError, read_rows

        try:
            rows = read_rows(str(source))
        except DatasetError as err:
            raise TaskFormatError(str(err)) from None
        tasks = []
        for number, row in enumerate(rows, 1):
            path = row.get("path")
            if path is None and isinstance(row.get("task"), dict):
                path = row["task"].get("path")
            if not isinstance(path, str):
                raise TaskFormatError(f"{source}: row {number} needs the `path` of a task folder "
                                      "(at the top level or under `task`)")
            task = _load_or_note((source.parent / path).resolve(), problems)
            if task is None:
                continue
            if row.get("instruction"):
                task.instruction = str(row["instruction"])
            tasks.append(task)
        return tasks
    if not source.is_dir():
        raise TaskFormatError(f"{source}: no such task folder or jsonl index")
    if (source / "task.yaml").is_file() or (source / "task.toml").is_file():
        return [load_task(source)]
    folders = [p for p in sorted(source.iterdir()) if (p / "task.yaml").is_file() or (p / "task.toml").is_file()]
    if not folders:
        raise TaskFormatError(f"{source}: no task folders (with task.yaml or task.toml) inside")
    return [task for folder in folders if (task := _load_or_note(folder, problems)) is not None]


def index_rows(folder: str | Path, relative_to: str | Path) -> list[dict]:
    """Dataset rows for every task under `folder`: {"instruction", "task": {"path", "name"}}."""
    from dockyard.data.datasets import index_row

    return [index_row(task.instruction, task.folder, task.name, relative_to) for task in load_tasks(folder)]
