"""Traces from other tools (heddle/importers.py): what they say becomes a Heddle trace
that the simulator runs, and a bad record names its file, line and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from heddle.errors import TraceError
from heddle.hardware import ClusterShape
from heddle.importers import import_trace
from heddle.sim import simulate
from scheduler.registry import create_policy
from tests.factories import write_trace

SESSION = {
    "session_id": "swe-1",
    "arrival_time_ns": 4059740,
    "sub_requests": [
        {"input_toks": 1472, "output_toks": 133, "tool_duration_ns": 127_348_767},
        {"input_toks": 1700, "output_toks": 125, "tool_duration_ns": 2_000_000_000},
        {"input_toks": 1734, "output_toks": 77, "tool_duration_ns": 0},
    ],
}
CSV_HEADER = "trajectory_id,turn,group_id,prompt_tokens,output_tokens,tool,tool_latency_s,tool_status,tool_output_tokens\n"  # noqa: E501


def test_llmservingsim_sessions(tmp_path: Path) -> None:
    other = {"session_id": "swe-2", "group_id": "task-7", "arrival_time_ns": 0,
             "sub_requests": [{"input_toks": 30, "output_toks": 4}]}  # fmt: skip
    path = write_trace(tmp_path / "s.jsonl", [SESSION, other])
    first, second = import_trace(path, "llmservingsim")
    spec = first.spec
    assert (spec.trajectory_id, spec.group_id, spec.prompt_tokens) == ("swe-1", "swe-1", 1472)
    assert [s.output_tokens for s in spec.steps] == [133, 125, 77]
    # What the next input adds beyond this call's input and output is the observation;
    # a context the harness trimmed gives none.
    assert [s.tool_output_tokens for s in spec.steps] == [95, 0, 0]
    assert [s.tool_latency_s for s in spec.steps[:2]] == pytest.approx([0.127348767, 2.0])
    assert spec.steps[-1].tool is None
    assert second.spec.group_id == "task-7"
    result = simulate([r.spec for r in (first, second)], create_policy("verl"), ClusterShape())
    assert result.generated_tokens == 335 + 4
    assert result.makespan_s > 2.127  # the tool waits are kept


def test_per_turn_csv(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(
        CSV_HEADER
        + "a,0,g,100,50,python,0.5,error,20\n"
        + "a,1,,,60,python,1.5,,7\n"
        + "a,2,,,10,,,,\n"
        + "b,0,,80,40,,,,\n"
    )
    a, b = import_trace(path, "csv")
    assert a.spec.group_id == "g"
    assert b.spec.group_id == "b"
    assert [(s.tool, s.tool_status, s.tool_output_tokens) for s in a.spec.steps] == [
        ("python", "error", 20), ("python", "ok", 7), (None, "ok", 0),
    ]  # fmt: skip
    assert a.spec.prompt_tokens == 100
    assert b.spec.generated_tokens == 40


@pytest.mark.parametrize(
    ("rows", "line", "field"),
    [
        ("a,0,,100,x,,,,\n", 2, "output_tokens"),
        ("a,1,,100,5,,,,\n", 2, "turn"),
        ("a,0,,,5,,,,\n", 2, "prompt_tokens"),
        ("a,0,,9,5,python,0.1,,3\na,1,,,5,python,0.1,,3\n", 3, "tool"),  # last calls a tool
        ("a,0,,9,5,python,0.1,lost,3\na,1,,,5,,,,\n", 2, "tool_status"),
        ("a,0,,9,5,,,,\na,1,,,5,,,,\n", 2, "tool"),  # a step but the last without a tool
    ],
)
def test_bad_csv_names_the_row_and_column(tmp_path: Path, rows: str, line: int, field: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(CSV_HEADER + rows)
    with pytest.raises(TraceError) as err:
        import_trace(path, "csv")
    assert (err.value.path, err.value.line, err.value.field) == (str(path), line, field)


def test_bad_session_names_the_line_and_field(tmp_path: Path) -> None:
    broken = dict(SESSION, sub_requests=[{"input_toks": 5, "output_toks": 0}])
    path = write_trace(tmp_path / "s.jsonl", [SESSION | {"session_id": "ok"}, broken])
    with pytest.raises(TraceError) as err:
        import_trace(path, "llmservingsim")
    assert (err.value.line, err.value.field) == (2, "sub_requests[0].output_toks")
    path = tmp_path / "h.csv"
    path.write_text("trajectory_id,turn,output_tokens,colour\n")
    with pytest.raises(TraceError, match="'colour' is not a column"):
        import_trace(path, "csv")
