"""Heddle's placement and order: progressive priority (the longest predicted remaining
runs first, preemptively) and the rank-to-instance placement with opportunistic
migration (Heddle paper, Alg. 1), with the reviews and drain moves beyond it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from heddle.types import Decision, TrajectoryView
from scheduler.heddle.bookings import Bookings
from scheduler.heddle.forecast import Forecast
from scheduler.heddle.plan import BatchPlan
from scheduler.heddle.reshaping import Reshaping
from scheduler.heddle.speeds import InstanceSpeeds, draining
from scheduler.interface import InstanceState
from scheduler.placement import NoHooks, least_loaded

# Below this many predicted remaining tokens a move does not pay for itself.
MIN_MIGRATE_TOKENS = 512
# A target holding this many more steps than its share is busy: skip the move.
BUSY_SLACK = 8


@dataclass
class LongestPredictedFirst:
    """Progressive priority: the longest predicted trajectory runs first, preemptively
    (the paper's adaptive longest-processing-time-first), keyed on the predicted
    remaining while the engines' KV cache holds what they run, and on the predicted
    total once a trajectory finds its context evicted.

    The remaining is the critical path's key: of two trajectories, the one with more
    left holds the batch up. But every step a trajectory makes lowers its key below
    the next longest, so the engine rotates among the long ones; where their contexts
    together outgrow the KV cache, each returns from its tool call to re-prefill an
    evicted context (robustness draw 1001 at 3,200 trajectories: 43M prefill tokens
    where the trace holds 10.4M; draw 1013 at 6,400: 2.16x the trace's, 299 s against
    271 s). Keyed on the total (the DP's rank key), progress alone does not move a
    trajectory, and the same ones keep their seats. Evictions are what the rotation
    costs, so the first one seen switches the key for the rest of the batch (the
    paper setting's 14B coding seed 0 ran 618 s on the total alone, 608 s so; docs/
    policies.md). A wrong signal errs toward the total, the key that holds across
    random draws."""

    forecast: Forecast
    queue: str = "priority"
    by_remaining: bool = False  # the remaining key always, a measure (benchmarks/variant_ab.py)
    reserve_kv: bool = True  # reserve each trajectory's forecast KV (`Reserving`)
    reserve_life_mean: bool = False  # its mean over its whole life, not what is left
    adapts: bool = True  # the remaining until an eviction is seen (else the total always)
    evicted_seen: bool = False  # a trajectory found its context evicted

    def priority(self, event: TrajectoryView, now: float) -> int:
        tid = event.trajectory_id
        self.evicted_seen = self.evicted_seen or event.context_evicted
        if self.by_remaining or (self.adapts and not self.evicted_seen):
            return -int(self.forecast.remaining.get(tid, 0.0))
        return -int(self.forecast.total(tid))

    def reserve_kv_tokens(self, event: TrajectoryView) -> int:
        """The engines hold a trajectory from its first step to its last and admit a
        new one only while the KV forecast for those they hold fits their cache: an
        instance keeps the contexts it started rather than starting more than it can
        hold and re-prefilling the ones back from their tool calls. What is reserved is
        a trajectory's mean KV over what is left of it (its context now plus half of
        what is to come, the DP's measure): those an instance holds are at every stage
        of their lives, and reserving each one's final context held the batch below
        what fits (robustness draw 1009: 401 s against 379 s; draw 1006: 1142 s against
        1037 s; docs/notes/issue-30-robustness.md). The mean over a whole life, what a
        population at every stage sums to, is too little where the longest grow
        together (`reserve_life_mean`, a measure: draw 1000, heddle-oracle 1315 s
        against 1637 s, the cold start 1802 s against 2494 s)."""
        if not self.reserve_kv:
            return 0
        if self.reserve_life_mean:
            final = event.context_tokens + self.forecast.growth_left(event.trajectory_id)
            return round((event.prompt_tokens + final) / 2)
        return max(event.context_tokens, round(self.forecast.mean_context(event.trajectory_id)))

    def predicted_remaining(self, trajectory_id: str) -> float | None:
        return self.forecast.remaining.get(trajectory_id)


@dataclass
class HeddlePlacement(NoHooks):
    """Where each step runs: its rank names an instance (the DP's groups), the booked
    work picks among instances of one width, and a trajectory moves during its tool call
    (or mid-decode, at a review) when its rank names another. What it books the planner
    forgets when a trajectory ends (`HeddlePlanner.on_trajectory_done`)."""

    forecast: Forecast
    bookings: Bookings
    plan: BatchPlan
    reshaping: Reshaping
    use_dp: bool = True
    migrate: bool = True

    @property
    def emptying(self) -> tuple[str, ...]:
        """The block being emptied to merge (`Reshaping._start_vacating`)."""
        return self.reshaping.vacating

    def place(
        self, event: TrajectoryView, instances: Sequence[InstanceState], now: float
    ) -> Decision:
        self.reshaping.decoding.pop(event.trajectory_id, None)
        remaining = self.forecast.update(event)
        decision = self._decide(event, instances, remaining)
        self._book(event.trajectory_id, decision.instance_id)
        return decision

    def _book(self, tid: str, instance_id: str) -> None:
        self.bookings.book(tid, instance_id, self.forecast.remaining.get(tid, 0.0))

    def _work_on(self, instance_id: str, excluding: str) -> float:
        remaining = self.forecast.remaining.get(excluding, 0.0)
        return self.bookings.work_on(instance_id, excluding, remaining)

    def _target(self, tid: str) -> tuple[str, float]:
        return self.plan.target(self.forecast.rank(tid), len(self.forecast))

    def _least_work_of_width(
        self,
        target: str,
        instances: Sequence[InstanceState],
        event: TrajectoryView,
        remaining: float,
    ) -> str:
        """Instances of one width are interchangeable: the rank names the width, the
        predicted work already booked picks the instance (pull-style balance, as per-step
        least-loaded gets). The trajectory stays where it is (its KV is there) unless
        moving evens out the work."""
        tid, prev = event.trajectory_id, event.previous_instance
        pinned, vacating = self.plan.pinned, self.reshaping.vacating
        if target in pinned:
            return target
        by_id = {s.instance_id: s for s in instances}
        width = by_id[target].tp
        closed = pinned | set(vacating)
        taking = [s.instance_id for s in instances
                  if s.tp == width and s.instance_id not in closed]  # fmt: skip
        best = min(taking, key=lambda i: (self._work_on(i, tid), i != prev))
        if (
            prev in by_id
            and prev not in vacating
            and prev not in pinned
            and by_id[prev].tp == width
            and self._work_on(prev, tid) <= self._work_on(best, tid) + remaining
        ):
            return prev
        return best

    def _decide(
        self, event: TrajectoryView, instances: Sequence[InstanceState], remaining: float
    ) -> Decision:
        plan, vacating = self.plan, self.reshaping.vacating
        prev = event.previous_instance
        if not self.use_dp:
            best = least_loaded(instances, prev)
            return Decision(best.instance_id, reason="least_loaded")
        target, share = self._target(event.trajectory_id)
        by_id = {s.instance_id: s for s in instances}
        if target in by_id:
            target = self._least_work_of_width(target, instances, event, remaining)
        if prev is None:
            return Decision(target, reason="dp_rank")
        if prev in vacating:
            return Decision(target, reason="vacating", migrate=True)
        if target == prev:
            return Decision(prev, reason="rank_kept")
        if not self.migrate or remaining < MIN_MIGRATE_TOKENS:
            return Decision(prev, reason="stay")
        src, dst = by_id.get(prev), by_id.get(target)
        if src is not None and dst is not None and dst.tp < src.tp and draining(instances):
            # GPUs are spare, and narrowing would undo what `_drain_moves` bought.
            return Decision(prev, reason="draining_keeps_width")
        leaving_pin = prev in plan.pinned and target not in plan.pinned
        if (
            src is not None
            and dst is not None
            and src.tp == dst.tp
            and src.num_in_flight <= dst.num_in_flight + BUSY_SLACK
            and not leaving_pin
        ):
            # Same width and not overloaded: a move would buy little balance for its cost.
            return Decision(prev, reason="same_width")
        if dst is not None and dst.num_in_flight > share + BUSY_SLACK:
            return Decision(prev, reason="target_busy")
        return Decision(target, reason="left_pinned" if leaving_pin else "rank_moved", migrate=True)

    def review(
        self, events: Sequence[TrajectoryView], instances: Sequence[InstanceState], now: float
    ) -> dict[str, Decision]:
        """Beyond the paper: a decode that outlives its prediction climbs the ranking
        (its predicted total is at least what it has made); when its rank names a wider
        instance it moves there mid-step rather than wait for a tool call it may never
        make (a final answer has none)."""
        if not (self.use_dp and self.migrate):
            return {}
        forecast, pinned = self.forecast, self.plan.pinned
        by_id = {s.instance_id: s for s in instances}
        moves = {}
        # Every decode re-predicted first, then moved longest first (the paper's order):
        # a move books its work where it lands, which the next choice of instance reads.
        remaining_of = {e.trajectory_id: forecast.update(e) for e in events}
        for event in sorted(events, key=lambda e: forecast.rank(e.trajectory_id)):
            tid = event.trajectory_id
            remaining = remaining_of[tid]
            target, share = self._target(tid)
            if event.previous_instance in self.reshaping.vacating:
                if target in by_id:
                    target = self._least_work_of_width(target, instances, event, remaining)
                moves[tid] = Decision(target, reason="vacating", migrate=True)
                self._book(tid, target)
                continue
            if remaining < MIN_MIGRATE_TOKENS:
                continue
            src = by_id.get(event.previous_instance or "")
            dst = by_id.get(target)
            if src is None or dst is None:
                continue
            leaving_pin = src.instance_id in pinned and target not in pinned
            if leaving_pin and dst.tp == src.tp:  # its rank left the pinned tier: make room
                target = self._least_work_of_width(target, instances, event, remaining)
                moves[tid] = Decision(target, reason="left_pinned", migrate=True)
                self._book(tid, target)
                continue
            # Stopping a decode pays for a wider instance, or, at the same width, for a
            # pinned one its rank entered: the mirror of leaving one (32B search seed 2:
            # a 12,709-token first turn ranked just below the pins decoded for 176 s on
            # a full open TP-8 beside idle pinned ones).
            entering_pin = target in pinned and src.instance_id not in pinned
            if dst.tp < src.tp or (dst.tp == src.tp and not entering_pin):
                continue
            if dst.num_in_flight > share + BUSY_SLACK:
                continue
            reason = "outgrew_instance" if dst.tp > src.tp else "entered_pinned"
            moves[tid] = Decision(target, reason=reason, migrate=True)
            self._book(tid, target)
        moves |= self._drain_moves(events, instances, moves)
        # What the reshaping's merges for long decodes weigh (`Reshaping.decoding`).
        self.reshaping.decoding = {
            e.trajectory_id: (moves[tid].instance_id if (tid := e.trajectory_id) in moves
                              else e.previous_instance or "", e.context_tokens)
            for e in events
        }  # fmt: skip
        return moves

    def _drain_moves(
        self,
        events: Sequence[TrajectoryView],
        instances: Sequence[InstanceState],
        decided: dict[str, Decision],
    ) -> dict[str, Decision]:
        """Beyond the paper: once an instance is idle the batch is draining and GPUs are
        spare, so a decode's own speed is what counts. Longest predicted first, each
        moves to the instance where it would run fastest (its batch and KV as the
        engines last reported them, plus it) if that is `DRAIN_WIDER_GAIN` times faster
        on a wider instance or `DRAIN_SAME_GAIN` on one as wide. The rank-to-instance
        map cannot do this: in the tail its predictions are all alike, and it left a
        TP-8 instance with five decodes beside two idle ones."""
        if not draining(instances):
            return {}
        forecast, vacating = self.forecast, self.reshaping.vacating
        speeds = InstanceSpeeds.of(instances, self.reshaping.shapes.models)
        moves = {}
        for event in sorted(
            (e for e in events if e.trajectory_id not in decided),
            key=lambda e: forecast.rank(e.trajectory_id),
        ):
            tid, src = event.trajectory_id, event.previous_instance or ""
            if forecast.remaining.get(tid, 0.0) < MIN_MIGRATE_TOKENS:
                continue
            context = event.context_tokens
            options = {iid: there for iid in speeds.width if iid not in vacating
                       and (there := speeds.faster(src, iid, context)) is not None}  # fmt: skip
            if not options:
                continue
            best = min(options, key=options.__getitem__)
            moves[tid] = Decision(best, reason="drain_faster", migrate=True)
            self._book(tid, best)
            speeds.move(src, best, context)
        return moves
