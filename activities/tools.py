"""Tool calls (task queue `tools`): trace replay or real execution."""

from __future__ import annotations

import asyncio
import time

from temporalio import activity

from activities.agent import observation_ref
from activities.heartbeat import heartbeating
from activities.store import in_store, replay_reward
from activities.toolkit.base import ToolRegistry, count_tokens
from activities.verify import verify
from heddle import activity_names as names
from heddle import metrics
from heddle.store import TrajectoryStore
from heddle.textfeatures import hashed_ngrams
from heddle.types import RewardRequest, ToolRequest, ToolResult, Verdict, VerifyRequest

# A verifier gets this long beyond its own (unit tests') timeout before its reward is an
# error: a custom verifier that hangs must not hold the batch.
VERIFY_GRACE_S = 30.0


class ToolActivities:
    def __init__(
        self, *, registry: ToolRegistry, store: TrajectoryStore, time_scale: float = 1.0
    ) -> None:
        self.registry = registry
        self.store = store
        self.time_scale = time_scale

    @activity.defn(name=names.RUN_TOOL)
    async def run_tool(self, request: ToolRequest) -> ToolResult:
        tool = request.tool or "unknown"
        try:
            with metrics.TOOL_SECONDS.labels(tool).time():
                async with heartbeating():
                    result = await self._run_tool(request)
        except Exception:
            metrics.TOOL_ERRORS.labels(tool, "crash").inc()
            raise
        if result.status != "ok":
            metrics.TOOL_ERRORS.labels(tool, result.status).inc()
        return result

    async def _run_tool(self, request: ToolRequest) -> ToolResult:
        if request.mode == "replay":
            # The trace's tool: same latency (in cluster time) and output size.
            await asyncio.sleep(request.latency_s * self.time_scale)
            return ToolResult(
                status=request.status,
                output_tokens=request.output_tokens,
                latency_s=request.latency_s,
            )
        started = time.monotonic()
        tool_input = None
        if request.tool_input_ref:
            tool_input = await in_store(self.store.get_text, request.tool_input_ref)
        observation = await self.registry.call(request.tool, tool_input)
        elapsed = time.monotonic() - started
        ref = observation_ref(
            request.batch_id, request.trajectory_id, request.step_index, request.call_index
        )
        await in_store(self.store.put_text, ref, observation.text)
        return ToolResult(
            status=observation.status,
            output_tokens=count_tokens(observation.text),
            latency_s=elapsed / self.time_scale,
            observation_ref=ref,
            error=observation.text[:200] if observation.status != "ok" else "",
            observation_ngrams=hashed_ngrams(observation.text),
        )

    @activity.defn(name=names.REWARD)
    async def reward(self, request: RewardRequest) -> float:
        """The trace's reward where it has one; else 1 for a trajectory that reached a
        final answer after a successful last tool call, 0 otherwise."""
        recorded = await in_store(self.store.trace_reward, request.batch_id, request.trajectory_id)
        return replay_reward(recorded, request)

    @activity.defn(name=names.VERIFY)
    async def verify(self, request: VerifyRequest) -> Verdict:
        """An agent trajectory's reward: its task's verifier on its final turn. A
        verifier that crashes or times out is a verdict with an error, never a failure."""
        task = await in_store(self.store.get_task, request.batch_id, request.task_id)
        turns = await in_store(self.store.load_turns, request.batch_id, request.trajectory_id)
        stored = turns.get(request.trajectory_id, [])
        if request.finish_reason != "answer" or not stored:
            return Verdict(0.0, f"no final answer ({request.finish_reason})")
        limit = task.verifier.timeout_s + VERIFY_GRACE_S
        async with heartbeating():
            try:
                return await asyncio.wait_for(verify(task.verifier, stored[-1].text), limit)
            except TimeoutError:
                return Verdict(0.0, "the verifier failed", error=f"timed out after {limit:g} s")
