"""The random workload family (heddle/families.py): its structure varies with the seed,
stays inside the model's limits, and its history is of other prompts."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from heddle.families import (
    MAX_GENERATED_TOKENS,
    OBSERVATION_CAP,
    draw_shape,
    generate_family,
)
from heddle.tracestats import trace_stats
from scheduler.libra import prompt_key

SEEDS = range(12)


def test_the_seed_draws_the_structure() -> None:
    shapes = [draw_shape(s) for s in SEEDS]
    assert len({s.turn_mode for s in shapes}) == 3
    assert len({len(s.tools) for s in shapes}) >= 3
    medians = [s.output_median for s in shapes]
    assert max(medians) / min(medians) > 5
    assert draw_shape(3) == draw_shape(3)
    assert generate_family("random", prompts=3, seed=3) == generate_family(
        "random", prompts=3, seed=3
    )


def test_limits_hold_on_every_seed() -> None:
    for seed in SEEDS:
        shape = draw_shape(seed)
        for r in generate_family("random", prompts=20, samples=8, seed=seed):
            spec = r.spec
            context = spec.prompt_tokens + sum(
                s.output_tokens + s.tool_output_tokens for s in spec.steps
            )
            assert context <= shape.max_context, (seed, spec.trajectory_id)
            assert spec.generated_tokens <= MAX_GENERATED_TOKENS
            assert len(spec.steps) <= shape.max_turns
            for s in spec.steps[:-1]:
                tool = next(t for t in shape.tools if t.name == s.tool)
                assert s.tool_latency_s <= tool.timeout_s
                assert s.tool_output_tokens <= OBSERVATION_CAP
                assert (s.tool_status == "timeout") == (s.tool_latency_s == tool.timeout_s)


def test_long_tails_and_group_variance_across_seeds() -> None:
    tails, cvs = [], []
    for seed in SEEDS:
        stats = trace_stats([r.spec for r in generate_family("random", prompts=40, seed=seed)])
        tails.append(stats["generated_tokens"]["max_over_median"])
        cvs.append(stats["group_cv_mean"])
    assert statistics.median(tails) >= 4
    assert statistics.median(cvs) >= 0.4
    assert max(tails) / min(tails) > 2  # the seeds differ in how long their tails are


def test_history_is_of_other_prompts_unless_epoch() -> None:
    def prompts(iteration: int, epoch: bool) -> set[str]:
        records = generate_family("random", prompts=50, seed=1, iteration=iteration, epoch=epoch)
        return {prompt_key(r.spec.group_id) for r in records}

    assert len(prompts(0, False) & prompts(1, False)) <= 2
    assert prompts(0, True) == prompts(1, True)
    # A prompt keeps its length when it returns; the policy's drift moves the outputs.
    a, b = (generate_family("random", prompts=5, seed=1, iteration=it, epoch=True) for it in (0, 1))
    assert [r.spec.prompt_tokens for r in a] == [r.spec.prompt_tokens for r in b]
    assert [r.spec.steps for r in a] != [r.spec.steps for r in b]


def test_the_robustness_benchmark_merges_runs_of_disjoint_draws_and_refuses_overlaps(
    tmp_path: Path,
) -> None:
    """`benchmarks/robustness.py --merge`: parts run apart report as one run, in draw
    order; a draw in two parts is an error naming the file, not a silent pick."""
    from benchmarks.robustness import merged

    def cells(*indices: int) -> list[dict[str, object]]:
        return [{"draw": {"index": i}, "sim_wall_s": 1.0} for i in indices]

    a, b, c = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"
    a.write_text(json.dumps(cells(1002, 1003)))
    b.write_text(json.dumps(cells(1000, 1001)))
    c.write_text(json.dumps(cells(1001)))
    assert [x["draw"]["index"] for x in merged([a, b])] == [1000, 1001, 1002, 1003]
    with pytest.raises(SystemExit, match=r"c\.json: draw 1001 is in an earlier file too"):
        merged([a, b, c])
    d = tmp_path / "d.json"
    d.write_text(json.dumps({"draw": 1}))
    with pytest.raises(SystemExit, match=r"d\.json: not a robustness\.json"):
        merged([d])


def test_the_robustness_benchmark_reruns_heddle_alone_against_the_stored_peers() -> None:
    """`--peers-from`: with a draw's stored cell, only Heddle's policies and verl run,
    and the cell comes out as the full run's; a stored verl that no longer matches (the
    peers changed) is refused rather than compared against."""
    from benchmarks.robustness import Draw, run_draw

    draw = Draw.of(1000)
    full = run_draw(draw, 3, 4, oracle=True)
    again = run_draw(draw, 3, 4, oracle=True, stored=full)
    assert {k: v for k, v in again.items() if k != "sim_wall_s"} == {
        k: v for k, v in full.items() if k != "sim_wall_s"
    }
    moved = {**full, "makespan_s": {**full["makespan_s"], "verl": full["makespan_s"]["verl"] + 1}}
    with pytest.raises(ValueError, match="the peers changed"):
        run_draw(draw, 3, 4, oracle=True, stored=moved)
    with pytest.raises(ValueError, match=r"not .* with 24"):
        run_draw(draw, 6, 4, oracle=True, stored=full)
