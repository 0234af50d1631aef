"""On-policy distillation end to end with `dockyard run`: two teacher servers (different weights, the
student's tokenizer) beside the student's engine; every rollout goes to the teacher its agent name
or dataset selects, and the student trains on teacher-minus-student logprobs per token."""

import json

from tests.run.test_local_run import run

TEACHERS_CLUSTER = ("cluster.num_nodes=4", "cluster.teacher.num_nodes=1")
OPD = ("grpo.adv_estimator={name: opd, norm_mode: none}", "grpo.async_grpo.enabled=true",
       "grpo.async_grpo.max_staleness_steps=1", "loss_fn.is_correction.enabled=true",
       "loss_fn.is_correction.lower_bound=0.5", "loss_fn.is_correction.upper_bound=2.0")


def write_prompts(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def opd_section(teacher_models, by_agent: str = "{adder: alpha}", default: str = "null") -> str:
    return (f"+on_policy_distillation={{teachers: [{{name: alpha, hf_path: {teacher_models['alpha']}}}, "
            f"{{name: beta, hf_path: {teacher_models['beta']}}}], teacher_model_by_agent_name: {by_agent}, "
            f"default_teacher: {default}}}")


def test_opd_routes_each_rollout_to_its_teacher_and_trains_on_their_logprobs(tiny_model, teacher_models, tmp_path):
    tmp_path.mkdir(exist_ok=True)
    # one mixed prompt set (async GRPO reads one dataset): the agent name of each row picks its teacher
    rows = [{"input": f"{a} + {a}", "label": str(2 * a), "metadata": {"agent_name": "adder"}} if a % 3 else
            {"input": f"{a} * 3", "label": str(3 * a), "metadata": {"agent_name": "multiplier"}} for a in range(60)]
    mixed = write_prompts(tmp_path / "mixed.jsonl", rows)
    result = run(tmp_path, tiny_model, *OPD, *TEACHERS_CLUSTER,
                 opd_section(teacher_models, by_agent="{adder: alpha, multiplier: beta}"),
                 "grpo.filters.identical_reward=false", "grpo.max_num_steps=3", "checkpointing.save_period=3",
                 f"data.datasets=[{{name: mixed, path: {mixed}}}]")
    assert result.returncode == 0, result.stdout
    assert "training prompts per teacher: alpha 40, beta 20" in result.stdout
    logs = tmp_path / "runs" / "grpo_tiny" / "logs"
    metrics = [json.loads(line) for line in (logs / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in metrics] == [1, 2, 3]
    for r in metrics:
        # the step's prompt rows say which agent each group had: 4 samples a group, each to its teacher
        adders = sum(rows[i]["metadata"]["agent_name"] == "adder" for i in r["async/prompt_rows"])
        assert r["opd/rollouts_alpha"] == 4 * adders and r["opd/rollouts_beta"] == 4 * (4 - adders)
        assert r["opd/reverse_kl_k1"] != 0 and r["time/teacher"] > 0
    assert any(r["opd/rollouts_alpha"] and r["opd/rollouts_beta"] for r in metrics)   # both in one step
    for name in ("alpha", "beta"):
        assert (logs / f"teacher_{name}_0.log").is_file()


def test_an_agent_name_no_teacher_takes_is_refused_at_start_naming_it(tiny_model, teacher_models, tmp_path):
    tmp_path.mkdir(exist_ok=True)
    rows = write_prompts(tmp_path / "p.jsonl", [{"input": "1 + 1", "label": "2", "metadata": {"agent_name": "poet"}}])
    result = run(tmp_path, tiny_model, *OPD, *TEACHERS_CLUSTER, opd_section(teacher_models),
                 "grpo.filters.identical_reward=false", "grpo.max_num_steps=1",
                 f"data.datasets=[{{name: verses, path: {rows}}}]")
    assert result.returncode == 2, result.stdout
    assert "agent name 'poet'" in result.stdout and "teacher_model_by_agent_name" in result.stdout
    assert "Traceback" not in result.stdout and not (tmp_path / "runs").exists()   # before anything started


def test_opd_settings_it_cannot_honour_are_refused_by_name(tiny_model, teacher_models, tmp_path):
    invalid = run(tmp_path, tiny_model, *OPD, *TEACHERS_CLUSTER, opd_section(teacher_models),
                  "policy.generation.temperature=0.7", "grpo.filters.identical_reward=true")
    unbuilt = run(tmp_path, tiny_model, *OPD, *TEACHERS_CLUSTER, opd_section(teacher_models),
                  "on_policy_distillation.gkd_ratio=0.5", "on_policy_distillation.pg_kl_method=full_kl",
                  "on_policy_distillation.topk=8")
    for result, paths in ((invalid, ("grpo.filters.identical_reward", "policy.generation.temperature")),
                          (unbuilt, ("on_policy_distillation.gkd_ratio", "on_policy_distillation.pg_kl_method",
                                     "on_policy_distillation.topk"))):
        assert result.returncode == 2
        for path in paths:
            assert f"  - {path}: " in result.stdout, path
    assert not (tmp_path / "runs").exists()
