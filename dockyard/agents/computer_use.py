"""`computer_use`: the multi-turn agent that works a desktop (env osworld) through the model.

The conversation, as OSWorld's agents hold it: a system message that gives the action space (pyautogui
code or computer_13 JSON, desktop/actions.py) and the screen size, the task's instruction with the first
observation, then one user message per observation after each reply. A screenshot is written into its
message as the vision model's image placeholder (`image_token`, one per screenshot); the rollout collector
keeps the screenshot beside the tokens, and the generation server and the trainer expand it. A reply's action is read on the host
into checked records (never executed here); WAIT observes again, DONE and FAIL end the episode (FAIL
says the task cannot be done: OSWorld's infeasible tasks want exactly that). The token side (exact sampled
tokens, bridged messages, masks) is transcript.py's, as for tool_calling.
"""

from __future__ import annotations

from dockyard.agents.tool_format import Action
from dockyard.agents.transcript import MessageBridge
from dockyard.data.datasets import Prompt, build_messages
from dockyard.desktop.actions import ALLOWED, COMPUTER_13, ActionError, Screen, parse_reply
from dockyard.desktop.observation import DesktopObservation

INVALID = "Invalid action:"
SEES = {"a11y_tree": "the desktop's accessibility tree: one line per element, with its role, name, text, top-left "
                     "position and size",
        "screenshot": "a screenshot of the desktop",
        "screenshot_a11y_tree": "a screenshot of the desktop and its accessibility tree: one line per element, with "
                                "its role, name, text, top-left position and size"}
PYAUTOGUI_GUIDE = """You work a Linux desktop ({width}x{height} pixels) to do the user's task. Each turn you see \
{sees}.
Act with Python code that uses pyautogui, in one ```python block. Allowed calls: {allowed}; \
each with literal arguments. Coordinates are screen pixels: click an element at its centre \
(position plus half its size). You cannot see the result of an action until the next turn.
Instead of code you may answer with one of these blocks: ```WAIT``` to look again, ```DONE``` when the task is \
finished, ```FAIL``` if the task cannot be done.
The user's password, where one is asked for, is "password"."""

COMPUTER_13_GUIDE = """You work a Linux desktop ({width}x{height} pixels) to do the user's task. Each turn you see \
{sees}.
Act with one JSON object in a ``` block, with "action_type" one of {kinds} and its parameters \
(x and y for the mouse, "button", "num_clicks", "text" for TYPING, "key" for PRESS / KEY_DOWN / KEY_UP, "keys" for \
HOTKEY, "dx" and "dy" for SCROLL); a list of such objects runs in order.
Answer with {{"action_type": "WAIT"}} to look again, "DONE" when the task is finished, "FAIL" if it cannot be done."""


class ComputerUseAgent:
    """Model replies with desktop actions, environment returns the next observation."""

    def __init__(self, tokenizer, tools=None, system_prompt: str | None = None, chat_template: str | None = None,
                 template_kwargs: dict | None = None, tool_format: str = "auto", action_space: str = "pyautogui",
                 screen: tuple[int, int] = (1920, 1080), observation_type: str = "a11y_tree",
                 image_token: str | None = None, image_placeholder: str | None = None):
        if observation_type not in SEES:
            raise ValueError(f"env.observation_type: {observation_type!r} is not one of {', '.join(SEES)}")
        if observation_type != "a11y_tree" and not image_token:
            raise ValueError(f"env.observation_type: {observation_type} shows the model screenshots; the policy "
                             "must be a vision-language model with policy.generation.allow_multimodal_inputs on")
        self.observation_type, self.image_token = observation_type, image_token
        self.image_placeholder = image_placeholder or image_token   # what a message writes per screenshot
        self.tokenizer, self.system_prompt, self.chat_template = tokenizer, system_prompt, chat_template
        self.kwargs = dict(template_kwargs or {})
        self.action_space = action_space
        self.screen = Screen(*screen)
        self.bridge = MessageBridge(tokenizer, chat_template, self.kwargs)

    def guide(self) -> str:
        values = {"width": self.screen.width, "height": self.screen.height, "sees": SEES[self.observation_type]}
        if self.action_space == "pyautogui":
            return PYAUTOGUI_GUIDE.format(allowed=", ".join(ALLOWED), **values)
        return COMPUTER_13_GUIDE.format(kinds=", ".join(COMPUTER_13), **values)

    def messages(self, prompt: Prompt, observation: str | DesktopObservation) -> list[dict]:
        system = "\n\n".join(part for part in (self.system_prompt, self.guide()) if part)
        messages = build_messages(prompt, system)
        messages[-1] = {**messages[-1], "content": f"{messages[-1]['content']}\n\n{self._seen(observation)}"}
        return messages

    def _seen(self, observation: str | DesktopObservation) -> str:
        if not isinstance(observation, DesktopObservation):
            return f"The desktop's accessibility tree:\n{observation}\n\nWhat is the next action?"
        parts = [self._inert(observation.note)] if observation.note else []
        if observation.screenshot is not None:
            parts.append(f"The desktop's screenshot: {self.image_placeholder}")
        if observation.tree is not None:
            parts.append(f"The desktop's accessibility tree:\n{self._inert(observation.tree)}")
        return "\n\n".join(parts + ["What is the next action?"])

    def _inert(self, text: str) -> str:
        """Desktop text with the placeholder's spelling broken: whatever the agent types on screen (a terminal
        line reading `<image>`) must not tokenise into a placeholder that no image stands behind."""
        return text.replace(self.image_token, f"{self.image_token[:-1]} {self.image_token[-1:]}") if self.image_token \
            else text

    def first_prompt(self, prompt: Prompt, observation: str | DesktopObservation = "") -> list[int]:
        ids = self.tokenizer.apply_chat_template(self.messages(prompt, observation), add_generation_prompt=True,
                                                 tokenize=True, chat_template=self.chat_template, return_dict=False,
                                                 **self.kwargs)
        return list(ids)

    def act(self, reply: str) -> Action:
        try:
            parsed = parse_reply(reply, self.action_space, self.screen)
        except ActionError as err:
            return Action("invalid", error=str(err))
        if parsed.special in ("DONE", "FAIL"):
            return Action("submit", name="computer", arguments={"special": parsed.special})
        return Action("tool", name="computer", arguments={"actions": parsed.actions, "special": parsed.special})

    def observation_ids(self, observation: str | DesktopObservation, reply_ended: bool) -> list[int]:
        invalid = isinstance(observation, str) and observation.startswith(INVALID)
        content = observation if invalid else self._seen(observation)
        return self.bridge.after_reply({"role": "user", "content": content}, reply_ended)

    def invalid_observation(self, action: Action) -> str:
        return f"{INVALID} {action.error}. Nothing was done; the desktop is as it was."
