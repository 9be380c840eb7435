"""The stack's Prometheus endpoints, scraped while a batch runs and after it: every
worker's Heddle metrics and the Temporal SDK's, the server's own, and the counters equal
to what the batch report and the store say happened. Traces: a worker with `--traces`
writes the workflows' and activities' spans."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import signal
import time
import urllib.request
from collections import Counter
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from heddle.client import HeddleClient
from heddle.runtime.stack import EmbeddedStack, free_port
from heddle.trace import load_trace
from heddle.types import RolloutOptions
from tests.live import SMALL_CLUSTER, kill_process, worker_process

ROOT = Path(__file__).resolve().parent.parent


Samples = dict[str, list[tuple[dict[str, str], float]]]


def scrape(address: str) -> Samples:
    """An endpoint's samples by name: (labels, value) each."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, []).append((s.labels, s.value))
    return samples


def total(scrapes: list[Samples], name: str, **labels: str) -> float:
    """The sum of a metric's samples over endpoints, those with `labels` only."""
    return sum(
        value
        for samples in scrapes
        for got, value in samples.get(name, [])
        if all(got.get(k) == v for k, v in labels.items())
    )


def records_with_tool_errors() -> list:
    """The demo trace, every fifth tool call failing (replayed as such)."""
    records = load_trace(ROOT / "examples" / "demo-coding-64.jsonl")
    calls = 0
    out = []
    for rec in records:
        steps = []
        for step in rec.spec.steps:
            if step.tool:
                calls += 1
                if calls % 5 == 0:
                    step = dataclasses.replace(step, tool_status="error")
            steps.append(step)
        out.append(dataclasses.replace(rec, spec=dataclasses.replace(rec.spec, steps=steps)))
    return out


