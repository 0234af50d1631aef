"""What the cluster itself says about the job before it is queued: the partition exists and is up,
it has the nodes, GPUs and time the plan asks for, and the account and QOS are the user's. Each
check runs only where its Slurm command answers; one that does not is reported as skipped."""

from __future__ import annotations

import getpass
import re
import subprocess

from dockyard.config.errors import Problem
from dockyard.config.schema import MasterConfig
from dockyard.config.job_plan import JobPlan
from dockyard.config.slurm_time import SlurmTimeError, minutes

TIMEOUT_S = 30


def _ask(*command: str) -> str | None:
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout if result.returncode == 0 else None


def _partitions() -> dict[str, dict[str, str]] | None:
    out = _ask("scontrol", "show", "partition", "-o")
    if out is None:
        return None
    partitions = {}
    for line in out.splitlines():
        fields = dict(word.split("=", 1) for word in line.split() if "=" in word)
        if "PartitionName" in fields:
            partitions[fields["PartitionName"]] = fields
    return partitions


def gpus_in_gres(gres: str) -> int:
    """GPUs per node in a sinfo %G value: gpu:4, gpu:a100:4(S:0-1), gpu:a100:2,gpu:v100:2, (null)."""
    total = 0
    for entry in re.split(r",(?![^(]*\))", gres):
        parts = re.sub(r"\(.*\)", "", entry).split(":")
        if parts[0] == "gpu" and len(parts) >= 2 and parts[-1].isdigit():
            total += int(parts[-1])
    return total


def check_slurm(cfg: MasterConfig, plan: JobPlan) -> tuple[list[Problem], list[str]]:
    partitions = _partitions()
    if partitions is None:
        return [], ["Slurm partition, nodes, GPUs and time limit: scontrol does not answer here"]
    slurm = cfg.cluster.slurm
    if slurm.partition is None:
        name = next((n for n, p in partitions.items() if p.get("Default") == "YES"), None)
        if name is None:
            return [Problem("cluster.slurm.partition", "the cluster has no default partition; name one "
                            f"({', '.join(partitions)})")], []
        field = "cluster.slurm.partition (the cluster's default)"
    else:
        name, field = slurm.partition, "cluster.slurm.partition"
        if name not in partitions:
            return [Problem(field, f"no partition {name!r} on this cluster; partitions: "
                            f"{', '.join(partitions)}")], []
    part = partitions[name]
    problems = []
    if part.get("State") not in ("UP", None):
        problems.append(Problem(field, f"partition {name!r} is {part['State']}"))
    total = int(part.get("TotalNodes", "0") or 0)
    if plan.total_nodes > total:
        problems.append(Problem("cluster.num_nodes", f"the job needs {plan.total_nodes} nodes but partition "
                                f"{name!r} has {total}"))
    max_nodes = part.get("MaxNodes", "UNLIMITED")
    if max_nodes.isdigit():
        for component in plan.components:
            if component.nodes > int(max_nodes):
                problems.append(Problem("cluster.num_nodes", f"the {component.role} component asks for "
                                        f"{component.nodes} nodes; partition {name!r} allows {max_nodes} per job"))
    max_time = part.get("MaxTime", "UNLIMITED")
    if max_time not in ("UNLIMITED", "INFINITE"):
        try:
            if minutes(slurm.time) > minutes(max_time):
                problems.append(Problem("cluster.slurm.time", f"{slurm.time} is over partition {name!r}'s "
                                        f"limit of {max_time}"))
        except SlurmTimeError:
            pass
    wanted = max((c.gpus_per_node for c in plan.components), default=0)
    if wanted:
        gres = _ask("sinfo", "-h", "-p", name, "-o", "%G")
        if gres is not None:
            have = max((gpus_in_gres(line.strip()) for line in gres.splitlines() if line.strip()), default=0)
            if wanted > have:
                problems.append(Problem("cluster.gpus_per_node", f"{wanted} GPUs per node asked for, but the "
                                        f"nodes of partition {name!r} have at most {have}"))
    accounting, notes = _accounting(cfg)
    return problems + accounting, notes


def _accounting(cfg: MasterConfig) -> tuple[list[Problem], list[str]]:
    slurm = cfg.cluster.slurm
    if slurm.account is None and slurm.qos is None:
        return [], []
    user = getpass.getuser()
    out = _ask("sacctmgr", "-n", "-P", "show", "assoc", f"user={user}", "format=account,qos")
    if out is None:
        return [], ["cluster.slurm.account / qos: sacctmgr does not answer here (no accounting database)"]
    rows = [line.split("|") for line in out.splitlines() if line.strip()]
    accounts = {row[0] for row in rows}
    problems = []
    if slurm.account is not None and slurm.account not in accounts:
        problems.append(Problem("cluster.slurm.account", f"user {user} has no association with account "
                                f"{slurm.account!r}; theirs: {', '.join(sorted(accounts)) or 'none'}"))
    if slurm.qos is not None:
        allowed = {q for row in rows if slurm.account in (None, row[0]) for q in row[1].split(",") if q}
        if slurm.qos not in allowed:
            problems.append(Problem("cluster.slurm.qos", f"QOS {slurm.qos!r} is not allowed for user {user}"
                                    + (f" under account {slurm.account!r}" if slurm.account else "")
                                    + f"; allowed: {', '.join(sorted(allowed)) or 'none'}"))
    return problems, []
