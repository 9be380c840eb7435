"""Tools a trajectory can call, by name. Each returns an observation; none raises for bad input."""

from activities.toolkit.base import (
    Observation,
    Tool,
    ToolRegistry,
    ToolUnavailable,
    custom_tool,
    default_registry,
)

__all__ = [
    "Observation", "Tool", "ToolRegistry", "ToolUnavailable", "custom_tool", "default_registry",
]  # fmt: skip
