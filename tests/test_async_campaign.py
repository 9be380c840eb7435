"""Asynchronous campaigns in the simulator: the staleness bound's rules, and a campaign
whose rollout runs ahead of its trainer without a trained token older than the bound."""

from __future__ import annotations

from collections import Counter

import pytest

from heddle.hardware import ClusterShape
from heddle.sim.campaign import AsyncCampaignResult, simulate_async_campaign
from heddle.staleness import StalenessBound, add_tokens
from heddle.types import TrajectorySpec
from heddle.workloads import generate
from scheduler.interface import PolicyContext
from scheduler.registry import create_policy

ROLLOUT = ClusterShape(model="qwen3-8b", gpu="h100", num_gpus=6)
PROMPTS, SAMPLES = 8, 4
BATCH = PROMPTS * SAMPLES


def test_room_follows_arealss_capacity_rule() -> None:
    bound = StalenessBound(max_staleness=1, batch_size=10, max_concurrent=15)
    assert bound.room(version=0, accepted=0, running=0) == 15  # the concurrency cap
    assert bound.room(version=0, accepted=8, running=10) == 2  # (1+0+1)*10 - 18
    assert bound.room(version=0, accepted=10, running=10) == 0  # two batches out
    assert bound.room(version=1, accepted=10, running=10) == 5  # a step frees a batch
    with pytest.raises(ValueError, match="on_stale"):
        StalenessBound(1, 10, 10, on_stale="keep")


def test_stale_tokens_stay_out_of_the_loss() -> None:
    bound = StalenessBound(max_staleness=1, batch_size=4, max_concurrent=4)
    spans: list[tuple[int, int]] = []
    for version, tokens in ((0, 100), (0, 20), (1, 50), (3, 7)):
        add_tokens(spans, version, tokens)
    assert spans == [(0, 120), (1, 50), (3, 7)]
    assert not bound.is_stale(spans, version=1)
    assert bound.is_stale(spans, version=2)
    assert bound.trainable_tokens(spans, train_version=1) == 177
    assert bound.trainable_tokens(spans, train_version=2) == 57
    assert bound.trainable_tokens(spans, train_version=3) == 7


def _batches(count: int) -> list[list[TrajectorySpec]]:
    return [
        [r.spec for r in generate("coding", prompts=PROMPTS, samples=SAMPLES, seed=3, iteration=i)]
        for i in range(1, count + 1)
    ]


def _campaign(
    policy: str, staleness: int, on_stale: str, iterations: int = 4
) -> tuple[AsyncCampaignResult, list[list[TrajectorySpec]]]:
    batches = _batches(iterations + staleness + 3)
    history = tuple(r.spec for r in generate("coding", prompts=PROMPTS, samples=SAMPLES, seed=3))
    bound = StalenessBound(staleness, BATCH, BATCH, on_stale)
    result = simulate_async_campaign(
        batches, create_policy(policy, PolicyContext(ROLLOUT, history)), ROLLOUT,
        trainer_gpus=2, bound=bound, iterations=iterations,
    )  # fmt: skip
    return result, batches


@pytest.mark.parametrize("policy", ["heddle", "verl"])
def test_partial_rollout_trains_every_token_within_the_bound(policy: str) -> None:
    result, batches = _campaign(policy, staleness=1, on_stale="partial")
    specs = {s.trajectory_id: s for b in batches for s in b}
    seen: Counter[str] = Counter()
    continued = 0
    for step in result.steps:
        assert len(step.trajectory_ids) == BATCH
        groups = Counter(specs[t].group_id for t in step.trajectory_ids)
        assert all(n == SAMPLES for n in groups.values())  # whole groups only
        seen.update(step.trajectory_ids)
        trained = 0
        for tid in step.trajectory_ids:
            spans = result.spans[tid]
            # Every token the trajectory made is tagged, across the syncs it ran through.
            assert sum(n for _, n in spans) == specs[tid].generated_tokens
            assert all(v <= step.step for v, _ in spans)
            trained += sum(n for v, n in spans if v >= step.step - 1)
            continued += len(spans) > 1
        assert step.trained_tokens == trained
        assert step.max_staleness <= 1
    assert max(seen.values()) == 1  # no trajectory trained twice
    # The rollout ran ahead: trajectories continued under new weights, and steps learned
    # from tokens a version old.
    assert continued > 0
    assert any(step.max_staleness == 1 for step in result.steps)
    commits = [s.committed_s for s in result.steps]
    assert commits == sorted(commits)
    assert all(s.started_s >= prev for s, prev in zip(result.steps[1:], commits, strict=False))


def test_drop_leaves_no_stale_token_and_drops_whole_groups() -> None:
    result, batches = _campaign("heddle", staleness=1, on_stale="drop")
    specs = {s.trajectory_id: s for b in batches for s in b}
    assert result.dropped_trajectories > 0
    assert result.dropped_trajectories % SAMPLES == 0
    for step in result.steps:
        for tid in step.trajectory_ids:
            assert min(v for v, _ in result.spans[tid]) >= step.step - 1
            assert sum(n for _, n in result.spans[tid]) == specs[tid].generated_tokens
        assert step.trained_tokens == step.generated_tokens
        assert step.max_staleness <= 1


def test_async_overlaps_rollout_with_training() -> None:
    """With the bound at 0 the rollout waits for each step; at 2 it runs ahead, and the
    same number of steps is done sooner."""
    strict, _ = _campaign("verl", staleness=0, on_stale="partial")
    ahead, _ = _campaign("verl", staleness=2, on_stale="partial")
    assert ahead.total_s < strict.total_s
