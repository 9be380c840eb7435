"""The worker's data converter decodes every payload exactly as Temporal's default does
(it only caches the dataclasses' field types), so the two can share a server."""

from __future__ import annotations

from typing import Any

import pytest
from temporalio.converter import DataConverter

from heddle.runtime.payloads import DATA_CONVERTER, _init_fields
from heddle.types import (
    BatchReport,
    ClusterPlan,
    DecideRequest,
    Decision,
    GenerateRequest,
    InstancePlan,
    RolloutOptions,
    StepSpec,
    TrajectoryInput,
    TrajectorySpec,
    TrajectoryView,
)

SPEC = TrajectorySpec("t", "g", 300, (StepSpec(120, "python", 1.0, "ok", 40), StepSpec(50)))
VIEW = TrajectoryView.first(SPEC).after_output(120).after_tool("python", "ok", 40).on("i3")
PAYLOADS: list[tuple[Any, Any]] = [
    (TrajectoryInput("b", SPEC, RolloutOptions(policy="heddle", time_scale=0.5)), TrajectoryInput),
    (DecideRequest(VIEW, "heddle", "b", planned=True), DecideRequest),
    (
        GenerateRequest("r", "t", 1, 460, 50, decided=DecideRequest(VIEW, "verl", "b")),
        GenerateRequest,
    ),
    (Decision("i2", 3, "longest first", migrate=True), Decision | None),
    (None, Decision | None),
    (BatchReport("b", 2, 1, 1, 9, 1.5, 6.0, {"t": 1.5}, failed_ids=["u"]), BatchReport),
    (ClusterPlan(8, [1, 2], [InstancePlan("i0", 2, 0, "draining")], 3), ClusterPlan),
]  # fmt: skip


@pytest.mark.parametrize(("value", "hint"), PAYLOADS, ids=lambda v: type(v).__name__)
def test_decodes_as_the_default_converter(value: Any, hint: Any) -> None:
    default = DataConverter.default.payload_converter
    payloads = default.to_payloads([value])
    assert DATA_CONVERTER.payload_converter.to_payloads([value]) == payloads
    ours = DATA_CONVERTER.payload_converter.from_payloads(payloads, [hint])
    assert ours == default.from_payloads(payloads, [hint]) == [value]


def test_missing_fields_take_defaults_and_unknown_ones_are_ignored() -> None:
    """A payload from an older or newer build still decodes, as with the default."""
    converter = DATA_CONVERTER.payload_converter
    (payload,) = converter.to_payloads([{"instance_id": "i1", "added_later": 1}])
    assert converter.from_payloads([payload], [Decision]) == [Decision("i1")]
    assert _init_fields.cache_info().currsize > 0  # decoded by the cached converter
    (bad,) = converter.to_payloads([{"priority": 1}])
    with pytest.raises(Exception, match="instance_id"):
        converter.from_payloads([bad], [Decision])
