"""Workload families: generators whose latent structure is itself drawn.

`heddle.workloads` has three fixed shapes that Heddle's policy was tuned on. A family
seed here first draws a *shape*: what drives a trajectory's length (the group's shared
difficulty, a turn count drawn per sample, per-turn verbosity, error-driven fix loops),
its tools (latencies lognormal with heavy tails and a timeout), observation sizes up to a
few thousand tokens, prompt lengths, the context limit, and how the policy drifts
between iterations. Then every iteration draws its batch of prompts from a data set of
thousands, so an earlier iteration's trace is a history of *other* prompts from the same
distribution, as in a real campaign (`epoch=True` keeps the same prompts every
iteration, the setting of `heddle.workloads`).

Nothing here is tuned to a policy: the ranges are wide on purpose, and a benchmark
judges a policy across many family seeds (benchmarks/robustness.py).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from heddle.trace import TraceRecord
from heddle.types import StepSpec, TrajectorySpec

FAMILIES = ("random",)
TOOL_NAMES = ("python", "search", "calculator", "browser", "shell", "sql")
# Qwen3's context (tokens of prompt, outputs and observations together) and the paper's
# 40K generated-token budget per trajectory.
MAX_CONTEXT_TOKENS = 40_960
MAX_GENERATED_TOKENS = 40_000
# Tools truncate what they return (a search's pages, a test log) to this many tokens.
OBSERVATION_CAP = 4_096


def _log_uniform(rng: random.Random, lo: float, hi: float) -> float:
    return math.exp(rng.uniform(math.log(lo), math.log(hi)))


@dataclass(frozen=True)
class ToolShape:
    name: str
    weight: float  # how often the model picks it
    latency_median_s: float
    latency_sigma: float  # lognormal; 1.5 is a heavy tail
    timeout_s: float  # a call running past it returns "timeout" at this latency
    observation_median: float
    observation_sigma: float


@dataclass(frozen=True)
class FamilyShape:
    """The drawn latent structure of one family seed."""

    prompt_median: float
    prompt_sigma: float
    output_median: float
    first_turn_factor: float  # the first turn's length against later ones (planning)
    difficulty_sigma: float  # shared by a GRPO group
    difficulty_jitter_sigma: float  # a prompt's difficulty moves between iterations
    verbosity_sigma: float  # shared by a sample's turns
    turn_sigma: float  # per turn
    turn_mode: str  # "uniform", "geometric" or "difficulty"
    turns_mean: float
    max_turns: int
    error_rate: float  # a tool call fails (times difficulty), forcing fix turns
    fix_turns_max: int
    tools: tuple[ToolShape, ...]
    max_context: int
    drift_output: float  # relative change of output length per iteration
    drift_errors: float  # relative change of the error rate per iteration
    dataset_prompts: int


def draw_shape(seed: int) -> FamilyShape:
    """One family: every parameter drawn from a wide range."""
    rng = random.Random(f"family:random:{seed}")
    names = rng.sample(TOOL_NAMES, rng.randint(1, 4))
    tools = tuple(
        ToolShape(
            name=name,
            weight=rng.uniform(0.2, 1.0),
            latency_median_s=_log_uniform(rng, 0.01, 3.0),
            latency_sigma=rng.uniform(0.3, 1.6),
            timeout_s=rng.choice((5.0, 10.0, 30.0, 60.0)),
            observation_median=_log_uniform(rng, 10, 2000),
            observation_sigma=rng.uniform(0.3, 1.0),
        )
        for name in names
    )
    return FamilyShape(
        prompt_median=_log_uniform(rng, 80, 3000),
        prompt_sigma=rng.uniform(0.1, 0.8),
        output_median=_log_uniform(rng, 80, 2500),
        first_turn_factor=_log_uniform(rng, 0.5, 3.0),
        difficulty_sigma=rng.uniform(0.05, 0.9),
        difficulty_jitter_sigma=rng.uniform(0.05, 0.4),
        verbosity_sigma=rng.uniform(0.1, 0.9),
        turn_sigma=rng.uniform(0.2, 0.9),
        turn_mode=rng.choice(("uniform", "geometric", "difficulty")),
        turns_mean=_log_uniform(rng, 1.5, 12),
        max_turns=rng.randint(8, 40),
        error_rate=rng.uniform(0.0, 0.4),
        fix_turns_max=rng.randint(1, 3),
        tools=tools,
        max_context=rng.choice((16_384, 32_768, MAX_CONTEXT_TOKENS)),
        drift_output=rng.uniform(-0.03, 0.08),
        drift_errors=rng.uniform(-0.1, 0.05),
        dataset_prompts=rng.randint(2_000, 20_000),
    )


def _planned_turns(rng: random.Random, shape: FamilyShape, difficulty: float) -> int:
    """The turns a sample means to take before any fix loop; drawn per sample."""
    mean = shape.turns_mean
    if shape.turn_mode == "uniform":
        turns = rng.randint(1, max(1, round(2 * mean - 1)))
    elif shape.turn_mode == "geometric":
        turns = 1 + int(rng.expovariate(1 / max(mean - 1, 0.05)))
    else:  # harder prompts take more turns
        turns = 1 + int(rng.expovariate(1 / max((mean - 1) * difficulty, 0.05)))
    return max(1, min(turns, shape.max_turns))


def _tool_call(rng: random.Random, tool: ToolShape) -> tuple[float, str, int]:
    latency = tool.latency_median_s * rng.lognormvariate(0, tool.latency_sigma)
    observation = round(tool.observation_median * rng.lognormvariate(0, tool.observation_sigma))
    observation = min(observation, OBSERVATION_CAP)
    if latency >= tool.timeout_s:
        return tool.timeout_s, "timeout", min(observation, 64)
    return latency, "ok", observation


def _trajectory(
    rng: random.Random,
    shape: FamilyShape,
    tid: str,
    gid: str,
    workload: str,
    prompt_tokens: int,
    difficulty: float,
    output_scale: float,
    error_rate: float,
) -> TrajectorySpec:
    turns = _planned_turns(rng, shape, difficulty)
    verbosity = rng.lognormvariate(0, shape.verbosity_sigma)
    weights = [t.weight for t in shape.tools]
    steps: list[StepSpec] = []
    context = prompt_tokens
    generated = 0
    i = 0
    while True:
        scale = shape.output_median * output_scale * difficulty * verbosity
        if i == 0:
            scale *= shape.first_turn_factor
        room = min(MAX_GENERATED_TOKENS - generated, shape.max_context - context)
        out = max(1, min(int(rng.lognormvariate(0, shape.turn_sigma) * scale), room))
        generated += out
        context += out
        tool = rng.choices(shape.tools, weights)[0]
        latency, status, observation = _tool_call(rng, tool)
        failed = status == "ok" and rng.random() < min(0.9, error_rate * difficulty)
        if failed:
            status = "error"
            turns += rng.randint(1, shape.fix_turns_max)  # the model tries to fix it
        room_after = min(
            MAX_GENERATED_TOKENS - generated, shape.max_context - context - observation
        )
        last = i + 1 >= min(turns, shape.max_turns) or room_after < 16
        if last:
            steps.append(StepSpec(output_tokens=out))
            break
        steps.append(
            StepSpec(
                output_tokens=out,
                tool=tool.name,
                tool_latency_s=round(latency, 4),
                tool_status=status,
                tool_output_tokens=observation,
            )
        )
        context += observation
        i += 1
    return TrajectorySpec(
        trajectory_id=tid,
        group_id=gid,
        prompt_tokens=prompt_tokens,
        steps=tuple(steps),
        workload=workload,
    )


def batch_prompts(
    shape: FamilyShape, seed: int, iteration: int, prompts: int, epoch: bool
) -> list[int]:
    """The data set's prompt indices an iteration samples: the same ones every iteration
    with `epoch`, else a fresh draw without replacement (a prompt rarely returns)."""
    if epoch:
        return list(range(prompts))
    rng = random.Random(f"family:random:{seed}:batch{iteration}")
    return rng.sample(range(max(shape.dataset_prompts, prompts)), prompts)


def generate_family(
    family: str,
    *,
    prompts: int,
    samples: int = 16,
    seed: int = 0,
    iteration: int = 0,
    epoch: bool = False,
) -> list[TraceRecord]:
    """A trace of `prompts` GRPO groups of `samples` trajectories of family seed `seed`."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; valid: {list(FAMILIES)}")
    if prompts < 1 or samples < 1:
        raise ValueError(f"prompts and samples must be >= 1, got {prompts} and {samples}")
    shape = draw_shape(seed)
    workload = f"{family}-{seed}"
    output_scale = max(0.3, 1 + shape.drift_output * iteration)
    error_rate = shape.error_rate * max(0.3, 1 + shape.drift_errors * iteration)
    rng = random.Random(f"family:random:{seed}:it{iteration}")
    records = []
    for p in batch_prompts(shape, seed, iteration, prompts, epoch):
        # A prompt's own length and difficulty, the same whenever it is drawn.
        prompt_rng = random.Random(f"family:random:{seed}:prompt{p}")
        prompt_tokens = max(
            1, round(shape.prompt_median * prompt_rng.lognormvariate(0, shape.prompt_sigma))
        )
        prompt_tokens = min(prompt_tokens, shape.max_context // 2)
        difficulty = prompt_rng.lognormvariate(0, shape.difficulty_sigma) * rng.lognormvariate(
            0, shape.difficulty_jitter_sigma
        )
        gid = f"it{iteration}-p{p}"
        for s in range(samples):
            spec = _trajectory(
                rng, shape, f"{gid}-s{s}", gid, workload, prompt_tokens, difficulty,
                output_scale, error_rate,
            )  # fmt: skip
            records.append(TraceRecord(spec=spec))
    return records
