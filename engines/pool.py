"""The engine instances of a cluster, built from its configuration.

This issue's pool holds simulated engines in the worker's process; the real-engine issue
adds vLLM instances hosted as processes or Ray actors behind the same interface.
"""

from __future__ import annotations

from engines.core import EngineCore, EngineLimits
from engines.costmodel import CostModel
from engines.simulated import SimulatedEngine


class EnginePool:
    def __init__(self, engines: dict[str, SimulatedEngine]) -> None:
        self.engines = engines

    @classmethod
    def simulated(
        cls,
        *,
        instance_ids: list[str],
        model: str,
        gpu: str,
        tp: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        gpu_memory_utilization: float,
        policy: str = "fcfs",
        time_scale: float = 1.0,
    ) -> EnginePool:
        cost = CostModel.for_names(model, gpu, tp, gpu_memory_utilization)
        limits = EngineLimits(
            kv_capacity_tokens=cost.kv_capacity_tokens,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            policy=policy,
        )
        return cls(
            {
                iid: SimulatedEngine(
                    instance_id=iid,
                    core=EngineCore(limits=limits, iteration_cost=cost.iteration_s),
                    time_scale=time_scale,
                )
                for iid in instance_ids
            }
        )

    def __getitem__(self, instance_id: str) -> SimulatedEngine:
        return self.engines[instance_id]

    @property
    def instance_ids(self) -> list[str]:
        return list(self.engines)

    async def start(self) -> None:
        for engine in self.engines.values():
            await engine.start()

    async def stop(self) -> None:
        for engine in self.engines.values():
            await engine.stop()
