"""Teachers of on-policy distillation: routing by agent name, prefill scoring against real teacher
servers, and the OPD advantage against a plain computation."""

import pytest
import torch

from dockyard.algorithms.advantages import OnPolicyDistillationAdvantage
from dockyard.config import load_config
from dockyard.data.datasets import Prompt
from dockyard.generation.client import EngineClient
from dockyard.generation.engine import SamplingParams
from dockyard.data.teacher_routing import TeacherRouting, TeacherRoutingError
from dockyard.loop.teachers import TeacherScorer
from dockyard.models import load_causal_lm
from dockyard.policy.samples import Sample
from tests.conftest import running_engine_server


_OPD_BASE = ("grpo.adv_estimator={name: opd, norm_mode: none}", "grpo.async_grpo.enabled=true",
             "loss_fn.is_correction.enabled=true", "loss_fn.is_correction.lower_bound=0.5",
             "loss_fn.is_correction.upper_bound=2.0", "cluster.num_nodes=4", "cluster.teacher.num_nodes=1")


def opd_config(tiny_model, by_agent: str, default: str = "null", datasets: str | None = None):
    overrides = [f"models_dir={tiny_model.parent}", *_OPD_BASE,
                 f"+on_policy_distillation={{teachers: [{{name: alpha, hf_path: {tiny_model}}}, "
                 f"{{name: beta, hf_path: {tiny_model}}}], teacher_model_by_agent_name: {by_agent}, "
                 f"default_teacher: {default}}}"]
    if datasets:
        overrides.append(f"data.datasets={datasets}")
    return load_config("grpo_tiny.yaml", overrides).config


def prompt(agent: str | None, source: str = "train") -> Prompt:
    return Prompt("1 + 1", "2", {"agent_name": agent} if agent else {}, source)


def test_the_agent_name_then_the_dataset_then_the_default_picks_the_teacher(tiny_model):
    routing = TeacherRouting(opd_config(tiny_model, "{coder: beta}"))
    assert routing.teacher(prompt("coder")) == "beta"
    assert routing.teacher(prompt(None)) == "alpha"                  # no agent name at all: the first teacher
    with pytest.raises(TeacherRoutingError, match="agent name 'poet'.*maps: coder"):
        routing.teacher(prompt("poet"))
    by_dataset = TeacherRouting(opd_config(tiny_model, "{coder: alpha}",
                                           datasets="[{name: train, path: x.jsonl, teacher_name: beta}]"))
    assert by_dataset.teacher(prompt("coder")) == "alpha"            # the agent's teacher first
    assert by_dataset.teacher(prompt("poet")) == "beta"              # then the dataset's teacher_name
    defaulted = TeacherRouting(opd_config(tiny_model, "{coder: alpha}", default="beta"))
    assert defaulted.teacher(prompt("poet")) == "beta" and defaulted.teacher(prompt("coder")) == "alpha"


def test_opd_advantage_is_teacher_minus_student_on_trained_tokens_only():
    torch.manual_seed(0)
    student = [torch.randn(5), torch.randn(3)]
    teacher = [torch.randn(5), torch.randn(3)]
    masks = [torch.tensor([1., 1., 0., 0., 1.]), torch.ones(3)]
    got = OnPolicyDistillationAdvantage("none", pg_ratio=0.5)(student, teacher, masks)
    for s, t, m, g in zip(student, teacher, masks, got):
        for i in range(len(s)):
            want = 0.5 * (float(t[i]) - float(s[i])) if m[i] else 0.0
            assert abs(float(g[i]) - want) < 1e-6
        assert not g.requires_grad
    with pytest.raises(ValueError, match="norm_mode must be none"):
        OnPolicyDistillationAdvantage("group_zscore")
    with pytest.raises(ValueError, match="differ in length"):
        OnPolicyDistillationAdvantage()([torch.zeros(2)], [torch.zeros(3)], [torch.ones(2)])


