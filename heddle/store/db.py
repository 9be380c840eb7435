"""Reads and writes of the trajectory store.

Every write is idempotent (keyed upserts), because activities are retried: a step
recorded twice is one row. A batch and its trajectories are inserted in one transaction,
so a rejected batch leaves nothing behind. SQLite by default, PostgreSQL by URL.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

from sqlalchemy import Connection, Engine, Table, create_engine, event, func, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session, sessionmaker

from heddle.store.models import BatchRow, StepRow, TextRow, TrajectoryRow, TurnRow
from heddle.tasks import Task, dump_task, parse_task
from heddle.trace import TraceRecord, parse_line
from heddle.types import (
    BatchReport,
    RolloutOptions,
    StepRecord,
    StepSpec,
    StepText,
    TrajectorySpec,
    TrajectoryStarted,
    TrajectorySummary,
    TurnRecord,
)

# What a running trajectory writes: its start, each step (an agent's turns' tokens too),
# its end.
TrajectoryWrite = TrajectoryStarted | StepRecord | TurnRecord | TrajectorySummary

# Keys in one `IN (...)`: well under SQLite's limit on a statement's parameters.
TEXTS_PER_QUERY = 500

# The tables as Core sees them, for the statements every step writes.
_STEPS = cast(Table, StepRow.__table__)
_TRAJECTORIES = cast(Table, TrajectoryRow.__table__)
_TURNS = cast(Table, TurnRow.__table__)
_TEXTS = cast(Table, TextRow.__table__)

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"


def default_url(state_dir: str | Path = ".heddle") -> str:
    return os.environ.get("HEDDLE_STORE_URL") or f"sqlite:///{Path(state_dir) / 'store.db'}"


def trajectory_key(batch_id: str, trajectory_id: str) -> str:
    return f"{batch_id}/{trajectory_id}"


def task_ref(batch_id: str, task_id: str) -> str:
    """Where an agent batch's task is kept (its samples share it)."""
    return f"{batch_id}/task/{task_id}"


def spec_to_json(spec: TrajectorySpec) -> str:
    return json.dumps(dataclasses.asdict(spec), separators=(",", ":"))


def spec_from_json(text: str) -> TrajectorySpec:
    data = json.loads(text)
    data["steps"] = tuple(_step_from_dict(s) for s in data["steps"])
    return TrajectorySpec(**data)


def _step_from_dict(data: dict[str, Any]) -> StepSpec:
    text = data.pop("text", None)
    if text is not None:
        text = StepText(
            tuple(text["output_ngrams"]), tuple(text["observation_ngrams"]),
            text["tool_input_chars"],
        )  # fmt: skip
    return StepSpec(**data, text=text)


# Alembic keeps its migration context in module globals: two upgrades at once in one
# process (a worker and a client side by side) corrupt each other, so they take turns.
_UPGRADE_LOCK = threading.Lock()


def upgrade(url: str) -> None:
    """Bring the store's schema to the newest Alembic revision."""
    with _UPGRADE_LOCK:
        _upgrade(url)


def _upgrade(url: str) -> None:
    from alembic import command
    from alembic.config import Config

    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", url)
    cfg.attributes["configure_logger"] = False
    command.upgrade(cfg, "head")


def _make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return engine
    return create_engine(url, pool_pre_ping=True)


