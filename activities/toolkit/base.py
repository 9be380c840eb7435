"""The tool interface and its registry.

A tool call that cannot run (unknown tool, malformed input, crash) yields an error
observation for the model to read; it never raises into the worker. The one exception is
`ToolUnavailable`: the tool's own infrastructure is down (a service it calls), which the
model cannot act on, so the call fails and Temporal retries it; a tool that stays down
fails its trajectory after the batch's `max_attempts`, and the batch goes on.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from heddle.tasks import count_tokens

__all__ = [
    "Observation", "Tool", "ToolRegistry", "ToolUnavailable", "count_tokens",
    "custom_tool", "default_registry",
]  # fmt: skip


class ToolUnavailable(RuntimeError):
    """Raised by a tool whose infrastructure is down: the call is retried, not observed."""


@dataclass(frozen=True)
class Observation:
    status: str  # ok | error | timeout
    text: str


Tool = Callable[[str], Awaitable[Observation]]


class ToolRegistry:
    def __init__(self) -> None:
        self._tools: dict[str, Tool] = {}

    def register(self, name: str, tool: Tool) -> None:
        self._tools[name] = tool

    @property
    def names(self) -> list[str]:
        return sorted(self._tools)

    async def call(self, name: str, tool_input: str | None) -> Observation:
        tool = self._tools.get(name)
        if tool is None:
            return Observation("error", f"unknown tool {name!r}; available tools: {self.names}")
        if tool_input is None or not isinstance(tool_input, str):
            return Observation("error", f"tool {name!r} needs an input string")
        try:
            return await tool(tool_input)
        except ToolUnavailable:
            raise
        except Exception as exc:  # a broken tool is the model's observation, not a crash
            return Observation("error", f"tool {name!r} failed: {type(exc).__name__}: {exc}")


def custom_tool(import_path: str) -> Tool:
    """An operator's tool, `module:function`: called with the call's input string, it
    returns the observation's text (or an `Observation`), sync or async."""
    module, sep, name = import_path.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"a tool is 'module:function', got {import_path!r}")
    fn = getattr(importlib.import_module(module), name)

    async def call(tool_input: str) -> Observation:
        result = fn(tool_input)
        if inspect.isawaitable(result):
            result = await result
        return result if isinstance(result, Observation) else Observation("ok", str(result))

    return call


def default_registry(
    *, search_db: str | None = None, custom: dict[str, str] | None = None
) -> ToolRegistry:
    from activities.toolkit.calculator import calculate
    from activities.toolkit.python_exec import PythonSandbox
    from activities.toolkit.search import LocalSearch

    registry = ToolRegistry()
    registry.register("python", PythonSandbox().run)
    registry.register("calculator", calculate)
    registry.register("search", LocalSearch(search_db).search)
    for name, import_path in (custom or {}).items():
        registry.register(name, custom_tool(import_path))
    return registry
