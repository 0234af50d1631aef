"""cluster.container: what a job whose steps run in a container needs of the config itself (what needs
the machine, an image that exists or a runtime the cluster offers, is preflight's)."""

from __future__ import annotations

from typing import Iterator

from dockyard.config import topology
from dockyard.config.constraints.registry import rule
from dockyard.config.errors import Problem
from dockyard.config.schema import MasterConfig

def _present(cfg: MasterConfig) -> list[str]:
    """The components whose steps this job runs."""
    present = ["trainer"]
    if cfg.data_plane is None and cfg.sft is None:   # a data-plane trainer job and SFT start no rollout servers
        present.append("rollout")
    if cfg.on_policy_distillation is not None:
        present.append("teacher")
    return present


def parse_mount(text: str) -> tuple[str, str, bool] | None:
    """SRC[:DST[:ro|rw]] as (source, target, read-only); None when it is not one (absolute paths only)."""
    parts = text.split(":")
    if len(parts) == 1:
        parts = [parts[0], parts[0]]
    if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] not in ("ro", "rw")) \
            or not all(p.startswith("/") for p in parts[:2]):
        return None
    if ".." in parts[1].split("/"):   # a target must name a place inside (charliecloud makes it in the job's root copy)
        return None
    return parts[0], parts[1], len(parts) == 3 and parts[2] == "ro"


def _mount_problems(mounts: list[str], where: str) -> Iterator[Problem]:
    for text in mounts:
        if parse_mount(text) is None:
            yield Problem(where, f"cluster.container: {text!r} is not SRC:DST or SRC:DST:ro with absolute paths "
                          "(no '..' in DST)")


@rule
def job_container(cfg: MasterConfig) -> Iterator[Problem]:
    """cluster.container: an image for every component that runs in one; mounts written SRC:DST[:ro] with absolute paths; slurm_oci runs one task per node in a step (trainer ranks and servers per node 1); servers of a trainer in a container run in one too."""
    container = cfg.cluster.container
    yield from _mount_problems(container.mounts, "cluster.container.mounts")
    said_image = False
    for component in _present(cfg):
        own = getattr(container, component)
        runtime = own.runtime or container.runtime
        if own.mounts is not None:
            yield from _mount_problems(own.mounts, f"cluster.container.{component}.mounts")
        if component != "trainer" and runtime == "none" and (container.trainer.runtime or container.runtime) != "none":
            # trainer rank 0 starts the servers from inside its container: a server outside it would be
            # started with the image's Python, which the node does not have
            yield Problem(f"cluster.container.{component}.runtime", f"cluster.container: the trainer runs in a "
                          f"container and starts the {component} servers from there, so they must run in one too "
                          "(any runtime, e.g. the trainer's); none is only possible for all components or for the "
                          "servers of a trainer that runs outside")
            continue
        if runtime == "none":
            continue
        if not (own.image or container.image):
            if own.runtime:
                yield Problem(f"cluster.container.{component}.image",
                              f"cluster.container: {component} steps run in {runtime}, which needs an image")
            elif not said_image:
                said_image = True
                yield Problem("cluster.container.image", f"cluster.container: runtime {runtime} needs an image")
        if runtime == "slurm_oci":
            per_node = topology.trainer_tasks_per_node(cfg) if component == "trainer" else \
                topology.server_tasks_per_node(cfg, component)
            if per_node > 1:
                field = ("cluster.cpu_ranks_per_node" if cfg.cluster.gpus_per_node == 0 else "cluster.gpus_per_node") \
                    if component == "trainer" else f"cluster.{component}.tasks_per_node"
                yield Problem(field, f"cluster.container: Slurm's OCI mode runs one task per node in a step, and "
                                     f"the {component} component has {per_node} per node; use 1 (one rank or "
                                     "server per node), or another runtime (pyxis, apptainer, podman)")


# what bubblewrap met inside each job container that runs on the dev cluster (checked by hand, docs/slurm.md)
BUBBLEWRAP_INSIDE = {
    "slurm_oci": "bwrap: 'setting up uid map: Operation not permitted' in runc's default bundle",
    "podman": "bwrap: 'Can't mount proc on /newroot/proc: Operation not permitted' (the container's masked /proc)",
    "charliecloud": "ch-run maps one uid, so the agent's own user, apart from the grader's, cannot exist in it "
                    "(chown to it: Invalid argument)",
}


@rule
def sandboxes_in_a_job_container(cfg: MasterConfig) -> Iterator[Problem]:
    """cluster.container: the environment's sandboxes (made by trainer rank 0, inside the trainer's container) are refused there, except env.sandbox.type none (trusted): what bubblewrap met inside each runtime that runs here is named; the other kinds are not verified inside a job container."""
    sandbox = cfg.env.sandbox
    runtime = cfg.cluster.container.trainer.runtime or cfg.cluster.container.runtime
    if sandbox is None or runtime == "none" or sandbox.type == "none":
        return
    seen = BUBBLEWRAP_INSIDE.get(runtime, "not verified inside this runtime") if sandbox.type == "bubblewrap" \
        else "not verified inside a job container yet"
    yield Problem("env.sandbox.type", f"cluster.container: the {sandbox.type} sandboxes are made by trainer rank 0, "
                  f"inside the trainer's {runtime} container, and need namespaces of their own there ({seen}); run "
                  "this config without cluster.container, or with env.sandbox.type none and trusted: true where the "
                  "job's container is the isolation")
