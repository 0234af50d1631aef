"""Sandboxes from `env.sandbox`: the backend by name through the registry, the caps from the config,
at most `max_concurrent` alive at once in this process.

Caps beyond the schema's keys are `env.sandbox` extra keys: memory_mb, max_processes, file_size_mb,
cpu_time_s, open_files, output_bytes, sandbox_memory_mb, workspace_mb, workspace_inodes, tmp_mb,
shm_mb. Any other extra key is refused by name (no silent knobs). The first sandbox a process makes
reaps what a dead trainer left on this machine (reaping.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
import time
from pathlib import Path

from dockyard import registry
from dockyard.config.schema.env import SandboxConfig
from dockyard.sandboxes.base import Sandbox, SandboxError, SandboxLimits, SandboxSpec
from dockyard.sandboxes.images import ImageBuilder, TaskImage
from dockyard.sandboxes.reaping import reap_once
from dockyard.sandboxes.user_namespaces import agent_user_problem, root_may_run
from dockyard.sandboxes.users import uid_range_problem

IMAGE_RUNNERS = ("podman", "bubblewrap")
LIMIT_KEYS = {f.name for f in dataclasses.fields(SandboxLimits)} - {"command_timeout_s"}


def limits_from(config: SandboxConfig) -> SandboxLimits:
    extra = dict(config.model_extra or {})
    unknown = sorted(set(extra) - LIMIT_KEYS)
    if unknown:
        raise SandboxError(f"env.sandbox.{unknown[0]}: not a sandbox setting (known extra keys: "
                           f"{', '.join(sorted(LIMIT_KEYS))})")
    for key, value in extra.items():
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise SandboxError(f"env.sandbox.{key}: must be a positive whole number, got {value!r}")
    return SandboxLimits(command_timeout_s=config.command_exec_timeout_s, **extra)


class SandboxFactory:
    """Creates the configured kind of sandbox; `create` blocks while max_concurrent are alive."""

    def __init__(self, config: SandboxConfig):
        self.config = config
        self.limits = limits_from(config)
        if config.trusted and config.type != "none":
            raise SandboxError(f"env.sandbox.trusted: only type none reads it (a {config.type} sandbox isolates "
                               "the commands either way); remove it")
        entry = registry.get("sandbox", config.type)
        if entry.factory is None:
            raise SandboxError(f"env.sandbox.type: sandbox {config.type!r} is not available in this version "
                               "(see `dockyard list sandbox`)")
        self.backend = entry.factory
        problem = getattr(self.backend, "refuses", lambda cfg: None)(config) or uid_range_problem(config) \
            or agent_user_problem(config)
        if problem:
            raise SandboxError(problem)
        self._slots = threading.BoundedSemaphore(config.max_concurrent)
        self.images = self._image_builder(config)

    @staticmethod
    def _image_builder(config: SandboxConfig) -> ImageBuilder | None:
        if config.task_images == "host":
            for key in ("base_images", "default_base_image"):
                if getattr(config, key):
                    raise SandboxError(f"env.sandbox.{key}: only task_images build reads it (set task_images: build, "
                                       "or remove it)")
            return None
        if config.type not in IMAGE_RUNNERS:
            raise SandboxError(f"env.sandbox.task_images: build runs task images in {' or '.join(IMAGE_RUNNERS)} "
                               f"sandboxes, not {config.type}; set task_images: host")
        if config.image:
            raise SandboxError(f"env.sandbox.image: with task_images build each task runs on its own image; "
                               f"map bases through env.sandbox.base_images instead of setting image ({config.image!r})")
        problem = ImageBuilder.problem()
        if problem:
            raise SandboxError(problem)
        return ImageBuilder(config.base_images, config.default_base_image, config.image_cache,
                            export_rootfs=config.type == "bubblewrap" or root_may_run(config),
                            bound_by_users=config.type == "bubblewrap" and config.agent_user != "root")

    def task_image(self, name: str, dockerfile: Path | None, context: Path | None,
                   rebuild: bool = False, export: bool = True) -> TaskImage | None:
        """The task's built image (built now if missing, or again with `rebuild`), or None when images
        are not built."""
        if self.images is None or dockerfile is None:
            return None
        return self.images.image_for(name, dockerfile, context or dockerfile.parent, rebuild, export)

    def service_image(self, task_name: str, service: str, dockerfile: Path | None, context: Path | None,
                      image: str | None, rebuild: bool = False) -> TaskImage:
        """A compose service's image: its `build:` built like a task's, or its `image:` through the base map
        (a one-line Dockerfile FROM it, so a substitution is announced as for a task's FROM)."""
        if dockerfile is None:
            context = self.images.cache_dir / "service-images" / hashlib.sha256(image.encode()).hexdigest()[:16]
            context.mkdir(parents=True, exist_ok=True)
            dockerfile = context / "Dockerfile"
            dockerfile.write_text(f"FROM {image}\n")
        return self.images.image_for(f"{task_name} service {service}", dockerfile, context, rebuild, export=False)

    def create(self, spec: SandboxSpec) -> Sandbox:
        if not spec.workdir:
            spec = dataclasses.replace(spec, workdir=self.config.working_dir)
        if not self._slots.acquire(timeout=self.config.creation_timeout_s):
            raise SandboxError(f"{spec.name}: no sandbox slot came free within env.sandbox.creation_timeout_s "
                               f"({self.config.creation_timeout_s:.0f} s; env.sandbox.max_concurrent="
                               f"{self.config.max_concurrent})")
        started = time.monotonic()
        try:
            reap_once()
            sandbox = self.backend(spec, self.limits, config=self.config)
        except BaseException:
            self._slots.release()
            raise
        if time.monotonic() - started > self.config.creation_timeout_s:
            sandbox.destroy()
            self._slots.release()
            raise SandboxError(f"{spec.name}: creating the sandbox took longer than env.sandbox.creation_timeout_s "
                               f"({self.config.creation_timeout_s:.0f} s)")
        release = sandbox._teardown

        def teardown() -> None:
            try:
                release()
            finally:
                self._slots.release()

        sandbox._teardown = teardown
        return sandbox
