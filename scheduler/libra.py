"""Libra's causal prefix tree of residual lengths and its bucket placement.

Rule (REFERENCES.md "Libra C-MLFQ"): a per-prompt tree keyed by tool-return states
`tool:size-bin:status` (size bins <=500, <=5000, larger), each node keeping the mean and
P90 of the residual generated length over its last 200 observations, with a global tree
as fallback. Every trajectory starts in the short bucket; on a tool return it moves only
if mean and P90 agree on the other bucket; a move carries its KV during the tool call.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from heddle.types import Decision, TrajectorySpec, TrajectoryView, tool_state
from scheduler.interface import InstanceState
from scheduler.placement import least_loaded

WINDOW = 200
LONG_THRESHOLD_TOKENS = 5_000


def prompt_key(group_id: str) -> str:
    """The prompt a GRPO group samples, across iterations ("it3-p17" -> "p17")."""
    head, _, rest = group_id.partition("-")
    return rest if head.startswith("it") and rest else group_id


@dataclass
class _Node:
    residuals: deque[int] = field(default_factory=lambda: deque(maxlen=WINDOW))
    children: dict[str, _Node] = field(default_factory=dict)

    def stats(self) -> tuple[float, float]:
        values = sorted(self.residuals)
        p90 = values[min(len(values) - 1, math.ceil(0.9 * len(values)) - 1)]
        return sum(values) / len(values), float(p90)


@dataclass
class PrefixTree:
    roots: dict[str, _Node] = field(default_factory=dict)
    global_root: _Node = field(default_factory=_Node)

    def observe(self, prompt: str, path: Sequence[str], residual: int) -> None:
        for root in (self.roots.setdefault(prompt, _Node()), self.global_root):
            node = root
            for state in path:
                node = node.children.setdefault(state, _Node())
            node.residuals.append(residual)

    def observe_trajectory(self, spec: TrajectorySpec) -> None:
        """Every tool-return point of a finished trajectory, with what was left after it."""
        total = spec.generated_tokens
        made = 0
        path: list[str] = []
        for step in spec.steps:
            self.observe(prompt_key(spec.group_id), path, total - made)
            made += step.output_tokens
            if step.tool is not None:
                path.append(tool_state(step.tool, step.tool_output_tokens, step.tool_status))

    def estimate(self, prompt: str, path: Sequence[str]) -> tuple[float, float] | None:
        """(mean, P90) at the deepest matching node, per prompt first, then global."""
        for root in (self.roots.get(prompt), self.global_root):
            node, found = root, None
            for state in path:
                if node is None:
                    break
                node = node.children.get(state)
                if node is not None and node.residuals:
                    found = node
            if found is None and root is not None and root.residuals and not path:
                found = root
            if found is not None:
                return found.stats()
        return None


@dataclass
class LibraPlacement:
    tree: PrefixTree = field(default_factory=PrefixTree)
    threshold: int = LONG_THRESHOLD_TOKENS
    bucket: dict[str, str] = field(default_factory=dict)
    _seen: dict[str, list[tuple[tuple[str, ...], int]]] = field(default_factory=dict)

    def learn(self, history: Iterable[TrajectorySpec]) -> None:
        for spec in history:
            self.tree.observe_trajectory(spec)

    def place(
        self, event: TrajectoryView, instances: Sequence[InstanceState], now: float
    ) -> Decision:
        tid = event.trajectory_id
        self._seen.setdefault(tid, []).append((event.tool_path, event.generated_tokens))
        current = self.bucket.get(tid, "short")
        wanted, reason = current, "stay"
        if event.step_index > 0:
            est = self.tree.estimate(prompt_key(event.group_id), event.tool_path)
            if est is not None:
                mean, p90 = est
                if mean > self.threshold and p90 > self.threshold:
                    wanted = "long"
                elif mean <= self.threshold and p90 <= self.threshold:
                    wanted = "short"
        self.bucket[tid] = wanted
        pool = [s for s in instances if s.role == wanted] or list(instances)
        prev = event.previous_instance
        if prev is not None and any(s.instance_id == prev for s in pool):
            return Decision(prev, reason=reason)
        best = least_loaded(pool)
        moved = prev is not None
        return Decision(
            best.instance_id, reason=f"to_{wanted}" if moved else "start", migrate=moved
        )

    def on_step_done(self, event: TrajectoryView, instance_id: str, output_tokens: int) -> None:
        return None

    def on_trajectory_done(
        self, trajectory_id: str, group_id: str, generated_tokens: int, num_turns: int
    ) -> None:
        # Online learning from the batch's own finished trajectories (siblings first).
        for path, made in self._seen.pop(trajectory_id, []):
            self.tree.observe(prompt_key(group_id), path, generated_tokens - made)
        self.bucket.pop(trajectory_id, None)


@dataclass(frozen=True)
class MultiLevelFeedback:
    """C-MLFQ's order, approximated: levels by attained service (doubling from 500
    tokens), lower level first, preemptive."""

    queue: str = "priority"
    base_tokens: int = 500

    def priority(self, event: TrajectoryView, now: float) -> int:
        return int(math.log2(event.generated_tokens / self.base_tokens + 1))