@pytest.fixture(scope="module")
def two_teachers(tiny_model, teacher_models):
    """Two real engine servers with different weights (same tokenizer); yields {name: (url, folder)}."""
    alpha, beta = teacher_models["alpha"], teacher_models["beta"]
    with running_engine_server(alpha, alpha.parent) as (alpha_url, _), \
            running_engine_server(beta, beta.parent) as (beta_url, _):
        yield {"alpha": (alpha_url, alpha), "beta": (beta_url, beta)}


def own_logprobs(folder, sequence: list[int], start: int) -> list[float]:
    model = load_causal_lm(folder).eval()
    with torch.no_grad():
        logits = model(torch.tensor([sequence])).logits[0, :-1].float()
    logprobs = torch.log_softmax(logits, -1).gather(-1, torch.tensor(sequence[1:])[:, None])[:, 0]
    return logprobs[start - 1:].tolist()


def test_each_rollout_is_scored_by_prefill_on_its_teachers_server(tiny_model, two_teachers):
    cfg = opd_config(tiny_model, "{adder: alpha, multiplier: beta}")
    clients = {name: EngineClient(url, name=f"teacher {name}") for name, (url, _) in two_teachers.items()}
    # rollouts sampled by one of the servers (the student's stand-in): a prompt and 6 sampled tokens each
    prompts_ids = [[1, 5, 9, 12], [1, 7, 3], [1, 4, 4, 8, 2]]
    completions = clients["alpha"].generate(prompts_ids, SamplingParams(n=1, max_tokens=6, temperature=1.0,
                                                                        seed=3, ignore_eos=True))
    samples = [Sample(token_ids=prompts_ids[c.prompt_index] + c.token_ids, prompt_length=len(prompts_ids[c.prompt_index]))
               for c in completions]
    agents = ["multiplier", "adder", "multiplier"]
    scores, metrics = TeacherScorer(clients, TeacherRouting(cfg)).score(samples, [prompt(a) for a in agents])
    assert metrics["opd/rollouts_alpha"] == 1 and metrics["opd/rollouts_beta"] == 2
    for sample, agent, got in zip(samples, agents, scores):
        teacher = {"adder": "alpha", "multiplier": "beta"}[agent]
        other = "beta" if teacher == "alpha" else "alpha"
        want = own_logprobs(two_teachers[teacher][1], sample.token_ids, sample.prompt_length)
        assert len(got) == sample.response_length
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want), atol=1e-4, rtol=0)
        # and not the other teacher's numbers: the routing is what made them match
        assert (torch.tensor(got) - torch.tensor(own_logprobs(two_teachers[other][1], sample.token_ids,
                                                              sample.prompt_length))).abs().max() > 1e-2
    for client in clients.values():
        client.close()


def test_teacher_settings_that_cannot_take_effect_here_are_refused_by_name(tiny_model):
    from dockyard.preflight.components import unsupported
    from tests.conftest import problems_of

    cfg = opd_config(tiny_model, "{}")
    cpu_tp = load_config("grpo_tiny.yaml", [f"models_dir={tiny_model.parent}", *_OPD_BASE, "cluster.cpu_ranks_per_node=2", "cluster.teacher.tasks_per_node=2",
        f"+on_policy_distillation={{teachers: [{{name: a, hf_path: {tiny_model}}}], "
        "parallelism: {tensor_parallel_size: 2}}"]).config
    assert [p.path for p in unsupported(cpu_tp)] == ["on_policy_distillation.parallelism.tensor_parallel_size"]
    assert unsupported(cfg) == []
    # two teachers but one teacher task: the second server's srun step would wait for CPUs forever
    assert any(p.startswith("cluster.teacher.tasks_per_node:") for p in problems_of(
        "grpo_tiny.yaml", f"models_dir={tiny_model.parent}", *_OPD_BASE, "cluster.teacher.tasks_per_node=1",
        f"+on_policy_distillation={{teachers: [{{name: a, hf_path: {tiny_model}}}, {{name: b, hf_path: {tiny_model}}}]}}"))

