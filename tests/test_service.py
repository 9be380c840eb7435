"""The live scheduler service around the pure policies: the soft state it keeps and the
moves it hands the trajectory workflow."""

from __future__ import annotations

import pytest

from heddle.types import DecideRequest, StepReport, TrajectoryView
from scheduler import registry
from scheduler.baselines import LeastLoaded
from scheduler.interface import Policy
from scheduler.order import FirstComeFirstServed
from scheduler.service import SchedulerService
from scheduler.split import Homogeneous


def _request(step_index: int, policy: str = "least_loaded") -> DecideRequest:
    view = TrajectoryView("t0", "g0", step_index, 100 + 50 * step_index, 40 * step_index)
    return DecideRequest(view, policy=policy)


class _MoveEachStep(LeastLoaded):
    """Each step on the other of i0/i1, its KV moved."""

    migrate = True

    def place(self, event, instances, now):  # type: ignore[no-untyped-def]
        from heddle.types import Decision

        target = f"i{event.step_index % 2}"
        return Decision(target, reason="test", migrate=event.previous_instance is not None)


def test_a_restarted_service_counts_the_steps_its_engines_still_hold() -> None:
    service = SchedulerService(instance_ids=["i0", "i1"])
    assert service.in_flight == {"i0": 0, "i1": 0}
    service.observe_loads({"i0": 3, "i1": 0, "gone": 2})
    assert service.in_flight == {"i0": 3, "i1": 0}
    service.report(StepReport("t0", "i0", 0, 10))
    assert service.in_flight["i0"] == 2
    service.observe_loads({"i0": 1}, {"i0": 0.25})  # never lowered: decided steps may not
    assert service.in_flight["i0"] == 2  # have arrived yet
    assert service.kv_usage == {"i0": 0.25}


def test_anticipate_is_for_policies_that_move_trajectories() -> None:
    service = SchedulerService(instance_ids=["i0", "i1"])
    decision = service.decide(_request(0), 0.0)
    assert not decision.anticipate
    assert service.anticipate(_request(1), 0.0) is None


def test_an_anticipated_move_is_where_the_next_step_finds_the_trajectory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(
        registry.POLICIES,
        "test-move",
        lambda ctx: Policy("test-move", FirstComeFirstServed(), _MoveEachStep(), Homogeneous(1)),
    )
    service = SchedulerService(instance_ids=["i0", "i1"])
    first = service.decide(_request(0, "test-move"), 0.0)
    assert (first.instance_id, first.anticipate, first.migrate) == ("i0", True, False)
    service.report(StepReport("t0", "i0", 0, 40))
    move = service.anticipate(_request(1, "test-move"), 1.0)
    assert move is not None
    assert (move.instance_id, move.migrate) == ("i1", True)
    assert service.in_flight == {"i0": 0, "i1": 0}  # a move starts no step
    # The next step is decided with the trajectory already on i1: nothing more to move.
    second = service.decide(_request(1, "test-move"), 2.0)
    assert second.instance_id == "i1"
    assert not second.migrate
    assert service.anticipate(_request(1, "test-move"), 2.0) is None  # already there


def test_a_step_decided_again_is_counted_once() -> None:
    """A decide made again for the same step (its workflow task retried after the first
    result was lost, or its engine gone) replaces the first: the counts a drain waits on
    come back to zero once the step reports."""
    service = SchedulerService(instance_ids=["i0", "i1"])
    first = service.decide(_request(0), 0.0)
    again = service.decide(_request(0), 0.1)
    assert sum(service.in_flight.values()) == 1
    service.report(StepReport("t0", again.instance_id, 0, 10))
    assert service.in_flight == {"i0": 0, "i1": 0}
    # A report of a superseded step (on the instance of the first decide) takes nothing.
    service.decide(_request(1), 1.0)
    service._start("t0", "i1")  # moved on mid-step, as a review does
    service.report(StepReport("t0", first.instance_id, 1, 5))
    assert service.in_flight == {"i0": 0, "i1": 1}
    service.report(StepReport("t0", "i1", 1, 5))
    assert service.in_flight == {"i0": 0, "i1": 0}


def test_a_step_named_for_an_instance_no_longer_offered_goes_to_one_that_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A planning policy may name an instance of its plan that takes no steps now (it
    serves prefill, or its engine died): the step goes to an offered one as wide."""
    monkeypatch.setitem(
        registry.POLICIES,
        "test-move",
        lambda ctx: Policy("test-move", FirstComeFirstServed(), _MoveEachStep(), Homogeneous(1)),
    )
    service = SchedulerService(instance_ids=["i0", "i1", "i2"])
    service.set_instances({"i1": 1, "i2": 1})  # i0 taken for prefill
    service.observe_loads({"i1": 2})
    decision = service.decide(_request(0, "test-move"), 0.0)  # the policy names i0
    assert decision.instance_id == "i2"  # the least busy of those offered
    assert service.in_flight == {"i0": 0, "i1": 2, "i2": 1}
    assert service.tool_users() == 0  # its step runs
    service.report(StepReport("t0", "i2", 0, 40))
    assert service.tool_users() == 1  # between steps
    assert service.load_by_instance() == {"i0": 0, "i1": 2, "i2": 1}
