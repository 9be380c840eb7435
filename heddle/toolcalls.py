"""Tool calls in a model's turn, in the Qwen / Hermes format the chat templates teach:

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "17 * 23"}}
    </tool_call>

A turn may hold several; the text around them is the model's prose (or, with no call, its
final answer). A call that cannot be read (bad JSON, no name, arguments not an object, a
tool the task does not offer, an unclosed tag) is kept as a `ToolCall` with its `error`,
which the agent loop turns into an observation the model reads: a model's mistake never
fails its trajectory.
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"
# Each task tool takes one string argument (`activities/toolkit`): its name and what the
# chat template tells the model of it.
TOOL_ARGUMENTS = {"calculator": "expression", "python": "code", "search": "query"}
_DESCRIPTIONS = {
    "calculator": ("Evaluate an arithmetic expression.", "the expression, e.g. 17 * 23"),
    "python": ("Run Python code in a sandbox and return what it prints.", "the code to run"),
    "search": ("Search the document collection.", "the search terms"),
}
_CALL = re.compile(re.escape(OPEN) + r"(.*?)(?:" + re.escape(CLOSE) + r"|$)", re.DOTALL)
_ANSWER = re.compile(r"answer\s*:", re.IGNORECASE)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    raw: str = ""  # the text between the tags, as the model wrote it
    error: str = ""  # why it cannot run ("" when it can)


@dataclass(frozen=True)
class ParsedTurn:
    text: str  # the turn without its tool calls
    calls: tuple[ToolCall, ...]

    @property
    def final(self) -> bool:
        """A turn without a tool call ends the trajectory: it is the answer."""
        return not self.calls


def parse_turn(turn: str, tools: tuple[str, ...] | list[str]) -> ParsedTurn:
    """The tool calls of one model turn, each checked against the offered `tools`."""
    calls = []
    for match in _CALL.finditer(turn):
        raw = match.group(1).strip()
        closed = match.group(0).endswith(CLOSE)
        calls.append(_call(raw, closed, tuple(tools)))
    return ParsedTurn(_CALL.sub("", turn).strip(), tuple(calls))


def _call(raw: str, closed: bool, tools: tuple[str, ...]) -> ToolCall:
    if not closed:
        return ToolCall("", raw=raw, error=f"the tool call has no closing {CLOSE}")
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as exc:
        return ToolCall("", raw=raw, error=f"the tool call is not valid JSON: {exc.msg}")
    if not isinstance(obj, dict):
        return ToolCall(
            "", raw=raw, error='the tool call must be {"name": ..., "arguments": {...}}'
        )
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return ToolCall("", raw=raw, error="the tool call has no name")
    arguments = obj.get("arguments", obj.get("parameters"))
    if isinstance(arguments, str):  # some models send the arguments as a JSON string
        with contextlib.suppress(json.JSONDecodeError):
            arguments = json.loads(arguments)
    if not isinstance(arguments, dict):
        return ToolCall(name, raw=raw, error=f"the arguments of {name!r} must be a JSON object")
    if name not in tools:
        return ToolCall(
            name, arguments, raw, f"unknown tool {name!r}; available tools: {list(tools)}"
        )
    key = TOOL_ARGUMENTS.get(name)
    if key is not None and not isinstance(arguments.get(key), str):
        return ToolCall(name, arguments, raw, f"{name!r} needs the string argument {key!r}")
    return ToolCall(name, arguments, raw)


def call_input(call: ToolCall) -> str:
    """The string a well-formed call passes its tool."""
    return str(call.arguments[TOOL_ARGUMENTS[call.name]])


def error_observation(call: ToolCall) -> str:
    """What the model reads back for a call that could not run."""
    return f"error: {call.error}"


def tool_schemas(tools: tuple[str, ...] | list[str]) -> list[dict[str, Any]]:
    """The offered tools as the function schemas chat templates render (OpenAI's form)."""
    schemas = []
    for name in tools:
        description, argument = _DESCRIPTIONS[name]
        key = TOOL_ARGUMENTS[name]
        schemas.append({
            "type": "function",
            "function": {
                "name": name,
                "description": description,
                "parameters": {
                    "type": "object",
                    "properties": {key: {"type": "string", "description": argument}},
                    "required": [key],
                },
            },
        })  # fmt: skip
    return schemas


def final_answer(text: str) -> str:
    """The answer a final turn gives: the line after its last 'Answer:', else the whole
    text."""
    marks = list(_ANSWER.finditer(text))
    if not marks:
        return text.strip()
    rest = text[marks[-1].end() :].strip()
    return rest.splitlines()[0].strip() if rest else ""
