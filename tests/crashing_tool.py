"""Custom tools for the fault tests (`heddle worker --tool NAME=tests.crashing_tool:FN`)."""

from activities.toolkit import ToolUnavailable


def down(tool_input: str) -> str:
    """A tool whose service never comes back: every call fails and is retried."""
    raise ToolUnavailable(f"the tool's service is down (input {tool_input[:20]!r})")


def echo(tool_input: str) -> str:
    return tool_input.upper()