class TrajectoryStore:
    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = _make_engine(url)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    @classmethod
    def open(cls, url: str) -> TrajectoryStore:
        """Apply migrations, then connect."""
        upgrade(url)
        return cls(url)

    def close(self) -> None:
        self.engine.dispose()

    @contextmanager
    def _session(self) -> Iterator[Session]:
        with self._sessions.begin() as session:
            yield session

    # ---- batches ---------------------------------------------------------------------
    def create_batch(
        self,
        *,
        batch_id: str,
        records: Iterable[TraceRecord],
        options: RolloutOptions,
        source: str,
        created_at: float,
        tasks: Sequence[Task] = (),
        status: str = "running",
    ) -> int:
        """Insert a batch with all its trajectories and texts (and the tasks of an agent
        batch), atomically. A batch of status "history" is an earlier iteration given as
        a file (`heddle rollout --history`): it never runs, later batches learn from it."""
        with self._session() as s:
            if s.get(BatchRow, batch_id) is not None:
                raise ValueError(f"batch {batch_id!r} already exists in the store")
            for task in tasks:
                s.add(
                    TextRow(
                        ref=task_ref(batch_id, task.task_id), content=json.dumps(dump_task(task))
                    )
                )
            count = 0
            for position, record in enumerate(records):
                spec = record.spec
                key = trajectory_key(batch_id, spec.trajectory_id)
                prompt_ref = None
                if record.prompt_text is not None:
                    prompt_ref = f"{key}/prompt"
                    s.add(TextRow(ref=prompt_ref, content=record.prompt_text))
                for i, text in enumerate(record.step_texts):
                    if text is not None:
                        s.add(TextRow(ref=f"{key}/trace/{i}", content=text))
                # Tool arguments go to the texts table; the spec keeps their keys.
                steps = list(spec.steps)
                for i, step in enumerate(steps):
                    if step.tool_input is not None:
                        ref = f"{key}/tool_input/{i}"
                        s.add(TextRow(ref=ref, content=step.tool_input))
                        steps[i] = dataclasses.replace(step, tool_input=None, tool_input_ref=ref)
                spec = dataclasses.replace(spec, steps=tuple(steps))
                s.add(
                    TrajectoryRow(
                        key=key,
                        batch_id=batch_id,
                        trajectory_id=spec.trajectory_id,
                        group_id=spec.group_id,
                        workload=spec.workload,
                        position=position,
                        prompt_tokens=spec.prompt_tokens,
                        spec_json=spec_to_json(spec),
                        prompt_ref=prompt_ref,
                        trace_reward=record.reward,
                    )
                )
                count += 1
            s.add(
                BatchRow(
                    batch_id=batch_id,
                    status=status,
                    policy=options.policy,
                    source=source,
                    options_json=json.dumps(dataclasses.asdict(options)),
                    num_trajectories=count,
                    created_at=created_at,
                )
            )
            return count

    def load_specs(
        self, batch_id: str, offset: int, limit: int, stride: int = 1, status: str = ""
    ) -> list[TrajectorySpec]:
        """Up to `limit` specs at positions `offset`, `offset + stride`, ... (a strided
        slice of the batch), in position order; only those of `status`, if given."""
        with self._session() as s:
            q = select(TrajectoryRow.spec_json).where(TrajectoryRow.batch_id == batch_id)
            if status:
                q = q.where(TrajectoryRow.status == status)
            if stride > 1:
                q = q.where(
                    TrajectoryRow.position >= offset,
                    (TrajectoryRow.position - offset) % stride == 0,
                )
            else:
                q = q.offset(offset)
            rows = s.scalars(q.order_by(TrajectoryRow.position).limit(limit)).all()
        return [spec_from_json(r) for r in rows]

    def batch_trace(self, batch_id: str) -> list[TraceRecord]:
        """The completed trajectories of a batch as a trace of what they did, in batch
        order: each step's tokens and tool as run, with the model's text and the tools'
        observations where there are some (an agent batch). An agent step's tool output
        is what the next turn appended to the context, in the model's tokens (the tool
        messages with the chat template's markup); several calls in a turn are one step
        with the last call's tool and the results joined. A trajectory that stopped at
        the turn limit ends on its last turn's output. Each line goes through the trace
        parser, so the records are exactly what loading the written trace gives."""
        with self._session() as s:
            rows = s.scalars(
                select(TrajectoryRow)
                .where(TrajectoryRow.batch_id == batch_id, TrajectoryRow.status == "completed")
                .order_by(TrajectoryRow.position)
            ).all()
            steps: dict[str, list[StepRow]] = {}
            for step in s.scalars(
                select(StepRow)
                .join(TrajectoryRow, StepRow.trajectory_key == TrajectoryRow.key)
                .where(TrajectoryRow.batch_id == batch_id, TrajectoryRow.status == "completed")
                .order_by(StepRow.trajectory_key, StepRow.step_index)
            ):
                steps.setdefault(step.trajectory_key, []).append(step)
            turn_texts = {
                (key, index): text
                for key, index, text in s.execute(
                    select(TurnRow.trajectory_key, TurnRow.step_index, TurnRow.text)
                    .join(TrajectoryRow, TurnRow.trajectory_key == TrajectoryRow.key)
                    .where(TrajectoryRow.batch_id == batch_id)
                )
            }
        calls = {
            (st.trajectory_key, st.step_index): json.loads(st.calls_json)
            for taken in steps.values()
            for st in taken
            if st.calls_json
        }
        refs = [c["observation_ref"] for cs in calls.values() for c in cs if c["observation_ref"]]
        refs += [c["input_ref"] for cs in calls.values() for c in cs if c["input_ref"]]
        if not turn_texts:  # a replayed batch: its trace's texts
            refs += [f"{key}/trace/{st.step_index}" for key, taken in steps.items() for st in taken]
        texts = self.get_texts(refs)
        records = []
        for line, row in enumerate(rows, start=1):
            taken = steps.get(row.key, [])
            if not taken:
                continue
            obj: dict[str, Any] = {
                "trajectory_id": row.trajectory_id,
                "group_id": row.group_id,
                "workload": row.workload,
                "prompt_tokens": taken[0].context_tokens,
                "steps": [],
            }
            if row.reward is not None:
                obj["reward"] = row.reward
            for i, st in enumerate(taken):
                item: dict[str, Any] = {"output_tokens": max(1, st.output_tokens)}
                text = turn_texts.get((row.key, st.step_index)) or texts.get(
                    f"{row.key}/trace/{st.step_index}"
                )
                if text:
                    item["text"] = text
                if st.tool is not None and i + 1 < len(taken):
                    item.update(
                        tool=st.tool,
                        tool_latency_s=st.tool_latency_s,
                        tool_status=st.tool_status or "ok",
                        tool_output_tokens=st.tool_output_tokens,
                    )
                    made = calls.get((row.key, st.step_index))
                    if made:
                        appended = taken[i + 1].context_tokens - st.context_tokens
                        item["tool_output_tokens"] = max(0, appended - st.output_tokens)
                        seen = [texts.get(c["observation_ref"], "") for c in made]
                        item["observation"] = "\n".join(seen)
                        if made[-1]["input_ref"] in texts:
                            item["tool_input"] = texts[made[-1]["input_ref"]]
                obj["steps"].append(item)
            records.append(parse_line(obj, path=f"batch {batch_id}", line=line))
        return records

    def history_specs(self, batch_id: str, limit: int) -> list[TrajectorySpec]:
        """What a batch learns from an earlier one: a replayed batch's trace specs, an
        agent batch's trajectories as they ran (`batch_trace`: its stored specs hold
        only the task)."""
        first = self.load_specs(batch_id, 0, 1)
        if first and first[0].task_id:
            return [r.spec for r in self.batch_trace(batch_id)[:limit]]
        return self.load_specs(batch_id, 0, limit)

    def batch_before(self, batch_id: str | None = None) -> str | None:
        """The batch created just before `batch_id` (None: the latest batch): the earlier
        iteration a batch learns from."""
        with self._session() as s:
            q = select(BatchRow.batch_id).order_by(BatchRow.created_at.desc())
            if batch_id is not None:
                created = s.scalar(select(BatchRow.created_at).where(BatchRow.batch_id == batch_id))
                if created is not None:
                    q = q.where(BatchRow.created_at < created)
            return s.scalars(q.limit(1)).first()

    def finish_batch(self, report: BatchReport) -> None:
        with self._session() as s:
            s.execute(
                update(BatchRow)
                .where(BatchRow.batch_id == report.batch_id)
                .values(
                    status="completed",
                    finished_at=report.finished_at,
                    report_json=json.dumps(dataclasses.asdict(report)),
                )
            )

    def get_batch(self, batch_id: str) -> dict[str, Any] | None:
        with self._session() as s:
            row = s.get(BatchRow, batch_id)
            if row is None:
                return None
            counts = dict(
                s.execute(
                    select(TrajectoryRow.status, func.count())
                    .where(TrajectoryRow.batch_id == batch_id)
                    .group_by(TrajectoryRow.status)
                ).all()
            )
            return {
                "batch_id": row.batch_id,
                "status": row.status,
                "policy": row.policy,
                "source": row.source,
                "num_trajectories": row.num_trajectories,
                "created_at": row.created_at,
                "finished_at": row.finished_at,
                "trajectory_status": {str(k): int(v) for k, v in counts.items()},
                "report": json.loads(row.report_json) if row.report_json else None,
            }

    def list_batches(self, limit: int = 50) -> list[dict[str, Any]]:
        with self._session() as s:
            ids = s.scalars(
                select(BatchRow.batch_id).order_by(BatchRow.created_at.desc()).limit(limit)
            ).all()
        return [b for b in (self.get_batch(i) for i in ids) if b is not None]

    # ---- trajectories ----------------------------------------------------------------
    def record_step(self, record: StepRecord) -> None:
        self.write([record])

    def finish_trajectory(self, summary: TrajectorySummary) -> None:
        self.write([summary])

    def write(self, writes: Sequence[TrajectoryWrite], texts: dict[str, str] | None = None) -> None:
        """Trajectories' writes (and `texts` by key) in one transaction, in order. Core
        statements on a connection, not the ORM session: every step of a live batch
        passes here."""
        with self.engine.begin() as conn:
            for w in writes:
                self._write_one(conn, w)
            for ref, content in (texts or {}).items():
                self._upsert_text(conn, ref, content)

    def _upsert_text(self, conn: Connection, ref: str, content: str) -> None:
        insert = pg_insert if self.engine.dialect.name == "postgresql" else sqlite_insert
        conn.execute(
            insert(_TEXTS)
            .values(ref=ref, content=content)
            .on_conflict_do_update(index_elements=[_TEXTS.c.ref], set_={"content": content})
        )

    def _write_one(self, conn: Connection, w: TrajectoryWrite) -> None:
        if isinstance(w, StepRecord):
            self._record_step(conn, w)
            return
        if isinstance(w, TurnRecord):
            self._record_turn(conn, w)
            return
        key = trajectory_key(w.batch_id, w.trajectory_id)
        if isinstance(w, TrajectoryStarted):
            conn.execute(
                update(_TRAJECTORIES)
                .where(_TRAJECTORIES.c.key == key, _TRAJECTORIES.c.status == "pending")
                .values(status="running", started_at=w.started_at)
            )
            return
        conn.execute(
            update(_TRAJECTORIES)
            .where(_TRAJECTORIES.c.key == key)
            .values(
                status=w.status,
                finish_reason=w.finish_reason,
                turns=w.turns,
                generated_tokens=w.generated_tokens,
                tool_calls=w.tool_calls,
                reward=w.reward,
                started_at=w.started_at,
                finished_at=w.finished_at,
                error=w.error or None,
                reward_reason=w.reward_reason or None,
                reward_error=w.reward_error or None,
            )
        )

    def _record_turn(self, conn: Connection, turn: TurnRecord) -> None:
        """A turn's tokens, replaced whole by a retried step (the stored turn is always
        the one whose result the trajectory went on with)."""
        values = {
            "input_ids": json.dumps(turn.input_ids),
            "output_ids": json.dumps(turn.output_ids),
            "output_logprobs": json.dumps(turn.output_logprobs),
            "weight_version": turn.weight_version,
            "finish_reason": turn.finish_reason,
            "text": turn.text,
        }
        key = trajectory_key(turn.batch_id, turn.trajectory_id)
        self._upsert_step_row(conn, _TURNS, key, turn.step_index, values)

    def _upsert_step_row(
        self, conn: Connection, table: Table, key: str, step_index: int, values: dict[str, Any]
    ) -> None:
        """Insert a row keyed by (trajectory, step), or replace its values: a retried
        step writes the same row again."""
        insert = pg_insert if self.engine.dialect.name == "postgresql" else sqlite_insert
        upsert = insert(table).values(trajectory_key=key, step_index=step_index, **values)
        conn.execute(
            upsert.on_conflict_do_update(
                index_elements=[table.c.trajectory_key, table.c.step_index], set_=values
            )
        )

    def load_turns(
        self, batch_id: str, trajectory_id: str | None = None
    ) -> dict[str, list[TurnRecord]]:
        """Every stored turn of a batch (or of one of its trajectories), by trajectory,
        in step order."""
        out: dict[str, list[TurnRecord]] = {}
        q = (
            select(TrajectoryRow.trajectory_id, TurnRow)
            .join(TurnRow, TurnRow.trajectory_key == TrajectoryRow.key)
            .where(TrajectoryRow.batch_id == batch_id)
        )
        if trajectory_id is not None:
            q = q.where(TrajectoryRow.key == trajectory_key(batch_id, trajectory_id))
        with self._session() as s:
            rows = s.execute(q.order_by(TrajectoryRow.position, TurnRow.step_index)).all()
        for tid, row in rows:
            out.setdefault(tid, []).append(
                TurnRecord(
                    batch_id, tid, row.step_index, json.loads(row.input_ids),
                    json.loads(row.output_ids), json.loads(row.output_logprobs),
                    row.weight_version, row.finish_reason, row.text,
                )
            )  # fmt: skip
        return out

    def get_task(self, batch_id: str, task_id: str) -> Task:
        """An agent batch's task, as it was validated when the batch was made."""
        text = self.get_text(task_ref(batch_id, task_id))
        if text is None:
            raise KeyError(f"batch {batch_id!r} has no task {task_id!r}")
        return parse_task(json.loads(text), path=task_ref(batch_id, task_id), line=1)

    def get_texts(self, refs: Sequence[str]) -> dict[str, str]:
        """Many texts at once (a turn's tool results): those that exist."""
        out: dict[str, str] = {}
        if not refs:
            return out
        with self._session() as s:
            for at in range(0, len(refs), TEXTS_PER_QUERY):
                part = refs[at : at + TEXTS_PER_QUERY]
                rows = s.execute(select(TextRow.ref, TextRow.content).where(TextRow.ref.in_(part)))
                out.update((ref, content) for ref, content in rows)
        return out

    def _record_step(self, conn: Connection, record: StepRecord) -> None:
        """One step's row, written again in place by a retry: an upsert and a guarded
        update of the trajectory's turn count."""
        key = trajectory_key(record.batch_id, record.trajectory_id)
        values = dataclasses.asdict(record)
        for name in ("batch_id", "trajectory_id", "step_index"):
            values.pop(name)
        values["observation_ref"] = values["observation_ref"] or None
        calls = values.pop("calls")
        values["calls_json"] = json.dumps(calls) if calls else None
        self._upsert_step_row(conn, _STEPS, key, record.step_index, values)
        conn.execute(
            update(_TRAJECTORIES)
            .where(_TRAJECTORIES.c.key == key, _TRAJECTORIES.c.turns < record.step_index + 1)
            .values(turns=record.step_index + 1)
        )

    def trace_reward(self, batch_id: str, trajectory_id: str) -> float | None:
        with self._session() as s:
            return s.scalar(
                select(TrajectoryRow.trace_reward).where(
                    TrajectoryRow.key == trajectory_key(batch_id, trajectory_id)
                )
            )

    def list_trajectories(
        self, batch_id: str, *, status: str | None = None, limit: int = 1000
    ) -> list[dict[str, Any]]:
        with self._session() as s:
            q = select(TrajectoryRow).where(TrajectoryRow.batch_id == batch_id)
            if status:
                q = q.where(TrajectoryRow.status == status)
            rows = s.scalars(q.order_by(TrajectoryRow.position).limit(limit)).all()
            return [_trajectory_dict(r) for r in rows]

    def get_trajectory(self, batch_id: str, trajectory_id: str) -> dict[str, Any] | None:
        key = trajectory_key(batch_id, trajectory_id)
        with self._session() as s:
            row = s.get(TrajectoryRow, key)
            if row is None:
                return None
            out = _trajectory_dict(row)
            out["task_id"] = json.loads(row.spec_json).get("task_id", "")
            steps = s.scalars(
                select(StepRow).where(StepRow.trajectory_key == key).order_by(StepRow.step_index)
            ).all()
            out["steps"] = [
                {
                    c.key: getattr(st, c.key)
                    for c in StepRow.__table__.columns
                    if c.key not in ("trajectory_key", "calls_json")
                }
                | {"calls": json.loads(st.calls_json) if st.calls_json else []}
                for st in steps
            ]
            return out

    def batch_progress(self, batch_id: str) -> dict[str, int]:
        """A batch's trajectories by status, and the tokens of those that ended."""
        with self._session() as s:
            rows = s.execute(
                select(
                    TrajectoryRow.status,
                    func.count(),
                    func.coalesce(func.sum(TrajectoryRow.generated_tokens), 0),
                )
                .where(TrajectoryRow.batch_id == batch_id)
                .group_by(TrajectoryRow.status)
            ).all()
        by = {status: (int(n), int(tokens)) for status, n, tokens in rows}
        completed, failed = by.get("completed", (0, 0)), by.get("failed", (0, 0))
        running = by.get("running", (0, 0))[0]
        return {
            "started": running + completed[0] + failed[0],
            "completed": completed[0],
            "failed": failed[0],
            "running": running,
            "generated_tokens": completed[1] + failed[1],
        }

    def batch_outcomes(self, batch_id: str) -> dict[str, Any]:
        """A batch's rewards and what its trajectories did: mean reward, the share with
        reward 1 (pass rate), tool calls, finish reasons, verifier errors."""
        with self._session() as s:
            rows = s.execute(
                select(
                    TrajectoryRow.finish_reason, TrajectoryRow.reward,
                    TrajectoryRow.tool_calls, TrajectoryRow.reward_error,
                ).where(TrajectoryRow.batch_id == batch_id)
            ).all()  # fmt: skip
        rewards = [r for _, r, _, _ in rows if r is not None]
        reasons: dict[str, int] = {}
        for reason, *_ in rows:
            reasons[reason or "running"] = reasons.get(reason or "running", 0) + 1
        return {
            "mean_reward": sum(rewards) / len(rewards) if rewards else None,
            "pass_rate": sum(r >= 1.0 for r in rewards) / len(rewards) if rewards else None,
            "tool_calls": sum(int(n or 0) for _, _, n, _ in rows),
            "finish_reasons": dict(sorted(reasons.items())),
            "reward_errors": sum(bool(e) for *_, e in rows),
        }

    def count_steps(self, batch_id: str) -> int:
        with self._session() as s:
            return int(
                s.scalar(
                    select(func.count())
                    .select_from(StepRow)
                    .join(TrajectoryRow, StepRow.trajectory_key == TrajectoryRow.key)
                    .where(TrajectoryRow.batch_id == batch_id)
                )
                or 0
            )

    # ---- campaigns --------------------------------------------------------------------
    # A campaign's spec, its task set and one record per finished iteration, kept as
    # texts under `campaign/<name>/`: the campaign workflow holds the live state, the
    # store what outlives its history (the task set it draws from, the table and plot).
    def create_campaign(self, name: str, spec: dict[str, Any], tasks: Sequence[Task]) -> None:
        """Store a campaign's spec and tasks, atomically; a name in use is refused."""
        with self._session() as s:
            if s.get(TextRow, _campaign_ref(name, "spec")) is not None:
                raise ValueError(f"campaign {name!r} already exists in the store")
            s.add(TextRow(ref=_campaign_ref(name, "spec"), content=json.dumps(spec)))
            tasks_json = json.dumps([dump_task(t) for t in tasks])
            s.add(TextRow(ref=_campaign_ref(name, "tasks"), content=tasks_json))

    def get_campaign(self, name: str) -> dict[str, Any] | None:
        text = self.get_text(_campaign_ref(name, "spec"))
        return None if text is None else cast(dict[str, Any], json.loads(text))

    def list_campaigns(self) -> list[str]:
        with self._session() as s:
            refs = s.scalars(
                select(TextRow.ref).where(TextRow.ref.like("campaign/%/spec")).order_by(TextRow.ref)
            ).all()
        return [r.removeprefix("campaign/").removesuffix("/spec") for r in refs]

    def campaign_tasks(self, name: str) -> list[Task]:
        ref = _campaign_ref(name, "tasks")
        text = self.get_text(ref)
        if text is None:
            raise KeyError(f"no campaign {name!r} in the store")
        return [parse_task(obj, path=ref, line=i + 1) for i, obj in enumerate(json.loads(text))]

    def record_iteration(self, record: dict[str, Any]) -> None:
        """An iteration's record; written again (a retried activity) it is replaced."""
        ref = _campaign_ref(record["campaign"], f"iteration/{record['iteration']:06d}")
        self.put_text(ref, json.dumps(record, sort_keys=True))

    def campaign_iterations(self, name: str) -> list[dict[str, Any]]:
        with self._session() as s:
            rows = s.scalars(
                select(TextRow.content)
                .where(TextRow.ref.like(_campaign_ref(name, "iteration/%")))
                .order_by(TextRow.ref)
            ).all()
        return [json.loads(r) for r in rows]

    # ---- engine weights --------------------------------------------------------------
    def record_engine_weights(self, queue_prefix: str, path: str, version: int) -> None:
        """The checkpoint an engine host's instances last synced to: a host restarted
        after a crash starts its instances on it, not on the configured model."""
        self.put_text(
            _engine_weights_ref(queue_prefix), json.dumps({"path": path, "version": version})
        )

    def engine_weights(self, queue_prefix: str) -> tuple[str, int] | None:
        found = self.get_text(_engine_weights_ref(queue_prefix))
        if found is None:
            return None
        weights = json.loads(found)
        return str(weights["path"]), int(weights["version"])

    # ---- texts -----------------------------------------------------------------------
    def put_text(self, ref: str, content: str) -> None:
        with self._session() as s:
            s.merge(TextRow(ref=ref, content=content))

    def get_text(self, ref: str) -> str | None:
        with self._session() as s:
            row = s.get(TextRow, ref)
            return None if row is None else row.content


def _engine_weights_ref(queue_prefix: str) -> str:
    return f"engine-weights/{queue_prefix or '-'}"


def _campaign_ref(name: str, what: str) -> str:
    return f"campaign/{name}/{what}"


def _trajectory_dict(row: TrajectoryRow) -> dict[str, Any]:
    return {
        c.key: getattr(row, c.key)
        for c in TrajectoryRow.__table__.columns
        if c.key not in ("spec_json",)
    }
