"""dockyard-submit against the real local Slurm cluster (slurm/dev-cluster/start.sh): grpo_tiny as a
heterogeneous job (2 trainer nodes + 1 rollout node), and components killed mid-run."""

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from dockyard.waiting import wait_until
from tests.conftest import REPO
from tests.launch.conftest import run_submit, submit_cli


def job_id_of(output: str) -> str:
    match = re.search(r"submitted job (\d+)", output)
    assert match, output
    return match.group(1)


def sacct_nodes(job_id: str) -> dict[str, str]:
    out = subprocess.run(["sacct", "-j", job_id, "-X", "-n", "-P", "-o", "JobID,NodeList"], capture_output=True,
                         text=True, timeout=30).stdout
    return dict(line.split("|") for line in out.splitlines() if line)


def test_grpo_tiny_runs_as_a_het_job_on_three_nodes(slurm_cluster, tmp_path, tiny_model):
    """The two trainer ranks form one tensor-parallel group across two nodes, as the plan says."""
    result = run_submit(tmp_path, tiny_model, "--nodes", "3", "--wait", "policy.dtensor_cfg.tensor_parallel_size=2",
                        timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    job = job_id_of(result.stdout)
    planned = re.search(r"^trainer mesh: .*$", result.stdout, re.MULTILINE)
    assert planned and "1 data-parallel x 2 tensor-parallel" in planned.group(0), result.stdout
    assert "COMPLETED" in result.stderr and "finished" in result.stderr
    # trainer ranks on two nodes, the engine on the third, as Slurm placed them
    nodes = sacct_nodes(job)
    assert nodes[f"{job}+0"] == "node[1-2]" and nodes[f"{job}+1"] == "node3", nodes
    folder = tmp_path / "slurm"
    assert "trainer rank 0/2 on node1" in (folder / f"{job}_0_log.err").read_text()
    assert f"dockyard: {planned.group(0)}" in (folder / f"{job}_0_log.err").read_text()
    assert "trainer rank 1/2 on node2" in (folder / f"{job}_1_log.err").read_text()
    server_log = folder / f"{job}.0_rollout0_node3.log"
    assert "serving on 0.0.0.0" in server_log.read_text()
    checkpoints = tmp_path / "runs" / "grpo_tiny" / "checkpoints"
    assert (checkpoints / "latest_checkpointed_iteration.txt").read_text().strip() == "4"
    assert (checkpoints / "step_4" / "trainer_state.json").is_file()
    metrics = [json.loads(line) for line in (tmp_path / "runs" / "grpo_tiny" / "logs" / "metrics.jsonl")
               .read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]


def started_long_run(tmp_path: Path, model_dir: Path) -> subprocess.Popen:
    tmp_path.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(submit_cli(tmp_path, model_dir, "--nodes", "3", "--wait", "grpo.max_num_steps=2000",
                                       "checkpointing.save_period=1000"),
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(REPO)))


def first_steps_done(folder: Path):
    logs = list(folder.glob("*_0_log.out"))
    return logs and "step 2:" in logs[0].read_text()


@pytest.mark.parametrize("victim", ["rollout server", "trainer rank 1"])
def test_a_dead_component_ends_the_job_within_60_s_naming_it(slurm_cluster, tmp_path, tiny_model, victim):
    process = started_long_run(tmp_path, tiny_model)
    folder = tmp_path / "slurm"
    try:
        wait_until(lambda: first_steps_done(folder), 240, "two training steps")
        if victim == "rollout server":
            address = json.loads(next(folder.glob("*_rollout0.address.json")).read_text())
            pid = address["pid"]
        else:
            text = next(folder.glob("*_1_log.err")).read_text()
            pid = int(re.search(r"trainer rank 1/2 on node2 \(pid (\d+)", text).group(1))
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        out, err = process.communicate(timeout=120)
        ended = time.monotonic() - killed
    finally:
        if process.poll() is None:
            process.kill()
    print(f"{victim}: the job ended {ended:.1f} s after the kill")
    assert process.returncode == 1, out + err
    assert ended <= 60, f"the job took {ended:.0f} s to end after the kill"
    assert "FAILED" in err
    if victim == "rollout server":
        assert re.search(r"rollout server 0 on node node3 .*log: .*_rollout0_node3\.log\) exited", err), err
    else:
        assert "node2: task 1" in err, err
