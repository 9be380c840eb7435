"""What the planner knows of each allowed TP degree, from the cluster's one shape."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from engines.costmodel import CostModel
from heddle.hardware import ClusterShape
from scheduler.placement_dp import InstanceModel
from scheduler.resources import SplitPlanner


@dataclass
class InstanceShapes:
    """Per allowed degree: the DP's instance model and the restart cost (computed on
    first use: a policy built for a batch it never plans pays nothing)."""

    cluster: ClusterShape
    _models: dict[int, InstanceModel] | None = field(default=None, repr=False)
    _restart_s: dict[int, float] | None = field(default=None, repr=False)

    def splitter(self, num_gpus: int | None = None) -> SplitPlanner:
        cluster = self.cluster if num_gpus is None else replace(self.cluster, num_gpus=num_gpus)
        return SplitPlanner(cluster)

    @property
    def models(self) -> dict[int, InstanceModel]:
        if self._models is None:
            self._models = self.splitter().models()
        return self._models

    @property
    def restart_s(self) -> dict[int, float]:
        if self._restart_s is None:
            self._restart_s = {
                tp: CostModel.of(self.cluster, tp).reconfiguration_s() for tp in self.models
            }
        return self._restart_s
