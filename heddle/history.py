"""An earlier iteration a learning policy starts from, given as a file: a trace (JSON
Lines, `heddle trace from-batch` writes one) or a training export (`heddle export`,
JSON Lines or Parquet).

An export has no steps, only each trajectory's tokens and loss mask; its steps are the
mask's runs: the first run of 0s is the prompt, each run of 1s a turn's output, and
each run of 0s after one the tool result the next turn read. Tool names, latencies and
texts are not in an export, so its steps call a tool named "unknown" that takes no time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from heddle.errors import TraceError
from heddle.jsonl import json_lines
from heddle.trace import TraceRecord, load_trace, parse_line

EXPORT_FIELDS = ("trajectory_id", "group_id", "loss_mask")
UNKNOWN_TOOL = "unknown"


def load_history(path: str | Path) -> list[TraceRecord]:
    """The trajectories of a trace or an export, validated whole; a bad line raises
    `TraceError` naming the file, the line and the field."""
    path_str = str(path)
    if path_str.endswith(".parquet"):
        return _from_export(_parquet_rows(path_str), path_str)
    for _, first in json_lines(path, TraceError):
        if isinstance(first, dict) and "loss_mask" in first:
            return _from_export(json_lines(path, TraceError), path_str)
        break
    return load_trace(path)


def _parquet_rows(path: str) -> list[tuple[int, Any]]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path, columns=[*EXPORT_FIELDS, "reward"])
    except (OSError, KeyError, ValueError) as exc:  # pyarrow: ArrowInvalid is a ValueError
        raise TraceError(path, None, None, f"is not a training export: {exc}") from None
    return list(enumerate(table.to_pylist(), start=1))


def _from_export(rows: Any, path: str) -> list[TraceRecord]:
    records = []
    seen: set[str] = set()
    for line, row in rows:
        if not isinstance(row, dict):
            raise TraceError(path, line, None, "a line must be a JSON object")
        for name in EXPORT_FIELDS:
            if name not in row:
                raise TraceError(path, line, name, "is required in a training export")
        mask = row["loss_mask"]
        if not isinstance(mask, list) or any(m not in (0, 1) for m in mask):
            raise TraceError(path, line, "loss_mask", "must be a list of 0s and 1s")
        runs = _runs(mask)
        if not runs or runs[0][0] != 0 or len(runs) < 2:
            raise TraceError(path, line, "loss_mask", "must be a prompt (0s), then a turn (1s)")
        steps: list[dict[str, Any]] = []
        for (bit, length), after in zip(runs[1:], [*runs[2:], None], strict=True):
            if bit == 0:
                continue
            step: dict[str, Any] = {"output_tokens": length}
            if after is not None:
                step |= {"tool": UNKNOWN_TOOL, "tool_latency_s": 0.0,
                         "tool_output_tokens": after[1]}  # fmt: skip
            steps.append(step)
        if "tool" in steps[-1]:  # ends on a tool result no turn read: drop it
            for name in ("tool", "tool_latency_s", "tool_output_tokens"):
                steps[-1].pop(name)
        obj = {"trajectory_id": row["trajectory_id"], "group_id": row["group_id"],
               "prompt_tokens": runs[0][1], "steps": steps}  # fmt: skip
        if row.get("reward") is not None:
            obj["reward"] = row["reward"]
        record = parse_line(obj, path=path, line=line)
        if record.spec.trajectory_id in seen:
            raise TraceError(path, line, "trajectory_id", "repeats an earlier line")
        seen.add(record.spec.trajectory_id)
        records.append(record)
    if not records:
        raise TraceError(path, None, None, "holds no trajectory")
    return records


def _runs(mask: list[int]) -> list[tuple[int, int]]:
    """(bit, length) of each run of equal values."""
    runs: list[tuple[int, int]] = []
    for bit in mask:
        if runs and runs[-1][0] == bit:
            runs[-1] = (bit, runs[-1][1] + 1)
        else:
            runs.append((bit, 1))
    return runs
