"""Soak: many short trajectories through one embedded stack, batch after batch, to find
leaks and limits rather than speed.

    python benchmarks/soak.py [--batches 4] [--per-batch 2500] [--out FILE]

One file-backed embedded stack (dev server, one worker hosting the simulated engines,
SQLite store) runs `--batches` batches of `--per-batch` two-step trajectories, one after
another. Every 5 s it samples the resident memory of the worker and the server (from
/proc). Per batch: wall time, LLM steps per second, and each process's memory at the
batch's end; after them: the largest history among the batch's workflows (batch, slices,
a sample of trajectories) against Temporal's limits, and how many runs of batch and slice
workflows continued as new. Memory is flat when the later batches end where the second
ended (the first also warms caches and the SQLite page cache up).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.live_scale import CLUSTER, live_stack, tiny_trace  # noqa: E402
from heddle.client import HeddleClient  # noqa: E402
from heddle.types import RolloutOptions  # noqa: E402

SAMPLE_S = 5.0
# Temporal's default limits on one workflow's history (the server warns at a fifth).
HISTORY_EVENTS_LIMIT = 51_200
HISTORY_BYTES_LIMIT = 50 * 2**20
TRAJECTORY_SAMPLE = 50


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def history_size(
    client: HeddleClient, workflow_id: str, run_id: str | None
) -> tuple[int, int]:
    """(events, bytes) of one run's history."""
    handle = client.temporal.get_workflow_handle(workflow_id, run_id=run_id)
    history = await handle.fetch_history()
    return len(history.events), sum(e.ByteSize() for e in history.events)


async def batch_histories(
    client: HeddleClient, batch_id: str, rng: random.Random
) -> dict[str, Any]:
    """The largest history of each kind of workflow of the batch, and its continue-as-new
    runs."""
    kinds: dict[str, dict[str, Any]] = {}
    trajectories = []
    async for w in client.temporal.list_workflows(f'WorkflowId STARTS_WITH "{batch_id}"'):
        if w.workflow_type == "TrajectoryWorkflow":
            trajectories.append(w)
            continue
        kind = kinds.setdefault(
            w.workflow_type, {"runs": 0, "continued_as_new": 0, "max_events": 0, "max_bytes": 0}
        )
        kind["runs"] += 1
        kind["continued_as_new"] += w.status is not None and w.status.name == "CONTINUED_AS_NEW"
        events, size = await history_size(client, w.id, w.run_id)
        kind["max_events"] = max(kind["max_events"], events)
        kind["max_bytes"] = max(kind["max_bytes"], size)
    sample = rng.sample(trajectories, min(TRAJECTORY_SAMPLE, len(trajectories)))
    sizes = [await history_size(client, w.id, w.run_id) for w in sample]
    kinds["TrajectoryWorkflow"] = {
        "runs": len(trajectories),
        "sampled": len(sample),
        "max_events": max(e for e, _ in sizes),
        "max_bytes": max(b for _, b in sizes),
    }
    return kinds


async def soak(batches: int, per_batch: int, time_scale: float) -> dict[str, Any]:
    rng = random.Random(0)
    samples: list[dict[str, float]] = []
    rows = []
    async with live_stack(CLUSTER, time_scale) as (stack, client):
        assert stack.server is not None
        pids = {"worker": stack.workers[0].pid, "server": stack.server.pid}
        began = time.monotonic()
        done = asyncio.Event()

        async def sample() -> None:
            while not done.is_set():
                samples.append(
                    {"t": time.monotonic() - began, **{k: rss_mib(p) for k, p in pids.items()}}
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(done.wait(), SAMPLE_S)

        sampler = asyncio.create_task(sample())
        histories = {}
        for b in range(batches):
            records = [
                dataclasses.replace(
                    r,
                    spec=dataclasses.replace(r.spec, trajectory_id=f"b{b}-{r.spec.trajectory_id}"),
                )
                for r in tiny_trace(per_batch)
            ]
            start = time.monotonic()
            handle = await client.start_rollout(records=records, options=RolloutOptions())
            report = await handle.report()
            wall = time.monotonic() - start
            steps = await asyncio.to_thread(client.store.count_steps, handle.batch_id)
            rows.append({
                "batch": b, "trajectories": report.trajectories, "completed": report.completed,
                "wall_s": round(wall, 1), "steps": steps, "steps_per_s": round(steps / wall, 1),
                **{f"{k}_rss_mib": round(rss_mib(p), 1) for k, p in pids.items()},
            })  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
            if b == batches - 1:
                histories = await batch_histories(client, handle.batch_id, rng)
        done.set()
        await sampler
    return {
        "batches": rows,
        "histories": histories,
        "limits": {"events": HISTORY_EVENTS_LIMIT, "bytes": HISTORY_BYTES_LIMIT},
        "rss_samples": samples,
        "time_scale": time_scale,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--per-batch", type=int, default=2500)
    parser.add_argument("--time-scale", type=float, default=0.05)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "soak.json")
    args = parser.parse_args()
    result = asyncio.run(soak(args.batches, args.per_batch, args.time_scale))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    rows = result["batches"]
    total = sum(r["steps"] for r in rows)
    wall = sum(r["wall_s"] for r in rows)
    print(f"{sum(r['completed'] for r in rows)} trajectories, {total} steps in {wall:.0f} s: "
          f"{total / wall:.1f} steps/s")  # fmt: skip
    for proc in ("worker", "server"):
        ends = [r[f"{proc}_rss_mib"] for r in rows]
        print(f"{proc} RSS at each batch's end (MiB): {ends}; last / second = "
              f"{ends[-1] / ends[min(1, len(ends) - 1)]:.2f}")  # fmt: skip
    for kind, h in result["histories"].items():
        print(f"{kind}: {h}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
