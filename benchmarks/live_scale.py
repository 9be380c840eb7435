"""The live path at scale: live against simulated makespan, the start ramp, CPU per step.

    python benchmarks/live_scale.py [--sizes 512 2048] [--policy verl --policy heddle]
                                    [--ceiling 2048] [--wall 150] [--out FILE]

For each size and policy: the simulator's makespan, then a live rollout of the same trace
on a fresh embedded stack (file-backed dev server, one worker process hosting the
simulated engines, SQLite store) at a time scale chosen so the simulated makespan takes
`--wall` seconds of wall time; heddle first rolls out the earlier iteration as its
history, on the same stack. Per run: live ÷ simulated makespan, the start ramp (wall
seconds from the batch's start until its last trajectory started), and the CPU seconds
per LLM step of the worker, the engine host (the same process in the default stack) and
the Temporal server, read from /proc. (The history is stored as the earlier batch, not
rolled out: planning reads its specs only.) Then the ceiling: tiny two-step trajectories with
no tool wait, as fast as the stack goes, in steps per second (`--ceiling`: 100 of 10
steps, the shape docs/benchmarks.md measured 22 steps/s on before the lean step path),
and the start ramp of a large batch of two-step ones (`--ramp`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import heddle
from heddle.bench import run_bench
from heddle.client import HeddleClient
from heddle.config import ClusterConfig
from heddle.runtime.stack import EmbeddedStack, free_port
from heddle.trace import TraceRecord
from heddle.types import BatchReport, RolloutOptions, StepSpec, TrajectorySpec
from heddle.workloads import generate

ROOT = Path(__file__).resolve().parents[1]
# The step path before the lean one, whose ceiling docs/benchmarks.md gave as 22 steps/s.
BEFORE = "1f142af"
# The setting: 16 H200s serving Qwen3-8B, coding, 16 samples a prompt.
CLUSTER = ClusterConfig(model="qwen3-8b", gpu="h200", num_gpus=16, default_tp=1)
SAMPLES = 16
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and its waited-for children."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / TICKS


@dataclass
class LiveRun:
    report: BatchReport
    start_ramp_s: float  # wall seconds from the batch's start to its last trajectory's
    # ... to the last trajectory workflow's creation (its start time in Temporal), before
    # its first task has run: how long starting them takes, apart from the CPU they wait on.
    created_ramp_s: float
    with_stack_s: float  # wall seconds from starting the stack to the report
    steps: int
    cpu_per_step_ms: dict[str, float]


@contextlib.asynccontextmanager
async def live_stack(
    cluster: ClusterConfig, time_scale: float, *, workers: int = 1, persist: bool = True
) -> AsyncIterator[tuple[EmbeddedStack, HeddleClient]]:
    """A fresh embedded stack (headless, on a free port, in a temporary folder) and a
    client of it, for one measured run."""
    with tempfile.TemporaryDirectory(prefix="heddle-live-") as state:
        stack = EmbeddedStack(
            state_dir=Path(state),
            cluster=cluster,
            time_scale=time_scale,
            headless=True,
            port=free_port(),
            num_workers=workers,
            persist=persist,
        )
        await stack.start()
        try:
            client = await HeddleClient.connect(stack.address, store_url=stack.store_url)
            async with client:
                yield stack, client
        finally:
            stack.stop()


async def live_run(
    records: list[TraceRecord],
    policy: str,
    time_scale: float,
    *,
    cluster: ClusterConfig = CLUSTER,
    history: list[TraceRecord] | None = None,
) -> LiveRun:
    """One rollout on a fresh embedded stack (after `history`, when given)."""
    begun = time.monotonic()
    async with live_stack(cluster, time_scale) as (stack, client):
        if history:
            # Planning reads the earlier batch's specs from the store: it is
            # stored as a batch the way a rollout stores it, not rolled out.
            await asyncio.to_thread(
                lambda: client.store.create_batch(
                    batch_id="history", records=history, options=RolloutOptions(),
                    source="history", created_at=time.time() - 1,
                )
            )  # fmt: skip
        assert stack.server is not None
        pids = {"server": stack.server.pid, "worker+engine host": stack.workers[0].pid}
        before = {name: cpu_s(pid) for name, pid in pids.items()}
        handle = await client.start_rollout(records=records, options=RolloutOptions(policy=policy))
        report = await handle.report()
        with_stack_s = time.monotonic() - begun
        after = {name: cpu_s(pid) for name, pid in pids.items()}
        rows = await client.list_trajectories(handle.batch_id, limit=len(records))
        steps = await asyncio.to_thread(client.store.count_steps, handle.batch_id)
        created = [
            w.start_time.timestamp()
            async for w in client.temporal.list_workflows('WorkflowType="TrajectoryWorkflow"')
        ]
    last_start = max(r["started_at"] or report.started_at for r in rows)
    return LiveRun(
        report=report,
        start_ramp_s=last_start - report.started_at,
        created_ramp_s=max(created) - report.started_at,
        with_stack_s=with_stack_s,
        steps=steps,
        cpu_per_step_ms={k: 1000 * (after[k] - before[k]) / max(1, steps) for k in pids},
    )


def tiny_trace(n: int, turns: int = 2, tool_latency_s: float = 1e-3) -> list[TraceRecord]:
    """Trajectories of one-token steps and tools of a millisecond: the orchestration
    alone (a replayed tool of any latency is a timer or an activity, as a real one)."""
    tool = StepSpec(1, "python", tool_latency_s, "ok", 1)
    steps = (*(tool for _ in range(turns - 1)), StepSpec(1))
    return [TraceRecord(TrajectorySpec(f"t{k}", f"g{k}", 10, steps, "coding")) for k in range(n)]


def row_of(run: LiveRun) -> dict[str, Any]:
    return {
        "live_makespan_s": round(run.report.makespan_s, 2),
        "live_wall_s": round(run.report.wall_s, 1),
        "completed": run.report.completed,
        "failed": run.report.failed,
        "start_ramp_s": round(run.start_ramp_s, 1),
        "created_ramp_s": round(run.created_ramp_s, 1),
        "with_stack_s": round(run.with_stack_s, 1),
        "steps": run.steps,
        "steps_per_s": round(run.steps / run.report.wall_s, 1),
        "cpu_ms_per_step": {k: round(v, 1) for k, v in run.cpu_per_step_ms.items()},
    }


async def scale_rows(
    sizes: list[int], policies: list[str], wall: float, steps_per_s: float
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for size in sizes:
        prompts = size // SAMPLES
        records = generate("coding", prompts=prompts, samples=SAMPLES, seed=0, iteration=1)
        earlier = generate("coding", prompts=prompts, samples=SAMPLES, seed=0, iteration=0)
        trace, past = [r.spec for r in records], [r.spec for r in earlier]
        sims = run_bench(trace, CLUSTER, policies, history=past).results
        for policy in policies:
            sim = sims[policy]
            # At least `wall` seconds, and slow enough that the steps come at most at
            # `steps_per_s`: well under the stack's ceiling, so the run measures the
            # schedule rather than Temporal.
            steps = sum(len(t.steps) for t in trace)
            scale = max(wall, steps / steps_per_s) / sim.makespan_s
            run = await live_run(records, policy, scale, history=earlier)
            row = {
                "sim_makespan_s": round(sim.makespan_s, 2),
                "time_scale": round(scale, 4),
                **row_of(run),
                "live_over_sim": round(run.report.makespan_s / sim.makespan_s, 3),
            }
            out[f"{size}/{policy}"] = row
            print(f"{size} {policy}: {json.dumps(row)}", flush=True)
        live = {p: out[f"{size}/{p}"]["live_makespan_s"] for p in policies}
        simulated = {p: out[f"{size}/{p}"]["sim_makespan_s"] for p in policies}
        if len(policies) >= 2:
            first, second = policies[0], policies[1]
            ratio = {
                "live": round(live[first] / live[second], 3),
                "simulated": round(simulated[first] / simulated[second], 3),
            }
            out[f"{size}/{first}÷{second}"] = ratio
            print(f"{size} {first} makespan ÷ {second}: {json.dumps(ratio)}", flush=True)
    return out


def ceiling_at(tree: Path, n: int, turns: int) -> dict[str, Any]:
    """This file's ceiling run in a fresh process on the code of `tree` (its stack, its
    worker and its workflows: the worker process inherits the path)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    argv = [sys.executable, str(Path(__file__).resolve()), "--once", str(n), str(turns)]
    done = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True, check=True)
    row: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return row


