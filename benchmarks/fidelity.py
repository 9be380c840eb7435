"""Fidelity: the same trace in the simulator and live (Temporal dev server, simulated
engines, SQLite store), and what orchestration costs per step.

    python benchmarks/fidelity.py [--prompts 4] [--wall 120] [--policy verl ...]

For each policy: the simulator's makespan, then a live rollout on a fresh embedded stack
at a time scale chosen so it takes about `--wall` seconds; live makespan is in the
cluster's time (wall / time scale), so the ratio compares like with like (target: within
10%). From the recorded Temporal histories, per LLM step: schedule-to-start (the task
waiting in its queue for a worker poll) and the activity's round trip beyond the
engine's own time, p50 and p99, in wall milliseconds. Then the ceiling: a trace of tiny
steps with no tool waits, run as fast as the stack goes, gives the steps per second one
worker process sustains (`--workers` processes share the workflows and tools; one hosts
the engines), with the dev server's state in a file (the embedded stack's default) and
in memory.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from live_scale import live_stack, tiny_trace  # this folder's sibling script

from heddle import activity_names as names
from heddle.bench import run_bench
from heddle.config import ClusterConfig
from heddle.stats import percentile
from heddle.trace import TraceRecord
from heddle.types import RolloutOptions
from heddle.workloads import generate
from scheduler.registry import PLANS_SPLIT


async def live_run(
    records: list[TraceRecord],
    cluster: ClusterConfig,
    policy: str,
    time_scale: float,
    workers: int = 1,
    history: list[TraceRecord] | None = None,
    persist: bool = True,
) -> tuple[Any, list[Any]]:
    """One rollout on a fresh embedded stack; its report and the trajectories' histories.
    A policy that learns first sees `history` rolled out on the same stack."""
    async with live_stack(cluster, time_scale, workers=workers, persist=persist) as (_, client):
        if history:
            await (await client.start_rollout(records=history)).report()
        handle = await client.start_rollout(records=records, options=RolloutOptions(policy=policy))
        report = await handle.report()
        histories = [
            await client.temporal.get_workflow_handle(
                f"{handle.batch_id}/{r.spec.trajectory_id}"
            ).fetch_history()
            for r in records
        ]
    return report, histories


def step_overheads(histories: list[Any]) -> dict[str, float]:
    """Per LLM step (GENERATE activity), wall ms: scheduled -> started (queue wait for a
    poll) and the round trip beyond the engine (started -> completed minus the engine's
    time is not in the history, so the round trip is reported whole beside it)."""
    to_start: list[float] = []
    for history in histories:
        scheduled: dict[int, tuple[str, float]] = {}
        for event in history.events:
            t = event.event_time.ToDatetime().timestamp()
            if event.HasField("activity_task_scheduled_event_attributes"):
                attrs = event.activity_task_scheduled_event_attributes
                scheduled[event.event_id] = (attrs.activity_type.name, t)
            elif event.HasField("activity_task_started_event_attributes"):
                attrs = event.activity_task_started_event_attributes
                kind, at = scheduled.get(attrs.scheduled_event_id, ("", t))
                if kind == names.GENERATE:
                    to_start.append((t - at) * 1000)
    return {
        "steps": len(to_start),
        "schedule_to_start_ms_p50": percentile(sorted(to_start), 50),
        "schedule_to_start_ms_p99": percentile(sorted(to_start), 99),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--wall", type=float, default=120.0, help="target live seconds")
    parser.add_argument("--policy", action="append", help="default: verl, least_loaded, heddle")
    parser.add_argument(
        "--workers", type=int, action="append", help="ceiling runs (default 1 and 2; 0: none)"
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/fidelity.json"))
    args = parser.parse_args()
    cluster = ClusterConfig(model="qwen3-8b", gpu="h100", num_gpus=4, default_tp=1)
    records = generate("coding", prompts=args.prompts, samples=16, seed=0, iteration=1)
    earlier = generate("coding", prompts=args.prompts, samples=16, seed=0, iteration=0)
    trace = [r.spec for r in records]
    out: dict[str, Any] = {"command": " ".join(sys.argv), "policies": {}, "ceiling": {}}
    for policy in args.policy or ["verl", "least_loaded", "heddle"]:
        learns = policy in PLANS_SPLIT
        history = [r.spec for r in earlier] if learns else []
        sim = run_bench(trace, cluster, [policy], history=history).results[policy]
        scale = args.wall / sim.makespan_s
        report, histories = await live_run(
            records, cluster, policy, scale, history=earlier if learns else None
        )
        row = {
            "sim_makespan_s": sim.makespan_s,
            "live_makespan_s": report.makespan_s,
            "live_over_sim": report.makespan_s / sim.makespan_s,
            "time_scale": scale,
            "live_wall_s": report.wall_s,
            "tokens_equal": report.generated_tokens == sim.generated_tokens,
            **step_overheads(histories),
        }
        out["policies"][policy] = row
        print(f"{policy}: {json.dumps(row)}", flush=True)
    for workers in [w for w in args.workers or [1, 2] if w > 0]:
        for persist in (True, False):
            tiny = tiny_trace(100, 10, tool_latency_s=0.0)
            report, _ = await live_run(
                tiny, cluster, "least_loaded", 1e-4, workers=workers, persist=persist
            )
            steps = sum(len(r.spec.steps) for r in tiny)
            server = "file" if persist else "memory"
            row = {"steps": steps, "batch_wall_s": report.wall_s,
                   "steps_per_s": steps / report.wall_s}  # fmt: skip
            out["ceiling"][f"{workers} worker(s), server state in {server}"] = row
            print(f"ceiling, {workers} worker(s), {server}: {json.dumps(row)}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    asyncio.run(main())
