"""A vLLM instance hosted as a Ray actor in a placement group: the same engine interface
as a local one (exact replay, the prefix cache across turns), and an actor that dies
fails its steps with `EngineDead`, which the workflow decides again elsewhere."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from engines.request import EngineRequest
from tests.real_engine import require_vllm, tiny_model, vllm_env

pytestmark = [pytest.mark.real_engine, pytest.mark.slow]


@pytest.fixture(scope="module")
def ray_engine(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Any, asyncio.AbstractEventLoop]]:
    require_vllm()
    import ray

    from engines.pool import EnginePool
    from engines.vllm import VllmSettings
    from tests.live import SMALL_CLUSTER

    vllm_env(tmp_path_factory.mktemp("vllm-ray"))
    model = tiny_model(tmp_path_factory)
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=128 * 2**20)
    from engines.pool import EngineShape

    small = replace(SMALL_CLUSTER.shape(), max_num_seqs=16, max_num_batched_tokens=2048)
    shape = EngineShape(small)
    settings = VllmSettings(model_path=str(model), max_num_seqs=16, max_model_len=2048)
    pool = EnginePool(shape, settings, ray=True)
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(pool.add("r0", 1))
        yield pool, loop
    finally:
        loop.run_until_complete(pool.stop())
        loop.close()
        ray.shutdown()


def test_a_ray_hosted_instance_replays_exactly_and_caches_the_next_turn(ray_engine: Any) -> None:
    pool, loop = ray_engine
    engine = pool["r0"]
    assert pool.unhealthy() == []
    first = loop.run_until_complete(engine.generate(EngineRequest("a1", "t-a", 300, 41)))
    assert first.output_tokens == 41
    second = loop.run_until_complete(engine.generate(EngineRequest("a2", "t-a", 300 + 41 + 9, 7)))
    assert second.output_tokens == 7
    block = engine.block_size
    assert second.cached_tokens >= (300 + 41 - 1) // block * block > 0


def test_an_actor_that_dies_fails_its_step_with_engine_dead(ray_engine: Any) -> None:
    from engines.vllm import EngineDead

    pool, loop = ray_engine
    engine = pool["r0"]

    async def run() -> None:
        step = asyncio.create_task(engine.generate(EngineRequest("k1", "t-k", 100, 3000)))
        while sum(r.num_output_tokens for r in engine.running_decodes()) < 20:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        assert engine.kv_usage > 0  # streamed back from the actor
        engine.backend.kill()
        with pytest.raises(EngineDead) as dead:
            await step
        assert 0 < dead.value.made < 3000

    loop.run_until_complete(run())
    assert pool.unhealthy() == ["r0"]
