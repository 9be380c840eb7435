"""An agent trajectory's context as token ids, a turn at a time, in the model's own chat
template (the model folder's tokenizer).

The ids the model sampled are never re-tokenized: each turn appends only what the
template puts between the model's end-of-turn token and its next turn (the tool results
and the next generation prompt), tokenized on their own. So the context a turn sees is
exactly the ids before it, and the stored trajectory is exactly what the model saw and
sampled. verl's and SkyRL's agent loops build their contexts the same way.
"""

from __future__ import annotations

from functools import cache
from typing import Any, Protocol

# The dummy conversation the template renders around new messages, to find what it adds.
_BASE = [{"role": "user", "content": "\x00u"}]
_REPLY = "\x00a"


class TemplateError(ValueError):
    """The chat template does not render a conversation as a growing prefix."""


class Tokenizer(Protocol):
    eos_token: str
    eos_token_id: int

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, ids: list[int], skip_special_tokens: bool = ...) -> str: ...


class ChatRenderer:
    """Renders prompts and tool results with one tokenizer's chat template."""

    def __init__(self, tokenizer: Tokenizer | Any) -> None:
        self.tokenizer = tokenizer
        self.eos_id = int(tokenizer.eos_token_id)
        self.eos_text = str(tokenizer.eos_token)
        self._between = cache(self._between_turns)

    @classmethod
    def from_model(cls, model_path: str) -> ChatRenderer:
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(model_path))

    def render(
        self, messages: list[dict[str, str]], tools: list[dict[str, Any]], *, prompt: bool
    ) -> str:
        """The conversation as text (`prompt`: with the next turn's generation prompt)."""
        text = self.tokenizer.apply_chat_template(
            messages, tools=tools or None, tokenize=False, add_generation_prompt=prompt
        )
        return str(text)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=False))

    def prompt_ids(self, messages: list[dict[str, str]], tools: list[dict[str, Any]]) -> list[int]:
        """The first turn's context: the task's messages and the generation prompt."""
        return self.encode(self.render(messages, tools, prompt=True))

    def reply_text(self, output_ids: list[int]) -> str:
        """A model turn's text, as the conversation keeps it (without its end token)."""
        if output_ids and output_ids[-1] == self.eos_id:
            output_ids = output_ids[:-1]
        return self.decode(output_ids)

    def after_reply_ids(
        self, messages: list[dict[str, str]], tools: list[dict[str, Any]], *, ended: bool
    ) -> list[int]:
        """What follows a model turn in the context: the template's text after the turn's
        end token (`ended`: the model made it; else the template's whole end of turn),
        the `messages` (tool results) and the next generation prompt."""
        tail, with_reply = self._between(_tools_key(tools))
        full = self.render([*_BASE, _assistant(), *messages], tools, prompt=True)
        if not full.startswith(with_reply):
            raise TemplateError("the chat template renders new messages before earlier ones")
        return self.encode((tail if ended else self.eos_text + tail) + full[len(with_reply) :])

    def _between_turns(self, tools_key: str) -> tuple[str, str]:
        """(the text the template puts after a model turn's end token, the dummy
        conversation with its model turn), for one set of tools."""
        tools = _tools_from_key(tools_key)
        head = self.render(_BASE, tools, prompt=True)
        with_reply = self.render([*_BASE, _assistant()], tools, prompt=False)
        if not with_reply.startswith(head) or _REPLY not in with_reply[len(head) :]:
            raise TemplateError("the chat template does not render a model turn after its prompt")
        after = with_reply[len(head) :].split(_REPLY, 1)[1]
        tail = after.split(self.eos_text, 1)[1] if self.eos_text in after else after
        return tail, with_reply


def _assistant() -> dict[str, str]:
    return {"role": "assistant", "content": _REPLY}


def _tools_key(tools: list[dict[str, Any]]) -> str:
    import json

    return json.dumps(tools)  # key order kept: the template renders it


def _tools_from_key(key: str) -> list[dict[str, Any]]:
    import json

    tools: list[dict[str, Any]] = json.loads(key)
    return tools
