"""A multi-turn trajectory as tokens: what the engine sampled, kept exactly, and the tokens of the
messages the environment added between turns.

Token in, token out across turns: the history is never re-tokenised. Each turn's prompt is the
previous prompt plus the sampled tokens plus the new message's tokens, so it extends the previous
turn's tokens by construction, and `extend` asserts it. Only a new message is tokenised: the chat
template renders it after a fixed stand-in conversation, and the text after the stand-in
assistant's end-of-turn marker (the rest of that turn's closing, the new message, the next
assistant header) is what gets tokenised. A sampled reply that stopped without its end-of-turn
token (cut by the length budget) is closed with that token, unsampled.

Loss mask: 1 on sampled tokens, 0 on everything the environment or the template added. Sampler
logprobs are kept per sampled token (0 where masked) for the IS correction.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dockyard.errors import DockyardError

_STAND_IN = "DOCKYARD_REPLY_MARKER_7f3a"


class TranscriptError(DockyardError, ValueError):
    """The chat template cannot be extended message by message (it rewrites earlier turns)."""


@dataclass
class Transcript:
    prompt_ids: list[int]
    tokens: list[int] = field(default_factory=list)      # everything after the first prompt
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)   # weights version per token (-1: not sampled)
    images: list[bytes] = field(default_factory=list)   # PNG per image placeholder token in `ids`, in order
    image_growth: int = 0   # tokens the placeholders add once expanded into the images' tokens
    turns: int = 0

    @property
    def ids(self) -> list[int]:
        return self.prompt_ids + self.tokens

    @property
    def length(self) -> int:
        """What the model runs on: the tokens with each image placeholder expanded."""
        return len(self.prompt_ids) + len(self.tokens) + self.image_growth

    def add_sampled(self, token_ids: list[int], logprobs: list[float], versions: list[int] | None = None) -> None:
        self.tokens += token_ids
        self.mask += [1] * len(token_ids)
        self.logprobs += list(logprobs)
        self.versions += list(versions) if versions is not None else [0] * len(token_ids)
        self.turns += 1

    def extend(self, previous: list[int], added: list[int]) -> None:
        """Add environment tokens; `previous` is what the last turn's prompt was built from."""
        if self.ids[:len(previous)] != previous:
            raise AssertionError("a turn's prompt must extend the previous turn's tokens")
        self.tokens += added
        self.mask += [0] * len(added)
        self.logprobs += [0.0] * len(added)
        self.versions += [-1] * len(added)


class MessageBridge:
    """Tokens that follow a sampled reply to add one message and open the next assistant turn."""

    def __init__(self, tokenizer, chat_template: str | None = None, template_kwargs: dict | None = None):
        self.tokenizer, self.chat_template = tokenizer, chat_template
        self.kwargs = dict(template_kwargs or {})
        end = tokenizer.eos_token
        if not end:
            raise TranscriptError("the tokenizer has no eos_token: a turn's end cannot be found")
        self.end_text = end
        self.end_ids = tokenizer.encode(end, add_special_tokens=False)

    def _render(self, messages: list[dict], generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt,
                                                  chat_template=self.chat_template, **self.kwargs)

    def after_reply(self, message: dict, reply_ended: bool) -> list[int]:
        """Token ids to append after a reply: (its end-of-turn token if it was cut,) the rest of the
        assistant turn's closing, `message`, and the next assistant header."""
        stand_in = [{"role": "user", "content": "start"}, {"role": "assistant", "content": _STAND_IN}]
        before = self._render(stand_in, False)
        after = self._render(stand_in + [message], True)
        if not after.startswith(before.rstrip()):
            raise TranscriptError("the chat template renders earlier turns differently once a message is added; "
                                  "multi-turn token-in/token-out needs a template that only appends")
        anchor = after.find(_STAND_IN + self.end_text)
        if anchor < 0:
            raise TranscriptError(f"the chat template does not end an assistant turn with the eos token "
                                  f"{self.end_text!r}; set policy.generation.chat_template.path to one that does")
        suffix = after[anchor + len(_STAND_IN) + len(self.end_text):]
        ids = self.tokenizer.encode(suffix, add_special_tokens=False)
        return ids if reply_ended else self.end_ids + ids
