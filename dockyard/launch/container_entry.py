"""The first program of every step inside a job container (launch/containers.py):

    python -m dockyard.launch.container_entry --keep=NAME,NAME [--name=TEXT] [--task-from-node] -- PROGRAM ARGS...

It runs PROGRAM with the environment a step should have, whatever the runtime passed in:

- only Slurm's, submitit's and dockyard's variables, the identity (USER, HOME, ...), the names in
  cluster.container.env and those the image's ENV sets (its DOCKYARD_IMAGE_ENV lists them: HF_HUB_OFFLINE,
  ...; where the submitter has one of them too, the runtime decides whose value arrives: Slurm's OCI
  mode and podman's --env-host the submitter's); the submitter's PATH, PYTHONPATH, VIRTUAL_ENV and the
  rest of a login environment stay out (Slurm's OCI mode and pyxis pass all of it), and PATH and
  VIRTUAL_ENV are the image's Python's;
- the per-task variables Slurm's OCI mode does not pass (SLURM_PROCID, SLURM_NODEID, SLURM_LOCALID,
  SLURMD_NODENAME, CUDA_VISIBLE_DEVICES; in a batch job the batch step's values arrive instead, 0 on
  every node) are recovered (--task-from-node): a step there has one task per node, so the node's
  place in the step's node list is the task's rank. The node is SLURMD_NODENAME where the
  site's oci.conf passes it (the dev cluster's does: its nodes share one host name), else the host
  name.
"""

from __future__ import annotations

import os
import socket
import sys

from dockyard.errors import DockyardError

ALWAYS_PREFIXES = ("SLURM_", "SLURMD_", "SUBMITIT_", "DOCKYARD_", "PMI_", "PMIX_", "OMPI_")
ALWAYS = {"USER", "LOGNAME", "HOME", "LANG", "LC_ALL", "TERM", "TZ", "CUDA_VISIBLE_DEVICES",
          "NVIDIA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "MASTER_ADDR", "MASTER_PORT",
          "RANK", "WORLD_SIZE", "LOCAL_RANK"}
# the image names the variables its ENV sets (containers/dockyard.Containerfile); the runtimes pass them in
# (charliecloud from the /ch/environment dockyard-submit writes into the job's root)
IMAGE_ENV = "DOCKYARD_IMAGE_ENV"
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class EntryError(DockyardError):
    label = "container entry"
    exit_status = 2


def step_environment(environ: dict[str, str], keep: set[str], python: str, task_from_node: bool = False
                     ) -> dict[str, str]:
    keep = keep | set(environ.get(IMAGE_ENV, "").split())   # the image's own ENV (HF_HUB_OFFLINE, ...)
    env = {k: v for k, v in environ.items() if k in keep or k in ALWAYS or k.startswith(ALWAYS_PREFIXES)}
    venv = os.path.dirname(os.path.dirname(os.path.abspath(python)))
    env["PATH"] = f"{os.path.dirname(os.path.abspath(python))}:{IMAGE_PATH}"
    if os.path.isfile(os.path.join(venv, "pyvenv.cfg")):
        env["VIRTUAL_ENV"] = venv
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("USER", environ.get("USER") or "root")   # charliecloud needs it; OCI mode passes the submitter's
    if not os.access(env.get("HOME") or "/nonexistent", os.W_OK):
        env["HOME"] = "/tmp"   # a read-only root: caches go to the container's scratch space
    recover_task_variables(env, task_from_node)
    return env


def recover_task_variables(env: dict[str, str], from_node: bool = False) -> None:
    """from_node (Slurm's OCI mode): what arrives is the batch step's SLURM_PROCID / NODEID / LOCALID
    (0 on every node of a job's step), so they are computed from the node whatever is there."""
    if "SLURM_STEP_NODELIST" not in env or ("SLURM_PROCID" in env and not from_node):
        return
    from dockyard.launch.allocation import expand_nodelist

    nodes = list(expand_nodelist(env["SLURM_STEP_NODELIST"]))
    node = env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    if node not in nodes:
        raise EntryError(f"this step's task variables (SLURM_PROCID, ...) did not arrive and this node ({node}) "
                         f"is not in SLURM_STEP_NODELIST {env['SLURM_STEP_NODELIST']}: set SLURMD_NODENAME in the "
                         "step's container (oci.conf, docs/slurm.md)")
    index = nodes.index(node)
    env.update({"SLURMD_NODENAME": node, "SLURM_NODEID": str(index), "SLURM_PROCID": str(index),
                "SLURM_LOCALID": "0"})
    env.setdefault("SLURM_STEP_NUM_TASKS", str(len(nodes)))
    gpus = env.get("SLURM_STEP_GPUS") or env.get("SLURM_JOB_GPUS")
    if gpus and ("CUDA_VISIBLE_DEVICES" not in env or from_node):
        env["CUDA_VISIBLE_DEVICES"] = gpus


def main(argv: list[str]) -> int:
    if "--" not in argv:
        print("dockyard container entry: usage: --keep=NAME,... -- PROGRAM ARGS...", file=sys.stderr)
        return 2
    split = argv.index("--")
    options, program = argv[:split], argv[split + 1:]
    keep = {name for option in options if option.startswith("--keep=")
            for name in option.removeprefix("--keep=").split(",") if name}
    if not program:
        print("dockyard container entry: no program after --", file=sys.stderr)
        return 2
    name = next((option.removeprefix("--name=") for option in options if option.startswith("--name=")), "")
    try:
        env = step_environment(dict(os.environ), keep, program[0], "--task-from-node" in options)
    except EntryError as err:
        print(f"dockyard container entry: {err}", file=sys.stderr, flush=True)
        return 2
    env["DOCKYARD_CONTAINER"] = name
    # one line per step in its log: which container, which Python, which task (checked by the tests)
    print(f"dockyard: container: {name}; {sys.executable}; node {env.get('SLURMD_NODENAME', '?')} task "
          f"{env.get('SLURM_PROCID', '?')}", file=sys.stderr, flush=True)
    os.execvpe(program[0], program, env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
