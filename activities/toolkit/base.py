"""The tool interface and its registry.

A tool call that cannot run (unknown tool, malformed input, crash) yields an error
observation for the model to read; it never raises into the worker.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from heddle.tasks import count_tokens

__all__ = ["Observation", "Tool", "ToolRegistry", "count_tokens", "default_registry"]


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
        except Exception as exc:  # a broken tool is the model's observation, not a crash
            return Observation("error", f"tool {name!r} failed: {type(exc).__name__}: {exc}")


def default_registry(*, search_db: str | None = None) -> ToolRegistry:
    from activities.toolkit.calculator import calculate
    from activities.toolkit.python_exec import PythonSandbox
    from activities.toolkit.search import LocalSearch

    registry = ToolRegistry()
    registry.register("python", PythonSandbox().run)
    registry.register("calculator", calculate)
    registry.register("search", LocalSearch(search_db).search)
    return registry
