"""The order a batch's trajectories start in. Starting thousands of workflows takes the
stack tens of seconds of CPU (docs/benchmarks.md, "The live path at scale"), while the
simulator starts them all at once; a trajectory that starts late finishes late, so the
ones expected to run longest start first and the ramp falls on the short ones. The
expectation is the earlier iteration's: a prompt keeps its difficulty across iterations
(GRPO samples it again), so its trajectories' mean length there ranks it here. The
batch's own lengths are never read: live, they are not known before it runs."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from heddle.types import TrajectorySpec
from scheduler.libra import prompt_key


def longest_expected_first(
    specs: Sequence[TrajectorySpec], history: Sequence[TrajectorySpec]
) -> list[int]:
    """Indices of `specs` in start order: by the mean generated tokens of the history's
    trajectories of the same prompt, longest first; a prompt the history lacks ranks at
    the history's mean; ties (and everything, without a history) keep the given order."""
    if not history:
        return list(range(len(specs)))
    made: dict[str, list[int]] = defaultdict(list)
    for h in history:
        made[prompt_key(h.group_id)].append(h.generated_tokens)
    mean = {k: sum(v) / len(v) for k, v in made.items()}
    overall = sum(h.generated_tokens for h in history) / len(history)
    expected = [mean.get(prompt_key(s.group_id), overall) for s in specs]
    return sorted(range(len(specs)), key=lambda i: (-expected[i], i))
