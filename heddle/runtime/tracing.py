"""OpenTelemetry traces of a worker's workflows and activities (`heddle worker --traces`),
through the Temporal SDK's `TracingInterceptor`: a batch's trajectories, each step's
decide, generate and tool call as spans an OTLP collector (Jaeger, Tempo) shows.

The `otel` extra brings the OpenTelemetry SDK and its OTLP exporter; the exporter reads
the standard `OTEL_EXPORTER_OTLP_*` variables. A file target writes one JSON span a line,
for a machine with no collector (and the tests).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

OTLP = "otlp"


class TracingUnavailable(ImportError):
    """The OpenTelemetry SDK is not installed (the `otel` extra)."""


def require_sdk() -> None:
    """Raise `TracingUnavailable`, naming the extra, where the OpenTelemetry SDK is
    missing: checked before a worker starts, so the mistake is one clean error."""
    try:
        import opentelemetry.sdk  # noqa: F401
    except ImportError as exc:
        raise TracingUnavailable(
            f"--traces needs the OpenTelemetry SDK: pip install 'heddle[otel]' ({exc})"
        ) from exc


def tracing_interceptor(target: str) -> Any:
    """Set up this process's tracer provider to export to `target` ("otlp" or a file
    path) and return the interceptor the client takes (`require_sdk` first)."""
    require_sdk()
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from temporalio.contrib.opentelemetry import TracingInterceptor

    provider = TracerProvider(resource=Resource.create({"service.name": "heddle-worker"}))
    provider.add_span_processor(BatchSpanProcessor(_exporter(target)))
    trace.set_tracer_provider(provider)
    # Batches are started by clients that trace nothing (the CLI): without this, no
    # workflow would have a span to hang its own on.
    return TracingInterceptor(always_create_workflow_spans=True)


def flush_traces() -> None:
    """Export the spans still buffered (a stopping worker)."""
    from opentelemetry import trace

    provider = trace.get_tracer_provider()
    shutdown = getattr(provider, "shutdown", None)
    if shutdown is not None:
        shutdown()


def _exporter(target: str) -> Any:
    if target == OTLP:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()
    return _json_lines_exporter(Path(target))


def _json_lines_exporter(path: Path) -> Any:
    """An exporter that appends spans to `path`, one JSON object a line."""
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    path.parent.mkdir(parents=True, exist_ok=True)

    class JsonLines(SpanExporter):  # type: ignore[misc]
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            with path.open("a") as out:
                for span in spans:
                    out.write(json.dumps(json.loads(span.to_json())) + "\n")
            return SpanExportResult.SUCCESS

    return JsonLines()
