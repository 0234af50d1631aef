"""On-policy distillation on the real local Slurm cluster: one het job of a trainer component (2
ranks), a rollout component (the student's engine) and a teacher component running two teacher
servers; preempted, then requeued with scontrol. The run completes, every incarnation starts both
teacher servers again, and every step's rollouts were scored by the teacher their agent names."""

import json
import os
import random
import re
import time

from tests.launch.conftest import metrics, run_submit
from tests.launch.holding import hold_after, hold_overrides
from tests.launch.jobs import logged_steps
from tests.launch.test_preemption_on_cluster import completed_after_two_resumes, preempt_then_requeue
from tests.run.test_distillation_run import OPD, opd_section

STEPS = 12


def test_distillation_job_with_two_teacher_servers_survives_preemption(slurm_cluster, tmp_path, tiny_model,
                                                                       teacher_models):
    rng = random.Random(int(os.environ.get("DOCKYARD_TEST_SEED", time.time())))
    first, second = rng.randint(2, 3), rng.randint(7, 8)
    print(f"interrupting after steps {first} (partition preemption) and {second} (scontrol requeue)")
    rows = [{"input": f"{a} + {a}", "label": str(2 * a), "metadata": {"agent_name": "adder"}} if a % 2 else
            {"input": f"{a} * 3", "label": str(3 * a), "metadata": {"agent_name": "multiplier"}} for a in range(80)]
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("".join(json.dumps(r) + "\n" for r in rows))
    hold_after(tmp_path, first)
    result = run_submit(tmp_path, tiny_model, "--nodes", "4", *hold_overrides(tmp_path), *OPD, "cluster.teacher.num_nodes=1",
                        opd_section(teacher_models, by_agent="{adder: alpha, multiplier: beta}"),
                        "grpo.filters.identical_reward=false", f"grpo.max_num_steps={STEPS}",
                        "checkpointing.save_period=3", f"data.datasets=[{{name: mixed, path: {mixed}}}]")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "teacher" in result.stdout   # the plan names the teacher component
    job = re.search(r"submitted job (\d+)", result.stdout).group(1)

    preempt_then_requeue(job, tmp_path, first, second, step_timeout_s=600)
    log = completed_after_two_resumes(job, tmp_path, first, second, STEPS)
    # each incarnation started both teachers' servers on the teacher component's node
    assert log.count("dockyard: started teacher alpha on node4") == 3, log[-3000:]
    assert log.count("dockyard: started teacher beta on node4") == 3
    for incarnation in (0, 1, 2):
        assert len(list((tmp_path / "slurm").glob(f"{job}.{incarnation}_teacher*_node4.log"))) == 2
    assert logged_steps(tmp_path) == list(range(1, STEPS + 1))
    for r in metrics(tmp_path):
        adders = sum(rows[i]["metadata"]["agent_name"] == "adder" for i in r["async/prompt_rows"])
        assert r["opd/rollouts_alpha"] == 4 * adders and r["opd/rollouts_beta"] == 4 * (4 - adders)
