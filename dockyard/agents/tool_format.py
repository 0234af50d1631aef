"""How tools are declared to a model and how its replies are read as actions.

Two formats, chosen from the model's chat template:

- `hermes` (Qwen2/Qwen3, Hermes, and any template that renders a `tools` list): tools go to the
  template as JSON schemas (`apply_chat_template(..., tools=...)`), and the model calls one with
      <tool_call>
      {"name": "bash", "arguments": {"command": "ls -la", "timeout": 30}}
      </tool_call>
  Tool results go back as `tool` messages (the template wraps them, e.g. in <tool_response>).
- `plain` (templates without tool support, such as SmolLM2's): the tools are described in the system
  message in words, and a reply acts by
      ```bash
      ls -la
      ```
  (one fenced bash block: the command; a block without a language counts when it is the only one),
  or ends the task with a last line `DONE`. Results go back
  as `user` messages starting "Output of your command".

In both, a reply with no action ends the episode (it is the agent's final answer, as `submit` is);
a reply whose action cannot be read (broken JSON, an unknown tool, missing arguments, an unclosed
block, several actions at once) is an invalid action: the episode goes on with an error message
as the observation, and `grpo.invalid_action_penalty` applies to the trajectory.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

DEFAULT_TIMEOUT_S = 60.0


@dataclass
class Tool:
    name: str
    description: str
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})

    def schema(self) -> dict:
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


BASH = Tool("bash", "Run a shell command in the task's terminal (a persistent bash session: the current "
            "directory and variables carry over) and see its output.",
            {"type": "object", "properties": {
                "command": {"type": "string", "description": "the command line to run"},
                "timeout": {"type": "number", "description": "seconds before the command is killed"}},
             "required": ["command"]})
SUBMIT = Tool("submit", "Say that the task is finished; the task's tests then decide.")
TERMINAL_TOOLS = [BASH, SUBMIT]


@dataclass
class Action:
    kind: str                                  # "tool", "submit" or "invalid"
    name: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str = ""


class HermesFormat:
    name = "hermes"
    _CALL = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)

    def system_text(self, tools: list[Tool]) -> str:
        return ""   # the chat template renders the tools itself

    def template_tools(self, tools: list[Tool]) -> list[dict] | None:
        return [tool.schema() for tool in tools]

    def parse(self, reply: str, tools: list[Tool]) -> Action:
        calls = self._CALL.findall(reply)
        if not calls:
            return Action("submit")
        if len(calls) > 1:
            return Action("invalid", error="one tool call per reply, please")
        body, closed = calls[0]
        if not closed:
            return Action("invalid", error="the <tool_call> is not closed with </tool_call>")
        try:
            call = json.loads(body.strip())
        except json.JSONDecodeError as err:
            return Action("invalid", error=f"the tool call is not valid JSON ({err.msg})")
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return Action("invalid", error='a tool call is {"name": ..., "arguments": {...}}')
        arguments = call.get("arguments", {})
        if isinstance(arguments, str):   # some models send the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                return Action("invalid", error="the tool call's arguments are not valid JSON")
        return _checked(call["name"], arguments, tools)

    def result_message(self, output: str) -> dict:
        return {"role": "tool", "content": output}


class PlainFormat:
    name = "plain"
    _SHELL = re.compile(r"```(?:bash|sh|shell)[ \t]*\n(.*?)(```|$)", re.DOTALL)
    # a bare ``` block counts when it is the reply's only block: small models often leave the language
    # out, and put the command's expected output in a bare block after a ```bash one
    _BARE = re.compile(r"```[ \t]*\n(.*?)(```|$)", re.DOTALL)

    def system_text(self, tools: list[Tool]) -> str:
        return ("You work in a Linux terminal. To run a shell command, reply with exactly one block:\n"
                "```bash\n<command>\n```\nYou will see its output. When the task is done, reply with DONE "
                "on the last line.")

    def template_tools(self, tools: list[Tool]) -> list[dict] | None:
        return None

    def parse(self, reply: str, tools: list[Tool]) -> Action:
        blocks = self._SHELL.findall(reply)
        if not blocks and reply.count("```") <= 2:
            blocks = self._BARE.findall(reply)
        if not blocks:
            lines = [line.strip() for line in reply.strip().splitlines() if line.strip()]
            return Action("submit") if not lines or lines[-1] == "DONE" or "```" not in reply else Action(
                "invalid", error="a command goes in a ```bash block")
        if len(blocks) > 1:
            return Action("invalid", error="one ```bash block per reply, please")
        command, closed = blocks[0]
        if not closed:
            return Action("invalid", error="the ```bash block is not closed with ```")
        return _checked("bash", {"command": command.strip()}, tools)

    def result_message(self, output: str) -> dict:
        return {"role": "user", "content": "Output of your command:\n" + output}


def _checked(name: str, arguments: Any, tools: list[Tool]) -> Action:
    known = {tool.name: tool for tool in tools}
    if name not in known:
        return Action("invalid", error=f"unknown tool {name!r}; tools: {', '.join(known)}")
    if not isinstance(arguments, dict):
        return Action("invalid", error=f"the arguments of {name} must be an object")
    missing = [key for key in known[name].parameters.get("required", []) if key not in arguments]
    if missing:
        return Action("invalid", error=f"{name} needs {', '.join(missing)}")
    if name == "submit":
        return Action("submit")
    if name == "bash":
        command = arguments.get("command")
        if not isinstance(command, str) or not command.strip():
            return Action("invalid", error="bash needs a non-empty command")
        timeout = arguments.get("timeout", DEFAULT_TIMEOUT_S)
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout <= 0:
            return Action("invalid", error="bash's timeout is a positive number of seconds")
        return Action("tool", "bash", {"command": command, "timeout": float(timeout)})
    return Action("tool", name, arguments)


FORMATS = {"hermes": HermesFormat, "plain": PlainFormat}


def format_for(tokenizer, chat_template: str | None = None, requested: str = "auto"):
    """`hermes` when the chat template renders a tools list, else `plain` (or the requested one)."""
    if requested != "auto":
        if requested not in FORMATS:
            raise ValueError(f"env.tool_format: {requested!r} is not a tool format ({', '.join(FORMATS)}, auto)")
        return FORMATS[requested]()
    template = chat_template or getattr(tokenizer, "chat_template", None) or ""
    return HermesFormat() if "tools" in template and "tool_call" in template else PlainFormat()
