"""An earlier iteration given as a file: a trace, or a training export whose steps are
its loss mask's runs."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from heddle.errors import TraceError
from heddle.history import UNKNOWN_TOOL, load_history
from heddle.workloads import generate
from tests.factories import write_records

ROW = {
    "trajectory_id": "t0", "group_id": "g", "reward": 1.0, "advantage": 0.0,
    "token_ids": list(range(14)), "logprobs": [0.0] * 14,
    # prompt 5, turn 3, tool result 4, turn 2
    "loss_mask": [0] * 5 + [1] * 3 + [0] * 4 + [1] * 2,
}  # fmt: skip


def _check(records) -> None:  # type: ignore[no-untyped-def]
    (record,) = records
    spec = record.spec
    assert spec.prompt_tokens == 5
    assert [(s.output_tokens, s.tool, s.tool_output_tokens) for s in spec.steps] == [
        (3, UNKNOWN_TOOL, 4),
        (2, None, 0),
    ]
    assert record.reward == 1.0


def test_an_export_in_json_lines_or_parquet_gives_the_steps_of_its_mask(tmp_path: Path) -> None:
    jsonl = tmp_path / "export.jsonl"
    jsonl.write_text(json.dumps(ROW) + "\n")
    _check(load_history(jsonl))
    parquet = tmp_path / "export.parquet"
    pq.write_table(pa.Table.from_pylist([ROW]), parquet)
    _check(load_history(parquet))


def test_a_trace_is_a_history_as_it_is(tmp_path: Path) -> None:
    records = generate("coding", prompts=1, samples=3)
    path = write_records(tmp_path / "t.jsonl", records)
    assert [r.spec for r in load_history(path)] == [r.spec for r in records]


@pytest.mark.parametrize(
    ("change", "field"),
    [({"loss_mask": [1, 1]}, "loss_mask"), ({"loss_mask": "01"}, "loss_mask"),
     ({"group_id": None}, "group_id")],
)  # fmt: skip
def test_a_bad_export_line_names_the_file_line_and_field(
    tmp_path: Path, change: dict, field: str
) -> None:
    path = tmp_path / "export.jsonl"
    row = {k: v for k, v in (ROW | change).items() if v is not None}
    path.write_text(json.dumps(ROW) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(TraceError) as err:
        load_history(path)
    assert (err.value.path, err.value.line, err.value.field) == (str(path), 2, field)
