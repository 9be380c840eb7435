"""The engine instances of a cluster: started, stopped and reshaped by instance.

This pool holds simulated engines in the worker's process, each shaped by its TP degree
through the cost model; the real-engine issue adds vLLM instances hosted as processes or
Ray actors behind the same interface.
"""

from __future__ import annotations

from dataclasses import dataclass

from engines.core import EngineCore, EngineLimits
from engines.costmodel import CostModel
from engines.simulated import SimulatedEngine


@dataclass(frozen=True)
class EngineShape:
    """What every instance of the cluster shares; only the TP degree differs."""

    model: str
    gpu: str
    max_num_seqs: int
    max_num_batched_tokens: int
    gpu_memory_utilization: float
    policy: str = "fcfs"
    time_scale: float = 1.0

    def cost(self, tp: int) -> CostModel:
        return CostModel.for_names(self.model, self.gpu, tp, self.gpu_memory_utilization)


class EnginePool:
    def __init__(self, shape: EngineShape) -> None:
        self.shape = shape
        self.engines: dict[str, SimulatedEngine] = {}
        self.tps: dict[str, int] = {}

    def _build(self, instance_id: str, tp: int) -> SimulatedEngine:
        shape = self.shape
        cost = shape.cost(tp)
        if cost.kv_capacity_tokens <= 0:
            raise ValueError(f"{shape.model} does not fit on TP-{tp} {shape.gpu} instances")
        limits = EngineLimits(
            kv_capacity_tokens=cost.kv_capacity_tokens,
            max_num_seqs=shape.max_num_seqs,
            max_num_batched_tokens=shape.max_num_batched_tokens,
            policy=shape.policy,
        )
        core = EngineCore(limits=limits, iteration_cost=cost.iteration_s)
        return SimulatedEngine(instance_id=instance_id, core=core, time_scale=shape.time_scale)

    async def add(self, instance_id: str, tp: int) -> SimulatedEngine:
        """Start an instance (idempotent: an instance already running is kept)."""
        if instance_id in self.engines:
            if self.tps[instance_id] != tp:
                raise ValueError(f"instance {instance_id} runs at TP {self.tps[instance_id]}")
            return self.engines[instance_id]
        engine = self._build(instance_id, tp)
        await engine.start()
        self.engines[instance_id], self.tps[instance_id] = engine, tp
        return engine

    async def remove(self, instance_id: str) -> None:
        """Stop an instance; steps still on it fail (and are retried by their workflows)."""
        engine = self.engines.pop(instance_id, None)
        self.tps.pop(instance_id, None)
        if engine is not None:
            await engine.stop()

    def restart_s(self, tp: int) -> float:
        """The modelled cost of starting an instance at `tp` (weight load, engine start)."""
        return self.shape.cost(tp).reconfiguration_s()

    def __getitem__(self, instance_id: str) -> SimulatedEngine:
        return self.engines[instance_id]

    @property
    def instance_ids(self) -> list[str]:
        return list(self.engines)

    async def stop(self) -> None:
        for instance_id in list(self.engines):
            await self.remove(instance_id)
