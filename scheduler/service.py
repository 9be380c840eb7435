"""The live scheduler service: soft state around the pure policies.

It keeps how many decided steps each instance has in flight and where each trajectory
last ran, asks the policy, and forgets everything on restart without harm: a lost count
only skews a few decisions.

Besides the engine's own request priority, a decision carries a Temporal task-queue
priority (`priority_key`, 1 first to 5 last): the step's place among the last
`PRIORITY_WINDOW` decisions' priorities, in `PRIORITY_BUCKETS` equal-count buckets, so a
backlogged engine queue hands out the most urgent steps first whatever the policy's scale.
"""

from __future__ import annotations

import bisect
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from dataclasses import replace

from heddle.types import DecideRequest, Decision, StepReport, TrajectoryDone
from scheduler.interface import InstanceState, Policy, PolicyContext, StepEvent
from scheduler.registry import create_policy

PRIORITY_BUCKETS = 5
PRIORITY_WINDOW = 1024


def step_event(request: DecideRequest, previous_instance: str | None) -> StepEvent:
    """The policy core's view of a live decide request (the simulator builds the same)."""
    return StepEvent(
        trajectory_id=request.trajectory_id,
        group_id=request.group_id,
        step_index=request.step_index,
        context_tokens=request.context_tokens,
        generated_tokens=request.generated_tokens,
        previous_instance=previous_instance,
        prompt_tokens=request.prompt_tokens,
        num_tool_calls=request.num_tool_calls,
        last_tool=request.last_tool,
        last_tool_status=request.last_tool_status,
        last_tool_output_tokens=request.last_tool_output_tokens,
        tool_path=tuple(request.tool_path),
        recent_output_tokens=tuple(request.recent_output_tokens),
    )


class PriorityBuckets:
    """Equal-count buckets over a sliding window of recent priorities (lower first)."""

    def __init__(self, buckets: int = PRIORITY_BUCKETS, window: int = PRIORITY_WINDOW) -> None:
        self.buckets = buckets
        self._recent: deque[int] = deque(maxlen=window)
        self._sorted: list[int] = []

    def key(self, priority: int) -> int:
        if len(self._recent) == self._recent.maxlen:
            old = self._recent[0]
            del self._sorted[bisect.bisect_left(self._sorted, old)]
        self._recent.append(priority)
        bisect.insort(self._sorted, priority)
        if len(self._sorted) == 1 or self._sorted[0] == self._sorted[-1]:
            return (self.buckets + 1) // 2  # nothing to rank against: the middle
        below = bisect.bisect_left(self._sorted, priority)
        return 1 + min(self.buckets - 1, below * self.buckets // len(self._sorted))


class SchedulerService:
    def __init__(
        self,
        *,
        instance_ids: Sequence[str] = (),
        context: PolicyContext | None = None,
        tps: Mapping[str, int] | None = None,
    ) -> None:
        self.context = context or PolicyContext()
        self.instance_ids: list[str] = []
        self.tps: dict[str, int] = {}
        self.in_flight: dict[str, int] = {}
        self._last_instance: dict[str, str] = {}
        self._policies: dict[str, Policy] = {}
        self._buckets: dict[str, PriorityBuckets] = {}
        tps = tps or {}
        self.set_instances({i: tps.get(i, self.context.default_tp) for i in instance_ids})

    def set_instances(self, tps: Mapping[str, int]) -> None:
        """The instances that take steps now (the cluster plan's active ones). Counts of
        steps still running on an instance that left are kept until they report."""
        self.instance_ids = list(tps)
        self.tps = dict(tps)
        for iid in self.instance_ids:
            self.in_flight.setdefault(iid, 0)

    def _policy(self, name: str) -> Policy:
        if name not in self._policies:
            self._policies[name] = create_policy(name, self.context)
            self._buckets[name] = PriorityBuckets()
        return self._policies[name]

    def decide(self, request: DecideRequest, now: float) -> Decision:
        if not self.instance_ids:
            # The decide activity is retried: steps wait for the plan, not fail.
            raise RuntimeError("no engine instance takes steps yet")
        previous = self._last_instance.get(request.trajectory_id)
        if previous not in self.tps:
            previous = None  # its instance was retired: its KV went with it
        event = step_event(request, previous)
        sessions = Counter(self._last_instance.values())
        states = [
            InstanceState(
                i,
                num_in_flight=self.in_flight[i],
                num_sessions=sessions[i],
                tp=self.tps.get(i, self.context.default_tp),
            )
            for i in self.instance_ids
        ]
        decision = self._policy(request.policy).decide(event, states, now)
        decision = replace(
            decision, priority_key=self._buckets[request.policy].key(decision.priority)
        )
        self.in_flight[decision.instance_id] += 1
        self._last_instance[request.trajectory_id] = decision.instance_id
        return decision

    def report(self, report: StepReport) -> None:
        if self.in_flight.get(report.instance_id, 0) > 0:
            self.in_flight[report.instance_id] -= 1

    def finished(self, done: TrajectoryDone) -> None:
        self._last_instance.pop(done.trajectory_id, None)
        self._policy(done.policy).on_trajectory_done(
            done.trajectory_id, done.group_id, done.generated_tokens, done.turns
        )
