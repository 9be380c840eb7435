"""Synthetic agentic workloads, written as traces.

The shape follows what the Heddle paper and its peers report (REFERENCES.md):
- long tails: a turn's output is lognormal, and the number of turns grows with every
  failed tool call (a failed test triggers fix turns), so the slowest trajectory runs
  many times the median (`heddle trace stats` prints max/median);
- strong variance inside a GRPO group: samples share the prompt's difficulty, but each
  draws its own turns, errors and output lengths;
- tool latency means from the paper's setting: coding 0.41-0.46 s, search 1.41-1.43 s,
  math 0.046-0.054 s (exponential around 0.45, 1.4 and 0.05 s);
- a 40K generated-token budget per trajectory (the paper's max tokens);
- prompts are a data set that every iteration draws again (an epoch per iteration): a
  prompt keeps its length and its difficulty, which moves a little as the policy learns
  (`DIFFICULTY_JITTER_SIGMA`);
- drift between iterations: as the policy trains, turns get longer and tools fail less
  (`DRIFT_*` below), so an earlier iteration's trace predicts a later one imperfectly.

The calibration targets are tested in tests/test_workloads.py.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from heddle.trace import TraceRecord
from heddle.types import StepSpec, TrajectorySpec


@dataclass(frozen=True)
class WorkloadShape:
    tool: str
    tool_latency_mean_s: float
    prompt_tokens: tuple[int, int]
    output_tokens_median: float
    # Lognormal sigmas of a turn's output: a sample-level verbosity shared by all its
    # turns (a sample that reasons at length keeps doing so), and per-turn noise.
    verbosity_sigma: float
    tool_output_tokens: tuple[int, int]
    error_rate: float  # chance a tool call fails and forces a fix turn
    base_turns: tuple[int, int]
    turn_sigma: float = 0.55
    max_turns: int = 24
    max_tokens: int = 40_000


WORKLOADS: dict[str, WorkloadShape] = {
    # Qwen3 thinking on CodeForces: long turns, failing tests force fix turns.
    "coding": WorkloadShape("python", 0.45, (300, 1500), 900, 0.7, (20, 400), 0.30, (1, 4)),
    # Search-R1 style on HotpotQA: short turns, several searches, long observations.
    "search": WorkloadShape("search", 1.4, (100, 400), 350, 0.5, (200, 1200), 0.10, (1, 5), 0.5),
    # DAPO-Math with a calculator: long reasoning, few cheap tool calls.
    "math": WorkloadShape("calculator", 0.05, (80, 400), 900, 0.7, (5, 60), 0.12, (1, 3)),
}
# Per iteration: turns grow 3% longer, tool errors 5% rarer (relative), down to a floor.
DRIFT_OUTPUT_PER_ITERATION = 0.03
DRIFT_ERRORS_PER_ITERATION = 0.05
# A prompt's difficulty in one iteration: its own (lognormal, sigma 0.5) times this much
# lognormal change, so the prompt's record from an earlier iteration is a noisy guide.
DIFFICULTY_JITTER_SIGMA = 0.25


def _trajectory(
    rng: random.Random,
    shape: WorkloadShape,
    tid: str,
    gid: str,
    workload: str,
    prompt_tokens: int,
    difficulty: float,
) -> TraceRecord:
    turns = rng.randint(*shape.base_turns)
    verbosity = rng.lognormvariate(0, shape.verbosity_sigma)
    steps: list[StepSpec] = []
    total = 0
    i = 0
    while True:
        scale = shape.output_tokens_median * difficulty * verbosity
        out = int(rng.lognormvariate(0, shape.turn_sigma) * scale)
        out = max(8, min(out, shape.max_tokens - total))
        total += out
        last = i + 1 >= turns or i + 1 >= shape.max_turns or total >= shape.max_tokens - 8
        if last:
            steps.append(StepSpec(output_tokens=out))
            break
        failed = rng.random() < shape.error_rate * difficulty
        if failed:
            turns += 1  # the model tries to fix what failed
        status = "error" if failed else ("timeout" if rng.random() < 0.02 else "ok")
        steps.append(
            StepSpec(
                output_tokens=out,
                tool=shape.tool,
                tool_latency_s=round(rng.expovariate(1 / shape.tool_latency_mean_s), 4),
                tool_status=status,
                tool_output_tokens=rng.randint(*shape.tool_output_tokens),
            )
        )
        i += 1
    spec = TrajectorySpec(
        trajectory_id=tid,
        group_id=gid,
        prompt_tokens=prompt_tokens,
        steps=tuple(steps),
        workload=workload,
    )
    return TraceRecord(spec=spec)


def generate(
    workload: str, *, prompts: int, samples: int = 16, seed: int = 0, iteration: int = 0
) -> list[TraceRecord]:
    """A trace of `prompts` GRPO groups of `samples` trajectories each."""
    try:
        shape = WORKLOADS[workload]
    except KeyError:
        raise ValueError(f"unknown workload {workload!r}; valid: {sorted(WORKLOADS)}") from None
    rng = random.Random(f"{workload}:{seed}:{iteration}")
    shape = replace(
        shape,
        output_tokens_median=shape.output_tokens_median
        * (1 + DRIFT_OUTPUT_PER_ITERATION * iteration),
        error_rate=shape.error_rate * max(0.5, 1 - DRIFT_ERRORS_PER_ITERATION * iteration),
    )
    records = []
    for p in range(prompts):
        gid = f"it{iteration}-p{p}"
        # The prompt's own length and difficulty, the same in every iteration.
        prompt_rng = random.Random(f"{workload}:{seed}:prompt{p}")
        prompt_tokens = prompt_rng.randint(*shape.prompt_tokens)
        # Difficulty is shared by the group; samples still diverge widely.
        difficulty = prompt_rng.lognormvariate(0, 0.5) * rng.lognormvariate(
            0, DIFFICULTY_JITTER_SIGMA
        )
        for s in range(samples):
            records.append(
                _trajectory(rng, shape, f"{gid}-s{s}", gid, workload, prompt_tokens, difficulty)
            )
    return records


def scale_tokens(records: list[TraceRecord], factor: float) -> list[TraceRecord]:
    """The same trajectories with every token count times `factor` (at least 1): a tiny
    model on CPU replays a workload's shape at a fraction of its size."""
    if not 0 < factor <= 1:
        raise ValueError(f"token scale must be in (0, 1], got {factor}")

    def scaled(n: int) -> int:
        return max(1, round(n * factor)) if n else 0

    return [
        replace(
            r,
            spec=replace(
                r.spec,
                prompt_tokens=scaled(r.spec.prompt_tokens),
                steps=tuple(
                    replace(
                        s,
                        output_tokens=scaled(s.output_tokens),
                        tool_output_tokens=scaled(s.tool_output_tokens),
                    )
                    for s in r.spec.steps
                ),
            ),
        )
        for r in records
    ]
