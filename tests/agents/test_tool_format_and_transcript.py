"""Reading replies as actions (both tool formats) and the token-level transcript of a multi-turn
trajectory, with real tokenizers: the tiny Llama's, SmolLM2's and a Qwen-style (Hermes) template."""

import pytest
from transformers import AutoTokenizer

from dockyard.agents.tool_calling import ToolCallingAgent
from dockyard.agents.tool_format import TERMINAL_TOOLS, HermesFormat, PlainFormat, format_for
from dockyard.agents.transcript import MessageBridge, Transcript, TranscriptError
from dockyard.data.datasets import Prompt
from tests.conftest import REPO

SMOL = REPO / "models" / "smollm2-135m-instruct"

# The Hermes tool-call protocol as Qwen2.5's template renders it (tools in the system message,
# <tool_call> in replies, tool results as <tool_response> in a user turn), written for this test.
HERMES_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n{{ messages[0]['content'] if messages[0]['role'] == 'system' else 'You are "
    "helpful.' }}\n\n# Tools\n<tools>{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools>\nCall a tool "
    "with <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call><|im_end|>\n{% elif messages[0]['role'] == "
    "'system' %}<|im_start|>system\n{{ messages[0]['content'] }}<|im_end|>\n{% endif %}"
    "{% for message in messages %}{% if message['role'] == 'tool' %}<|im_start|>user\n<tool_response>\n"
    "{{ message['content'] }}\n</tool_response><|im_end|>\n{% elif message['role'] != 'system' %}<|im_start|>"
    "{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def smol():
    return AutoTokenizer.from_pretrained(SMOL)


def test_plain_format_reads_bash_blocks_submit_and_mistakes():
    plain, tools = PlainFormat(), TERMINAL_TOOLS
    act = plain.parse("I will list the files.\n```bash\nls -la\n```", tools)
    assert (act.kind, act.name, act.arguments) == ("tool", "bash", {"command": "ls -la", "timeout": 60.0})
    assert plain.parse("All done.\nDONE", tools).kind == "submit"
    assert plain.parse("The file is created.", tools).kind == "submit"      # no action: the final answer
    assert plain.parse("```bash\nls", tools).error == "the ```bash block is not closed with ```"
    assert "one ```bash block" in plain.parse("```bash\nls\n```\n```bash\npwd\n```", tools).error
    assert plain.parse("```python\nprint(1)\n```", tools).kind == "invalid"
    assert plain.parse("Run:\n```\ntouch done.txt\n```", tools).arguments["command"] == "touch done.txt"
    shown = plain.parse("```bash\necho hi > a.txt\n```\nThe output will be:\n```\nhi\n```", tools)
    assert shown.arguments["command"] == "echo hi > a.txt"   # the bare block after it is not a second command
    assert plain.parse("```bash\n\n```", tools).error == "bash needs a non-empty command"


def test_hermes_format_reads_tool_calls_and_names_what_is_wrong():
    hermes, tools = HermesFormat(), TERMINAL_TOOLS
    act = hermes.parse('<tool_call>\n{"name": "bash", "arguments": {"command": "cat a.txt", "timeout": 5}}\n</tool_call>',
                       tools)
    assert (act.kind, act.arguments) == ("tool", {"command": "cat a.txt", "timeout": 5.0})
    as_string = hermes.parse('<tool_call>{"name": "bash", "arguments": "{\\"command\\": \\"pwd\\"}"}</tool_call>', tools)
    assert as_string.arguments["command"] == "pwd"
    assert hermes.parse('<tool_call>{"name": "submit", "arguments": {}}</tool_call>', tools).kind == "submit"
    assert hermes.parse("Finished.", tools).kind == "submit"
    assert "not valid JSON" in hermes.parse("<tool_call>{name: bash}</tool_call>", tools).error
    assert "unknown tool 'python'" in hermes.parse('<tool_call>{"name": "python", "arguments": {}}</tool_call>',
                                                   tools).error
    assert hermes.parse('<tool_call>{"name": "bash", "arguments": {}}</tool_call>', tools).error == "bash needs command"
    assert "positive number" in hermes.parse(
        '<tool_call>{"name": "bash", "arguments": {"command": "ls", "timeout": -1}}</tool_call>', tools).error
    assert "not closed" in hermes.parse('<tool_call>{"name": "bash"', tools).error


def test_the_format_follows_the_chat_template(smol):
    assert format_for(smol).name == "plain"                       # SmolLM2's template knows no tools
    assert format_for(smol, HERMES_TEMPLATE).name == "hermes"
    assert format_for(smol, requested="hermes").name == "hermes"
    with pytest.raises(ValueError, match="env.tool_format: 'xml'"):
        format_for(smol, requested="xml")


@pytest.mark.parametrize("template", [None, HERMES_TEMPLATE], ids=["smollm2", "hermes"])
def test_turns_extend_the_sampled_tokens_exactly(smol, template):
    """Token in, token out: the ids after three turns equal the first prompt + each turn's sampled ids
    + the bridged messages, and decode to the conversation the template would render."""
    agent = ToolCallingAgent(smol, TERMINAL_TOOLS, system_prompt="Be careful.", chat_template=template)
    transcript = Transcript(agent.first_prompt(Prompt("Count the lines of data.txt.", None, {}, "t")))
    if template:
        assert "<tools>" in smol.decode(transcript.prompt_ids) and '"name": "bash"' in smol.decode(transcript.prompt_ids)
    replies = ['<tool_call>{"name": "bash", "arguments": {"command": "wc -l data.txt"}}</tool_call>' if template
               else "```bash\nwc -l data.txt\n```", "It has 37 lines."]
    sampled = []
    for turn, reply in enumerate(replies):
        ids = smol.encode(reply, add_special_tokens=False) + smol.encode(smol.eos_token, add_special_tokens=False)
        before = transcript.ids
        transcript.add_sampled(ids, [-0.5] * len(ids))
        sampled.append(ids)
        assert transcript.ids[:len(before)] == before
        if turn == 0:
            observation = agent.observation_ids("37 data.txt\n[exit status 0]", reply_ended=True)
            transcript.extend(transcript.ids, observation)
    mask = transcript.mask
    assert sum(mask) == sum(len(ids) for ids in sampled)
    assert [t for t, m in zip(transcript.tokens, mask) if m] == sampled[0] + sampled[1]
    assert [lp for lp, m in zip(transcript.logprobs, mask) if not m] == [0.0] * (len(mask) - sum(mask))
    messages = agent.messages(Prompt("Count the lines of data.txt.", None, {}, "t")) + [
        {"role": "assistant", "content": replies[0]}, agent.format.result_message("37 data.txt\n[exit status 0]"),
        {"role": "assistant", "content": replies[1]}]
    rendered = smol.apply_chat_template(messages, tokenize=False, chat_template=template,
                                        **({"tools": [t.schema() for t in TERMINAL_TOOLS]} if template else {}))
    assert smol.decode(transcript.ids) == rendered.rstrip("\n")
    with pytest.raises(AssertionError, match="must extend"):
        transcript.extend(transcript.ids[:-1] + [0], [1, 2])


def test_a_reply_cut_by_the_length_budget_is_closed_unsampled(smol):
    bridge = MessageBridge(smol)
    closed = bridge.after_reply({"role": "user", "content": "x"}, reply_ended=False)
    assert closed[:len(bridge.end_ids)] == bridge.end_ids
    assert bridge.after_reply({"role": "user", "content": "x"}, reply_ended=True) == closed[len(bridge.end_ids):]


def test_a_template_that_rewrites_history_is_refused(smol):
    rewriting = ("{% for m in messages %}{% if loop.last %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                 "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    with pytest.raises(TranscriptError, match="renders earlier turns differently"):
        MessageBridge(smol, rewriting).after_reply({"role": "user", "content": "x"}, True)
