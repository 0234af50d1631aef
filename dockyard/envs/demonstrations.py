"""Agent demonstrations from oracle solutions, for agent SFT: each task's solution run as the agent's
own bash calls in a real sandbox of the configured kind, written down as the conversation the agent
loop would have had with it: the same first messages (system prompt, tool format, instruction), each
call written the way the tool format reads it, the real output of each command as the observation
message the loop sends, and the format's way to finish. A demonstration whose task's tests do not
pass, or that the loop could not produce under the config's budgets (turns, tokens a turn, tokens in
all), is left out and named.

`replayed_ids` turns a demonstration back into the token stream the agent loop builds turn by turn
(first prompt, reply tokens with their end-of-turn token, bridged observation messages), so a check
can compare it with what the SFT loop trains on (data/conversations.py).
"""

from __future__ import annotations

import json
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from dockyard import registry
from dockyard.agents.tool_format import Action, PlainFormat
from dockyard.data.datasets import Prompt, load_prompts
from dockyard.errors import DockyardError
from dockyard.models import load_tokenizer

# a line that cannot stand alone as one bash call: a continuation, a here-document, an open block
_MULTI_LINE = re.compile(r"(\\$|<<|\b(then|do|else|in)$|\{$|\($)")


class DemonstrationError(DockyardError, ValueError):
    """A demonstration that cannot be made in the agent's own format; the message names the setting."""


def oracle_calls(script: str) -> list[str]:
    """A solution script as the agent's bash calls: one per command line (comments, the shebang and
    `set -e` left out), or the whole body as one call when a line continues onto the next."""
    lines = [line.rstrip() for line in script.splitlines()]
    body = [line for line in lines if line.strip() and not line.lstrip().startswith("#")
            and line.strip() not in ("set -e", "set -eu", "set -euo pipefail")]
    if any(_MULTI_LINE.search(line.strip()) for line in body):
        return ["\n".join(body)]
    return body


def call_text(tool_format, command: str) -> str:
    """A bash call written the way the tool format reads it."""
    if isinstance(tool_format, PlainFormat):
        return f"```bash\n{command}\n```"
    return "<tool_call>" + json.dumps({"name": "bash", "arguments": {"command": command}}) + "</tool_call>"


def finish_text(tool_format) -> str:
    return "DONE" if isinstance(tool_format, PlainFormat) else "Done."


def demonstrate(env, agent, prompt: Prompt) -> tuple[list[dict], float]:
    """The conversation of the oracle solving `prompt`'s task in a sandbox, and the tests' reward."""
    task = env.task_for(prompt)
    if task.solution is None or task.solution.suffix != ".sh":
        raise DemonstrationError(f"task {task.name}: no solution script to demonstrate (solution.sh or solve.sh)")
    messages = agent.messages(prompt)
    episode = env.open(prompt)
    try:
        for command in oracle_calls(task.solution.read_text()):
            observation = episode.execute(Action("tool", "bash", {"command": command}))
            messages += [{"role": "assistant", "content": call_text(agent.format, command)},
                         agent.format.result_message(observation)]
        messages.append({"role": "assistant", "content": finish_text(agent.format)})
        reward = float(episode.finish())
    finally:
        episode.close()
    return messages, reward


def replayed_ids(agent, messages: list[dict]) -> tuple[list[int], list[int]]:
    """The token stream the agent loop builds for this conversation: the first prompt, then per reply its
    tokens and end-of-turn token (as sampled), then the observation's bridged tokens; and 1 on the tokens
    the loop would have sampled (its loss mask)."""
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    tools = agent.format.template_tools(agent.tools)
    kwargs = dict(agent.kwargs, **({"tools": tools} if tools else {}))
    ids = list(agent.tokenizer.apply_chat_template(messages[:first], add_generation_prompt=True, tokenize=True,
                                                   chat_template=agent.chat_template, return_dict=False, **kwargs))
    sampled = [0] * len(ids)
    for message in messages[first:]:
        if message["role"] == "assistant":
            added = agent.tokenizer.encode(message["content"], add_special_tokens=False) + agent.bridge.end_ids
        else:
            added = agent.bridge.after_reply(message, reply_ended=True)
        ids += added
        sampled += [int(message["role"] == "assistant")] * len(added)
    return ids, sampled