def worktree(rev: str) -> Path:
    """A checkout of `rev` beside this one (made once, kept for later runs)."""
    path = Path(tempfile.gettempdir()) / f"heddle-at-{rev}"
    if not path.exists():
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), rev],
            check=True, capture_output=True,
        )  # fmt: skip
    return path


def ceiling_against(rev: str, n: int, turns: int, rounds: int) -> dict[str, Any]:
    """The ceiling of this tree and of `rev`, run in turns so both see the same machine;
    the medians and their ratio."""
    trees = {"now": ROOT, rev: worktree(rev)}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    for k in range(rounds):
        for name, tree in trees.items():
            row = ceiling_at(tree, n, turns)
            runs[name].append(row)
            print(f"ceiling round {k + 1}, {name}: {json.dumps(row)}", flush=True)
    medians = {
        name: statistics.median(r["steps_per_s"] for r in rows) for name, rows in runs.items()
    }
    return {
        "trajectories": n,
        "steps_each": turns,
        "steps_per_s_median": medians,
        "ratio": round(medians["now"] / medians[rev], 2),
        "runs": runs,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[512, 2048])
    parser.add_argument("--policy", action="append", help="default: verl, heddle")
    parser.add_argument("--wall", type=float, default=120.0, help="least live seconds a run")
    parser.add_argument(
        "--steps-per-s", type=float, default=15.0, help="the most LLM steps a second a run asks"
    )
    parser.add_argument(
        "--ceiling",
        type=int,
        nargs=2,
        default=[100, 10],
        metavar=("TRAJECTORIES", "STEPS"),
        help="the ceiling's tiny trace (0 0: none); 100 x 10 is docs/benchmarks.md's 22 steps/s",
    )
    parser.add_argument(
        "--ramp", type=int, default=2048, help="two-step tiny trajectories for the start ramp"
    )
    parser.add_argument(
        "--against", default=BEFORE, help="the revision whose ceiling runs beside this one's"
    )
    parser.add_argument("--rounds", type=int, default=3, help="ceiling runs of each, in turns")
    parser.add_argument("--once", type=int, nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/live_scale.json"))
    args = parser.parse_args()
    if args.once:  # one ceiling run, for ceiling_at
        row = row_of(await live_run(tiny_trace(*args.once), "least_loaded", 1e-4))
        print(json.dumps({**row, "code": str(Path(heddle.__file__).parents[1])}))
        return
    started = time.monotonic()
    out: dict[str, Any] = {"command": " ".join(["python", *sys.argv])}
    policies = args.policy or ["verl", "heddle"]
    out["runs"] = await scale_rows(args.sizes, policies, args.wall, args.steps_per_s)
    if args.ceiling[0]:
        out["ceiling"] = ceiling_against(args.against, *args.ceiling, args.rounds)
        print(f"ceiling: {json.dumps({k: v for k, v in out['ceiling'].items() if k != 'runs'})}")
    if args.ramp:
        out["ramp"] = row_of(await live_run(tiny_trace(args.ramp), "least_loaded", 1e-4))
        print(f"ramp, {args.ramp} trajectories of 2 tiny steps: {json.dumps(out['ramp'])}")
    out["wall_s"] = round(time.monotonic() - started, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out} ({out['wall_s']} s)")


if __name__ == "__main__":
    asyncio.run(main())
