"""Traces a user may already have, read into Heddle's trace format.

- `llmservingsim`: LLMServingSim's agentic JSON Lines, one session a line:
  `{"session_id", "arrival_time_ns", "sub_requests": [{"input_toks", "output_toks",
  "tool_duration_ns"}, ...]}`. A sub-request's input is the whole context so far, so a
  tool's observation is what the next input adds beyond this call's input and output.
  An optional `group_id` on the line groups sessions of one prompt; without it each
  session is its own group.
- `csv`: a per-turn CSV with a header; columns `trajectory_id`, `turn`, `output_tokens`
  and, on the first turn of a trajectory, `prompt_tokens`; optional `group_id`, `tool`,
  `tool_latency_s`, `tool_status` and `tool_output_tokens`. A trajectory's last turn
  calls no tool.

Every record is checked as `heddle.trace` checks a trace line, and the first bad one
raises a `TraceError` with its file, line and field before anything is written.
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path
from typing import Any

from heddle.errors import TraceError
from heddle.jsonl import json_lines
from heddle.trace import TraceRecord, parse_line
from heddle.trace import _int as _int_field  # the trace's own integer check

UNNAMED_TOOL = "tool"


def _session(obj: Any, path: str, line: int) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise TraceError(path, line, None, "a session line must be a JSON object")
    subs = obj.get("sub_requests")
    if not isinstance(subs, list) or not subs:
        raise TraceError(path, line, "sub_requests", "must be a non-empty list")
    sid = obj.get("session_id", f"session_{line}")
    if not isinstance(sid, str) or not sid:
        raise TraceError(path, line, "session_id", f"must be a non-empty string, got {sid!r}")
    inputs, outputs, waits = [], [], []
    for i, sub in enumerate(subs):
        where = f"sub_requests[{i}]"
        if not isinstance(sub, dict):
            raise TraceError(path, line, where, "must be a JSON object")
        for name in ("input_toks", "output_toks"):
            if name not in sub:
                raise TraceError(path, line, f"{where}.{name}", "is required")
        for name, into, minimum in (("input_toks", inputs, 1), ("output_toks", outputs, 1),
                                    ("tool_duration_ns", waits, 0)):  # fmt: skip
            into.append(_int_field(sub.get(name, 0), path=path, line=line,
                                   name=f"{where}.{name}", minimum=minimum))  # fmt: skip
    steps: list[dict[str, Any]] = []
    for i, out in enumerate(outputs):
        step: dict[str, Any] = {"output_tokens": out}
        if i + 1 < len(outputs):
            step.update(
                tool=UNNAMED_TOOL,
                tool_latency_s=waits[i] / 1e9,
                tool_status="ok",
                # A context the harness trimmed adds less than this call's output: no
                # observation, rather than a negative one.
                tool_output_tokens=max(0, inputs[i + 1] - inputs[i] - out),
            )
        steps.append(step)
    group = obj.get("group_id", sid)
    return {
        "trajectory_id": sid,
        "group_id": group,
        "workload": "llmservingsim",
        "prompt_tokens": inputs[0],
        "steps": steps,
    }


# A reader's trajectories: the line where each starts, its trace object, and for a
# format of a row per turn, each step's line (an error names the row, not the first).
Read = list[tuple[int, dict[str, Any], list[int] | None]]


def _llmservingsim(path: Path) -> Read:
    return [(n, _session(obj, str(path), n), None) for n, obj in json_lines(path, TraceError)]


_CSV_REQUIRED = ("trajectory_id", "turn", "output_tokens")
_CSV_OPTIONAL = ("prompt_tokens", "group_id", "tool", "tool_latency_s", "tool_status",
                 "tool_output_tokens")  # fmt: skip


def _csv_number(row: dict[str, str], name: str, path: str, line: int, kind: type) -> Any:
    text = (row.get(name) or "").strip()
    try:
        return kind(text)
    except ValueError:
        raise TraceError(path, line, name, f"must be a number, got {text!r}") from None


def _turns_csv(path: Path) -> Read:
    where = str(path)
    try:
        fh = path.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise TraceError(where, None, None, f"cannot read: {exc.strerror}") from None
    with fh:
        reader = csv.DictReader(fh)
        header = reader.fieldnames or []
        for name in _CSV_REQUIRED:
            if name not in header:
                raise TraceError(where, 1, name, "is a required column")
        extra = sorted(set(header) - set(_CSV_REQUIRED) - set(_CSV_OPTIONAL))
        if extra:
            raise TraceError(where, 1, extra[0], "is not a column of the per-turn CSV")
        lines: dict[str, tuple[int, dict[str, Any], list[int]]] = {}
        for row in reader:
            line = reader.line_num
            tid = (row["trajectory_id"] or "").strip()
            if not tid:
                raise TraceError(where, line, "trajectory_id", "must not be empty")
            turn = _csv_number(row, "turn", where, line, int)
            _, obj, step_lines = lines.setdefault(
                tid, (line, {"trajectory_id": tid, "workload": "csv", "steps": []}, [])
            )
            if turn != len(obj["steps"]):
                raise TraceError(where, line, "turn", f"expected {len(obj['steps'])}, got {turn}")
            if turn == 0:
                if not (row.get("prompt_tokens") or "").strip():
                    raise TraceError(where, line, "prompt_tokens", "is required on turn 0")
                obj["prompt_tokens"] = _csv_number(row, "prompt_tokens", where, line, int)
                obj["group_id"] = (row.get("group_id") or "").strip() or tid
            step: dict[str, Any] = {
                "output_tokens": _csv_number(row, "output_tokens", where, line, int)
            }
            tool = (row.get("tool") or "").strip()
            if tool:
                step["tool"] = tool
                step["tool_latency_s"] = _csv_number(row, "tool_latency_s", where, line, float)
                step["tool_output_tokens"] = _csv_number(
                    row, "tool_output_tokens", where, line, int
                )
                step["tool_status"] = (row.get("tool_status") or "").strip() or "ok"
            obj["steps"].append(step)
            step_lines.append(line)
    return list(lines.values())


def _parse(obj: dict[str, Any], path: str, line: int, step_lines: list[int] | None) -> TraceRecord:
    """`parse_line`, with a step's error moved to that step's own row and column."""
    try:
        return parse_line(obj, path=path, line=line)
    except TraceError as exc:
        head, dot, column = (exc.field or "").partition("].")
        if step_lines is None or not head.startswith("steps[") or not dot:
            raise
        raise TraceError(path, step_lines[int(head[6:])], column, exc.message) from None


FORMATS: dict[str, Callable[[Path], Read]] = {
    "llmservingsim": _llmservingsim,
    "csv": _turns_csv,
}


def import_trace(path: str | Path, fmt: str) -> list[TraceRecord]:
    """Read `path` in format `fmt`; every trajectory validated, ids unique."""
    try:
        reader = FORMATS[fmt]
    except KeyError:
        raise ValueError(f"unknown trace format {fmt!r}; valid: {sorted(FORMATS)}") from None
    path = Path(path)
    records: list[TraceRecord] = []
    seen: dict[str, int] = {}
    for line, obj, step_lines in reader(path):
        record = _parse(obj, str(path), line, step_lines)
        tid = record.spec.trajectory_id
        if tid in seen:
            raise TraceError(str(path), line, "trajectory_id", f"{tid!r} repeats line {seen[tid]}")
        seen[tid] = line
        records.append(record)
    if not records:
        raise TraceError(str(path), None, None, "holds no trajectory")
    return records
