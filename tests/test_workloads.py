"""Workload calibration: the properties heddle/workloads.py promises, measured."""

from __future__ import annotations

import pytest

from heddle.tracestats import trace_stats
from heddle.workloads import WORKLOADS, generate, scale_tokens

TOOL_LATENCY = {"coding": 0.45, "search": 1.4, "math": 0.05}


@pytest.fixture(scope="module", params=sorted(WORKLOADS))
def workload(request: pytest.FixtureRequest) -> tuple[str, dict]:  # type: ignore[type-arg]
    name = request.param
    return name, trace_stats([r.spec for r in generate(name, prompts=200, seed=0)])


def test_long_tail(workload: tuple[str, dict]) -> None:  # type: ignore[type-arg]
    _, stats = workload
    assert stats["generated_tokens"]["max_over_median"] >= 4


def test_budget_of_40k_tokens(workload: tuple[str, dict]) -> None:  # type: ignore[type-arg]
    _, stats = workload
    assert stats["generated_tokens"]["max"] <= 40_000


def test_variance_inside_groups(workload: tuple[str, dict]) -> None:  # type: ignore[type-arg]
    _, stats = workload
    assert stats["group_cv_mean"] >= 0.5
    assert stats["group_max_over_min_median"] >= 4


def test_tool_latency_means(workload: tuple[str, dict]) -> None:  # type: ignore[type-arg]
    name, stats = workload
    (mean,) = stats["tool_latency_mean_s"].values()
    assert mean == pytest.approx(TOOL_LATENCY[name], rel=0.1)


def test_tool_errors_cause_more_turns() -> None:
    specs = [r.spec for r in generate("coding", prompts=200, seed=1)]
    with_errors = [len(s.steps) for s in specs if any(st.tool_status == "error" for st in s.steps)]
    without = [len(s.steps) for s in specs if all(st.tool_status != "error" for st in s.steps)]
    assert sum(with_errors) / len(with_errors) > 1.5 * sum(without) / len(without)


def test_seeded_and_drifting() -> None:
    a = [r.spec for r in generate("math", prompts=20, seed=3)]
    assert a == [r.spec for r in generate("math", prompts=20, seed=3)]
    assert a != [r.spec for r in generate("math", prompts=20, seed=4)]
    early = trace_stats([r.spec for r in generate("math", prompts=300, seed=3, iteration=0)])
    late = trace_stats([r.spec for r in generate("math", prompts=300, seed=3, iteration=10)])
    assert late["generated_tokens"]["mean"] > 1.1 * early["generated_tokens"]["mean"]
    assert late["tool_status"].get("error", 0) < early["tool_status"].get("error", 0)


def test_a_scaled_trace_keeps_its_shape_at_a_fraction_of_its_tokens() -> None:
    records = generate("coding", prompts=2, seed=0)
    small = scale_tokens(records, 0.1)
    for big, little in zip(records, small, strict=True):
        assert little.spec.trajectory_id == big.spec.trajectory_id
        assert len(little.spec.steps) == len(big.spec.steps)
        for b, s in zip(big.spec.steps, little.spec.steps, strict=True):
            assert s.output_tokens == max(1, round(b.output_tokens * 0.1))
            assert (s.tool, s.tool_latency_s, s.tool_status) == (
                b.tool,
                b.tool_latency_s,
                b.tool_status,
            )
    with pytest.raises(ValueError, match="token scale"):
        scale_tokens(records, 0)
