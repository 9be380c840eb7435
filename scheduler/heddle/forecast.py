"""Progressive prediction and ranking: each trajectory's remaining tokens, re-predicted at
every step, and its rank among the active ones by predicted total length (Heddle paper,
"Progressive prediction")."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from heddle.types import TrajectorySpec, TrajectoryView
from scheduler.predictor import RemainingPredictor


class Lengths(Protocol):
    """Where a trajectory's remaining length comes from."""

    # True when the lengths are the batch's own (the oracle ablation).
    exact: bool

    def predict(self, event: TrajectoryView) -> float: ...

    def rank_remaining(self, event: TrajectoryView, expected: float) -> float:
        """The remaining tokens its rank assumes, given the expected count: the
        expected count itself unless a source knows its uncertainty."""
        ...

    def finished(self, group_id: str, generated_tokens: int) -> None: ...


@dataclass
class TrueLengths:
    """The oracle: the batch's true lengths, the predictor's headroom."""

    truth: dict[str, TrajectorySpec]
    exact: bool = True

    def predict(self, event: TrajectoryView) -> float:
        spec = self.truth[event.trajectory_id]
        return float(max(1, spec.generated_tokens - event.generated_tokens))

    def rank_remaining(self, event: TrajectoryView, expected: float) -> float:
        return expected

    def finished(self, group_id: str, generated_tokens: int) -> None:
        return None


@dataclass
class LearnedLengths:
    """The LightGBM predictor trained on an earlier iteration; a finished sibling sharpens
    its group's later predictions."""

    predictor: RemainingPredictor
    exact: bool = False
    # Rank by the predictor's upper quantile (`RemainingPredictor.upper_rows`; it must
    # be trained with `upper=True`), not its expected count.
    rank_upper: bool = False

    def predict(self, event: TrajectoryView) -> float:
        return self.predictor.predict(event)

    def rank_remaining(self, event: TrajectoryView, expected: float) -> float:
        return self.predictor.predict_upper(event) if self.rank_upper else expected

    def finished(self, group_id: str, generated_tokens: int) -> None:
        self.predictor.memory.sibling_finished(group_id, generated_tokens)


@dataclass
class Forecast:
    """The active trajectories' predicted remaining tokens and mean KV, and their ranking
    (longest predicted total first), kept sorted as each is re-predicted."""

    lengths: Lengths
    # Context tokens added per generated token (tool outputs included), from the history:
    # search observations can outweigh what the model writes.
    context_growth: float = 1.0
    remaining: dict[str, float] = field(default_factory=dict)
    _key: dict[str, float] = field(default_factory=dict)
    _context: dict[str, float] = field(default_factory=dict)
    _active: list[tuple[float, str]] = field(default_factory=list)

    @staticmethod
    def growth_of(specs: Sequence[TrajectorySpec]) -> float:
        generated = sum(s.generated_tokens for s in specs)
        observed = sum(st.tool_output_tokens for s in specs for st in s.steps)
        return 1.0 + observed / generated if generated else 1.0

    def __len__(self) -> int:
        """How many trajectories are active."""
        return len(self._active)

    def __contains__(self, trajectory_id: object) -> bool:
        return trajectory_id in self._key

    def update(self, event: TrajectoryView) -> float:
        """Re-predict a trajectory; its rank key is its predicted total length (made so
        far plus predicted remaining), so progress alone does not move it."""
        tid = event.trajectory_id
        self._unrank(tid)
        value = self.lengths.predict(event)
        self.remaining[tid] = value
        # Its mean KV while the rest runs: the context now plus half of what is still to
        # come, generated tokens and the tool outputs that come with them.
        self._context[tid] = event.context_tokens + self.growth_left(tid) / 2
        key = self.lengths.rank_remaining(event, value) + event.generated_tokens
        self._key[tid] = key
        bisect.insort(self._active, (-key, tid))
        return value

    def total(self, tid: str) -> float:
        """Its predicted total length (made so far plus predicted remaining): the rank key."""
        return self._key.get(tid, 0.0)

    def mean_context(self, tid: str) -> float:
        """Its mean KV over what is left of it: the context now plus half of what is
        still to come."""
        return self._context.get(tid, 0.0)

    def growth_left(self, tid: str) -> float:
        """The context tokens still to come: its predicted remaining with the tool
        outputs that come with them."""
        return self.remaining.get(tid, 0.0) * self.context_growth

    def rank(self, tid: str) -> int:
        return bisect.bisect_left(self._active, (-self._key[tid], tid))

    def finished(self, tid: str, group_id: str, generated_tokens: int) -> None:
        self.remaining.pop(tid, None)
        self._context.pop(tid, None)
        self._unrank(tid)
        self._key.pop(tid, None)
        self.lengths.finished(group_id, generated_tokens)

    def _unrank(self, tid: str) -> None:
        old = self._key.get(tid)
        if old is not None:
            i = bisect.bisect_left(self._active, (-old, tid))
            if i < len(self._active) and self._active[i] == (-old, tid):
                self._active.pop(i)

    def longest_first(self) -> tuple[list[float], list[float]]:
        """The active trajectories' predicted remaining tokens, longest first, and their
        mean KV while they run: the DP's input."""
        pairs = sorted(((self.remaining[t], self._context[t]) for _, t in self._active),
                       key=lambda p: -p[0])  # fmt: skip
        return [r for r, _ in pairs], [c for _, c in pairs]


@dataclass
class BatchLengths:
    """No history (a campaign's first iteration): the forecast learns from the batch as
    it runs. A trajectory is expected to make as many tokens again as it has made (in a
    heavy tail, remaining work grows with attained work), or, once a sibling of its
    group has finished, what the siblings made on average, while it is short of that.
    Forecasting from the batch's finished trajectories instead (the mean of those that
    ran past it) ranked worse: those are the short ones (docs/notes/issue-30-robustness.md)."""

    exact: bool = False
    siblings: dict[str, list[int]] = field(default_factory=dict)

    def predict(self, event: TrajectoryView) -> float:
        made = event.generated_tokens
        done = self.siblings.get(event.group_id)
        if done:
            return float(max(1.0, sum(done) / len(done) - made, made / 4))
        return float(max(1, made))

    def rank_remaining(self, event: TrajectoryView, expected: float) -> float:
        return expected

    def finished(self, group_id: str, generated_tokens: int) -> None:
        self.siblings.setdefault(group_id, []).append(generated_tokens)
