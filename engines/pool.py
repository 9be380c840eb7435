"""The engine instances of a cluster: started, stopped and reshaped by instance.

The pool holds simulated engines (each shaped by its TP degree through the cost model) or
vLLM instances (each an `AsyncLLM` whose engine core runs in its own process) behind one
interface, `Engine`; the engine host starts and stops them as the cluster plan says.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from engines.core import EngineLimits, modelled_core
from engines.costmodel import CostModel, cheapest_move, same_node, weight_sync_s
from engines.request import EngineRequest
from engines.simulated import EngineResult, SimulatedEngine

if TYPE_CHECKING:
    from engines.disaggregation import PrefillPool
from engines.vllm import (
    LocalVllm,
    TokenSessions,
    VllmBackend,
    VllmEngine,
    VllmSettings,
    read_vocab_size,
)
from heddle import metrics
from heddle.hardware import MODELS, ClusterShape

log = logging.getLogger(__name__)


class Engine(Protocol):
    """What the engine host and the LLM step activity use of an instance."""

    instance_id: str
    kind: str

    @property
    def load(self) -> int: ...

    @property
    def is_healthy(self) -> bool: ...

    @property
    def kv_usage(self) -> float: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def generate(
        self, request: EngineRequest, on_progress: Callable[[int], None] | None = None
    ) -> EngineResult: ...

    def running_decodes(self) -> list[EngineRequest]: ...

    def queued_steps(self) -> list[EngineRequest]: ...

    def stop_to_move(self, request_id: str, target: str) -> bool: ...


def ties_embeddings(model_path: str) -> bool:
    """Whether the model folder's config ties its output embedding to its input one."""
    config = Path(model_path) / "config.json"
    return config.exists() and bool(json.loads(config.read_text()).get("tie_word_embeddings"))


@dataclass(frozen=True)
class EngineShape:
    """What every instance of the cluster shares; only the TP degree differs."""

    cluster: ClusterShape
    policy: str = "fcfs"
    time_scale: float = 1.0

    def cost(self, tp: int) -> CostModel:
        return CostModel.of(self.cluster, tp)


