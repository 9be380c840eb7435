"""Input errors that say where the problem is: file, line and field."""

from __future__ import annotations


class InputError(ValueError):
    """Bad user input, raised before any work starts."""

    def __init__(self, path: str, line: int | None, field: str | None, message: str) -> None:
        self.path = path
        self.line = line
        self.field = field
        self.message = message
        where = path if line is None else f"{path}:{line}"
        what = f"field '{field}' " if field else ""
        super().__init__(f"{where}: {what}{message}")


class TraceError(InputError):
    """A malformed trace line."""


class ConfigError(InputError):
    """A malformed configuration file."""
