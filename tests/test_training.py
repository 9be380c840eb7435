"""Training-ready output: an agent batch's turns in the store come back as token ids,
aligned log-probs and a loss mask, with GRPO advantages, and export to JSON Lines and
Parquet (written to a real SQLite store)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from heddle.store import TrajectoryStore
from heddle.trace import parse_line
from heddle.training import assemble, group_advantages, training_batch, write_export
from heddle.types import RolloutOptions, TrajectorySummary, TurnRecord
from tests.factories import traj
from tests.test_cli import heddle

# (trajectory, group, reward or None when it failed)
ROLLOUT = [("a", "g0", 1.0), ("b", "g0", 0.0), ("c", "g0", 0.5), ("d", "g1", 1.0),
           ("e", "g1", 1.0), ("f", "g1", None)]  # fmt: skip


def _turns(tid: str) -> list[TurnRecord]:
    """Two turns: the prompt then a sampled call; a tool result then the answer."""
    return [
        TurnRecord("b1", tid, 0, [1, 2, 3], [10, 11], [-0.5, -0.25], 0, "tool_call"),
        TurnRecord("b1", tid, 1, [4, 5], [12, 13, 14], [-1.0, -0.1, -0.2], 1, "stop"),
    ]


def _store_batch(store_url: str) -> TrajectoryStore:
    store = TrajectoryStore.open(store_url)
    records = [parse_line(traj(t, [{"output_tokens": 5}], group=g), path="mem", line=1)
               for t, g, _ in ROLLOUT]  # fmt: skip
    store.create_batch(batch_id="b1", records=records, options=RolloutOptions(),
                       source="tasks", created_at=0)  # fmt: skip
    for tid, _, _ in ROLLOUT:
        store.write(_turns(tid))
    # A retried turn is stored once, as the attempt the trajectory went on with.
    store.write([TurnRecord("b1", "a", 1, [4, 5], [12, 99], [-2.0, -3.0], 1, "stop")])
    for tid, group, reward in ROLLOUT:
        status = "failed" if reward is None else "completed"
        store.finish_trajectory(TrajectorySummary("b1", tid, group, status, "answer", 2, 5, 1,
                                                  reward or 0.0, 0.0, 1.0))  # fmt: skip
    return store


def test_training_batch_aligns_tokens_logprobs_and_mask(store_url: str) -> None:
    samples = {s.trajectory_id: s for s in training_batch(_store_batch(store_url), "b1")}
    assert sorted(samples) == ["a", "b", "c", "d", "e"]  # the failed one is left out
    b = samples["b"]
    assert b.token_ids == [1, 2, 3, 10, 11, 4, 5, 12, 13, 14]
    assert b.loss_mask == [0, 0, 0, 1, 1, 0, 0, 1, 1, 1]
    assert b.logprobs == [0, 0, 0, -0.5, -0.25, 0, 0, -1.0, -0.1, -0.2]
    assert b.weight_versions == [0, 1]
    assert samples["a"].token_ids[-2:] == [12, 99]  # the retried turn, whole
    for s in samples.values():
        assert len(s.token_ids) == len(s.logprobs) == len(s.loss_mask)
        assert sum(s.loss_mask) == sum(lp != 0 for lp in s.logprobs)
    for group in ("g0", "g1"):
        advantages = [s.advantage for s in samples.values() if s.group_id == group]
        assert sum(advantages) == pytest.approx(0.0, abs=1e-9)
    assert samples["a"].advantage > 0 > samples["b"].advantage
    assert samples["d"].advantage == samples["e"].advantage == 0.0  # equal rewards


def test_turns_older_than_the_staleness_bound_leave_the_loss(store_url: str) -> None:
    """An asynchronous campaign's step from version 2 with a bound of 1 learns from
    versions 1 and 2: a version-0 turn stays as context ("partial"), or its trajectory's
    group leaves the step ("drop")."""
    store = _store_batch(store_url)
    for tid in ("d", "e"):  # group g1 sampled wholly by version 1
        store.write([TurnRecord("b1", tid, 0, [1, 2, 3], [10, 11], [-0.5, -0.25], 1, "tool_call")])
    partial = {s.trajectory_id: s for s in training_batch(store, "b1", oldest_version=1)}
    assert sorted(partial) == ["a", "b", "c", "d", "e"]
    assert partial["b"].token_ids == [1, 2, 3, 10, 11, 4, 5, 12, 13, 14]
    assert partial["b"].loss_mask == [0, 0, 0, 0, 0, 0, 0, 1, 1, 1]
    assert partial["d"].loss_mask == [0, 0, 0, 1, 1, 0, 0, 1, 1, 1]
    dropped = training_batch(store, "b1", oldest_version=1, on_stale="drop")
    assert sorted(s.trajectory_id for s in dropped) == ["d", "e"]
    assert [s.advantage for s in dropped] == [0.0, 0.0]  # g1's rewards are equal
    everything = training_batch(store, "b1", oldest_version=0, on_stale="drop")
    assert len(everything) == 5


def test_advantages_and_a_turn_without_its_logprobs() -> None:
    adv = group_advantages({"x": ("g", 1.0), "y": ("g", 0.0), "z": ("h", 3.0)})
    assert adv["x"] == pytest.approx(1.0, abs=1e-5)
    assert adv["y"] == pytest.approx(-1.0, abs=1e-5)
    assert adv["z"] == 0.0  # a group of one
    with pytest.raises(ValueError, match="2 sampled tokens but 1 log-probs"):
        assemble([TurnRecord("b", "t", 0, [1], [2, 3], [-1.0])])


def test_exports_round_trip_as_jsonl_and_parquet(store_url: str, tmp_path: Path) -> None:
    samples = training_batch(_store_batch(store_url), "b1")
    write_export(samples, str(tmp_path / "out.jsonl"), "jsonl")
    lines = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert lines == [s.row() for s in samples]
    write_export(samples, str(tmp_path / "out.parquet"), "parquet")
    table = pq.read_table(tmp_path / "out.parquet")
    assert table.column_names == list(samples[0].row())
    assert table.to_pylist() == [s.row() for s in samples]


def test_export_command(store_url: str, tmp_path: Path) -> None:
    _store_batch(store_url)
    out = tmp_path / "b1.parquet"
    done = heddle("export", "b1", str(out), "--format", "parquet", "--store", store_url)
    assert done.returncode == 0, done.stderr
    assert pq.read_table(out).num_rows == 5
    missing = heddle("export", "nope", str(out), "--store", store_url)
    assert missing.returncode == 2
    assert missing.stderr.startswith("error: no batch 'nope'")
    bad = heddle("export", "b1", str(out), "--format", "csv", "--store", store_url)
    assert bad.returncode == 2
    assert "error: --format must be jsonl or parquet" in bad.stderr
