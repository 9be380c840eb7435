"""A live engine that steps the clockless core in wall-clock time.

Each iteration's modelled duration, multiplied by `time_scale`, is slept, so a live run on
simulated engines takes the cluster's time scaled; reports divide by the scale again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from engines.core import EngineCore
from engines.request import EngineRequest

log = logging.getLogger(__name__)

# Sleeps shorter than this are accumulated rather than taken one by one: asyncio's timer
# resolution and the event loop's overhead would otherwise dominate small iterations.
MIN_SLEEP_S = 0.002
# How far behind schedule the loop may fall (a busy CPU) before it stops catching up.
MAX_LAG_S = 0.25


@dataclass
class EngineResult:
    request_id: str
    output_tokens: int
    cached_tokens: int
    queued_s: float
    started_at: float
    finished_at: float
    moved_to: str = ""  # stopped mid-decode to continue on another instance
    # A sampled (agent) turn: the ids the model made, the log-prob of each, and why it
    # stopped (vLLM's `stop` at the end-of-turn token, `length` at the budget).
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    finish_reason: str = ""
    weight_version: int = -1  # of a sampled turn's weights (-1: not reported)


class _Pending:
    __slots__ = ("added_at", "future", "on_progress", "request", "started_at")

    def __init__(
        self,
        request: EngineRequest,
        future: asyncio.Future[EngineResult],
        on_progress: Callable[[int], None] | None,
        added_at: float,
    ) -> None:
        self.request = request
        self.future = future
        self.on_progress = on_progress
        self.added_at = added_at
        self.started_at = 0.0


class SimulatedEngine:
    """One engine instance on simulated hardware."""

    kind = "simulated"

    def __init__(self, *, instance_id: str, core: EngineCore, time_scale: float = 1.0) -> None:
        if time_scale <= 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        self.instance_id = instance_id
        self.core = core
        self.time_scale = time_scale
        self._pending: dict[str, _Pending] = {}
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def load(self) -> int:
        """Requests waiting or running on this instance."""
        return self.core.num_requests

    @property
    def kv_usage(self) -> float:
        return self.core.kv_usage

    @property
    def is_healthy(self) -> bool:
        """A simulated engine does not die (its worker process may)."""
        return True

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name=f"engine-{self.instance_id}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for pending in self._pending.values():
            if not pending.future.done():
                pending.future.set_exception(RuntimeError(f"engine {self.instance_id} stopped"))
        self._pending.clear()

    async def generate(
        self, request: EngineRequest, on_progress: Callable[[int], None] | None = None
    ) -> EngineResult:
        """Run one LLM step to completion; `on_progress(tokens)` as tokens are made."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[EngineResult] = loop.create_future()
        self.core.add_request(request)
        self._pending[request.request_id] = _Pending(request, future, on_progress, time.time())
        self._wakeup.set()
        try:
            return await future
        except asyncio.CancelledError:
            self.abort(request.request_id)
            raise

    def running_decodes(self) -> list[EngineRequest]:
        """Requests that have generated, preempted ones included (as vLLM's stream shows
        them): what a mid-step review sees."""
        waiting = [r for r in self.core.queued() if r.num_output_tokens]
        return [r for r in self.core.running if r.num_output_tokens] + waiting

    def queued_steps(self) -> list[EngineRequest]:
        """Requests waiting for a seat: an instance being emptied moves them too."""
        return self.core.queued()

    def stop_to_move(self, request_id: str, target: str) -> bool:
        """End a request now, running or queued, as made so far, to continue on
        `target`; its KV stays here as a cached prefix for the move. False if it is no
        longer here."""
        pending = self._pending.get(request_id)
        if pending is None:
            return False
        request = pending.request
        if request_id not in self.core or request.is_finished:
            return False
        made = request.num_output_tokens
        self.core.abort(request_id)
        del self._pending[request_id]
        if not pending.future.done():
            now = time.time()
            started_at = pending.started_at or now  # a queued step "starts" as it leaves
            pending.future.set_result(
                EngineResult(
                    request_id=request_id,
                    output_tokens=made,
                    cached_tokens=request.num_cached_tokens,
                    queued_s=max(0.0, started_at - pending.added_at),
                    started_at=started_at,
                    finished_at=now,
                    moved_to=target,
                )
            )
        return True

    def abort(self, request_id: str) -> None:
        self.core.abort(request_id)
        pending = self._pending.pop(request_id, None)
        if pending is not None and not pending.future.done():
            pending.future.cancel()

    async def _loop(self) -> None:
        target = time.monotonic()
        while True:
            if not self.core.has_work():
                self._wakeup.clear()
                await self._wakeup.wait()
                target = time.monotonic()
                continue
            out = self.core.step()
            now_wall = time.time()
            for request_id, made in out.advanced.items():
                pending = self._pending.get(request_id)
                if pending is None:
                    continue
                if not pending.started_at:
                    pending.started_at = now_wall
                if made and pending.on_progress is not None:
                    pending.on_progress(pending.request.num_output_tokens)
            scaled = out.duration_s * self.time_scale
            target += scaled
            delay = target - time.monotonic()
            if delay >= MIN_SLEEP_S:
                await asyncio.sleep(delay)
            else:
                if delay < -MAX_LAG_S:
                    target = time.monotonic()
                await asyncio.sleep(0)
            finished_at = time.time()
            for request_id in out.finished:
                pending = self._pending.pop(request_id, None)
                if pending is None or pending.future.done():
                    continue
                request = pending.request
                pending.future.set_result(
                    EngineResult(
                        request_id=request_id,
                        output_tokens=request.num_output_tokens,
                        cached_tokens=request.num_cached_tokens,
                        queued_s=max(0.0, pending.started_at - pending.added_at),
                        started_at=pending.started_at,
                        finished_at=finished_at,
                    )
                )
