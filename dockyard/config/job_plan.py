"""The job plan: which het-job components a validated config needs, how many nodes, tasks and GPUs
each has, and what runs there. dockyard-submit renders it; the job reads it back inside the allocation.

Split rules for `--nodes N` (cluster.num_nodes):
- colocate true: one component; every node is a trainer node and the generation servers share them
  (started with `srun --overlap` next to the trainer ranks).
- colocate false: rollout gets cluster.rollout.num_nodes, teacher cluster.teacher.num_nodes, the
  trainer the rest (or cluster.trainer.num_nodes, which must then make the sum). With data_plane
  there is no rollout component: rollout-worker jobs of their own generate (launch/worker_job.py).
Trainer tasks per node: GPUs per node (cpu_ranks_per_node on CPU). Server tasks per node: GPUs per
node / rollout_gpus_per_replica (one on CPU), or the group's tasks_per_node.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from dockyard.config import topology
from dockyard.config.schema import MasterConfig

TRAINER, ROLLOUT, TEACHER = "trainer", "rollout", "teacher"


@dataclass(frozen=True)
class Component:
    role: str
    het_group: int
    nodes: int
    tasks_per_node: int
    gpus_per_node: int
    runs: str

    @property
    def tasks(self) -> int:
        return self.nodes * self.tasks_per_node


@dataclass(frozen=True)
class ServerGroup:
    """Where a kind of server runs: its own het group, or overlapping the trainer's nodes."""
    role: str
    het_group: int
    nodes: int
    tasks_per_node: int
    overlap: bool


@dataclass(frozen=True)
class JobPlan:
    components: tuple[Component, ...]
    servers: tuple[ServerGroup, ...]

    @property
    def trainer(self) -> Component:
        return self.components[0]

    @property
    def total_nodes(self) -> int:
        return sum(c.nodes for c in self.components)

    def server_group(self, role: str) -> ServerGroup | None:
        return next((s for s in self.servers if s.role == role), None)

    def to_dict(self) -> dict:
        return {"components": [asdict(c) for c in self.components], "servers": [asdict(s) for s in self.servers]}

    @classmethod
    def from_dict(cls, data: dict) -> "JobPlan":
        return cls(tuple(Component(**c) for c in data["components"]), tuple(ServerGroup(**s) for s in data["servers"]))

    def table(self) -> str:
        rows = [("het group", "role", "nodes", "tasks/node", "GPUs/node", "runs")]
        rows += [(str(c.het_group), c.role, str(c.nodes), str(c.tasks_per_node), str(c.gpus_per_node), c.runs)
                 for c in self.components]
        for s in self.servers:
            if s.overlap:
                rows.append(("0 (overlap)", s.role, str(s.nodes), str(s.tasks_per_node), "shared",
                             f"{s.role} servers next to the trainer ranks"))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(lines)


def _server_runs(cfg: MasterConfig, role: str) -> str:
    if role == ROLLOUT:
        return f"{cfg.policy.generation.backend} generation servers"
    return "teacher servers"


def plan_job(cfg: MasterConfig) -> JobPlan:
    cluster = cfg.cluster
    trainer = Component(TRAINER, 0, topology.trainer_nodes(cfg), topology.trainer_tasks_per_node(cfg),
                        cluster.trainer.gpus_per_node if cluster.trainer.gpus_per_node is not None
                        else cluster.gpus_per_node, "trainer ranks (rank 0 drives the loop)")
    components, servers = [trainer], []
    # a data-plane run generates in rollout-worker jobs of their own (worker_job.py), not in this job
    roles = ([ROLLOUT] if cfg.data_plane is None else []) + ([TEACHER] if cfg.on_policy_distillation is not None else [])
    for role in roles:
        group = getattr(cluster, role)
        tasks = topology.server_tasks_per_node(cfg, role)
        if group.num_nodes == 0 and cluster.colocate:
            nodes = 1 if cluster.gpus_per_node == 0 else trainer.nodes
            on_cpu = 1 if group.tasks_per_node is None else group.tasks_per_node
            servers.append(ServerGroup(role, 0, nodes, on_cpu if cluster.gpus_per_node == 0 else tasks, overlap=True))
            continue
        gpus = cluster.gpus_per_node if group.gpus_per_node is None else group.gpus_per_node
        component = Component(role, len(components), group.num_nodes, tasks, gpus, _server_runs(cfg, role))
        components.append(component)
        servers.append(ServerGroup(role, component.het_group, component.nodes, tasks, overlap=False))
    return JobPlan(tuple(components), tuple(servers))
