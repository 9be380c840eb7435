"""Prefill/decode disaggregation (issue 31, Prorsa's lever): the role planner, the
simulator's prefill instances and KV handoffs, and the cluster file's `disaggregation:`."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from engines.costmodel import CostModel
from heddle.config import load_cluster
from heddle.errors import ConfigError
from heddle.hardware import ClusterShape, Disaggregation
from heddle.sim import SimResult, simulate
from heddle.types import StepSpec, TrajectorySpec
from scheduler.interface import PolicyContext
from scheduler.registry import create_policy
from scheduler.roles import DECODE, PREFILL, PrefillForecast, RoleInstance, prefill_instances


def _instances(*tps: int, role: str = DECODE, load: int = 0) -> list[RoleInstance]:
    return [
        RoleInstance(f"i{k}", tp, role, load, prefill_tokens_per_s=20_000.0 * tp,
                     kv_capacity_tokens=100_000 * tp)
        for k, tp in enumerate(tps)
    ]  # fmt: skip


def test_nothing_decoding_means_every_instance_prefills_its_own() -> None:
    config = Disaggregation(prefill_share=0.5)
    pool = _instances(1, 1, 1, 1)
    assert (
        prefill_instances(pool, demand_tokens=10**7, decoding_kv_tokens=0, config=config) == set()
    )


def test_the_forecast_takes_enough_instances_for_its_demand_narrowest_and_least_loaded_first() -> (
    None
):
    config = Disaggregation(prefill_share=0.5, horizon_s=10.0)
    pool = [*_instances(2, 1, 1, 1)]
    pool[1] = dataclasses.replace(pool[1], load=5)
    # 200,000 tokens in 10 s: one TP-1 (20,000 tokens/s) covers it, the least loaded.
    one = prefill_instances(pool, demand_tokens=200_000, decoding_kv_tokens=1, config=config)
    assert one == {"i2"}
    # More demand: up to half the GPUs (2 of 5), never the wide one first.
    many = prefill_instances(pool, demand_tokens=10**7, decoding_kv_tokens=1, config=config)
    assert many == {"i2", "i3"}
    # The decode instances left must hold the KV decoding now.
    tight = prefill_instances(pool, demand_tokens=10**7, decoding_kv_tokens=350_000, config=config)
    assert tight == {"i2"}


def test_an_instance_on_prefill_stays_until_demand_halves() -> None:
    config = Disaggregation(prefill_share=0.5, horizon_s=10.0)
    pool = _instances(1, 1, 1, 1)
    pool[3] = dataclasses.replace(pool[3], role=PREFILL, load=9)
    # The one on prefill is kept (not the idle i0) while it covers half the demand...
    kept = prefill_instances(pool, demand_tokens=200_000, decoding_kv_tokens=1, config=config)
    assert kept == {"i3"}
    # ...and is let go when there is none.
    assert prefill_instances(pool, demand_tokens=0, decoding_kv_tokens=1, config=config) == set()


def test_a_static_pool_is_the_narrowest_instances_on_its_share() -> None:
    config = Disaggregation(roles="static", prefill_share=0.25)
    assert prefill_instances(
        _instances(4, 2, 1, 1), demand_tokens=0, decoding_kv_tokens=0, config=config
    ) == {"i2", "i3"}
    # A share smaller than any instance still takes one; never every instance.
    assert prefill_instances(_instances(8, 8), demand_tokens=0, decoding_kv_tokens=0,
                             config=config) == {"i0"}  # fmt: skip
    assert prefill_instances(_instances(8), demand_tokens=0, decoding_kv_tokens=0,
                             config=config) == set()  # fmt: skip


def test_the_forecast_predicts_observations_from_those_seen() -> None:
    forecast = PrefillForecast(min_prefill_tokens=512)
    assert forecast.demand_tokens([600, 100], num_tool_users=10) == 600  # nothing seen yet
    forecast.observe(1000)
    forecast.observe(2000)
    assert forecast.demand_tokens([], num_tool_users=4) == 6000
    small = PrefillForecast(min_prefill_tokens=512)
    small.observe(300)  # below the threshold: they stay on their decode instances
    assert small.demand_tokens([], num_tool_users=100) == 0


def _search_like(n: int) -> list[TrajectorySpec]:
    """Trajectories whose tools return long observations (a search agent's pages)."""
    out = []
    for k in range(n):
        steps = tuple(
            StepSpec(
                300 + 37 * ((k + j) % 11),
                "search",
                tool_latency_s=0.5 + 0.1 * (k % 5),
                tool_output_tokens=2500,
            )
            for j in range(4)
        )
        out.append(TrajectorySpec(f"t{k}", f"g{k // 4}", 800, (*steps, StepSpec(900)), "search"))
    return out


def _run(cluster: ClusterShape, trace: list[TrajectorySpec], policy: str) -> SimResult:
    ctx = PolicyContext(cluster, (), tuple(trace), 0)
    return simulate(trace, create_policy(policy, ctx), cluster)


@pytest.mark.parametrize("policy", ["verl", "least_loaded"])
def test_prefills_run_on_the_prefill_pool_and_their_kv_moves_to_the_decode_instance(
    policy: str,
) -> None:
    trace = _search_like(48)
    cluster = ClusterShape(model="qwen3-8b", gpu="h100", num_gpus=4)
    together = _run(cluster, trace, policy)
    static = Disaggregation(roles="static", prefill_share=0.25, min_prefill_tokens=512)
    apart = _run(dataclasses.replace(cluster, disaggregation=static), trace, policy)
    assert together.kv_handoffs == together.offloaded_prefill_tokens == 0
    assert apart.generated_tokens == together.generated_tokens
    assert apart.trajectories == together.trajectories == 48
    # Every observation (2,500 tokens) prefills on the pool: 4 a trajectory. Its KV
    # (and, for a trajectory's first offloaded step, the context it lacked) goes home.
    assert apart.kv_handoffs >= 4 * 48
    assert apart.offloaded_prefill_tokens >= 4 * 48 * 2500
    cost = CostModel.of(cluster, 1)
    one = cost.migration_s(2500, same_node=True, target_tp=1)
    assert apart.handoff_s >= 4 * 48 * one
    # The pool is one TP-1 instance beside the policy's split of the other three GPUs (a
    # quarter of the four): it never switched, and the decode instances prefilled less.
    assert apart.role_switches == 0
    pool = [i for i in apart.instances if i["role"] == PREFILL]
    assert [(i["instance_id"], i["tp"]) for i in pool] == [("prefill0", 1)]
    assert sum(int(i["tp"]) for i in apart.instances) == 4  # type: ignore[call-overload]
    assert apart.prefill_tokens - apart.offloaded_prefill_tokens < together.prefill_tokens / 2


def test_idle_instances_take_up_prefill_in_the_tail_and_give_it_back_at_the_end() -> None:
    """Short trajectories finish and leave instances idle while four long ones still call
    tools that return long observations: the idle instances prefill those (no
    trajectory moves for it), and decode again once no tool call is left."""
    short = [TrajectorySpec(f"s{k}", f"gs{k // 8}", 600, (StepSpec(400),), "search")
             for k in range(60)]  # fmt: skip
    long = _search_like(4)
    long = [dataclasses.replace(t, steps=t.steps[:-1] * 3 + t.steps[-1:]) for t in long]
    cluster = ClusterShape(model="qwen3-8b", gpu="h100", num_gpus=8)
    config = Disaggregation(roles="forecast", prefill_share=0.5, horizon_s=1.0)
    shape = dataclasses.replace(cluster, disaggregation=config)
    together = _run(cluster, [*short, *long], "least_loaded")
    apart = _run(shape, [*short, *long], "least_loaded")
    assert apart.trajectories == 64
    assert apart.generated_tokens == together.generated_tokens
    assert apart.offloaded_prefill_tokens >= 2500 * 8
    assert apart.role_switches >= 2
    assert apart.role_switches % 2 == 0  # every instance taken was given back
    # Nothing decoding in the first burst of prompts: no pool then.
    first = _run(shape, short, "least_loaded")
    assert first.role_switches == first.offloaded_prefill_tokens == 0


def test_heddle_plans_on_instances_the_pool_takes(tmp_path: Path) -> None:
    """Heddle plans on the whole split; a step it sends to an instance serving prefill
    decodes on one as wide, and the batch completes."""
    trace = _search_like(64)
    cluster = ClusterShape(model="qwen3-8b", gpu="h100", num_gpus=16)
    history = tuple(dataclasses.replace(s, trajectory_id=f"h-{s.trajectory_id}") for s in trace)
    config = Disaggregation(roles="static", prefill_share=0.25)
    shape = dataclasses.replace(cluster, disaggregation=config)
    ctx = PolicyContext(shape, history, tuple(trace), 0)
    result = simulate(trace, create_policy("heddle", ctx), shape)
    assert result.trajectories == 64
    assert result.role_switches == 1
    assert result.offloaded_prefill_tokens > 0


def test_the_cluster_file_turns_disaggregation_on(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text("num_gpus: 8\ndisaggregation:\n  roles: static\n  prefill_share: 0.25\n")
    shape = load_cluster(path).shape()
    assert shape.disaggregation == Disaggregation(roles="static", prefill_share=0.25)
    path.write_text("num_gpus: 8\ndisaggregation:\n  roles: dynamic\n")
    with pytest.raises(ConfigError) as info:
        load_cluster(path)
    assert (info.value.line, info.value.field) == (3, "disaggregation.roles")
    path.write_text("num_gpus: 8\ndisaggregation:\n  prefill_share: 1.0\n")
    with pytest.raises(ConfigError) as info:
        load_cluster(path)
    assert info.value.field == "disaggregation.prefill_share"


def _metric(name: str) -> float:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value(name) or 0.0


def test_live_simulated_engines_prefill_on_the_pool(
    temporal_address: str, store_url: str, queue_prefix: str
) -> None:
    """On the live stack, a static pool of one instance of four prefills the long
    observations; the scheduler places no step there, and every step still makes its
    recorded tokens."""
    import asyncio

    from heddle.config import ClusterConfig, DisaggregationConfig
    from heddle.trace import TraceRecord
    from heddle.types import RolloutOptions
    from tests.live import live_client

    config = DisaggregationConfig(roles="static", prefill_share=0.25)
    cluster = ClusterConfig(model="qwen3-8b", gpu="h100", num_gpus=4, disaggregation=config)
    trace = _search_like(12)
    handoffs = _metric("heddle_prefill_handoffs_total")
    tokens = _metric("heddle_offloaded_prefill_tokens_total")

    async def run() -> tuple[int, set[str], dict[str, int]]:
        async with live_client(
            temporal_address, store_url, queue_prefix, time_scale=0.05, cluster=cluster
        ) as client:
            handle = await client.start_rollout(
                records=[TraceRecord(s) for s in trace], options=RolloutOptions()
            )
            report = await asyncio.wait_for(handle.report(), 300)
            instances, made = set(), {}
            for spec in trace:
                row = client.store.get_trajectory(handle.batch_id, spec.trajectory_id)
                assert row is not None
                instances |= {s["instance_id"] for s in row["steps"]}
                made[spec.trajectory_id] = sum(s["output_tokens"] for s in row["steps"])
            return report.completed, instances, made

    completed, instances, made = asyncio.run(run())
    assert completed == 12
    assert made == {s.trajectory_id: s.generated_tokens for s in trace}
    # The pool is one TP-1 of the four (the narrowest, least loaded, first by id, chosen
    # as the plan came): steps decoded on the other three only. Which one depends on
    # when the first round of roles runs: usually i0, but on a loaded machine steps can
    # reach i0 first and the pool is i1.
    assert _metric("heddle_prefill_instances") == 1
    assert len(instances) == 3, instances
    assert instances < {"i0", "i1", "i2", "i3"}, instances
    # Every observation (2,500 tokens, 4 a trajectory) prefilled on the pool.
    assert _metric("heddle_prefill_handoffs_total") - handoffs >= 4 * 12
    assert _metric("heddle_offloaded_prefill_tokens_total") - tokens >= 4 * 12 * 2500


def test_live_idle_instances_take_up_prefill_in_the_tail(
    temporal_address: str, store_url: str, queue_prefix: str
) -> None:
    """The forecast's roles on the live stack: once the short trajectories are done,
    idle instances prefill the long ones' tool results."""
    import asyncio

    from heddle.config import ClusterConfig, DisaggregationConfig
    from heddle.trace import TraceRecord
    from heddle.types import RolloutOptions
    from tests.live import live_client

    config = DisaggregationConfig(roles="forecast", prefill_share=0.5, horizon_s=2.0)
    cluster = ClusterConfig(model="qwen3-8b", gpu="h100", num_gpus=8, disaggregation=config)
    short = [TrajectorySpec(f"s{k}", f"gs{k // 8}", 600, (StepSpec(400),), "search")
             for k in range(24)]  # fmt: skip
    long = [dataclasses.replace(t, steps=t.steps[:-1] * 3 + t.steps[-1:])
            for t in _search_like(4)]  # fmt: skip
    handoffs = _metric("heddle_prefill_handoffs_total")

    async def run() -> int:
        async with live_client(
            temporal_address, store_url, queue_prefix, time_scale=0.1, cluster=cluster
        ) as client:
            records = [TraceRecord(s) for s in [*short, *long]]
            handle = await client.start_rollout(records=records, options=RolloutOptions())
            report = await asyncio.wait_for(handle.report(), 300)
            return report.completed

    assert asyncio.run(run()) == 28
    assert _metric("heddle_prefill_handoffs_total") - handoffs >= 4


def test_a_stopped_worker_leaves_none_of_its_hosts_loops_running(
    temporal_address: str, store_url: str, queue_prefix: str
) -> None:
    """Following the plan, reviewing decodes and planning prefill roles all end with the
    worker. The follower once outlived it where the roles were planned, and could act on
    a reshaped plan after the host closed: a CI run of the test above hung for 300 s in
    asyncio's teardown."""
    import asyncio

    from heddle.config import ClusterConfig, DisaggregationConfig
    from tests.live import in_process_worker

    config = DisaggregationConfig(roles="forecast", prefill_share=0.5, horizon_s=2.0)
    cluster = ClusterConfig(model="qwen3-8b", gpu="h100", num_gpus=8, disaggregation=config)

    async def left_running() -> list[str]:
        before = asyncio.all_tasks()
        async with in_process_worker(
            temporal_address, store_url, queue_prefix, time_scale=0.1, cluster=cluster
        ):
            await asyncio.sleep(1.0)  # the host follows the plan and plans the roles
        left = asyncio.all_tasks() - before
        return sorted(t.get_coro().__qualname__ for t in left if not t.done())  # type: ignore[union-attr]

    assert asyncio.run(left_running()) == []


def test_a_static_pool_keeps_its_gpus_out_of_the_policies_cluster() -> None:
    static = Disaggregation(roles="static", prefill_share=0.125)
    shape = ClusterShape(model="qwen3-32b", num_gpus=64, default_tp=2, disaggregation=static)
    assert shape.prefill_pool_gpus == 8
    assert shape.for_placement().num_gpus == 56
    tiny = dataclasses.replace(shape, num_gpus=4, disaggregation=static)
    assert tiny.prefill_pool_gpus == 2  # one instance at least
    two = dataclasses.replace(shape, num_gpus=2)
    assert two.prefill_pool_gpus == 0  # never every GPU
    forecast = dataclasses.replace(shape, disaggregation=Disaggregation())
    assert forecast.for_placement() is forecast  # the forecast's pool comes from the split


def test_an_asynchronous_campaign_runs_with_forecast_roles() -> None:
    """Prompts admitted while other trajectories decode are the demand a pool serves in
    an asynchronous campaign: roles are planned through every admission."""
    from heddle.sim.campaign import simulate_async_campaign
    from heddle.staleness import StalenessBound

    batches = [
        [dataclasses.replace(t, trajectory_id=f"b{i}-{t.trajectory_id}") for t in _search_like(16)]
        for i in range(6)
    ]
    config = Disaggregation(roles="forecast", prefill_share=0.5, horizon_s=1.0)
    rollout = ClusterShape(model="qwen3-8b", gpu="h100", num_gpus=6, disaggregation=config)
    result = simulate_async_campaign(
        batches, create_policy("least_loaded", PolicyContext(rollout)), rollout,
        trainer_gpus=2, bound=StalenessBound(1, 16, 16, "partial"), iterations=3,
    )  # fmt: skip
    assert len(result.steps) == 3
    assert all(s.trained_tokens > 0 for s in result.steps)
