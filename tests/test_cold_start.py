"""The cold start: a campaign's first iteration has no history, so Heddle's forecast
learns from the batch as it runs (`BatchLengths`, `heddle-cold`)."""

from __future__ import annotations

import dataclasses

import pytest

from heddle.families import generate_family
from heddle.hardware import ClusterShape
from heddle.sim.simulator import simulate
from heddle.types import TrajectoryView
from scheduler.heddle.forecast import BatchLengths
from scheduler.interface import PolicyContext
from scheduler.registry import create_policy, learns_from_history, policy_without_history


def _view(tid: str, group: str, made: int) -> TrajectoryView:
    return TrajectoryView(tid, group, 1 if made else 0, 200 + made, made, prompt_tokens=200)


def test_with_no_sibling_finished_the_longer_run_is_forecast_longer() -> None:
    lengths = BatchLengths()
    short, long = lengths.predict(_view("a", "g", 100)), lengths.predict(_view("b", "h", 3000))
    assert long > short >= 1


def test_a_finished_sibling_forecasts_its_group() -> None:
    lengths = BatchLengths()
    before = lengths.predict(_view("a", "g", 100))
    lengths.finished("g", 9000)
    after = lengths.predict(_view("a", "g", 100))
    assert after == pytest.approx(8900)
    assert after > before
    # Past every sibling, the trajectory's own run is what it has to go on.
    assert lengths.predict(_view("a", "g", 12_000)) >= 12_000 / 4
    # Another group's forecast is untouched.
    assert lengths.predict(_view("c", "h", 100)) == before


def test_a_learning_policy_with_no_history_runs_the_cold_start() -> None:
    assert policy_without_history("heddle") == "heddle-cold"
    assert not learns_from_history("heddle-cold")
    assert policy_without_history("verl") == "verl"
    with pytest.raises(ValueError, match="give it a history"):
        create_policy("heddle", PolicyContext())
    create_policy("heddle-cold", PolicyContext())


def test_the_cold_start_never_reads_the_batch_truth() -> None:
    """The bench hands every policy the batch (the oracle reads its lengths): the cold
    start must decide the same whatever the truth says."""
    trace = [r.spec for r in generate_family("random", prompts=6, samples=4, seed=3)]
    cluster = ClusterShape(num_gpus=4)
    lied = tuple(dataclasses.replace(s, steps=s.steps[:1]) for s in trace)
    makespans = {
        simulate(trace, create_policy("heddle-cold", PolicyContext(cluster, truth=t)),
                 cluster).makespan_s
        for t in ((), tuple(trace), lied)
    }  # fmt: skip
    assert len(makespans) == 1
    # Nor its tool outputs: the context's growth per token starts from none.
    policy = create_policy("heddle-cold", PolicyContext(cluster, truth=tuple(trace)))
    assert policy.split.forecast.context_growth == 1.0  # type: ignore[attr-defined]
