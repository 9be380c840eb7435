"""The clockless engine core: budgets, KV capacity, prefix cache, order and preemption."""

from __future__ import annotations

import asyncio

import pytest

from engines.costmodel import CostModel
from engines.simulated import SimulatedEngine
from tests.factories import create_core, request, run_until_done


def test_every_requested_token_is_generated_exactly_once() -> None:
    core = create_core(max_num_batched_tokens=512, max_num_seqs=4)
    wants = {f"r{i}": 5 + 7 * i for i in range(10)}
    for rid, n in wants.items():
        core.add_request(request(rid, context=300, new=n))
    assert run_until_done(core) == wants
    assert core.num_running_kv_tokens == 0


def test_token_budget_and_seat_limit_hold_each_iteration() -> None:
    core = create_core(max_num_batched_tokens=256, max_num_seqs=3)
    for i in range(6):
        core.add_request(request(f"r{i}", context=1000, new=20))
    while core.has_work():
        out = core.step()
        assert out.num_prefill_tokens + out.num_decode_seqs <= 256
        assert len(core.running) <= 3


def test_prefill_is_chunked_under_the_budget() -> None:
    core = create_core(max_num_batched_tokens=100)
    core.add_request(request("r", context=350, new=2))
    chunks = []
    while core.has_work():
        out = core.step()
        chunks.append((out.num_prefill_tokens, out.advanced.get("r", 0)))
    assert chunks == [(100, 0), (100, 0), (100, 0), (50, 1), (0, 1)]


def test_prefix_cache_keeps_a_trajectorys_context_between_turns() -> None:
    core = create_core()
    core.add_request(request("t/0", context=500, new=50, key="t"))
    run_until_done(core)
    # Next turn: previous context + output + tool output.
    core.add_request(request("t/1", context=500 + 50 + 30, new=10, key="t"))
    out = core.step()
    assert out.num_prefill_tokens == 580 - 549  # only what was not cached
    assert core._by_id["t/1"].num_cached_tokens == 549


def test_kv_usage_counts_running_requests_not_evictable_prefixes() -> None:
    core = create_core(kv_capacity_tokens=10_000)
    core.add_request(request("t/0", context=500, new=50, key="t"))
    core.step()
    assert core.kv_usage == pytest.approx(core.num_running_kv_tokens / 10_000)
    assert core.kv_usage > 0
    run_until_done(core)
    # The finished turn's context stays cached (a later turn hits it), yet vLLM v1
    # reports it as free: the cache evicts it when a request needs the room.
    assert core.kv_free_tokens < 10_000
    assert core.kv_usage == 0.0


def test_kv_exhaustion_preempts_and_still_finishes() -> None:
    core = create_core(kv_capacity_tokens=1200, max_num_batched_tokens=2048)
    for i in range(4):
        core.add_request(request(f"r{i}", context=250, new=200))
    preempted = 0
    made: dict[str, int] = {}
    while core.has_work():
        out = core.step()
        preempted += len(out.preempted)
        for rid, n in out.advanced.items():
            made[rid] = made.get(rid, 0) + n
        assert core.num_running_kv_tokens + core.num_cached_kv_tokens <= 1200
    assert preempted > 0
    assert made == {f"r{i}": 200 for i in range(4)}


def test_fcfs_serves_in_arrival_order() -> None:
    core = create_core(max_num_seqs=1)
    for rid in ("a", "b", "c"):
        core.add_request(request(rid, context=10, new=3))
    order = []
    while core.has_work():
        order += core.step().finished
    assert order == ["a", "b", "c"]


def test_priority_preempts_the_lowest_running_request() -> None:
    core = create_core(max_num_seqs=2, policy="priority")
    core.add_request(request("low", context=10, new=50, priority=5))
    core.add_request(request("mid", context=10, new=50, priority=3))
    core.step()
    assert {r.request_id for r in core.running} == {"low", "mid"}
    core.add_request(request("urgent", context=10, new=5, priority=0))
    out = core.step()
    assert out.preempted == ["low"]
    assert {r.request_id for r in core.running} == {"mid", "urgent"}
    finished = []
    while core.has_work():
        finished += core.step().finished
    assert finished == ["urgent", "mid", "low"]


