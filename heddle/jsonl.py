"""Reading the JSON Lines files users bring (traces, task sets)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from heddle.errors import InputError


def json_lines(path: str | Path, error: type[InputError]) -> Iterator[tuple[int, Any]]:
    """(line number, decoded object) of each non-blank line. A file that cannot be read,
    is not UTF-8, or has a line that is not JSON raises `error`, naming the file (and the
    line)."""
    path_str = str(path)
    try:
        handle = open(path, encoding="utf-8")  # noqa: SIM115 - closed below
    except OSError as exc:
        raise error(path_str, None, None, f"cannot be read: {exc.strerror}") from exc
    with handle:
        try:
            for line_no, text in enumerate(handle, start=1):
                if not text.strip():
                    continue
                try:
                    obj = json.loads(text)
                except json.JSONDecodeError as exc:
                    raise error(path_str, line_no, None, f"is not valid JSON: {exc.msg}") from exc
                yield line_no, obj
        except UnicodeDecodeError as exc:
            raise error(path_str, None, None, "is not UTF-8 text") from exc
