"""Prefill on other instances, live (the cluster's `disaggregation`, simulated engines).

The simulator's rules (`heddle/sim/simulator.py`, "disaggregated prefill") on the engine
host's simulated engines: a step whose context its decode instance lacks at least
`min_prefill_tokens` of prefills on the least backlogged instance serving prefill, which
first pulls what the decode instance holds of the context; the prefill makes the step's
first token, and the new KV goes back to the decode instance, each transfer taking the
cost model's time (scaled). The engine host picks the roles (`scheduler.roles`) and
offers the scheduler only the instances that decode.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from engines.costmodel import same_node
from engines.pool import EnginePool
from engines.request import EngineRequest
from engines.simulated import EngineResult, SimulatedEngine
from heddle import metrics
from heddle.hardware import Disaggregation


class PrefillPool:
    """The instances serving prefill now, and the prefills sent to them."""

    def __init__(
        self,
        pool: EnginePool,
        config: Disaggregation,
        observe: Callable[[int], None] = lambda tokens: None,
    ) -> None:
        self.pool = pool
        self.config = config
        self.serving: set[str] = set()  # instances serving prefill (the host sets them)
        self.observe = observe  # what a tool's result added to a context (the forecast's)

    def _engine(self, instance_id: str) -> SimulatedEngine | None:
        engine = self.pool.engines.get(instance_id)
        return engine if isinstance(engine, SimulatedEngine) else None

    def _target(self, trajectory_id: str, context_tokens: int) -> SimulatedEngine | None:
        """The prefill instance done soonest: its queue, then what it lacks of this context."""
        best: tuple[float, str] | None = None
        for iid in sorted(self.serving):
            engine = self._engine(iid)
            if engine is None:
                continue
            core = engine.core
            lacks = context_tokens - core.cached_tokens(trajectory_id)
            score = (core.prefill_backlog_tokens + lacks) / self.rate(iid)
            if best is None or score < best[0]:
                best = (score, iid)
        return self._engine(best[1]) if best else None

    def rate(self, instance_id: str) -> float:
        """Prefill tokens a second at a full token budget."""
        cost = self.pool.shape.cost(self.pool.tps[instance_id])
        return cost.prefill_tokens_per_s(self.pool.shape.cluster.max_num_batched_tokens)

    async def _transfer(self, source: str, target: str, tokens: int) -> None:
        if tokens <= 0:
            return
        pool = self.pool
        seconds = pool.shape.cost(pool.tps[source]).migration_s(
            tokens,
            same_node=same_node(pool.first_gpu[source], pool.first_gpu[target]),
            target_tp=pool.tps[target],
        )
        await asyncio.sleep(seconds * pool.shape.time_scale)

    async def prefill(self, home: SimulatedEngine, request: EngineRequest) -> EngineResult | None:
        """Prefill `request`'s context elsewhere and make its first token, the KV then on
        `home`; None where the step prefills at home (too little to prefill, a one-token
        step, no prefill instance)."""
        tid, context = request.prefix_key, request.context_tokens
        held = home.core.cached_tokens(tid)
        lacking = context - held
        if held and lacking >= 1:  # a later step: what the tool's result added
            self.observe(lacking)
        if (
            lacking < self.config.min_prefill_tokens
            or request.max_new_tokens < 2
            or home.instance_id in self.serving
        ):
            return None
        target = self._target(tid, context)
        if target is None:
            return None
        pulled = held - target.core.cached_tokens(tid)
        if pulled > 0:
            await self._transfer(home.instance_id, target.instance_id, pulled)
            target.core.put_prefix(tid, held)
        result = await target.generate(
            EngineRequest(
                request_id=f"{request.request_id}/prefill",
                prefix_key=tid,
                context_tokens=context,
                max_new_tokens=1,
                priority=request.priority,
            )
        )
        await self._transfer(
            target.instance_id, home.instance_id, context - home.core.cached_tokens(tid)
        )
        home.core.put_prefix(tid, context)  # if it has no room, the rest prefills it again
        metrics.PREFILL_HANDOFFS.inc()
        metrics.OFFLOADED_PREFILL_TOKENS.inc(lacking)
        result.finished_at = time.time()
        return result
