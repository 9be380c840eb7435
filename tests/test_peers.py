"""Each peer's distinguishing rule fires as its source says (docs/policies.md): verl*'s
skew switch, WAR's load threshold and cache / load score, sticky-least-loaded's
fewest-sessions rule. Pure placements on hand-made instance states."""

from __future__ import annotations

from heddle.types import StepSpec, TrajectorySpec, TrajectoryView
from scheduler.interface import InstanceState
from scheduler.placement import SkewSwitch, StickyLeastSessions, StickySessions
from scheduler.war import FewestTurnsLeft, TurnsLeft, WarPlacement


def view(tid: str = "t0", group: str = "g0", on: str | None = None) -> TrajectoryView:
    spec = TrajectorySpec(tid, group, 100, (StepSpec(10, "python", 0.1), StepSpec(10)), "coding")
    return TrajectoryView.first(spec).on(on)


def states(*loads: int, sessions: tuple[int, ...] = ()) -> list[InstanceState]:
    return [
        InstanceState(f"i{k}", num_in_flight=n, num_sessions=sessions[k] if sessions else 0)
        for k, n in enumerate(loads)
    ]


def test_verl_star_leaves_a_sticky_session_only_when_the_skew_passes_its_threshold() -> None:
    verl, star = StickySessions(), SkewSwitch()
    for p in (verl, star):  # both put the session on i0 (least loaded then)
        assert p.place(view(), states(0, 5), 0).instance_id == "i0"
    # Skew 32 (not above the threshold): both stay sticky on the busier i0.
    assert verl.place(view(on="i0"), states(40, 8), 1).instance_id == "i0"
    at = star.place(view(on="i0"), states(40, 8), 1)
    assert (at.instance_id, at.reason) == ("i0", "sticky")
    # Skew 33: verl* moves the session to the least loaded; verl does not.
    assert verl.place(view(on="i0"), states(41, 8), 2).instance_id == "i0"
    moved = star.place(view(on="i0"), states(41, 8), 2)
    assert (moved.instance_id, moved.reason) == ("i1", "skew_least_loaded")
    # ... and the session stays there once the skew is gone.
    assert star.place(view(on="i1"), states(10, 10), 3).instance_id == "i1"


def test_war_is_sticky_below_its_load_threshold_and_scores_above_it() -> None:
    war = WarPlacement(seats_per_instance=100)
    assert war.place(view(), states(0, 1), 0).instance_id == "i0"
    # Load 0.45 of the seats, below 0.5: sticky however uneven.
    below = war.place(view(on="i0"), states(80, 10), 1)
    assert (below.instance_id, below.reason) == ("i0", "sticky")
    # Load 0.55: the score weighs the cached context (1.0) against in-flight share (2.0
    # per 100%): 60 vs 50 in flight keeps the cache (1 - 1.2 > -1.0) ...
    keep = war.place(view(on="i0"), states(60, 50), 2)
    assert (keep.instance_id, keep.reason) == ("i0", "score")
    # ... 80 vs 30 does not (1 - 1.6 < -0.6): the step goes where the load is lower.
    move = war.place(view(on="i0"), states(80, 30), 3)
    assert (move.instance_id, move.reason) == ("i1", "score")


def test_war_orders_by_the_turns_its_siblings_took() -> None:
    turns = TurnsLeft()
    order = FewestTurnsLeft(turns)
    before = order.priority(view(group="g1"), 0)
    assert before == 40  # the prior: 4 turns
    turns.observe("g1", 10)  # a sibling that took 10 turns: more are left
    after = order.priority(view(group="g1"), 0)
    assert after == int(10 * (0.7 * 4 + 0.3 * 10))
    assert after > before
    # A group with no finished sibling gets the global EMA; one whose siblings were
    # short runs before g1's.
    assert order.priority(view(group="g2"), 0) == int(10 * turns.global_ema)
    turns.observe("g3", 1)
    assert order.priority(view(group="g3"), 0) < order.priority(view(group="g1"), 0)


def test_sticky_least_loaded_places_a_new_session_by_sessions_not_steps() -> None:
    sticky, verl = StickyLeastSessions(), StickySessions()
    # i0 has fewer steps in flight but more sessions: the two rules disagree.
    instances = states(2, 6, sessions=(5, 1))
    assert verl.place(view("new"), instances, 0).instance_id == "i0"
    first = sticky.place(view("new"), instances, 0)
    assert (first.instance_id, first.reason) == ("i1", "fewest_sessions")
    # Equal sessions: fewer steps in flight breaks the tie.
    assert sticky.place(view("other"), states(7, 3, sessions=(2, 2)), 0).instance_id == "i1"
    # Then the session stays, even where another instance has fewer sessions now.
    again = sticky.place(view("new", on="i1"), states(0, 9, sessions=(0, 9)), 1)
    assert (again.instance_id, again.reason) == ("i1", "sticky")
