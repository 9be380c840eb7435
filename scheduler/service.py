"""The live scheduler service: soft state around the pure policies.

It keeps how many decided steps each instance has in flight and where each trajectory
last ran, asks the policy, and forgets everything on restart without harm: a lost count
only skews a few decisions.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from heddle.types import DecideRequest, Decision, StepReport, TrajectoryDone
from scheduler.interface import InstanceState, Policy, PolicyContext, StepEvent
from scheduler.registry import create_policy


class SchedulerService:
    def __init__(
        self, *, instance_ids: Sequence[str], context: PolicyContext | None = None
    ) -> None:
        if not instance_ids:
            raise ValueError("the scheduler needs at least one engine instance")
        self.instance_ids = list(instance_ids)
        self.context = context or PolicyContext()
        self.in_flight: dict[str, int] = dict.fromkeys(self.instance_ids, 0)
        self._last_instance: dict[str, str] = {}
        self._policies: dict[str, Policy] = {}

    def _policy(self, name: str) -> Policy:
        if name not in self._policies:
            self._policies[name] = create_policy(name, self.context)
        return self._policies[name]

    def decide(self, request: DecideRequest, now: float) -> Decision:
        event = StepEvent(
            trajectory_id=request.trajectory_id,
            group_id=request.group_id,
            step_index=request.step_index,
            context_tokens=request.context_tokens,
            generated_tokens=request.generated_tokens,
            previous_instance=self._last_instance.get(request.trajectory_id),
        )
        sessions = Counter(self._last_instance.values())
        states = [
            InstanceState(i, num_in_flight=self.in_flight[i], num_sessions=sessions[i])
            for i in self.instance_ids
        ]
        decision = self._policy(request.policy).decide(event, states, now)
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