def test_metrics_during_a_batch_match_its_report(tmp_path: Path) -> None:
    stack = EmbeddedStack(
        state_dir=tmp_path / "stack",
        port=free_port(),
        headless=True,
        cluster=SMALL_CLUSTER,
        time_scale=0.05,
        num_workers=2,  # the engine host and a worker that reaches its scheduler remotely
    )
    records = records_with_tool_errors()

    async def run() -> None:
        await stack.start()
        targets = stack.metrics_targets
        assert len(targets["heddle"]) == len(targets["temporal-sdk"]) == 2
        groups = json.loads((stack.state_dir / "prometheus-targets.json").read_text())
        assert {g["labels"]["job"] for g in groups} == {"heddle", "temporal-sdk", "temporal-server"}
        client = await HeddleClient.connect(stack.address, store_url=stack.store_url)
        async with client:
            # Heddle's policy learns from an earlier batch: the same trace stands in.
            handle = await client.start_rollout(
                records=records, options=RolloutOptions(policy="heddle"), history=records
            )
            report_task = asyncio.ensure_future(handle.report())
            # Mid-batch: steps counted, the engines' queues and the forecasts shown.
            deadline = time.monotonic() + 120
            seen_forecast = seen_steps = False
            while not report_task.done() and not (seen_forecast and seen_steps):
                assert time.monotonic() < deadline, "no step was ever counted mid-batch"
                try:
                    host = await asyncio.to_thread(scrape, targets["heddle"][0])
                except OSError:  # the worker still starting
                    await asyncio.sleep(0.2)
                    continue
                seen_steps = seen_steps or total([host], "heddle_llm_steps_total") > 0
                forecasts = host.get("heddle_predicted_remaining_tokens", [])
                if forecasts:
                    seen_forecast = True
                    ranks = sorted(int(labels["rank"]) for labels, _ in forecasts)
                    assert ranks == list(range(1, len(ranks) + 1))
                    values = [v for _, v in sorted(forecasts, key=lambda f: int(f[0]["rank"]))]
                    assert values == sorted(values, reverse=True)
                    assert all(labels["engine"] for labels, _ in forecasts)
                await asyncio.sleep(0.2)
            assert seen_steps, "the batch ended before a scrape saw a step"
            assert seen_forecast, "no scrape showed a forecast"
            report = await asyncio.wait_for(report_task, 300)
            rows = await client.list_trajectories(handle.batch_id, limit=1000)
            plan = await client.cluster_plan()
        assert report.completed == len(records)
        await asyncio.sleep(0.5)  # the last counts land after the workflow's result

        heddle = [await asyncio.to_thread(scrape, a) for a in targets["heddle"]]
        assert total(heddle, "heddle_generated_tokens_total") == report.generated_tokens
        assert total(heddle, "heddle_llm_steps_total") == sum(r["turns"] for r in rows)
        assert total(heddle, "heddle_trajectories_total", status="completed") == report.completed
        assert total(heddle, "heddle_trajectories_total", status="failed") == report.failed == 0
        expected_calls = sum(1 for r in records for s in r.spec.steps if s.tool)
        assert total(heddle, "heddle_tool_seconds_count") == expected_calls
        errors = Counter(
            (s.tool, s.tool_status) for r in records for s in r.spec.steps
            if s.tool and s.tool_status != "ok"
        )  # fmt: skip
        assert errors
        for (tool, status), n in errors.items():
            assert total(heddle, "heddle_tool_errors_total", tool=tool, status=status) == n
        # Every step's decide was served by the engine host's scheduler.
        host, other = heddle
        assert total([host], "heddle_decide_seconds_count", policy="heddle") >= total(
            heddle, "heddle_llm_steps_total"
        )
        assert total([other], "heddle_decide_seconds_count") == 0
        # The split the batch planned, applied as one reshape, and its instances' gauges.
        assert total([host], "heddle_reshapes_total", kind="batch_split", outcome="done") == 1
        instances = {labels["engine"]: v for labels, v in host["heddle_engine_tp"]}
        assert instances == {i.instance_id: i.tp for i in plan.instances}
        queues = {labels["engine"] for labels, _ in host["heddle_engine_queued_steps"]}
        assert queues == set(instances)
        assert total([host], "heddle_engine_running_steps") == 0
        assert total([host], "heddle_forecast_trajectories") == 0  # all ended
        moves = {labels["when"] for labels, _ in host["heddle_migrations_total"]}
        assert moves == {"step_start", "tool_call", "mid_step"}
        if len(instances) == 1:  # the split the policy planned for this trace
            assert total([host], "heddle_migrations_total") == 0

        # The Temporal SDK's metrics on each worker, the server's own.
        for address in targets["temporal-sdk"]:
            sdk = await asyncio.to_thread(scrape, address)
            assert (
                total([sdk], "temporal_workflow_completed_total") > 0
                or total([sdk], "temporal_activity_execution_latency_count") > 0
            ), sorted(sdk)[:20]
        server = await asyncio.to_thread(scrape, targets["temporal-server"][0])
        assert any(name.startswith("service_requests") for name in server), sorted(server)[:20]

    try:
        asyncio.run(run())
    finally:
        stack.stop()


def test_a_worker_with_traces_exports_its_workflows_and_activities_spans(
    temporal_address: str, store_url: str, queue_prefix: str, tmp_path: Path
) -> None:
    spans_file = tmp_path / "spans.jsonl"
    records = load_trace(ROOT / "examples" / "demo-coding-64.jsonl")[:6]

    async def run() -> None:
        worker = worker_process(
            temporal_address, store_url, queue_prefix, tmp_path / "worker.log",
            time_scale=0.02, extra=("--traces", str(spans_file)),
        )  # fmt: skip
        try:
            client = await HeddleClient.connect(
                temporal_address, store_url=store_url, queue_prefix=queue_prefix
            )
            async with client:
                handle = await client.start_rollout(records=records)
                report = await asyncio.wait_for(handle.report(), 120)
                assert report.completed == len(records)
        finally:
            kill_process(worker, signal.SIGTERM)  # a clean stop flushes the spans

    asyncio.run(run())
    spans = [json.loads(line) for line in spans_file.read_text().splitlines()]
    names = Counter(span["name"] for span in spans)
    assert names["RunWorkflow:TrajectoryWorkflow"] == len(records), names
    assert names["RunActivity:generate"] >= sum(len(r.spec.steps) for r in records), names
    # One trace a trajectory: its activities' spans hang under its workflow's.
    by_id = {span["context"]["span_id"]: span for span in spans}
    generate = next(s for s in spans if s["name"] == "RunActivity:generate")
    parent = by_id.get(generate["parent_id"])
    assert parent is not None
    assert parent["context"]["trace_id"] == generate["context"]["trace_id"]
