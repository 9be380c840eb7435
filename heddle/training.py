"""Training-ready output of an agent batch: per trajectory its token ids, the log-prob of
each sampled token, the loss mask, the reward and the GRPO advantage.

A trajectory's tokens are its turns in order: what was appended before each turn (the
prompt, then a tool's result with the chat template's markup) with mask 0, then what the
model sampled, mask 1. `logprobs` is aligned with `token_ids` (0.0 where the mask is 0),
the layout verl and OpenRLHF take. The advantage is GRPO's: the reward less its group's
mean, over the group's standard deviation (none for a group whose rewards are all equal).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from heddle.store import TrajectoryStore
from heddle.types import TurnRecord

# Added to a group's standard deviation: DeepSeekMath's GRPO and verl use 1e-6.
STD_EPS = 1e-6


@dataclass(frozen=True)
class TrainingSample:
    trajectory_id: str
    group_id: str
    token_ids: list[int]
    logprobs: list[float]
    loss_mask: list[int]
    reward: float
    advantage: float
    finish_reason: str
    weight_versions: list[int]  # of each turn, in order

    def row(self) -> dict[str, Any]:
        """The sample as one row of an export (JSON Lines or Parquet)."""
        return dataclasses.asdict(self)


def assemble(
    turns: list[TurnRecord], oldest_version: int | None = None
) -> tuple[list[int], list[float], list[int]]:
    """Token ids, aligned log-probs and the loss mask of a trajectory's turns; a turn
    sampled by a version older than `oldest_version` is context only (mask 0)."""
    ids: list[int] = []
    logprobs: list[float] = []
    mask: list[int] = []
    for turn in turns:
        if len(turn.output_logprobs) != len(turn.output_ids):
            raise ValueError(
                f"{turn.trajectory_id} turn {turn.step_index}: {len(turn.output_ids)} sampled "
                f"tokens but {len(turn.output_logprobs)} log-probs"
            )
        ids += turn.input_ids + turn.output_ids
        logprobs += [0.0] * len(turn.input_ids) + turn.output_logprobs
        trained = oldest_version is None or turn.weight_version >= oldest_version
        mask += [0] * len(turn.input_ids) + [int(trained)] * len(turn.output_ids)
    return ids, logprobs, mask


def group_advantages(rewards: dict[str, tuple[str, float]]) -> dict[str, float]:
    """GRPO's advantage of each trajectory, from (group, reward) by trajectory id."""
    by_group: dict[str, list[float]] = defaultdict(list)
    for group, reward in rewards.values():
        by_group[group].append(reward)
    stats = {
        g: (statistics.fmean(rs), statistics.pstdev(rs) if len(rs) > 1 else 0.0)
        for g, rs in by_group.items()
    }
    return {
        tid: (reward - stats[group][0]) / (stats[group][1] + STD_EPS)
        for tid, (group, reward) in rewards.items()
    }


def training_batch(
    store: TrajectoryStore,
    batch_id: str,
    oldest_version: int | None = None,
    on_stale: str = "partial",
) -> list[TrainingSample]:
    """The completed trajectories of a batch that have turns, ready for a trainer. A
    failed trajectory, or one without a reward, is left out, and its group's advantages
    are taken over the rest. Turns sampled by a version older than `oldest_version` (an
    asynchronous campaign's bound) stay as context out of the loss ("partial"), or their
    trajectory's whole group is left out ("drop")."""
    turns = store.load_turns(batch_id)
    rows = [
        r
        for r in store.list_trajectories(batch_id, status="completed", limit=10**9)
        if r["trajectory_id"] in turns and r["reward"] is not None
    ]
    if oldest_version is not None and on_stale == "drop":
        stale = {
            r["group_id"]
            for r in rows
            if any(t.weight_version < oldest_version for t in turns[r["trajectory_id"]])
        }
        rows = [r for r in rows if r["group_id"] not in stale]
    advantages = group_advantages({r["trajectory_id"]: (r["group_id"], r["reward"]) for r in rows})
    samples = []
    for r in rows:
        tid = r["trajectory_id"]
        ids, logprobs, mask = assemble(turns[tid], oldest_version)
        sample = TrainingSample(
            trajectory_id=tid,
            group_id=r["group_id"],
            token_ids=ids,
            logprobs=logprobs,
            loss_mask=mask,
            reward=float(r["reward"]),
            advantage=advantages[tid],
            finish_reason=r["finish_reason"] or "",
            weight_versions=[t.weight_version for t in turns[tid]],
        )
        samples.append(sample)
    return samples


def write_export(samples: list[TrainingSample], path: str, fmt: str) -> None:
    """The samples as JSON Lines, or as Parquet (pyarrow, what RL trainers read)."""
    if fmt == "jsonl":
        import json

        with open(path, "w", encoding="utf-8") as fh:
            for s in samples:
                fh.write(json.dumps(s.row()) + "\n")
        return
    if fmt != "parquet":
        raise ValueError(f"unknown export format {fmt!r}: jsonl or parquet")
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise RuntimeError("a parquet export needs pyarrow: pip install 'heddle[export]'") from exc
    rows = [s.row() for s in samples]
    columns = [f.name for f in dataclasses.fields(TrainingSample)]
    pq.write_table(pa.table({c: [r[c] for r in rows] for c in columns}), path)