def beyond_the_loops_budgets(cfg, agent, messages: list[dict]) -> str | None:
    """Why the agent loop could never have this conversation under the config's budgets, or None. SFT on
    a reply the loop would cut off teaches the policy a start it cannot finish."""
    replies = [m["content"] for m in messages if m["role"] == "assistant"]
    if len(replies) > cfg.grpo.max_rollout_turns:
        return f"{len(replies)} turns, more than grpo.max_rollout_turns ({cfg.grpo.max_rollout_turns})"
    longest = max(len(agent.tokenizer.encode(r, add_special_tokens=False)) + len(agent.bridge.end_ids) for r in replies)
    if longest > cfg.policy.generation.max_new_tokens:
        return (f"a reply of {longest} tokens, more than policy.generation.max_new_tokens "
                f"({cfg.policy.generation.max_new_tokens}) allows a turn")
    ids, _ = replayed_ids(agent, messages)
    if len(ids) > cfg.policy.max_total_sequence_length:
        return f"{len(ids)} tokens, more than policy.max_total_sequence_length ({cfg.policy.max_total_sequence_length})"
    return None


def write_demonstrations(cfg, tasks: str | Path, out: str | Path, log=sys.stderr) -> tuple[int, list[str]]:
    """Demonstrations of every row of `tasks` (a jsonl index read like the config's first dataset) into
    `out` ({"messages", "task"} per line); the number written and the tasks left out, with why."""
    if cfg.env.agent is None:
        raise DemonstrationError("env.agent: demonstrations are an agent's conversations; set env.agent")
    env = registry.build("environment", cfg.env.name, config=cfg.env)
    if not getattr(env, "multi_turn", False) or not hasattr(env, "task_for"):
        raise DemonstrationError(f"env.name: {cfg.env.name!r} has no task folders with solutions to demonstrate")
    chat = cfg.policy.generation.chat_template
    tokenizer = load_tokenizer(cfg.policy.tokenizer_name or cfg.policy.model_name)
    agent = registry.build("agent", cfg.env.agent, tokenizer=tokenizer, tools=env.tools,
                           system_prompt=cfg.data.add_system_prompt,
                           chat_template=Path(chat.path).read_text() if chat.path else None,
                           template_kwargs=chat.generation_prompt_kwargs, tool_format=env.tool_format)
    if not isinstance(agent.format, PlainFormat):
        # the hermes format's tools are rendered by the template from a `tools` argument, which the SFT
        # loop does not pass when it renders a conversation
        raise DemonstrationError(f"env.tool_format: demonstrations are made in the plain format only; "
                                 f"{cfg.policy.model_name} reads {agent.format.name}")
    rows = load_prompts(cfg.data.datasets[0].model_copy(update={"path": str(tasks), "shuffle": False}))

    def attempt(prompt: Prompt) -> tuple[str, list[dict] | None, str | None]:
        name = prompt.metadata.get("name") or prompt.metadata.get("path")
        try:
            messages, reward = demonstrate(env, agent, prompt)
        except Exception as err:   # one task's broken set-up never ends the others'
            return name, None, f"{type(err).__name__}: {err}"
        if reward < 1.0:
            return name, None, f"its tests gave the oracle {reward:g}"
        too_long = beyond_the_loops_budgets(cfg, agent, messages)
        return (name, None, f"the agent loop could not produce it: {too_long}") if too_long else (name, messages, None)

    written, left_out = 0, []
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as sink, ThreadPoolExecutor(max_workers=cfg.env.num_workers) as pool:
        for name, messages, why in pool.map(attempt, rows):   # in the rows' order
            if messages is None:
                left_out.append(f"{name}: {why}")
                continue
            sink.write(json.dumps({"messages": messages, "task": name}) + "\n")
            written += 1
            print(f"{name}: {sum(m['role'] == 'assistant' for m in messages) - 1} call(s)", file=log, flush=True)
    return written, left_out
