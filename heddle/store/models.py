"""Tables of the trajectory store. Changing one needs an Alembic migration in migrations/."""

from __future__ import annotations

from sqlalchemy import Float, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class BatchRow(Base):
    __tablename__ = "batches"

    batch_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    status: Mapped[str] = mapped_column(String(16), default="running")
    policy: Mapped[str] = mapped_column(String(64), default="")
    source: Mapped[str] = mapped_column(Text, default="")  # trace path or batch spec
    options_json: Mapped[str] = mapped_column(Text, default="{}")
    num_trajectories: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[float] = mapped_column(Float, default=0.0)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    report_json: Mapped[str | None] = mapped_column(Text, nullable=True)


class TrajectoryRow(Base):
    __tablename__ = "trajectories"

    # "<batch_id>/<trajectory_id>": a trace may be rolled out in many batches.
    key: Mapped[str] = mapped_column(String(300), primary_key=True)
    batch_id: Mapped[str] = mapped_column(ForeignKey("batches.batch_id"), index=True)
    trajectory_id: Mapped[str] = mapped_column(String(160))
    group_id: Mapped[str] = mapped_column(String(160), index=True)
    workload: Mapped[str] = mapped_column(String(64), default="unknown")
    position: Mapped[int] = mapped_column(Integer)  # order in the trace
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    spec_json: Mapped[str] = mapped_column(Text)  # compact spec, no long texts
    prompt_ref: Mapped[str | None] = mapped_column(String(340), nullable=True)
    trace_reward: Mapped[float | None] = mapped_column(Float, nullable=True)
    status: Mapped[str] = mapped_column(String(16), default="pending")
    finish_reason: Mapped[str | None] = mapped_column(String(32), nullable=True)
    turns: Mapped[int] = mapped_column(Integer, default=0)
    generated_tokens: Mapped[int] = mapped_column(Integer, default=0)
    tool_calls: Mapped[int] = mapped_column(Integer, default=0)
    reward: Mapped[float | None] = mapped_column(Float, nullable=True)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    reward_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    reward_error: Mapped[str | None] = mapped_column(Text, nullable=True)

    __table_args__ = (Index("ix_trajectories_batch_position", "batch_id", "position"),)


class StepRow(Base):
    __tablename__ = "steps"

    trajectory_key: Mapped[str] = mapped_column(ForeignKey("trajectories.key"), primary_key=True)
    step_index: Mapped[int] = mapped_column(Integer, primary_key=True)
    instance_id: Mapped[str] = mapped_column(String(64))
    context_tokens: Mapped[int] = mapped_column(Integer)
    output_tokens: Mapped[int] = mapped_column(Integer)
    cached_tokens: Mapped[int] = mapped_column(Integer, default=0)
    queued_s: Mapped[float] = mapped_column(Float, default=0.0)
    gen_started_at: Mapped[float] = mapped_column(Float, default=0.0)
    gen_finished_at: Mapped[float] = mapped_column(Float, default=0.0)
    tool: Mapped[str | None] = mapped_column(String(64), nullable=True)
    tool_status: Mapped[str | None] = mapped_column(String(16), nullable=True)
    tool_output_tokens: Mapped[int] = mapped_column(Integer, default=0)
    tool_latency_s: Mapped[float] = mapped_column(Float, default=0.0)
    observation_ref: Mapped[str | None] = mapped_column(String(340), nullable=True)
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    resumed_tokens: Mapped[int] = mapped_column(Integer, default=0)
    calls_json: Mapped[str | None] = mapped_column(Text, nullable=True)  # an agent turn's


class TurnRow(Base):
    """One model turn's tokens (JSON arrays): `heddle.types.TurnRecord`."""

    __tablename__ = "turns"

    trajectory_key: Mapped[str] = mapped_column(ForeignKey("trajectories.key"), primary_key=True)
    step_index: Mapped[int] = mapped_column(Integer, primary_key=True)
    input_ids: Mapped[str] = mapped_column(Text)
    output_ids: Mapped[str] = mapped_column(Text)
    output_logprobs: Mapped[str] = mapped_column(Text)
    weight_version: Mapped[int] = mapped_column(Integer, default=0)
    finish_reason: Mapped[str] = mapped_column(String(32), default="")
    text: Mapped[str] = mapped_column(Text, default="", server_default="")


class TextRow(Base):
    """Long texts (prompts, generated text, tool observations), referenced by key."""

    __tablename__ = "texts"

    ref: Mapped[str] = mapped_column(String(340), primary_key=True)
    content: Mapped[str] = mapped_column(Text)
