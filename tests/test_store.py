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


def _agent_batch(store: TrajectoryStore, batch_id: str = "ag") -> None:
    """An agent batch of two samples of one math task, written as the engine host and
    the workflow write it: a turn that calls two tools, then an answer (sample 0); a
    sample that failed (1)."""
    from heddle.tasks import agent_records, load_tasks
    from heddle.types import ToolCallRecord, TurnRecord

    task = load_tasks("heddle/data/tasks/math.jsonl")[0]
    store.create_batch(
        batch_id=batch_id, records=agent_records([task], 2), options=RolloutOptions(),
        source="tasks", created_at=1.0, tasks=[task],
    )  # fmt: skip
    tid = f"{task.task_id}.0"
    calls = [
        ToolCallRecord("calculator", input_ref=f"{batch_id}/{tid}/in/0", input_chars=5,
                       observation_ref=f"{batch_id}/{tid}/obs/0", status="ok", output_tokens=2),
        ToolCallRecord("calculator", input_ref=f"{batch_id}/{tid}/in/1", input_chars=3,
                       observation_ref=f"{batch_id}/{tid}/obs/1", status="ok", output_tokens=1),
    ]  # fmt: skip
    store.write(
        [
            TurnRecord(batch_id, tid, 0, list(range(40)), [7] * 12, [-0.5] * 12,
                       finish_reason="stop", text="<tool_call>…</tool_call>"),
            StepRecord(batch_id, tid, 0, "i0", 40, 12, tool="calculator", tool_status="ok",
                       tool_output_tokens=3, tool_latency_s=0.01, calls=calls),
            TurnRecord(batch_id, tid, 1, [1] * 9, [8] * 4, [-0.1] * 4, finish_reason="stop",
                       text="The answer is 4."),
            StepRecord(batch_id, tid, 1, "i1", 61, 4),
            TrajectorySummary(batch_id, tid, task.task_id, "completed", "answer", 2, 16, 2,
                              reward=1.0),
            TrajectorySummary(batch_id, f"{task.task_id}.1", task.task_id, "failed", "error",
                              0, 0, 0),
        ],
        {f"{batch_id}/{tid}/in/0": "2 + 2", f"{batch_id}/{tid}/in/1": "4*1",
         f"{batch_id}/{tid}/obs/0": "4", f"{batch_id}/{tid}/obs/1": "4"},
    )  # fmt: skip


def test_a_finished_agent_batch_is_a_trace_of_what_its_trajectories_did(
    store_url: str, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    import json

    from heddle.textfeatures import hashed_ngrams
    from heddle.trace import dump_record, load_trace

    store = TrajectoryStore.open(store_url)
    _agent_batch(store)
    (record,) = store.batch_trace("ag")  # the failed sample is left out
    spec = record.spec
    assert spec.prompt_tokens == 40  # the rendered prompt, not the estimate
    assert [s.output_tokens for s in spec.steps] == [12, 4]
    first = spec.steps[0]
    # What the next turn appended: 61 - 40 - 12, the template's markup included.
    assert (first.tool, first.tool_output_tokens) == ("calculator", 9)
    assert first.tool_input == "4*1"  # the last call's
    assert record.step_observations[0] == "4\n4"
    assert record.step_texts == ("<tool_call>…</tool_call>", "The answer is 4.")
    assert first.text is not None
    assert first.text.output_ngrams == hashed_ngrams("<tool_call>…</tool_call>")
    assert record.reward == 1.0
    # The learning policies read it as the earlier iteration.
    assert store.history_specs("ag", 100) == [spec]
    # The written trace loads back to the same records.
    path = tmp_path / "from-batch.jsonl"
    path.write_text(json.dumps(dump_record(record)) + "\n")
    assert [r.spec for r in load_trace(path)] == [spec]
