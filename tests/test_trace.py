"""Malformed traces fail whole, naming file, line and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from heddle.errors import TraceError
from heddle.trace import dump_record, load_trace
from heddle.workloads import generate
from tests.factories import traj, write_records, write_trace

TOOL_STEP = {"output_tokens": 10, "tool": "python", "tool_latency_s": 0.1, "tool_output_tokens": 5}


def test_valid_trace_round_trips(tmp_path: Path) -> None:
    records = generate("search", prompts=2, samples=4, seed=1)
    path = write_records(tmp_path / "t.jsonl", records)
    loaded = load_trace(path)
    assert [r.spec for r in loaded] == [r.spec for r in records]
    assert [dump_record(r) for r in loaded] == [dump_record(r) for r in records]


@pytest.mark.parametrize(
    ("line", "field", "words"),
    [
        ("{not json", None, "not valid JSON"),
        ("[1, 2]", None, "JSON object"),
        (
            {"group_id": "g", "prompt_tokens": 5, "steps": [{"output_tokens": 1}]},
            "trajectory_id",
            "required",
        ),
        (traj("a", [{"output_tokens": 1}]) | {"prompt_tokens": "5"}, "prompt_tokens", "integer"),
        (traj("a", [{"output_tokens": 1}]) | {"prompt_tokens": 0}, "prompt_tokens", ">= 1"),
        (traj("a", []), "steps", "non-empty"),
        (traj("a", [{"output_tokens": -3}]), "steps[0].output_tokens", ">= 1"),
        (traj("a", [{}]), "steps[0].output_tokens", "required"),
        (
            traj("a", [{"output_tokens": 4}, {"output_tokens": 4}]),
            "steps[0].tool",
            "every step but the last",
        ),
        (traj("a", [TOOL_STEP]), "steps[0].tool", "last step must not call a tool"),
        (
            traj(
                "a",
                [
                    {"output_tokens": 4, "tool": "python", "tool_latency_s": 0.1},
                    {"output_tokens": 1},
                ],
            ),
            "steps[0].tool_output_tokens",
            "required",
        ),
        (
            traj("a", [TOOL_STEP | {"tool_status": "weird"}, {"output_tokens": 1}]),
            "steps[0].tool_status",
            "one of",
        ),
        (
            traj("a", [TOOL_STEP | {"tool_latency_s": float("nan")}, {"output_tokens": 1}]),
            "steps[0].tool_latency_s",
            "finite",
        ),
        (
            traj("a", [{"output_tokens": 1, "tool_latency_s": 1.0}]),
            "steps[0].tool_latency_s",
            "without a tool",
        ),
        (traj("a", [{"output_tokens": 1}]) | {"colour": "red"}, "colour", "not a trace field"),
        (traj("a", [{"output_tokens": 1, "speed": 2}]), "steps[0].speed", "not a step field"),
    ],
)
def test_malformed_line_names_file_line_and_field(
    tmp_path: Path, line: object, field: str | None, words: str
) -> None:
    good = traj("ok", [TOOL_STEP, {"output_tokens": 3}])
    path = write_trace(tmp_path / "bad.jsonl", [good, good | {"trajectory_id": "ok2"}, line])  # type: ignore[list-item]
    with pytest.raises(TraceError) as info:
        load_trace(path)
    err = info.value
    assert err.path == str(path)
    assert err.line == 3
    assert err.field == field
    assert words in str(err)
    assert f"{path}:3" in str(err)


def test_duplicate_trajectory_id_is_rejected(tmp_path: Path) -> None:
    line = traj("same", [{"output_tokens": 1}])
    path = write_trace(tmp_path / "dup.jsonl", [line, line])
    with pytest.raises(TraceError, match="repeats line 1") as info:
        load_trace(path)
    assert (info.value.line, info.value.field) == (2, "trajectory_id")


def test_missing_and_empty_files(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot be read"):
        load_trace(tmp_path / "nope.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(TraceError, match="no trajectory"):
        load_trace(tmp_path / "empty.jsonl")
