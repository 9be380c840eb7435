"""Heddle's Prometheus metrics: what an operator watches on a dashboard while a batch runs.

Every worker process serves them at its `--metrics` address (`serve`); the Temporal
SDK's own metrics go to a second address through its runtime (`sdk_runtime`), since the
SDK's core exports from its own thread. Counters count events where they happen: a step
in the engine activity, a trajectory's end in the store activity, a tool call in the tool
activity; gauges that describe state (queues, KV, forecasts) are read at scrape time
from the objects that hold it (`watch_engines`, `watch_forecasts`), so nothing goes
stale between scrapes. A retried activity counts again: these are events, and the store
is the record.

Names follow Prometheus' conventions (`_total` counters, `_seconds` histograms, base
units). An engine instance is the `engine` label: `instance` is the scrape target's, which
Prometheus sets itself. `docker/grafana/heddle.json` charts them.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

# Latencies from a decide (sub-millisecond) to an engine restart (minutes).
_FAST = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_SLOW = (0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)

LLM_STEPS = Counter(
    "heddle_llm_steps", "LLM steps (or agent turns) the engines ended, by instance", ["engine"]
)
GENERATED_TOKENS = Counter(
    "heddle_generated_tokens", "Tokens the engines generated, by instance", ["engine"]
)
LLM_STEP_SECONDS = Histogram(
    "heddle_llm_step_seconds", "Wall time of an LLM step activity, queue wait included",
    buckets=_SLOW,
)  # fmt: skip
DECIDE_SECONDS = Histogram(
    "heddle_decide_seconds", "Time the engine host's scheduler took to decide a step",
    ["policy"], buckets=_FAST,
)  # fmt: skip
MIGRATIONS = Counter(
    "heddle_migrations",
    "Trajectories moved to another instance: at a step's start, during its tool call "
    "(re-predicted as the step ended), or mid-step (a review)",
    ["when"],
)
KV_MOVE_SECONDS = Histogram(
    "heddle_kv_move_seconds", "Time a trajectory's KV move between instances took",
    buckets=(*_FAST, 5.0, 10.0),
)  # fmt: skip
KV_MOVED_TOKENS = Counter("heddle_kv_moved_tokens", "Context tokens moved between instances")
PREFILL_HANDOFFS = Counter(
    "heddle_prefill_handoffs",
    "Steps prefilled on an instance serving prefill, their KV then sent to their own",
)
OFFLOADED_PREFILL_TOKENS = Counter(
    "heddle_offloaded_prefill_tokens", "Context tokens prefilled on instances serving prefill"
)
PREFILL_INSTANCES = Gauge("heddle_prefill_instances", "Instances serving prefill now")
RESHAPES = Counter(
    "heddle_reshapes",
    "Cluster reshapes (instances retired for new ones of another TP), by kind and outcome",
    ["kind", "outcome"],
)
RESHAPE_SECONDS = Histogram(
    "heddle_reshape_seconds", "Time from asking for a reshape to its new instances up",
    ["kind"], buckets=_SLOW,
)  # fmt: skip
TRAJECTORIES = Counter(
    "heddle_trajectories", "Trajectories ended, by status and finish reason",
    ["status", "finish_reason"],
)  # fmt: skip
TOOL_SECONDS = Histogram(
    "heddle_tool_seconds", "Wall time of a tool call, by tool", ["tool"], buckets=_SLOW
)
TOOL_ERRORS = Counter(
    "heddle_tool_errors", "Tool calls that did not return ok, by tool and status",
    ["tool", "status"],
)  # fmt: skip

# Every label value a dashboard charts starts at 0, not absent until its first event.
for _when in ("step_start", "tool_call", "mid_step"):
    MIGRATIONS.labels(_when)
for _kind in ("batch_split", "rollout"):
    for _outcome in ("done", "refused"):
        RESHAPES.labels(_kind, _outcome)

# How many of the longest forecasts `heddle_predicted_remaining_tokens` shows, by rank.
FORECAST_RANKS = 5


class EngineView(Protocol):
    """What the engine gauges read of an instance (`engines.pool.Engine` has it)."""

    @property
    def kv_usage(self) -> float: ...

    def running_decodes(self) -> list[Any]: ...

    def queued_steps(self) -> list[Any]: ...


class _EngineCollector(Collector):
    def __init__(
        self, engines: Callable[[], Mapping[str, EngineView]], tps: Callable[[], Mapping[str, int]]
    ) -> None:
        self.engines = engines
        self.tps = tps

    def collect(self) -> Iterable[GaugeMetricFamily]:
        queued = GaugeMetricFamily(
            "heddle_engine_queued_steps", "Steps waiting in an instance's engine",
            labels=["engine"],
        )  # fmt: skip
        running = GaugeMetricFamily(
            "heddle_engine_running_steps", "Steps decoding on an instance", labels=["engine"]
        )
        kv = GaugeMetricFamily(
            "heddle_engine_kv_usage_ratio", "Share of an instance's KV cache in use",
            labels=["engine"],
        )  # fmt: skip
        tp = GaugeMetricFamily(
            "heddle_engine_tp", "Tensor-parallel degree of each hosted instance",
            labels=["engine"],
        )  # fmt: skip
        tps = self.tps()
        for iid, engine in sorted(self.engines().items()):
            try:
                queued.add_metric([iid], len(engine.queued_steps()))
                running.add_metric([iid], len(engine.running_decodes()))
                kv.add_metric([iid], engine.kv_usage)
            except Exception:  # an engine stopping under the scrape
                log.debug("engine %s could not be read for metrics", iid, exc_info=True)
                continue
            if iid in tps:
                tp.add_metric([iid], tps[iid])
        yield from (queued, running, kv, tp)


class _ForecastCollector(Collector):
    def __init__(self, forecasts: Callable[[], Mapping[str, tuple[int, str]]]) -> None:
        self.forecasts = forecasts

    def collect(self) -> Iterable[GaugeMetricFamily]:
        items = list(self.forecasts().items())
        top = GaugeMetricFamily(
            "heddle_predicted_remaining_tokens",
            "The longest forecasts of trajectories' remaining tokens (rank 1 the longest), "
            "with the instance each last ran on",
            labels=["rank", "trajectory", "engine"],
        )
        longest = heapq.nlargest(FORECAST_RANKS, items, key=lambda kv: kv[1][0])
        for rank, (tid, (tokens, instance)) in enumerate(longest, 1):
            top.add_metric([str(rank), tid, instance], tokens)
        count = GaugeMetricFamily(
            "heddle_forecast_trajectories", "Running trajectories the scheduler forecasts"
        )
        count.add_metric([], len(items))
        yield from (top, count)


def watch_engines(
    engines: Callable[[], Mapping[str, EngineView]], tps: Callable[[], Mapping[str, int]]
) -> None:
    """Serve per-instance queue depth, running steps, KV use and TP, read at scrape time."""
    REGISTRY.register(_EngineCollector(engines, tps))


def watch_forecasts(forecasts: Callable[[], Mapping[str, tuple[int, str]]]) -> None:
    """Serve the longest forecasts: `forecasts()` maps a running trajectory to its latest
    (predicted remaining tokens, instance)."""
    REGISTRY.register(_ForecastCollector(forecasts))


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host or "0.0.0.0", int(port)


class MetricsAddressError(OSError):
    """The metrics address cannot be served (taken, or not this machine's)."""


def serve(address: str) -> None:
    """Serve this process's metrics over HTTP at HOST:PORT (`/metrics`)."""
    host, port = _host_port(address)
    try:
        start_http_server(port, addr=host)
    except OSError as exc:
        raise MetricsAddressError(f"cannot serve metrics at {address}: {exc.strerror}") from exc
    log.info("metrics at http://%s:%d/metrics", host, port)


def sdk_runtime(address: str) -> Any:
    """A Temporal runtime that serves the SDK's own metrics (workflow and activity task
    latencies, poll results, sticky cache) in Prometheus' format at HOST:PORT."""
    from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

    return Runtime(telemetry=TelemetryConfig(metrics=PrometheusConfig(bind_address=address)))
