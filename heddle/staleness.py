"""Bounded staleness for asynchronous campaigns: which trajectories may start, and which
of their tokens a train step may learn from.

A campaign is asynchronous when the rollout of later batches overlaps the training of
earlier ones, so a trajectory's tokens can be made by weights older than those the
trainer updates. The bound S caps that lag: a train step that starts from policy version
k learns only from tokens made by versions k - S .. k. Two rules keep it:

- Admission (AReaL's capacity rule): a trajectory starts only while
  `min(max_concurrent - running, (S + v + 1) * B - (accepted + running)) > 0`, for policy
  version v and batch size B, so the rollout runs at most S batches ahead of the trainer.
- A trajectory still running when the version moves past S of its oldest token is stale.
  By option it is continued under the new weights (`partial`: every token keeps the
  version that made it, and those more than S versions old at its train step stay in the
  context but out of the loss), or dropped with its whole group (`drop`).

Pure: the simulated campaign (`heddle.sim.campaign`) and the live one share it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

ON_STALE = ("partial", "drop")

# (policy version, tokens it made), in the order made: vLLM's `weight_versions` spans.
VersionSpans = list[tuple[int, int]]


@dataclass(frozen=True)
class StalenessBound:
    max_staleness: int  # S: versions a trained token may lag the trainer
    batch_size: int  # B: trajectories per train step
    max_concurrent: int  # trajectories the rollout runs at once
    on_stale: str = "partial"  # "partial" or "drop" (see the module's docstring)

    def __post_init__(self) -> None:
        if self.max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, not {self.max_staleness}")
        if self.batch_size < 1 or self.max_concurrent < 1:
            raise ValueError("batch_size and max_concurrent must be >= 1")
        if self.on_stale not in ON_STALE:
            raise ValueError(f"on_stale must be one of {ON_STALE}, not {self.on_stale!r}")

    def room(self, version: int, accepted: int, running: int) -> int:
        """How many more trajectories may start now (AReaL's capacity rule): `accepted`
        counts those finished and kept (trained or waiting to be), `running` those in
        flight; dropped ones count in neither."""
        by_staleness = (self.max_staleness + version + 1) * self.batch_size - (accepted + running)
        return max(0, min(self.max_concurrent - running, by_staleness))

    def oldest_trainable(self, train_version: int) -> int:
        """The oldest version whose tokens a step from `train_version` learns from."""
        return train_version - self.max_staleness

    def is_stale(self, spans: Sequence[tuple[int, int]], version: int) -> bool:
        """Whether a trajectory holds tokens no step from `version` on may learn from."""
        oldest = oldest_version(spans)
        return oldest is not None and oldest < self.oldest_trainable(version)

    def trainable_tokens(self, spans: Sequence[tuple[int, int]], train_version: int) -> int:
        """Its tokens a step from `train_version` learns from; the rest stay context."""
        floor = self.oldest_trainable(train_version)
        return sum(tokens for v, tokens in spans if v >= floor)


def add_tokens(spans: VersionSpans, version: int, tokens: int) -> None:
    """Record `tokens` made by `version` (merged into the last span when it is the same)."""
    if tokens <= 0:
        return
    if spans and spans[-1][0] == version:
        spans[-1] = (version, spans[-1][1] + tokens)
    else:
        spans.append((version, tokens))


def oldest_version(spans: Sequence[tuple[int, int]]) -> int | None:
    return min((v for v, tokens in spans if tokens), default=None)
