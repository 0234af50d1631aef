"""What a task inside the Slurm job knows about the allocation: the job and restart, its own rank,
and each het group's nodes. No variable names a task's het group; the trainer is group 0."""

from __future__ import annotations

import os
import socket
import subprocess
from dataclasses import dataclass
from functools import lru_cache

from dockyard.errors import DockyardError


class AllocationError(DockyardError, RuntimeError):
    pass


@lru_cache(maxsize=None)
def expand_nodelist(nodelist: str) -> tuple[str, ...]:
    """node[1-3],gpu7 -> (node1, node2, node3, gpu7), as Slurm itself expands it."""
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                             timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError) as err:
        raise AllocationError(f"cannot expand the node list {nodelist!r} with scontrol: {err}") from err
    return tuple(out.split())


def _require(env: dict, name: str) -> str:
    value = env.get(name)
    if value is None:
        raise AllocationError(f"{name} is not set: this must run inside a Slurm job step")
    return value


@dataclass(frozen=True)
class Allocation:
    job_id: str            # the leader's id (what scontrol requeue takes)
    restart_count: int     # 0 on the first run, then 1, 2, ... after each requeue
    rank: int
    world_size: int
    local_rank: int
    node: str
    het_size: int
    env: dict

    @classmethod
    def from_env(cls, env: dict | None = None) -> "Allocation":
        env = dict(os.environ if env is None else env)
        return cls(job_id=_require(env, "SLURM_JOB_ID"),
                   restart_count=int(env.get("SLURM_RESTART_COUNT") or 0),
                   rank=int(_require(env, "SLURM_PROCID")),
                   world_size=int(_require(env, "SLURM_NTASKS")),
                   local_rank=int(env.get("SLURM_LOCALID", 0)),
                   node=env.get("SLURMD_NODENAME") or socket.gethostname(),
                   het_size=int(env.get("SLURM_HET_SIZE", 1)),
                   env=env)

    def nodes(self, het_group: int) -> tuple[str, ...]:
        if self.het_size > 1:
            nodelist = _require(self.env, f"SLURM_JOB_NODELIST_HET_GROUP_{het_group}")
        elif het_group == 0:
            nodelist = _require(self.env, "SLURM_JOB_NODELIST")
        else:
            raise AllocationError(f"het group {het_group} asked for, but this job has one component")
        return expand_nodelist(nodelist)

    @property
    def incarnation(self) -> str:
        """Names files that must not be read by a later run of a requeued job."""
        return f"{self.job_id}.{self.restart_count}"
