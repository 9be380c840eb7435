"""The trajectory store: migrations, atomic batch insert, idempotent writes."""

from __future__ import annotations

import pytest
from sqlalchemy import inspect
from sqlalchemy.exc import IntegrityError

from heddle.store import TrajectoryStore
from heddle.trace import parse_line
from heddle.types import RolloutOptions, StepRecord, TrajectoryStarted, TrajectorySummary
from tests.factories import traj


def _record(tid: str):  # type: ignore[no-untyped-def]
    line = traj(
        tid,
        [
            {"output_tokens": 3, "tool": "python", "tool_latency_s": 0.1, "tool_output_tokens": 4},
            {"output_tokens": 2},
        ],
    ) | {"prompt_text": "hello"}
    return parse_line(line, path="mem", line=1)


def test_migrations_create_the_schema(store_url: str) -> None:
    store = TrajectoryStore.open(store_url)
    tables = set(inspect(store.engine).get_table_names())
    assert {"batches", "trajectories", "steps", "texts", "alembic_version"} <= tables
    TrajectoryStore.open(store_url)  # upgrading again is a no-op


def test_batch_insert_is_atomic(store_url: str) -> None:
    store = TrajectoryStore.open(store_url)
    opts = RolloutOptions()
    store.create_batch(batch_id="b", records=[_record("a")], options=opts, source="x", created_at=0)
    with pytest.raises(ValueError, match="already exists"):
        store.create_batch(
            batch_id="b", records=[_record("z")], options=opts, source="x", created_at=0
        )

    def records():  # fails half-way through
        yield _record("c1")
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError):
        store.create_batch(batch_id="b2", records=records(), options=opts, source="x", created_at=0)
    assert store.get_batch("b2") is None
    assert store.list_trajectories("b2") == []
    assert store.get_text("b/a/prompt") == "hello"


def test_step_and_finish_writes_are_idempotent(store_url: str) -> None:
    store = TrajectoryStore.open(store_url)
    store.create_batch(
        batch_id="b", records=[_record("a")], options=RolloutOptions(), source="x", created_at=0
    )
    for _ in range(3):  # a retried activity writes the same row again
        store.record_step(StepRecord("b", "a", 0, "i0", 5, 3, tool="python", tool_status="ok"))
    store.record_step(StepRecord("b", "a", 1, "i1", 12, 2))
    summary = TrajectorySummary("b", "a", "g0", "completed", "answer", 2, 5, 1, 1.0, 1.0, 2.0)
    store.finish_trajectory(summary)
    store.finish_trajectory(summary)
    got = store.get_trajectory("b", "a")
    assert got is not None
    assert [s["step_index"] for s in got["steps"]] == [0, 1]
    assert got["status"] == "completed"
    assert got["turns"] == 2
    assert got["generated_tokens"] == 5
    assert store.count_steps("b") == 2


def test_writes_of_one_transaction_all_land_or_none(store_url: str) -> None:
    """A step of a trajectory the store does not have breaks a constraint: the writes
    before it in the same transaction are rolled back with it."""
    store = TrajectoryStore.open(store_url)
    store.create_batch(
        batch_id="b", records=[_record("a")], options=RolloutOptions(), source="x", created_at=0
    )
    with pytest.raises(IntegrityError):
        store.write([TrajectoryStarted("b", "a", 1.0), StepRecord("b", "nope", 0, "i0", 5, 3)])
    got = store.get_trajectory("b", "a")
    assert got is not None
    assert got["status"] == "pending"
    store.write([TrajectoryStarted("b", "a", 1.0), StepRecord("b", "a", 0, "i0", 5, 3)])
    got = store.get_trajectory("b", "a")
    assert got is not None
    assert (got["status"], got["turns"], len(got["steps"])) == ("running", 1, 1)


def test_postgresql_by_url(postgres_url: str) -> None:
    """The same store code on PostgreSQL: migrations, batch, idempotent steps."""
    store = TrajectoryStore.open(postgres_url)
    assert {"batches", "trajectories", "steps", "texts"} <= set(
        inspect(store.engine).get_table_names()
    )
    store.create_batch(
        batch_id="pg", records=[_record("a")], options=RolloutOptions(), source="x", created_at=0
    )
    for _ in range(2):
        store.record_step(StepRecord("pg", "a", 0, "i0", 5, 3))
    store.finish_trajectory(TrajectorySummary("pg", "a", "g0", "completed", "answer", 1, 3, 0))
    got = store.get_trajectory("pg", "a")
    assert got is not None
    assert len(got["steps"]) == 1
    assert got["status"] == "completed"
    assert store.load_specs("pg", 0, 10)[0].trajectory_id == "a"
    store.close()


def test_tool_inputs_are_kept_as_texts_and_specs_carry_their_keys(store_url: str) -> None:
    store = TrajectoryStore.open(store_url)
    line = traj(
        "a",
        [
            {
                "output_tokens": 3,
                "tool": "python",
                "tool_latency_s": 0.1,
                "tool_output_tokens": 4,
                "tool_input": "print(1)",
            },
            {"output_tokens": 2},
        ],
    )
    record = parse_line(line, path="mem", line=1)
    store.create_batch(
        batch_id="b", records=[record], options=RolloutOptions(), source="x", created_at=0
    )
    step = store.load_specs("b", 0, 1)[0].steps[0]
    assert step.tool_input is None  # workflow history carries the key, not the code
    assert step.tool_input_ref == "b/a/tool_input/0"
    assert store.get_text(step.tool_input_ref) == "print(1)"
