"""Agent demonstrations from oracle solutions (`dockyard env demonstrate`): made in a real bubblewrap
sandbox, in the agent loop's own messages, and token for token what the agent loop would have built."""

import json

import pytest

from dockyard import registry
from dockyard.config import load_config
from dockyard.data.conversations import conversation_tokens
from dockyard.envs.demonstrations import (DemonstrationError, beyond_the_loops_budgets, oracle_calls, replayed_ids,
                                          write_demonstrations)
from dockyard.envs.terminal_bench import TERMINAL_TOOLS
from dockyard.envs.terminal_families.splits import SplitPlan, generate
from dockyard.models import load_tokenizer
from dockyard.sandboxes.bubblewrap import bwrap_path
from tests.conftest import REPO

SMOL = REPO / "models" / "smollm2-135m-instruct"
needs_bwrap = pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap is not installed (tools/install.sh)")


def config(*overrides):
    return load_config("grpo_terminal_bench_local.yaml", [f"models_dir={REPO / 'models'}", *overrides]).config


def test_a_solution_script_becomes_one_call_per_command_or_one_for_a_block():
    assert oracle_calls("#!/bin/bash\nset -e\n# make it\nmkdir out\n\ncd out && touch a\n") == ["mkdir out",
                                                                                              "cd out && touch a"]
    script = "#!/bin/bash\nfor f in *.txt; do\n  mv \"$f\" x\ndone\n"
    assert oracle_calls(script) == ["for f in *.txt; do\n  mv \"$f\" x\ndone"]


@needs_bwrap
def test_demonstrations_are_real_and_token_identical_to_the_agent_loops_stream(tmp_path):
    generate(SplitPlan(train_per_family=3, heldout_per_family=0, unseen_per_family=0,
                       families=("count_lines", "git_ops", "json_field", "fix_script", "csv_join"), unseen=("csv_join",)),
             tmp_path / "set")
    rows = tmp_path / "set" / "train.jsonl"
    # one task whose tests cannot pass: its demonstration is left out, by name
    broken = tmp_path / "set" / "train" / "git_ops-3-002" / "tests" / "test_outputs.py"
    broken.write_text(broken.read_text() + "\n\ndef test_impossible():\n    assert False\n")
    out = tmp_path / "demos.jsonl"
    written, left_out = write_demonstrations(config(), rows, out)
    assert written == 11 and len(left_out) == 1 and left_out[0].startswith("git_ops-3-002: its tests gave the oracle 0")
    demos = [json.loads(line) for line in out.read_text().splitlines()]
    tokenizer = load_tokenizer(SMOL)
    agent = registry.build("agent", "tool_calling", tokenizer=tokenizer, tools=TERMINAL_TOOLS,
                           system_prompt=config().data.add_system_prompt, tool_format="auto")
    for demo in demos:
        messages = demo["messages"]
        assert [m["role"] for m in messages[:2]] == ["system", "user"] and messages[-1] == {"role": "assistant",
                                                                                         "content": "DONE"}
        observations = [m["content"] for m in messages if m["role"] == "user"][1:]
        assert observations and all(o.startswith("Output of your command:\n") and "[exit status 0]" in o
                                    for o in observations)
        trained, mask = conversation_tokens(tokenizer, messages)
        replayed, sampled = replayed_ids(agent, messages)
        assert trained[:len(replayed)] == replayed, demo["task"]
        assert tokenizer.decode(trained[len(replayed):]) == "\n"   # the template's newline after the last turn
        # SFT trains on what the agent loop would have sampled, and on the template's newline after each
        # end-of-turn token, which the loop adds itself (the engine stops at the end-of-turn token)
        end = agent.bridge.end_ids[-1]
        assert sum(sampled) > 0 and all(mask[i] for i, s in enumerate(sampled) if s)
        assert all(trained[i - 1] == end and tokenizer.decode([trained[i]]) == "\n"
                   for i in range(len(replayed)) if mask[i] and not sampled[i])
    git = next(d for d in demos if d["task"] == "git_ops-1-000")
    assert "git init" in git["messages"][2]["content"]
    # a fix reads the script first: the second call's edit is the line the first call's output shows
    fix = next(d for d in demos if d["task"] == "fix_script-1-000")
    look, seen, edit = (m["content"] for m in fix["messages"][2:5])
    broken = edit.split("s/", 1)[1].split("/", 1)[0]
    assert look.startswith("```bash\ncat ") and broken in seen and "sed -i" in edit
    # what the loop could not have produced under the config's budgets is named (and left out when written)
    assert all(beyond_the_loops_budgets(config(), agent, d["messages"]) is None for d in demos)
    assert beyond_the_loops_budgets(config("grpo.max_rollout_turns=2"), agent, fix["messages"]) == \
        "3 turns, more than grpo.max_rollout_turns (2)"
    assert "more than policy.generation.max_new_tokens (12) allows a turn" in beyond_the_loops_budgets(
        config("policy.generation.max_new_tokens=12"), agent, git["messages"])
    assert "more than policy.max_total_sequence_length (150)" in beyond_the_loops_budgets(
        config("policy.max_total_sequence_length=150"), agent, git["messages"])


def test_only_the_plain_tool_format_is_demonstrated_and_a_single_turn_env_is_refused(tmp_path):
    with pytest.raises(DemonstrationError, match="env.tool_format: demonstrations are made in the plain format"):
        write_demonstrations(config("+env.tool_format=hermes"), tmp_path / "none.jsonl", tmp_path / "out.jsonl")
    with pytest.raises(DemonstrationError, match="env.agent"):
        write_demonstrations(config("env.agent=null", "grpo.max_rollout_turns=1"), tmp_path / "none.jsonl",
                             tmp_path / "out.jsonl")
