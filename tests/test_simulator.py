"""Simulator invariants, determinism, and the policies' distinct behaviour."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import pytest

from engines.costmodel import CostModel
from heddle.hardware import ClusterShape
from heddle.sim import lower_bound, simulate
from heddle.sim.simulator import Simulator
from heddle.types import Decision, StepSpec, TrajectorySpec, TrajectoryView
from heddle.workloads import generate
from scheduler.interface import InstanceState, Policy, PolicyContext
from scheduler.order import FirstComeFirstServed
from scheduler.placement import LeastLoaded
from scheduler.registry import create_policy, policy_names
from scheduler.split import Homogeneous

CLUSTER = ClusterShape(model="qwen3-8b", gpu="h100", num_gpus=8)


@pytest.fixture(scope="module")
def trace():  # type: ignore[no-untyped-def]
    return [r.spec for r in generate("coding", prompts=12, samples=16, seed=5)]


@pytest.mark.parametrize("name", policy_names())
def test_invariants_hold_for_every_policy(name: str, trace) -> None:  # type: ignore[no-untyped-def]
    history = tuple(r.spec for r in generate("coding", prompts=12, samples=16, seed=5, iteration=1))
    policy = create_policy(name, PolicyContext(history=history, truth=tuple(trace)))
    sim = Simulator(trace=trace, policy=policy, record_steps=True, cluster=CLUSTER)
    result = sim.run()
    # Every trace token generated exactly once.
    assert result.generated_tokens == sum(s.generated_tokens for s in trace)
    for spec in trace:
        assert sim.trajectories[spec.trajectory_id].view.generated_tokens == spec.generated_tokens
    # No step starts before its tool returned, and steps of one trajectory never overlap.
    assert sim.step_log is not None
    assert len(sim.step_log) == sum(len(s.steps) for s in trace)
    last_finish: dict[str, float] = {}
    for tid, _, ready, submitted, first, finished, _ in sorted(
        sim.step_log, key=lambda r: (r[0], r[1])
    ):
        assert submitted >= ready - 1e-9
        assert first >= submitted - 1e-9
        assert finished > first
        assert ready >= last_finish.get(tid, 0.0) - 1e-9
        last_finish[tid] = finished
    # No instance over its KV capacity.
    for inst in result.instances:
        assert inst["peak_kv_tokens"] <= inst["kv_capacity_tokens"]
    bound = lower_bound(
        trace,
        ClusterShape(
            model="qwen3-8b", gpu="h100", num_gpus=8, tp_choices=(1, 2, 4, 8), max_num_seqs=256
        ),
    )
    assert result.makespan_s >= bound["lower_bound_s"]
    assert 0 < result.gpu_busy_frac <= 1


def test_deterministic(trace) -> None:  # type: ignore[no-untyped-def]
    runs = [simulate(trace, create_policy("verl"), CLUSTER) for _ in range(2)]
    assert runs[0].makespan_s == runs[1].makespan_s
    assert runs[0].completion_times == runs[1].completion_times


def test_occupancy_is_sampled_without_changing_the_run(trace) -> None:  # type: ignore[no-untyped-def]
    """`sample_every_s` (benchmarks/tail_report.py --every) records each TP degree's
    queues and KV over time; the run itself is the same as without it."""
    plain = simulate(trace, create_policy("verl"), CLUSTER)
    sim = Simulator(trace=trace, policy=create_policy("verl"), sample_every_s=10.0, cluster=CLUSTER)
    result = sim.run()
    assert result.makespan_s == plain.makespan_s
    times = sorted({o.time_s for o in sim.occupancy})
    assert times[0] == 0.0
    assert times[-1] <= result.makespan_s
    assert all(b - a == pytest.approx(10.0) for a, b in itertools.pairwise(times))
    assert len(times) == int(result.makespan_s // 10) + 1
    first = [o for o in sim.occupancy if o.time_s == 0.0]
    # Every first step is placed at time 0: each trajectory is a session, running or queued.
    assert sum(o.num_sessions for o in first) == len(trace)
    assert sum(o.num_running + o.num_waiting for o in first) == len(trace)
    assert sum(o.num_instances for o in first) * first[0].tp == CLUSTER.num_gpus
    assert all(0.0 <= o.kv_usage <= 1.0 for o in sim.occupancy)
    assert any(o.kv_usage > 0.0 for o in sim.occupancy)


def test_kv_pressure_preempts_and_still_completes(trace) -> None:  # type: ignore[no-untyped-def]
    # Qwen3-32B on one TP-2 H100 pair leaves little KV: requests are preempted and
    # recomputed, and the batch still completes with every token.
    small = trace
    result = simulate(
        small,
        create_policy("verl", PolicyContext(ClusterShape(default_tp=2))),
        ClusterShape(model="qwen3-32b", gpu="h100", num_gpus=2),
    )
    assert result.generated_tokens == sum(s.generated_tokens for s in small)
    (inst,) = result.instances
    assert inst["peak_kv_tokens"] > 0.9 * inst["kv_capacity_tokens"]


def test_policies_behave_differently(trace) -> None:  # type: ignore[no-untyped-def]
    makespans = {
        name: simulate(trace, create_policy(name), CLUSTER).makespan_s
        for name in ("verl", "slime", "autellix")
    }
    assert len(set(makespans.values())) == 3
    libra = simulate(trace, create_policy("libra"), CLUSTER)
    assert {i["role"] for i in libra.instances} == {"short", "long"}
    assert libra.migrations > 0


def test_sticky_policies_keep_a_trajectory_on_its_instance(trace) -> None:  # type: ignore[no-untyped-def]
    for name in ("verl", "sticky_least_loaded"):
        sim = Simulator(trace=trace, policy=create_policy(name), record_steps=True, cluster=CLUSTER)
        sim.run()
        homes: dict[str, set[str]] = {}
        for tid, *_, instance in sim.step_log or []:
            homes.setdefault(tid, set()).add(instance)
        assert all(len(h) == 1 for h in homes.values()), name


def test_a_split_for_another_cluster_is_refused(trace) -> None:  # type: ignore[no-untyped-def]
    """A planning policy splits the GPUs its context names; the simulator checks them
    against its own cluster instead of running instances on GPUs it does not have."""
    policy = create_policy(
        "heddle-oracle", PolicyContext(ClusterShape(num_gpus=8), truth=tuple(trace))
    )
    with pytest.raises(ValueError, match=r"split the cluster into 8 GPUs.*it has 4"):
        Simulator(
            trace=trace,
            policy=policy,
            cluster=ClusterShape(model="qwen3-8b", gpu="h100", num_gpus=4),
        )


class _EveryStepMoves(LeastLoaded):
    """Each step on the instance its previous step did not run on, with its KV."""

    migrate = True

    def place(
        self, event: TrajectoryView, instances: Sequence[InstanceState], now: float
    ) -> Decision:
        ids = sorted(i.instance_id for i in instances)
        prev = event.previous_instance
        target = ids[(ids.index(prev) + 1) % len(ids)] if prev else ids[0]
        return Decision(target, reason="alternate", migrate=True)


@pytest.mark.parametrize(("num_gpus", "tp", "same_node"), [(16, 8, False), (8, 4, True)])
def test_a_move_pays_the_link_between_its_instances_or_recomputes_without_one(
    num_gpus: int, tp: int, same_node: bool
) -> None:
    # One trajectory: 2,000 prompt tokens, 1,000 generated, a tool, then a second step
    # on the other instance (the other node's TP-8, or the same node's other TP-4).
    first = StepSpec(1_000, tool="x", tool_output_tokens=500)
    trace = [TrajectorySpec("t", "g", 2_000, (first, StepSpec(10)))]

    def run(kv_transfer: bool) -> Simulator:
        policy = Policy("alternate", FirstComeFirstServed(), _EveryStepMoves(), Homogeneous(tp))
        sim = Simulator(
            trace=trace,
            policy=policy,
            kv_transfer=kv_transfer,
            cluster=ClusterShape(model="qwen3-14b", gpu="h100", num_gpus=num_gpus),
        )
        sim.run()
        return sim

    cost = CostModel.for_names("qwen3-14b", "h100", tp)
    moved = run(kv_transfer=True)
    assert (moved.migrations, moved.recomputed_moves) == (1, 0)
    # The cached context crosses the link: the prompt and the first step but its last
    # token, whose KV is computed with the next step (as in vLLM).
    expected = cost.migration_s(2_999, same_node=same_node, target_tp=tp)
    assert moved.migration_s == pytest.approx(expected)
    recomputed = run(kv_transfer=False)
    assert (recomputed.migrations, recomputed.recomputed_moves, recomputed.migration_s) == (1, 1, 0)
    # Recomputing the context on the target takes longer than sending it.
    assert recomputed.now > moved.now > recomputed.now - cost.prefill_s(3_000)
