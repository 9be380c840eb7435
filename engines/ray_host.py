"""vLLM instances hosted as Ray actors, each in a placement group of its TP degree's
devices: GPU bundles in production, a CPU bundle here.

The actor runs `LocalVllm` (vLLM's async engine with its own multiprocessing executor:
vLLM refuses Ray as its executor on CPU) and streams token ids back; the engine host
keeps the trajectories' token ids and the engine interface (`VllmEngine`), so a Ray-hosted
instance and a local one behave alike. An actor that dies surfaces as `EngineDead`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator
from typing import Any

from engines.request import Sampling
from engines.vllm import EngineDead, LocalVllm, StreamPart, VllmSettings

log = logging.getLogger(__name__)


class VllmActor:
    """The Ray actor: one vLLM instance and its token stream."""

    def __init__(self, instance_id: str, settings: VllmSettings, tp: int) -> None:
        self.vllm = LocalVllm(instance_id, settings, tp)

    async def start(self) -> int:
        await self.vllm.start()
        return self.vllm.block_size

    async def healthy(self) -> bool:
        return self.vllm.is_healthy

    async def stream(
        self,
        request_id: str,
        prompt: list[int],
        max_new_tokens: int,
        priority: int,
        sampling: Sampling | None = None,
    ) -> AsyncGenerator[tuple[StreamPart, float], None]:
        """The token stream, each part with the KV cache use after it."""
        parts = self.vllm.stream(request_id, prompt, max_new_tokens, priority, sampling)
        async for part in parts:
            yield part, self.vllm.kv_usage

    async def stop(self) -> None:
        await self.vllm.stop()

    async def sync_weights(self, path: str, version: int) -> None:
        await self.vllm.sync_weights(path, version)


class RayVllm:
    """The engine host's handle on a `VllmActor` (the `VllmBackend` interface)."""

    def __init__(
        self, instance_id: str, settings: VllmSettings, tp: int, *, use_gpus: bool
    ) -> None:
        self.instance_id = instance_id
        self.settings = settings
        self.tp = tp
        self.use_gpus = use_gpus
        self._actor: Any = None
        self._group: Any = None
        self._block_size = 0
        self._dead = False
        self.kv_usage = 0.0  # as the actor's last streamed part said

    @property
    def is_healthy(self) -> bool:
        return self._actor is not None and not self._dead

    @property
    def block_size(self) -> int:
        return self._block_size

    async def start(self) -> None:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        bundle = {"GPU": float(self.tp), "CPU": 1.0} if self.use_gpus else {"CPU": 1.0}
        self._group = placement_group([bundle], strategy="STRICT_PACK")
        await self._group.ready()
        actor_cls = ray.remote(VllmActor)
        self._actor = actor_cls.options(
            name=f"heddle-vllm-{self.instance_id}-{id(self):x}",
            num_cpus=1,
            num_gpus=self.tp if self.use_gpus else 0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(self._group),
            max_restarts=0,
        ).remote(self.instance_id, self.settings, self.tp)
        self._block_size = await self._actor.start.remote()
        self._dead = False
        log.info("vLLM instance %s up as a Ray actor", self.instance_id)

    async def stop(self) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        actor, self._actor = self._actor, None
        if actor is not None:
            try:
                await actor.stop.remote()
            except Exception:
                log.debug("actor of %s gone before stop", self.instance_id)
            ray.kill(actor)
        if self._group is not None:
            remove_placement_group(self._group)
            self._group = None

    async def sync_weights(self, path: str, version: int) -> None:
        if self._actor is None:
            raise EngineDead(self.instance_id, 0)
        await self._actor.sync_weights.remote(path, version)

    def kill(self) -> None:
        """End the actor's process at once (what a crashed host looks like)."""
        import ray

        ray.kill(self._actor, no_restart=True)

    async def stream(
        self,
        request_id: str,
        prompt: list[int],
        max_new_tokens: int,
        priority: int,
        sampling: Sampling | None = None,
    ) -> AsyncGenerator[StreamPart, None]:
        from ray.exceptions import RayActorError, RayTaskError

        if self._actor is None:
            raise EngineDead(self.instance_id, 0)
        refs = self._actor.stream.options(num_returns="streaming").remote(
            request_id, prompt, max_new_tokens, priority, sampling
        )
        try:
            async for ref in refs:
                part, self.kv_usage = await ref
                yield part
        except (RayActorError, RayTaskError) as exc:
            self._dead = True
            raise EngineDead(self.instance_id, 0) from exc
        finally:
            import ray

            with contextlib.suppress(Exception):  # a finished stream has nothing to cancel
                ray.cancel(refs)  # a stream closed early aborts its request in the actor
