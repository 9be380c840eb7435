"""The live scheduler service: soft state around the pure policies.

It keeps how many decided steps each instance has in flight, asks the policy, and
forgets everything on restart without harm: a lost count only skews one decision.
"""

from __future__ import annotations

from collections.abc import Sequence

from heddle.types import DecideRequest, Decision, StepReport
from scheduler.interface import InstanceState, PlacementPolicy, StepEvent
from scheduler.registry import create_policy


class SchedulerService:
    def __init__(self, *, instance_ids: Sequence[str]) -> None:
        if not instance_ids:
            raise ValueError("the scheduler needs at least one engine instance")
        self.instance_ids = list(instance_ids)
        self.in_flight: dict[str, int] = dict.fromkeys(self.instance_ids, 0)
        self._last_instance: dict[str, str] = {}
        self._policies: dict[str, PlacementPolicy] = {}

    def _policy(self, name: str) -> PlacementPolicy:
        if name not in self._policies:
            self._policies[name] = create_policy(name)
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
        states = [InstanceState(i, self.in_flight[i]) for i in self.instance_ids]
        decision = self._policy(request.policy).decide(event, states, now)
        self.in_flight[decision.instance_id] += 1
        self._last_instance[request.trajectory_id] = decision.instance_id
        return decision

    def report(self, report: StepReport) -> None:
        if self.in_flight.get(report.instance_id, 0) > 0:
            self.in_flight[report.instance_id] -= 1

    def finished(self, trajectory_id: str) -> None:
        self._last_instance.pop(trajectory_id, None)