def test_request_larger_than_the_cache_is_refused() -> None:
    core = create_core(kv_capacity_tokens=100)
    with pytest.raises(ValueError, match="needs 150 KV tokens"):
        core.add_request(request("big", context=100, new=50))


def test_iteration_time_grows_with_batch_and_context() -> None:
    cost = CostModel.for_names("qwen3-8b", "h100", 1)
    assert (
        cost.decode_token_s(1, 1000) < cost.decode_token_s(64, 1000) < cost.decode_token_s(64, 8000)
    )
    # Tensor parallelism lowers per-token latency at batch 1.
    tp = [CostModel.for_names("qwen3-32b", "h100", t).decode_token_s(1) for t in (1, 2, 4, 8)]
    assert tp == sorted(tp, reverse=True)


def _fast_forward(core, arrivals=()):  # type: ignore[no-untyped-def]
    """Drain with decode blocks where possible; return (made, total time)."""
    made: dict[str, int] = {}
    clock = 0.0
    while core.has_work():
        block = core.decode_block()
        out = core.advance_decode(block, block.num_iterations) if block else core.step()
        clock += out.duration_s
        for rid, n in out.advanced.items():
            made[rid] = made.get(rid, 0) + n
    return made, clock


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_decode_blocks_match_single_steps(policy: str) -> None:
    def fill(core):  # type: ignore[no-untyped-def]
        for i in range(12):
            core.add_request(
                request(f"r{i}", context=200 + 37 * i, new=30 + 11 * i, priority=i % 3)
            )

    slow = create_core(max_num_seqs=8, kv_capacity_tokens=6000, policy=policy)
    fill(slow)
    made_slow: dict[str, int] = {}
    clock_slow = 0.0
    while slow.has_work():
        out = slow.step()
        clock_slow += out.duration_s
        for rid, n in out.advanced.items():
            made_slow[rid] = made_slow.get(rid, 0) + n
    fast = create_core(max_num_seqs=8, kv_capacity_tokens=6000, policy=policy)
    fill(fast)
    made_fast, clock_fast = _fast_forward(fast)
    assert made_fast == made_slow
    assert clock_fast == pytest.approx(clock_slow, rel=1e-3)


def test_partial_block_and_iteration_boundaries() -> None:
    core = create_core()
    for i in range(4):
        core.add_request(request(f"r{i}", context=100, new=50 + i))
    core.step()  # prefill; every request has its first token
    block = core.decode_block()
    assert block is not None
    assert block.num_iterations == 49  # until r0 finishes
    assert block.iterations_done_by(0.0) == 0
    assert block.iterations_done_by(block.first_s * 0.5) == 1  # the one in progress
    assert block.iterations_done_by(block.elapsed_s(10)) == 10
    out = core.advance_decode(block, 10)
    assert out.advanced == {f"r{i}": 10 for i in range(4)}
    assert not out.finished


def test_migrated_prefix_is_a_cache_hit() -> None:
    core = create_core()
    assert core.put_prefix("t", 800)
    core.add_request(request("t/3", context=900, new=5, key="t"))
    out = core.step()
    assert out.num_prefill_tokens == 100
    assert core.drop_prefix("nothing") == 0


def test_a_queued_step_can_be_moved_before_it_runs() -> None:
    """An instance being emptied moves its queued steps too (none made a token)."""

    async def run() -> None:
        engine = SimulatedEngine(instance_id="a", core=create_core(max_num_seqs=1))
        await engine.start()
        try:
            first = asyncio.create_task(engine.generate(request("r1", new=5_000)))
            second = asyncio.create_task(engine.generate(request("r2", new=10)))
            while not engine.running_decodes():  # noqa: ASYNC110 (polls the engine)
                await asyncio.sleep(0.001)
            assert [r.request_id for r in engine.queued_steps()] == ["r2"]
            assert engine.stop_to_move("r2", "b")
            moved = await second
            assert (moved.moved_to, moved.output_tokens) == ("b", 0)
            assert engine.queued_steps() == []
            assert not engine.stop_to_move("r2", "b")  # gone
            assert engine.stop_to_move("r1", "b")  # a running one still moves
            assert (await first).moved_to == "b"
        finally:
            await engine.stop()

    asyncio.run(run())