class EnginePool:
    """Simulated engines, or vLLM instances when `vllm` says how to start them."""

    def __init__(
        self, shape: EngineShape, vllm: VllmSettings | None = None, *, ray: bool = False
    ) -> None:
        self.shape = shape
        self.vllm = vllm
        self.ray = ray  # vLLM instances as Ray actors (ray.init done by the caller)
        # vLLM instances of this host share the trajectories' token ids: a step that
        # moves finds its context on the new instance.
        self.sessions = TokenSessions(read_vocab_size(vllm.model_path)) if vllm else None
        self.engines: dict[str, Engine] = {}
        self.tps: dict[str, int] = {}
        self.first_gpu: dict[str, int] = {}  # where a move between nodes goes over the NICs
        # KV moves under way during a trajectory's tool call: its next step waits for them.
        self._moving: dict[str, asyncio.Task[int]] = {}
        self.weight_version = 0  # of the weights the instances run (a campaign's step)
        # The cluster's `disaggregation` (simulated engines): set by the worker.
        self.prefills: PrefillPool | None = None

    def _build(self, instance_id: str, tp: int) -> Engine:
        if self.vllm is not None:
            assert self.sessions is not None
            backend: VllmBackend = LocalVllm(instance_id, self.vllm, tp)
            if self.ray:
                from engines.ray_host import RayVllm

                backend = RayVllm(instance_id, self.vllm, tp, use_gpus=self.vllm.use_gpus)
            return VllmEngine(instance_id=instance_id, backend=backend, sessions=self.sessions)
        # Temporal's hops between a trajectory's steps take wall time that `time_scale`
        # does not shrink, so a scaled run keeps the reservation TTL's wall length.
        ttl_s = EngineLimits.session_ttl_s / self.shape.time_scale
        core, _ = modelled_core(self.shape.cluster, tp, self.shape.policy, session_ttl_s=ttl_s)
        return SimulatedEngine(instance_id=instance_id, core=core, time_scale=self.shape.time_scale)

    async def add(self, instance_id: str, tp: int, first_gpu: int = 0) -> Engine:
        """Start an instance on `tp` GPUs from `first_gpu` (idempotent: an instance
        already running is kept)."""
        if instance_id in self.engines:
            if self.tps[instance_id] != tp:
                raise ValueError(f"instance {instance_id} runs at TP {self.tps[instance_id]}")
            return self.engines[instance_id]
        settings = self.vllm
        engine = self._build(instance_id, tp)
        await engine.start()
        while self.vllm is not None and settings is not None and self.vllm is not settings:
            # A weight sync came while it started (it was not an instance yet): it
            # catches up, in place, or by a restart where it loaded tied embeddings.
            if ties_embeddings(settings.model_path):
                await engine.stop()
                settings, engine = self.vllm, self._build(instance_id, tp)
                await engine.start()
            else:
                settings = self.vllm
                await engine.sync_weights(settings.model_path, settings.weight_version)  # type: ignore[attr-defined]
        self.engines[instance_id], self.tps[instance_id] = engine, tp
        self.first_gpu[instance_id] = first_gpu
        return engine

    async def remove(self, instance_id: str) -> None:
        """Stop an instance; steps still on it fail (and are retried by their workflows)."""
        engine = self.engines.pop(instance_id, None)
        self.tps.pop(instance_id, None)
        self.first_gpu.pop(instance_id, None)
        if engine is not None:
            await engine.stop()

    def restart_s(self, tp: int) -> float:
        """The modelled cost of starting an instance at `tp` (weight load, engine start);
        a vLLM instance pays its real start instead."""
        return 0.0 if self.vllm else self.shape.cost(tp).reconfiguration_s()

    async def sync_weights(self, path: str, version: int) -> float:
        """Give every instance the weights at `path`, labelled `version`; returns the
        seconds it took (for simulated engines: the modelled broadcast of the model's
        weights into each instance at once, waited out on the stack's clock)."""
        if self.vllm is not None:
            return await self._sync_vllm(path, version)
        if not self.tps:
            return 0.0
        model = self.shape.cluster.model
        modelled = max(weight_sync_s(MODELS[model], tp) for tp in self.tps.values())
        await asyncio.sleep(modelled * self.shape.time_scale)
        self.weight_version = version
        return modelled

    async def _sync_vllm(self, path: str, version: int) -> float:
        """Every instance at once; instances started from now on load `path` too, so an
        instance that failed its sync, or died, comes back on the committed checkpoint,
        never on the base model."""
        assert self.vllm is not None
        log.info("weight sync to version %d: %s", version, path)
        began = time.monotonic()
        loaded = self.vllm.model_path
        self.vllm = dataclasses.replace(self.vllm, model_path=path, weight_version=version)
        engines = list(self.engines.items())
        if ties_embeddings(loaded):
            # vLLM's CPU build keeps a tied lm_head's packed copy from the load: reloaded
            # in place it would go stale. The instances restart on `path` instead.
            log.warning("instances run a model with tied embeddings: restarting them on %s", path)
            for _, engine in engines:
                await engine.stop()
            self.weight_version = version
            return time.monotonic() - began
        results = await asyncio.gather(
            *(e.sync_weights(path, version) for _, e in engines),  # type: ignore[attr-defined]
            return_exceptions=True,
        )
        failed = [iid for (iid, _), r in zip(engines, results, strict=True) if r is not None]
        for iid in failed:
            # Stopped, it reads as dead: the host marks it down and starts it again.
            log.warning("instance %s failed its weight sync: restarting it on %s", iid, path)
            await self.engines[iid].stop()
        self.weight_version = version
        return time.monotonic() - began

    def unhealthy(self) -> list[str]:
        """Instances whose engine died (a vLLM engine core process that exited)."""
        return [iid for iid, e in self.engines.items() if not e.is_healthy]

    async def move_prefix(self, trajectory_id: str, source: str, target: str) -> int:
        """Move a trajectory's cached context from `source` to `target`; returns the
        tokens moved. Simulated engines transfer the KV in the cost model's time (scaled)
        or, where the target's prefill is faster (`cheapest_move`), leave the context for
        the next step to prefill there; vLLM instances have no transfer path here, so the
        target prefills the context (a warm-up) and the source's copy ages out of its
        cache."""
        if source not in self.engines or target not in self.engines:
            return 0
        began = time.monotonic()
        tokens = await self._move_prefix(trajectory_id, source, target)
        metrics.KV_MOVE_SECONDS.observe(time.monotonic() - began)
        metrics.KV_MOVED_TOKENS.inc(tokens)
        return tokens

    async def _move_prefix(self, trajectory_id: str, source: str, target: str) -> int:
        if self.vllm is not None:
            assert self.sessions is not None
            tokens = len(self.sessions.ids.get(trajectory_id, ()))
            engine = self.engines[target]
            assert isinstance(engine, VllmEngine)
            return await engine.warm(trajectory_id, tokens)
        src, dst = self.engines[source], self.engines[target]
        assert isinstance(src, SimulatedEngine)
        assert isinstance(dst, SimulatedEngine)
        tokens = src.core.drop_prefix(trajectory_id)
        if not tokens:
            return 0
        move = cheapest_move(
            self.shape.cost(self.tps[source]), self.shape.cost(self.tps[target]), tokens,
            same_node=same_node(self.first_gpu[source], self.first_gpu[target]),
        )  # fmt: skip
        if move.recompute:
            return 0
        await asyncio.sleep(move.seconds * self.shape.time_scale)
        if target in self.engines:  # it may have stopped meanwhile
            dst.core.put_prefix(trajectory_id, tokens)
        return tokens

    def move_prefix_soon(self, trajectory_id: str, source: str, target: str) -> None:
        """Start moving a trajectory's context (`move_prefix`) without waiting: it goes
        while the trajectory's tool runs, and its next step waits for it (`settled`)."""
        previous = self._moving.get(trajectory_id)

        async def move() -> int:
            if previous is not None:
                await asyncio.gather(previous, return_exceptions=True)
            return await self.move_prefix(trajectory_id, source, target)

        task = asyncio.ensure_future(move())
        self._moving[trajectory_id] = task
        task.add_done_callback(lambda t: self._forget_move(trajectory_id, t))

    def _forget_move(self, trajectory_id: str, task: asyncio.Task[int]) -> None:
        if self._moving.get(trajectory_id) is task:
            del self._moving[trajectory_id]
        if not task.cancelled() and task.exception() is not None:
            log.warning("KV move of %s failed: %s", trajectory_id, task.exception())

    async def settled(self, trajectory_id: str) -> None:
        """Wait for a move of the trajectory's context that is still under way (a failed
        one leaves the context to be recomputed)."""
        task = self._moving.get(trajectory_id)
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)

    def __getitem__(self, instance_id: str) -> Engine:
        return self.engines[instance_id]

    @property
    def instance_ids(self) -> list[str]:
        return list(self.engines)

    async def stop(self) -> None:
        for instance_id in list(self.engines):
            await self.remove(instance_id)
