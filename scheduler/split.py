"""GPU splits: how a cluster's GPUs are cut into engine instances."""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.interface import InstanceSpec


@dataclass(frozen=True)
class Homogeneous:
    """Every instance at one TP degree (the peers' setting)."""

    tp: int

    def instances(self, num_gpus: int) -> list[InstanceSpec]:
        if num_gpus % self.tp:
            raise ValueError(f"{num_gpus} GPUs do not divide into TP-{self.tp} instances")
        return [InstanceSpec(f"i{k}", self.tp) for k in range(num_gpus // self.tp)]


@dataclass(frozen=True)
class Buckets:
    """Two pools: narrow instances for short requests, wide ones for long (Libra)."""

    short_tp: int
    long_tp: int
    long_fraction: float = 0.25

    def instances(self, num_gpus: int) -> list[InstanceSpec]:
        long_gpus = int(num_gpus * self.long_fraction) // self.long_tp * self.long_tp
        long_gpus = max(long_gpus, self.long_tp) if num_gpus > self.long_tp else 0
        short_gpus = num_gpus - long_gpus
        if short_gpus % self.short_tp:
            raise ValueError(f"{short_gpus} GPUs do not divide into TP-{self.short_tp} instances")
        specs = [
            InstanceSpec(f"s{k}", self.short_tp, "short")
            for k in range(short_gpus // self.short_tp)
        ]
        specs += [
            InstanceSpec(f"l{k}", self.long_tp, "long") for k in range(long_gpus // self.long_tp)
        ]
        return specs
