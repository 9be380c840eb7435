"""The scheduler service as every worker reaches it: in the engine host's process, or
over a loopback-or-LAN socket from any other worker.

The engine host owns the one `SchedulerService` of a cluster (it knows what every engine
holds). A trajectory's decide is a local activity of whichever worker runs the
workflow, so it costs no Temporal round trip; that activity calls `LocalScheduler` when
its process is the engine host, or `RemoteScheduler`, which sends the call to the host's
`SchedulerServer` (newline-delimited JSON, one connection per worker, calls multiplexed
by id). The host announces the server's address in the cluster plan.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from temporalio.converter import AdvancedJSONEncoder, value_to_type

from heddle import metrics
from heddle.types import DecideRequest, Decision, StepReport, TrajectoryDone
from scheduler.service import BatchNotPlanned, SchedulerService

log = logging.getLogger(__name__)

# A call that gets no answer in this long fails; the local activity retries it.
CALL_TIMEOUT_S = 10.0


class LocalScheduler:
    """The service of this process, with the engine host's replanning: a restarted
    service that lost a planned batch plans it again from the store on its first call.
    It also keeps the metrics of what the service decides: decide latency, migrations,
    and each running trajectory's latest forecast (`forecasts`)."""

    def __init__(
        self,
        service: SchedulerService,
        replan: Callable[[str, str], Awaitable[None]] | None = None,
    ) -> None:
        self.service = service
        self.replan = replan
        # trajectory -> (predicted remaining tokens, instance), while it runs.
        self.forecasts: dict[str, tuple[int, str]] = {}

    async def _ensure_planned(self, request: DecideRequest) -> None:
        if request.planned and not self.service.is_planned(request.policy, request.batch_id):
            if self.replan is None:
                raise BatchNotPlanned(request.policy, request.batch_id)
            await self.replan(request.policy, request.batch_id)

    async def decide(self, request: DecideRequest) -> Decision:
        await self._ensure_planned(request)
        began = time.perf_counter()
        decision = self.service.decide(request, time.time())
        metrics.DECIDE_SECONDS.labels(request.policy).observe(time.perf_counter() - began)
        if decision.migrate:
            metrics.MIGRATIONS.labels("step_start").inc()
        if decision.predicted_remaining >= 0:
            self.forecasts[request.trajectory_id] = (
                decision.predicted_remaining,
                decision.instance_id,
            )
        return decision

    async def anticipate(self, request: DecideRequest) -> Decision | None:
        await self._ensure_planned(request)
        move = self.service.anticipate(request, time.time())
        if move is not None:
            metrics.MIGRATIONS.labels("tool_call").inc()
        return move

    async def report(self, report: StepReport) -> None:
        self.service.report(report)

    async def finished(self, done: TrajectoryDone) -> None:
        self.service.finished(done)
        self.forecasts.pop(done.trajectory_id, None)


# The calls a remote worker makes: the argument's type and the result's.
_CALLS: dict[str, tuple[type, Any]] = {
    "decide": (DecideRequest, Decision),
    "anticipate": (DecideRequest, Decision | None),
    "report": (StepReport, None),
    "finished": (TrajectoryDone, None),
}


def _dumps(message: dict[str, Any]) -> bytes:
    return json.dumps(message, cls=AdvancedJSONEncoder).encode() + b"\n"


class SchedulerServer:
    """Serves a `LocalScheduler` to the workers of other processes."""

    def __init__(self, scheduler: LocalScheduler) -> None:
        self.scheduler = scheduler
        self._server: asyncio.Server | None = None
        self.calls: Counter[str] = Counter()  # served, by call
        self._answering: set[asyncio.Task[None]] = set()

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Listen; returns the HOST:PORT to announce."""
        self._server = await asyncio.start_server(self._serve, host, port)
        bound = self._server.sockets[0].getsockname()
        return f"{bound[0]}:{bound[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                message = json.loads(line)
                task = asyncio.create_task(self._answer(message, writer))
                self._answering.add(task)
                task.add_done_callback(self._answering.discard)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _answer(self, message: dict[str, Any], writer: asyncio.StreamWriter) -> None:
        call_id, op = message["id"], message["op"]
        self.calls[op] += 1
        try:
            arg_type, _ = _CALLS[op]
            result = await getattr(self.scheduler, op)(value_to_type(arg_type, message["arg"]))
            reply = {"id": call_id, "ok": result}
        except Exception as exc:
            reply = {"id": call_id, "error": f"{type(exc).__name__}: {exc}"}
        with contextlib.suppress(ConnectionError):
            writer.write(_dumps(reply))
            await writer.drain()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        log.info("the scheduler served other workers: %s", json.dumps(dict(self.calls)))


class SchedulerUnavailable(RuntimeError):
    """The engine host's scheduler could not be reached or failed the call (retried)."""


class RemoteScheduler:
    """The engine host's service, called from another process. `address()` says where it
    is now (the cluster plan's announcement): a restarted host is found again."""

    def __init__(self, address: Callable[[], str]) -> None:
        self.address = address
        self._ids = itertools.count()
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._connected_to = ""
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    async def _connection(self) -> asyncio.StreamWriter:
        async with self._lock:
            address = self.address()
            if not address:
                raise SchedulerUnavailable("the engine host has not announced its scheduler yet")
            if self._writer is None or self._connected_to != address or self._writer.is_closing():
                await self._disconnect()
                host, port = address.rsplit(":", 1)
                reader, self._writer = await asyncio.open_connection(host, int(port))
                self._connected_to = address
                self._reader_task = asyncio.create_task(self._read(reader))
            return self._writer

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while line := await reader.readline():
                message = json.loads(line)
                future = self._pending.pop(message["id"], None)
                if future is not None and not future.done():
                    future.set_result(message)
        finally:
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(SchedulerUnavailable("the connection closed"))
            self._pending.clear()

    async def _disconnect(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._reader_task is not None:
            self._reader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader_task
        self._writer = self._reader_task = None

    async def _call(self, op: str, arg: Any) -> Any:
        try:
            writer = await self._connection()
        except OSError as exc:
            raise SchedulerUnavailable(f"no scheduler at {self.address()!r}: {exc}") from exc
        call_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[call_id] = future
        writer.write(_dumps({"id": call_id, "op": op, "arg": arg}))
        try:
            reply = await asyncio.wait_for(future, CALL_TIMEOUT_S)
        finally:
            self._pending.pop(call_id, None)
        if "error" in reply:
            raise SchedulerUnavailable(reply["error"])
        _, result_type = _CALLS[op]
        return None if result_type is None else value_to_type(result_type, reply["ok"])

    async def decide(self, request: DecideRequest) -> Decision:
        result: Decision = await self._call("decide", request)
        return result

    async def anticipate(self, request: DecideRequest) -> Decision | None:
        result: Decision | None = await self._call("anticipate", request)
        return result

    async def report(self, report: StepReport) -> None:
        await self._call("report", report)

    async def finished(self, done: TrajectoryDone) -> None:
        await self._call("finished", done)

    async def close(self) -> None:
        async with self._lock:
            await self._disconnect()
