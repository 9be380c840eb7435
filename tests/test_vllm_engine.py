"""One vLLM instance (CPU build) behind the engine interface: exact trace replay, priority
order, the prefix cache across a trajectory's turns, the warm-up a migration uses, and a
step stopped to move. The engine starts once for the module."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from engines.request import EngineRequest
from tests.real_engine import require_vllm, tiny_model, vllm_env

pytestmark = [pytest.mark.real_engine, pytest.mark.slow]

HOST_NICE_BEFORE: list[int] = []  # the host thread's niceness before the engine started


@pytest.fixture(scope="module")
def engine(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Any, asyncio.AbstractEventLoop]]:
    require_vllm()
    from engines.vllm import LocalVllm, TokenSessions, VllmEngine, VllmSettings, read_vocab_size

    root = tmp_path_factory.mktemp("vllm")
    vllm_env(root)
    model = tiny_model(tmp_path_factory)
    # One sequence at a time: later requests queue, in vLLM's priority order.
    settings = VllmSettings(model_path=str(model), max_num_seqs=1, max_model_len=2048)
    sessions = TokenSessions(read_vocab_size(str(model)))
    eng = VllmEngine(instance_id="v0", backend=LocalVllm("v0", settings, tp=1), sessions=sessions)
    loop = asyncio.new_event_loop()
    HOST_NICE_BEFORE.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
    loop.run_until_complete(eng.start())
    try:
        yield eng, loop
    finally:
        loop.run_until_complete(eng.stop())
        loop.close()


def _request(rid: str, tid: str, context: int, new: int, priority: int = 0) -> EngineRequest:
    return EngineRequest(rid, tid, context, new, priority=priority)


def test_a_step_generates_exactly_the_trace_tokens(engine: Any) -> None:
    eng, loop = engine
    seen: list[int] = []
    result = loop.run_until_complete(
        eng.generate(_request("r-exact", "t-exact", 100, 37), seen.append)
    )
    assert result.output_tokens == 37
    assert seen[-1] == 37
    assert len(eng.sessions.ids["t-exact"]) == 100 + 37


def test_the_second_turn_hits_the_prefix_cache(engine: Any) -> None:
    eng, loop = engine
    first = loop.run_until_complete(eng.generate(_request("p1", "t-prefix", 200, 40)))
    assert first.cached_tokens == 0
    # The next turn: the earlier context, the tokens generated, then a tool's output.
    second = loop.run_until_complete(eng.generate(_request("p2", "t-prefix", 200 + 40 + 25, 10)))
    block = eng.block_size  # the cache hits whole blocks
    assert second.cached_tokens >= (200 + 40 - 1) // block * block > 0


def test_waiting_steps_start_in_priority_order(engine: Any) -> None:
    eng, loop = engine
    done: list[str] = []

    async def one(rid: str, new: int, priority: int) -> None:
        await eng.generate(_request(rid, f"t-{rid}", 50, new, priority))
        done.append(rid)

    async def run() -> None:
        blocker = asyncio.create_task(one("blocker", 400, -10))
        # The blocker holds the only sequence slot.
        while not eng.running_decodes():  # noqa: ASYNC110 (polls the engine)
            await asyncio.sleep(0.01)
        waiting = [asyncio.create_task(one(f"q{p}", 4, p)) for p in (3, 1, 4, 2)]
        await asyncio.gather(blocker, *waiting)

    loop.run_until_complete(run())
    assert done == ["blocker", "q1", "q2", "q3", "q4"]


def test_a_warm_up_puts_a_context_in_the_cache(engine: Any) -> None:
    eng, loop = engine
    assert loop.run_until_complete(eng.warm("t-warm", 300)) == 300
    result = loop.run_until_complete(eng.generate(_request("w1", "t-warm", 300, 5)))
    assert result.cached_tokens >= (300 - 1) // eng.block_size * eng.block_size > 0


def test_a_step_stopped_to_move_returns_what_it_made(engine: Any) -> None:
    eng, loop = engine

    async def run() -> Any:
        step = asyncio.create_task(eng.generate(_request("m1", "t-move", 60, 1500)))
        while sum(r.num_output_tokens for r in eng.running_decodes()) < 20:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        assert eng.kv_usage > 0  # vLLM's own report of its KV cache, mid-decode
        assert eng.stop_to_move("m1", "v1")
        return await step

    result = loop.run_until_complete(run())
    assert result.moved_to == "v1"
    assert 0 < result.output_tokens < 1500
    # Its tokens stay in the trajectory's context for the instance it moves to.
    assert len(eng.sessions.ids["t-move"]) == 60 + result.output_tokens
    assert eng.load == 0


def _thread_nice(pid: int) -> dict[int, int]:
    """Each thread of a process and its niceness (Linux keeps one per thread)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        out[int(tid)] = int(fields[16])  # field 19 of stat: nice
    return out


def test_on_cpu_every_engine_thread_runs_at_lower_priority(engine: Any) -> None:
    import psutil

    children = psutil.Process().children(recursive=True)
    engine_procs = [p for p in children if "VLLM" in p.name() or "VLLM" in " ".join(p.cmdline())]
    assert engine_procs, [p.name() for p in children]
    host_nice = _thread_nice(os.getpid())[threading.get_native_id()]
    for proc in engine_procs:
        nice = _thread_nice(proc.pid)
        assert set(nice.values()) == {max(10, host_nice)}, (proc.name(), nice)
    # This process, the host, keeps its own.
    assert host_nice == HOST_NICE_BEFORE[0]
