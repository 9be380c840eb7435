"""Changes during rollout: instances merged for the tail, and decodes moved mid-step."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import pytest

from engines.costmodel import CostModel
from heddle.hardware import ClusterShape
from heddle.sim.simulator import Simulator
from heddle.types import Decision, StepSpec, TrajectorySpec, TrajectoryView
from scheduler.heddle import HeddlePlanner, HeddleVariant
from scheduler.interface import (
    InstanceSpec,
    InstanceState,
    Policy,
    PolicyContext,
    Reshape,
)
from scheduler.order import FirstComeFirstServed
from scheduler.placement import LeastLoaded, least_loaded
from scheduler.reshape import GpuLayout, merges_that_pay
from scheduler.resources import SplitPlanner

CLUSTER = ClusterShape(model="qwen3-8b", gpu="h100", num_gpus=4)


def _spec(tid: str, *outputs: int, tool_s: float = 0.5) -> TrajectorySpec:
    steps = [StepSpec(n, "python", tool_s, "ok", 20) for n in outputs[:-1]]
    return TrajectorySpec(tid, "g", 100, (*steps, StepSpec(outputs[-1])))


def test_layout_blocks_only_aligned_fully_blocks_within() -> None:
    layout = GpuLayout.pack(["a", "b", "c", "d", "e"], [4, 1, 1, 1, 1])
    assert layout.first_gpu == {"a": 0, "b": 4, "c": 5, "d": 6, "e": 7}
    # c and d are both idle but not one aligned block (GPUs 5-6 straddle two TP-2 blocks).
    assert layout.blocks_within({"c", "d"}, {1, 2, 4, 8}) == []
    # All four idle TP-1s fill GPUs 4-7: one TP-4 first, then the TP-2s inside it.
    assert layout.blocks_within({"b", "c", "d", "e"}, {1, 2, 4, 8}) == [
        (("b", "c", "d", "e"), 4),
        (("b", "c"), 2),
        (("d", "e"), 2),
    ]
    # With the TP-4 idle too, the whole node: an 8-GPU block of mixed widths.
    assert layout.blocks_within({"a", "b", "c", "d", "e"}, {1, 8})[0] == (
        ("a", "b", "c", "d", "e"),
        8,
    )
    assert layout.blocks_within({"b", "c"}, {1, 4}) == []  # TP-2 not allowed, TP-4 not idle
    layout.merge(("b", "c"), "f")
    layout.merge(("d", "e"), "g")
    assert layout.tp == {"a": 4, "f": 2, "g": 2}
    assert layout.blocks_within({"f", "g"}, {1, 2, 4, 8}) == [(("f", "g"), 4)]
    assert layout.blocks_within({"a", "f"}, {1, 2, 4, 8}) == []  # g, in a's block, is busy


def test_a_merge_pays_for_a_long_tail_and_not_for_a_short_one() -> None:
    planner = SplitPlanner(
        ClusterShape(model="qwen3-8b", gpu="h100", num_gpus=8, tp_choices=(1, 2, 4, 8))
    )
    models = planner.models()
    restart = {tp: 25.0 for tp in models}
    narrow = [1] * 8
    pairs = [(0, 1), (2, 3), (4, 5), (6, 7)]
    # One 30K-token tail on TP-1: a TP-2 halves most of its per-token time.
    assert merges_that_pay([30_000.0], [15_000.0], narrow, pairs, models, restart) == [0]
    # A 500-token remainder finishes before any restart would.
    assert merges_that_pay([500.0], [300.0], narrow, pairs, models, restart) == []


@dataclass
class _MergeWhenIdle:
    """Test split: two TP-1 instances and a TP-2; merges the TP-1 pair once both idle."""

    done: bool = False
    ready: list[str] | None = None
    busy_retire: bool = False

    def instances(self, num_gpus: int) -> list[InstanceSpec]:
        return [InstanceSpec("a", 1), InstanceSpec("b", 1), InstanceSpec("c", 2)]

    def reshape(self, instances: Sequence[InstanceState], now: float) -> list[Reshape]:
        by_id = {s.instance_id: s for s in instances}
        if self.done or "a" not in by_id:
            return []
        idle = all(by_id[i].num_in_flight == 0 and by_id[i].num_sessions == 0 for i in "ab")
        if idle or self.busy_retire:
            self.done = True
            return [Reshape(("a", "b"), InstanceSpec("m", 2), 10.0, "test")]
        return []

    def on_instance_ready(self, spec: InstanceSpec) -> None:
        self.ready = [*(self.ready or []), spec.instance_id]


class _PreferNew(LeastLoaded):
    def place(
        self, event: TrajectoryView, instances: Sequence[InstanceState], now: float
    ) -> Decision:
        if any(s.instance_id == "m" for s in instances):
            return Decision("m", reason="new")
        if event.trajectory_id == "long":
            return Decision("c", reason="long")
        narrow = [s for s in instances if s.instance_id in ("a", "b")]
        return Decision(least_loaded(narrow).instance_id, reason="least_loaded")


def test_the_simulator_retires_idle_instances_and_starts_the_merged_one() -> None:
    trace = [_spec("long", 50, 50, 50, 50, 50, 50, tool_s=5.0)]
    trace += [_spec(f"s{i}", 20) for i in range(6)]
    split = _MergeWhenIdle()
    policy = Policy("merge", FirstComeFirstServed(), _PreferNew(), split)
    sim = Simulator(trace=trace, policy=policy, record_steps=True, cluster=CLUSTER)
    result = sim.run()
    assert result.reconfigurations == 1
    assert result.reconfiguration_s == 10.0
    assert split.ready == ["m"]
    assert result.generated_tokens == sum(s.generated_tokens for s in trace)
    assert sim.step_log is not None
    used = {row[6] for row in sim.step_log}
    assert "m" in used  # the merged instance took steps once its restart was over
    first_on_m = min(row[4] for row in sim.step_log if row[6] == "m")
    retired_at = max(row[5] for row in sim.step_log if row[6] in ("a", "b"))
    assert first_on_m >= retired_at + 10.0 - 1e-9
    assert {i["instance_id"] for i in result.instances} == {"a", "b", "c", "m"}


def test_the_simulator_refuses_to_retire_a_busy_instance() -> None:
    trace = [_spec(f"s{i}", 2000) for i in range(4)]
    policy = Policy("bad", FirstComeFirstServed(), LeastLoaded(), _MergeWhenIdle(busy_retire=True))
    with pytest.raises(ValueError, match="not an idle instance"):
        Simulator(trace=trace, policy=policy, cluster=CLUSTER).run()


class _MoveLongDecodes(LeastLoaded):
    """Test reviewer: any step shown to it moves to the TP-2 instance."""

    def __init__(self) -> None:
        self.shown: list[TrajectoryView] = []

    def place(
        self, event: TrajectoryView, instances: Sequence[InstanceState], now: float
    ) -> Decision:
        return Decision("a" if event.trajectory_id == "long" else "b", reason="fixed")

    def review(
        self, events: Sequence[TrajectoryView], instances: Sequence[InstanceState], now: float
    ) -> dict[str, Decision]:
        self.shown += events
        return {e.trajectory_id: Decision("c", reason="wider") for e in events
                if e.previous_instance == "a"}  # fmt: skip


class _Fixed:
    def instances(self, num_gpus: int) -> list[InstanceSpec]:
        return [InstanceSpec("a", 1), InstanceSpec("b", 1), InstanceSpec("c", 2)]


def test_a_long_decode_moves_mid_step_and_resumes_from_its_tokens() -> None:
    trace = [_spec("long", 20_000), _spec("short", 100)]
    fixed = Policy("fixed", FirstComeFirstServed(), LeastLoaded(), _Fixed())
    reviewer = _MoveLongDecodes()
    moving = Policy("moving", FirstComeFirstServed(), reviewer, _Fixed())
    stay = Simulator(
        trace=trace,
        policy=Policy("stay", FirstComeFirstServed(), _NoReview(), _Fixed()),
        record_steps=True,
        cluster=CLUSTER,
    ).run()
    sim = Simulator(trace=trace, policy=moving, record_steps=True, cluster=CLUSTER)
    moved = sim.run()
    assert fixed.reviews is False
    assert moving.reviews is True
    # Shown once it had made 2,048 tokens of the step, with those tokens counted.
    assert reviewer.shown
    assert reviewer.shown[0].generated_tokens >= 2048
    assert moved.migrations == 1
    assert moved.migration_s > 0
    # Every token made once: the resumed request generated only what was left.
    assert moved.generated_tokens == stay.generated_tokens == 20_100
    assert sim.step_log is not None
    assert [row[6] for row in sim.step_log if row[0] == "long"] == ["c"]
    # TP-2 decodes faster than TP-1 for most of the step.
    assert moved.makespan_s < stay.makespan_s


class _Watch(LeastLoaded):
    """Test reviewer: every step on "a"; records what each review shows, and whether the
    shown step was running or preempted (back in the queue) at that moment."""

    def __init__(self) -> None:
        self.sim: Simulator | None = None
        self.shown: list[tuple[TrajectoryView, bool]] = []

    def place(
        self, event: TrajectoryView, instances: Sequence[InstanceState], now: float
    ) -> Decision:
        return Decision("a", reason="fixed")

    def review(
        self, events: Sequence[TrajectoryView], instances: Sequence[InstanceState], now: float
    ) -> dict[str, Decision]:
        assert self.sim is not None
        core = self.sim.instances["a"].core
        waiting = {r.prefix_key for r in core.waiting}
        self.shown += [(e, e.trajectory_id in waiting) for e in events]
        return {}


def test_a_preempted_decode_is_still_shown_to_the_review() -> None:
    """vLLM's token stream shows a preempted request's tokens to the live engine host,
    so the simulator's review shows it too, with the tokens its turn made: a long decode
    that is starved on a full instance is the one a policy most wants to move."""
    kv = CostModel.for_names("qwen3-8b", "h100", 1).kv_capacity_tokens
    n = 6  # each context fills 1/6 of the cache less 3,000 tokens: full after ~3,000 made
    trace = [TrajectorySpec(f"t{k}", "g", kv // n - 3_000, (StepSpec(12_000),))
             for k in range(n)]  # fmt: skip
    watch = _Watch()
    sim = Simulator(
        trace=trace, policy=Policy("w", FirstComeFirstServed(), watch, _Fixed()), cluster=CLUSTER
    )
    watch.sim = sim
    sim.run()
    preempted = [e for e, queued in watch.shown if queued]
    assert preempted, "a decode preempted after 2,048 tokens was never shown"
    assert all(e.step_tokens >= 2048 for e, _ in watch.shown)
    assert all(e.step_tokens == e.generated_tokens for e, _ in watch.shown)  # one turn each


class _EmptyA(LeastLoaded):
    """Test placement: every first step goes to "a", which it then empties (if `empty`),
    moving every step shown there to "c"."""

    def __init__(self, empty: bool, batch: int) -> None:
        self.empty, self.batch = empty, batch
        self.emptying: tuple[str, ...] = ()
        self.shown: list[TrajectoryView] = []

    def place(
        self, event: TrajectoryView, instances: Sequence[InstanceState], now: float
    ) -> Decision:
        self.batch -= 1
        if self.empty and self.batch == 0:
            self.emptying = ("a",)
        return Decision("a" if event.step_index == 0 else "c", reason="fixed")

    def review(
        self, events: Sequence[TrajectoryView], instances: Sequence[InstanceState], now: float
    ) -> dict[str, Decision]:
        self.shown += events
        return {e.trajectory_id: Decision("c", reason="emptying") for e in events
                if e.previous_instance in self.emptying}  # fmt: skip


def test_an_instance_being_emptied_shows_and_loses_every_step_at_the_next_review() -> None:
    """Queued steps and short decodes on an instance being emptied are shown to the
    review too, and all leave at once: emptying must not wait for a queue to drain."""
    trace = [_spec("long", 20_000), *(_spec(f"s{k}", 1_500) for k in range(40))]
    runs = {}
    for empty in (False, True):
        placement = _EmptyA(empty, len(trace))
        sim = Simulator(
            trace=trace,
            policy=Policy("e", FirstComeFirstServed(), placement, _Fixed()),
            record_steps=True,
            cluster=replace(CLUSTER, max_num_seqs=4),
        )
        runs[empty] = (placement, sim, sim.run())
    keep, _, kept = runs[False]
    # Without emptying only the long decode is shown, once it has made 2,048 tokens.
    assert {e.trajectory_id for e in keep.shown} == {"long"}
    assert kept.migrations == 0
    placement, sim, moved = runs[True]
    # At the first review (5 s, before any step ends) all 41 on "a" are shown and leave.
    on_a = [e for e in placement.shown if e.previous_instance == "a"]
    assert len(on_a) == 41
    assert max(e.generated_tokens for e in on_a) < 2048
    assert sum(e.generated_tokens == 0 for e in on_a) >= 41 - 4  # queued: 4 seats
    assert moved.migrations == 41
    assert sim.step_log is not None
    assert all(row[6] == "c" for row in sim.step_log)  # no step finished on "a"
    assert moved.generated_tokens == kept.generated_tokens == 20_000 + 40 * 1_500


class _NoReview(LeastLoaded):
    def place(
        self, event: TrajectoryView, instances: Sequence[InstanceState], now: float
    ) -> Decision:
        return Decision("a" if event.trajectory_id == "long" else "b", reason="fixed")


def _event(tid: str, step: int, generated: int, prev: str | None) -> TrajectoryView:
    return TrajectoryView(tid, "g", step, 100 + generated, generated, previous_instance=prev,
                     prompt_tokens=100)  # fmt: skip


def test_heddle_merges_idle_narrow_instances_when_the_tail_gains() -> None:
    truth = [_spec("long", 10, 40_000), *(_spec(f"s{i}", 10, 200) for i in range(60))]
    ctx = PolicyContext(ClusterShape(num_gpus=8, tp_choices=(1, 2, 4, 8)), truth=tuple(truth))
    planner = HeddlePlanner.for_context(ctx, HeddleVariant(oracle=True, plan_tp=False))
    placement = planner.placement()
    planner.on_batch_start([_event(s.trajectory_id, 0, 0, None) for s in truth])
    ids = [s.instance_id for s in planner.instances(8)]
    assert planner.plan.tps == (1,) * 8
    # The short ones finish; the long one waits for its tool on the first instance.
    for s in truth[1:]:
        planner.on_trajectory_done(s.trajectory_id, "g", 210, 1)
    states = [InstanceState(i, 0, 1 if i == ids[0] else 0, 1) for i in ids]
    changes = planner.reshape(states, 30.0)
    assert changes, "seven idle TP-1 instances and a 40K-token tail: merging pays"
    retired = [i for c in changes for i in c.retire]
    assert ids[0] not in retired
    assert len(retired) == len(set(retired))
    assert all(c.cost_s > 0 for c in changes)
    # The widest block the busy instance leaves free is tried first: GPUs 4-7 as a TP-4.
    assert changes[0].create.tp == 4
    assert changes[0].retire == tuple(ids[4:])
    # Until the new instances are up, the plan only names instances that exist.
    assert set(planner.plan.instance_ids) == set(ids) - set(retired)
    for c in changes:
        planner.on_instance_ready(c.create)
    assert set(planner.plan.instance_ids) >= {c.create.instance_id for c in changes}
    # The long trajectory's rank now names a wider instance: it moves at its tool call.
    up = [InstanceState(i, 0, 0, tp) for i, tp in zip(planner.plan.instance_ids, planner.plan.tps,
                                                     strict=True)]  # fmt: skip
    decision = placement.place(_event("long", 1, 10, ids[0]), up, 31.0)
    assert decision.migrate
    assert decision.instance_id != ids[0]


def test_heddle_merges_a_block_of_idle_narrow_instances_for_crowded_long_decodes() -> None:
    """The math tail: long single-turn decodes crowd the only TP-8 while eight TP-1s
    sit idle. No decode moves to a TP-1 mid-step, so pairs of TP-1s would not help;
    the whole idle block becomes one TP-8, and the drain moves then fill it."""
    truth = [_spec(f"l{i}", 40_000) for i in range(8)]
    ctx = PolicyContext(ClusterShape(num_gpus=16, tp_choices=(1, 2, 4, 8)), truth=tuple(truth))
    planner = HeddlePlanner.for_context(ctx, HeddleVariant(oracle=True, plan_tp=False))
    placement = planner.placement()
    planner.on_batch_start([_event(s.trajectory_id, 0, 0, None) for s in truth])
    # The split as the math batch ends: one TP-8 (GPUs 0-7) and eight TP-1s (8-15).
    planner.plan.instance_ids = ["wide", *(f"n{k}" for k in range(8))]
    planner.plan.tps = (8,) + (1,) * 8
    planner.plan.sizes = (8,) + (0,) * 8  # every rank on the TP-8
    planner.reshaping.layout = GpuLayout.pack(planner.plan.instance_ids, planner.plan.tps)
    wide = InstanceState("wide", 8, 8, 8, kv_usage=0.1)
    states = [wide, *(InstanceState(f"n{k}", 0, 0, 1) for k in range(8))]
    decodes = [_event(s.trajectory_id, 0, 12_000, "wide") for s in truth]
    assert placement.review(decodes, states, 300.0) == {}  # nowhere faster yet
    changes = planner.reshape(states, 300.0)
    assert [c.create.tp for c in changes] == [8]
    assert changes[0].retire == tuple(f"n{k}" for k in range(8))
    planner.on_instance_ready(changes[0].create)
    new = changes[0].create.instance_id
    moves = placement.review(decodes, [wide, InstanceState(new, 0, 0, 8)], 321.0)
    assert moves
    assert {d.instance_id for d in moves.values()} == {new}


def test_heddle_empties_busy_narrow_instances_and_merges_them_when_the_dp_says_so() -> None:
    """No narrow instance goes idle while each holds a long trajectory, yet the DP wants
    a wide one: the block stops taking steps, its trajectories leave at their next step
    (or, mid-decode, at the review), and once empty it merges."""
    truth = [_spec(f"l{i}", 2_000, 2_000, 30_000) for i in range(24)]
    ctx = PolicyContext(ClusterShape(num_gpus=16, tp_choices=(1, 2, 4, 8)), truth=tuple(truth))
    planner = HeddlePlanner.for_context(ctx, HeddleVariant(oracle=True, plan_tp=False))
    placement = planner.placement()
    planner.on_batch_start([_event(s.trajectory_id, 0, 0, None) for s in truth])
    narrow = [f"n{k}" for k in range(8)]
    planner.plan.instance_ids, planner.plan.tps = ["wide", *narrow], (8,) + (1,) * 8
    planner.plan.sizes = (16,) + (1,) * 8  # sixteen on the TP-8, one on each TP-1
    planner.reshaping.layout = GpuLayout.pack(planner.plan.instance_ids, planner.plan.tps)
    busy = [InstanceState("wide", 16, 16, 8), *(InstanceState(i, 1, 1, 1) for i in narrow)]
    for k, s in enumerate(truth):
        planner.bookings.book(
            s.trajectory_id,
            narrow[k] if k < 8 else "wide",
            planner.forecast.remaining[s.trajectory_id],
        )
    assert planner.reshape(busy, 1.0) == []  # nothing idle to merge yet ...
    assert planner.reshaping.vacating == tuple(narrow)  # ... but the TP-1 block is being emptied
    assert not set(planner.plan.instance_ids) & set(narrow)  # and no rank maps there
    # A step boundary leaves, however little is left; a decode in progress leaves at review.
    step = placement.place(_event("l0", 1, 2_000, "n0"), busy, 2.0)
    assert step.reason == "vacating"
    assert step.migrate
    assert step.instance_id == "wide"
    moves = placement.review([_event("l1", 0, 2_500, "n1")], busy, 5.0)
    assert moves["l1"].instance_id == "wide"
    assert planner.reshape(busy, 6.0) == []  # not empty yet
    empty = [InstanceState("wide", 8, 8, 8), *(InstanceState(i, 0, 0, 1) for i in narrow)]
    changes = planner.reshape(empty, 60.0)
    assert [(c.retire, c.create.tp, c.reason) for c in changes] == [
        (tuple(narrow), 8, "merge_vacated_for_tail")
    ]
    assert planner.reshaping.vacating == ()
