"""`tool_calling`: the multi-turn agent that works an environment's tools through the model.

It owns the conversation's text side: the first prompt (system message with the tool format,
the task's instruction), reading each reply as an action (tool_format.py), and the message an
observation goes back as. The token side (exact sampled tokens, bridged messages, masks) is
transcript.py's; the turn loop is dockyard/loop/agent_rollouts.py.
"""

from __future__ import annotations

from dockyard.agents.tool_format import Action, Tool, format_for
from dockyard.agents.transcript import MessageBridge
from dockyard.data.datasets import Prompt, build_messages


class ToolCallingAgent:
    """Model emits tool calls (the template's own format, or the plain-text fallback), environment
    returns observations."""

    def __init__(self, tokenizer, tools: list[Tool], system_prompt: str | None = None,
                 chat_template: str | None = None, template_kwargs: dict | None = None, tool_format: str = "auto"):
        self.tokenizer, self.tools = tokenizer, tools
        self.system_prompt, self.chat_template = system_prompt, chat_template
        self.kwargs = dict(template_kwargs or {})
        self.format = format_for(tokenizer, chat_template, tool_format)
        self.bridge = MessageBridge(tokenizer, chat_template, self.kwargs)

    def messages(self, prompt: Prompt) -> list[dict]:
        guide = self.format.system_text(self.tools)
        system = "\n\n".join(part for part in (self.system_prompt, guide) if part) or None
        return build_messages(prompt, system)

    def first_prompt(self, prompt: Prompt) -> list[int]:
        tools = self.format.template_tools(self.tools)
        kwargs = dict(self.kwargs, **({"tools": tools} if tools else {}))
        ids = self.tokenizer.apply_chat_template(self.messages(prompt), add_generation_prompt=True, tokenize=True,
                                                 chat_template=self.chat_template, return_dict=False, **kwargs)
        return list(ids)

    def act(self, reply: str) -> Action:
        return self.format.parse(reply, self.tools)

    def observation_ids(self, observation: str, reply_ended: bool) -> list[int]:
        return self.bridge.after_reply(self.format.result_message(observation), reply_ended)

    def invalid_observation(self, action: Action) -> str:
        return f"Invalid action: {action.error}."
