"""The LLM step activity, one worker per engine instance (task queue `engine.<id>`)."""

from __future__ import annotations

import time
from collections.abc import Callable

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.heartbeat import heartbeating
from engines.core import RequestTooLarge
from engines.pool import Engine
from engines.request import EngineRequest
from engines.vllm import EngineDead
from heddle import activity_names as names
from heddle.types import GenerateRequest, GenerateResult


class EngineActivities:
    def __init__(self, *, engine: Engine, on_dead: Callable[[str], None] | None = None) -> None:
        self.engine = engine
        self.on_dead = on_dead  # the host stops offering the instance before the retry

    @activity.defn(name=names.GENERATE)
    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Generate one step. A retried attempt resumes from the tokens its predecessor
        heartbeated: those are already part of the context."""
        info = activity.info()
        resumed = int(info.heartbeat_details[0]) if info.heartbeat_details else 0
        resumed = min(resumed, request.max_new_tokens)
        made = resumed

        def on_progress(tokens: int) -> None:
            nonlocal made
            made = resumed + tokens

        started = time.time()
        if resumed >= request.max_new_tokens:
            return GenerateResult(
                instance_id=self.engine.instance_id,
                output_tokens=resumed,
                started_at=started,
                finished_at=started,
                attempt=info.attempt,
                resumed_tokens=resumed,
            )
        engine_request = EngineRequest(
            request_id=f"{request.request_id}#{info.attempt}",
            prefix_key=request.trajectory_id,
            context_tokens=request.context_tokens + resumed,
            max_new_tokens=request.max_new_tokens - resumed,
            priority=request.priority,
        )
        try:
            async with heartbeating(lambda: made):
                result = await self.engine.generate(engine_request, on_progress)
        except RequestTooLarge as exc:
            # No retry can make it fit; the trajectory fails, the batch goes on.
            raise ApplicationError(str(exc), type="RequestTooLarge", non_retryable=True) from exc
        except EngineDead as exc:
            # A retry here would find the same dead engine: the workflow re-decides.
            if self.on_dead is not None:
                self.on_dead(self.engine.instance_id)
            raise ApplicationError(
                str(exc), resumed + exc.made, type=names.ENGINE_DEAD, non_retryable=True
            ) from exc
        return GenerateResult(
            instance_id=self.engine.instance_id,
            output_tokens=resumed + result.output_tokens,
            cached_tokens=result.cached_tokens,
            queued_s=result.queued_s,
            started_at=result.started_at,
            finished_at=result.finished_at,
            attempt=info.attempt,
            resumed_tokens=resumed,
            moved_to=result.moved_to,
        )
