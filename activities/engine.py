"""The LLM step activity, one worker per engine instance (task queue `engine.<id>`).

On the lean step path (`GenerateRequest.decided` set) the engine host keeps the step's
books itself, where the facts are: the KV a decision moved comes from its source first,
a decode the scheduler stops mid-step goes on on its new instance within this activity,
the step's end is reported to the host's scheduler service, and the re-prediction for
the tool call that follows moves the KV while the tool runs. The workflow then pays one
Temporal round trip per LLM step.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.agent import AgentTurns
from activities.heartbeat import heartbeating
from engines.core import RequestTooLarge
from engines.pool import Engine, EnginePool
from engines.request import EngineRequest, Sampling
from engines.simulated import EngineResult, SimulatedEngine
from engines.vllm import EngineDead
from heddle import activity_names as names
from heddle import metrics
from heddle.types import GenerateRequest, GenerateResult, StepReport
from scheduler.service import SchedulerService

log = logging.getLogger(__name__)


class EngineActivities:
    def __init__(
        self,
        *,
        engine: Engine,
        on_dead: Callable[[str], None] | None = None,
        pool: EnginePool | None = None,
        service: SchedulerService | None = None,
        agent: AgentTurns | None = None,
    ) -> None:
        self.engine = engine
        self.agent = agent  # the host's agent turns (vLLM engines only)
        self.on_dead = on_dead  # the host stops offering the instance before the retry
        self.pool = pool  # the host's other instances, where a stopped decode goes on
        self.service = service  # the host's scheduler: the lean path's books

    @activity.defn(name=names.GENERATE)
    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Generate one step (or agent turn), counted for the metrics on the instance
        where it ended."""
        with metrics.LLM_STEP_SECONDS.time():
            if request.agent is not None:
                result = await self._agent_turn(request)
            else:
                result = await self._generate(request)
        metrics.LLM_STEPS.labels(result.instance_id).inc()
        return result

    async def _generate(self, request: GenerateRequest) -> GenerateResult:
        """A replayed step. A retried attempt resumes from the tokens its predecessor
        heartbeated: those are already part of the context."""
        info = activity.info()
        resumed = int(info.heartbeat_details[0]) if info.heartbeat_details else 0
        resumed = min(resumed, request.max_new_tokens)
        made = resumed

        def on_progress(tokens: int) -> None:
            nonlocal made
            made = base + tokens

        started = time.time()
        if resumed >= request.max_new_tokens:
            # Made before a retry (perhaps during the tool's wait, which starts again).
            return GenerateResult(
                instance_id=self.engine.instance_id,
                output_tokens=resumed,
                started_at=started,
                finished_at=started,
                attempt=info.attempt,
                resumed_tokens=resumed,
                wait_left_s=await self._tool_wait(request, resumed),
            )
        lean = request.decided is not None and self.pool is not None
        engine, first, base = self.engine, None, resumed
        if lean and request.move_from:
            await self._move(request.trajectory_id, request.move_from, engine.instance_id)
        try:
            async with heartbeating(lambda: made):
                while True:
                    result = await self._step(engine, request, base, info.attempt, on_progress)
                    first = first or result
                    made = base = base + result.output_tokens
                    target = result.moved_to
                    if not lean or not target or made >= request.max_new_tokens:
                        break
                    # Stopped mid-decode by the scheduler: the rest runs on `target`.
                    assert self.pool is not None
                    if target not in self.pool.engines:
                        break  # it stopped meanwhile: the workflow decides the rest
                    self._report(request, engine.instance_id)
                    await self._move(request.trajectory_id, engine.instance_id, target)
                    engine = self.pool[target]
        finally:
            if lean:
                self._report(request, engine.instance_id)
        done = made >= request.max_new_tokens
        moved_to = "" if lean and done else result.moved_to
        next_instance = self._anticipate(request, engine.instance_id, made) if lean else ""
        return GenerateResult(
            instance_id=engine.instance_id,
            output_tokens=made,
            cached_tokens=first.cached_tokens,
            queued_s=first.queued_s,
            started_at=first.started_at,
            finished_at=result.finished_at,
            attempt=info.attempt,
            resumed_tokens=resumed,
            moved_to=moved_to,
            next_instance=next_instance,
            # The KV move the re-prediction began runs during this wait.
            wait_left_s=await self._tool_wait(request, made) if done else 0.0,
        )

    async def _agent_turn(self, request: GenerateRequest) -> GenerateResult:
        """One model turn of an agent trajectory: sampled on this instance (or, stopped
        mid-decode by the scheduler, continued on another from the exact tokens made),
        then parsed and stored by the host's `AgentTurns`. A retried turn starts over."""
        if self.agent is None:
            raise ApplicationError(
                "this engine host runs no model for agent turns (simulated engines)",
                type="NoAgentModel", non_retryable=True,
            )  # fmt: skip
        agent = request.agent
        assert agent is not None
        info = activity.info()
        turn = await self.agent.prepare(request)
        lean = request.decided is not None and self.pool is not None
        engine = self.engine
        if lean and request.move_from:
            await self._move(request.trajectory_id, request.move_from, engine.instance_id)
        sampling = Sampling(agent.temperature, agent.top_p, agent.seed)
        ids: list[int] = []
        logprobs: list[float] = []
        finish, first, result = "context", None, None
        base = 0

        def on_progress(tokens: int) -> None:
            nonlocal made
            made = base + tokens

        made = 0
        version = -1
        try:
            async with heartbeating(lambda: made):
                while len(ids) < turn.max_new_tokens:
                    engine_request = EngineRequest(
                        request_id=f"{request.request_id}#{info.attempt}+{len(ids)}",
                        prefix_key=request.trajectory_id,
                        context_tokens=len(turn.prompt) + len(ids),
                        max_new_tokens=turn.max_new_tokens - len(ids),
                        priority=request.priority,
                        sampling=sampling,
                        prompt_ids=turn.prompt + ids,
                    )
                    result = await self._run(
                        engine, engine_request, len(ids), request.trajectory_id, on_progress
                    )
                    first = first or result
                    ids += result.output_ids
                    logprobs += result.output_logprobs
                    version = max(version, result.weight_version)
                    base = made = len(ids)
                    finish = result.finish_reason or "length"
                    target = result.moved_to
                    if result.finish_reason or not target:
                        break
                    # Stopped mid-decode to move: the rest is sampled from the ids made.
                    if lean and self.pool is not None and target in self.pool.engines:
                        self._report(request, engine.instance_id)
                        await self._move(request.trajectory_id, engine.instance_id, target)
                        engine = self.pool[target]
        finally:
            if lean:
                self._report(request, engine.instance_id)
        outcome = await self.agent.finish(request, turn, ids, logprobs, finish, max(version, 0))
        now = time.time()
        before_tool = bool(outcome.calls)
        next_instance = ""
        if lean and before_tool:
            next_instance = self._anticipate(
                request, engine.instance_id, len(ids), outcome.output_ngrams
            )
        return GenerateResult(
            instance_id=engine.instance_id,
            output_tokens=len(ids),
            cached_tokens=first.cached_tokens if first else 0,
            queued_s=first.queued_s if first else 0.0,
            started_at=first.started_at if first else now,
            finished_at=result.finished_at if result else now,
            attempt=info.attempt,
            next_instance=next_instance,
            turn=outcome,
        )

    async def _tool_wait(self, request: GenerateRequest, made: int) -> float:
        """Wait out the replayed tool that follows the step, heartbeating (a lost worker
        is noticed within the heartbeat timeout), counted as that tool's call. Cut short
        when this worker stops (its instance retired): returns what is left, which the
        workflow waits instead, so no retry is left on the queue of an instance that is
        gone."""
        seconds = request.then_wait_s
        if request.then_tool:
            metrics.TOOL_SECONDS.labels(request.then_tool).observe(max(0.0, seconds))
            if request.then_tool_status != "ok":
                metrics.TOOL_ERRORS.labels(request.then_tool, request.then_tool_status).inc()
        if seconds <= 0:
            return 0.0
        deadline = time.monotonic() + seconds
        async with heartbeating(lambda: made):
            shutdown = asyncio.ensure_future(activity.wait_for_worker_shutdown())
            try:
                await asyncio.wait([shutdown], timeout=seconds)
            finally:
                shutdown.cancel()
        return max(0.0, deadline - time.monotonic()) if activity.is_worker_shutdown() else 0.0

    async def _step(
        self,
        engine: Engine,
        request: GenerateRequest,
        made: int,
        attempt: int,
        on_progress: Callable[[int], None],
    ) -> EngineResult:
        """The step's tokens from `made` on, on `engine`."""
        engine_request = EngineRequest(
            request_id=f"{request.request_id}#{attempt}" + (f"+{made}" if made else ""),
            prefix_key=request.trajectory_id,
            context_tokens=request.context_tokens + made,
            max_new_tokens=request.max_new_tokens - made,
            priority=request.priority,
            reserve_kv_tokens=request.reserve_kv_tokens,
            ends_session=request.ends_session,
        )
        prefills = self.pool.prefills if self.pool is not None else None
        if prefills is not None and not made and isinstance(engine, SimulatedEngine):
            first = await prefills.prefill(engine, engine_request)
            if first is not None:  # the first token came from a prefill instance
                return await self._after_prefill(engine, engine_request, first, on_progress)
        return await self._run(engine, engine_request, made, request.trajectory_id, on_progress)

    async def _after_prefill(
        self,
        engine: Engine,
        engine_request: EngineRequest,
        first: EngineResult,
        on_progress: Callable[[int], None],
    ) -> EngineResult:
        """The rest of a step whose prefill and first token were made elsewhere, its KV
        now here: the step's result counts both."""
        on_progress(1)
        rest = EngineRequest(
            request_id=f"{engine_request.request_id}+1",
            prefix_key=engine_request.prefix_key,
            context_tokens=engine_request.context_tokens + 1,
            max_new_tokens=engine_request.max_new_tokens - 1,
            priority=engine_request.priority,
            reserve_kv_tokens=engine_request.reserve_kv_tokens,
            ends_session=engine_request.ends_session,
        )
        result = await self._run(
            engine, rest, 1, engine_request.prefix_key, lambda tokens: on_progress(tokens + 1)
        )
        return EngineResult(
            request_id=engine_request.request_id,
            output_tokens=result.output_tokens + 1,
            cached_tokens=first.cached_tokens,
            queued_s=first.queued_s,
            started_at=first.started_at,
            finished_at=result.finished_at,
            moved_to=result.moved_to,
        )

    async def _run(
        self,
        engine: Engine,
        engine_request: EngineRequest,
        made: int,
        trajectory_id: str,
        on_progress: Callable[[int], None],
    ) -> EngineResult:
        """One engine request, its failures as the workflow reads them."""
        request = engine_request
        if self.pool is not None:
            await self.pool.settled(trajectory_id)  # a move still under way
        try:
            result = await engine.generate(request, on_progress)
        except RequestTooLarge as exc:
            # No retry can make it fit; the trajectory fails, the batch goes on.
            raise ApplicationError(str(exc), type="RequestTooLarge", non_retryable=True) from exc
        except EngineDead as exc:
            # A retry here would find the same dead engine: the workflow re-decides.
            if self.on_dead is not None:
                self.on_dead(engine.instance_id)
            raise ApplicationError(
                str(exc), made + exc.made, type=names.ENGINE_DEAD, non_retryable=True
            ) from exc
        metrics.GENERATED_TOKENS.labels(engine.instance_id).inc(result.output_tokens)
        return result

    async def _move(self, trajectory_id: str, source: str, target: str) -> None:
        assert self.pool is not None
        await self.pool.settled(trajectory_id)  # the move during the tool call comes first
        try:
            await self.pool.move_prefix(trajectory_id, source, target)
        except Exception:  # the target recomputes the context instead
            log.exception("KV move of %s from %s to %s failed", trajectory_id, source, target)

    def _report(self, request: GenerateRequest, instance_id: str) -> None:
        if self.service is not None:
            self.service.report(
                StepReport(request.trajectory_id, instance_id, request.step_index, 0)
            )

    def _anticipate(
        self,
        request: GenerateRequest,
        instance_id: str,
        made: int,
        ngrams: tuple[float, ...] = (),
    ) -> str:
        """Re-predict as the step ends, before the tool's result; where the new rank
        calls for another instance, the KV moves there while the tool runs."""
        if not request.anticipate or self.service is None or request.decided is None:
            return ""
        assert self.pool is not None
        ahead = request.decided.after_output(made, ngrams)
        try:
            move = self.service.anticipate(ahead, time.time())
        except Exception:  # no move: the next decide places the step anyway
            log.exception("re-prediction of %s failed", request.trajectory_id)
            return ""
        if move is None or move.instance_id == instance_id:
            return ""
        metrics.MIGRATIONS.labels("tool_call").inc()
        self.pool.move_prefix_soon(request.trajectory_id, instance_id, move.instance_id)
        return move.instance_id
