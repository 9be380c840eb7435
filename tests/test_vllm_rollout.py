"""Rollouts through Temporal on real vLLM engines (CPU build, a tiny local model): a
trace replays token for token, a trajectory's next turn hits the prefix cache, and an
engine process killed mid-step costs no trajectory. One worker process hosts two vLLM
instances for the module, as `heddle worker` does."""

from __future__ import annotations

import asyncio
import itertools
import re
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from heddle.client import HeddleClient
from heddle.config import ClusterConfig, EngineConfig
from heddle.trace import TraceRecord
from heddle.types import RolloutOptions, StepSpec, TrajectorySpec
from tests.live import kill_process, worker_process
from tests.real_engine import require_vllm, tiny_model, vllm_env

pytestmark = [pytest.mark.real_engine, pytest.mark.slow]

ENGINES_UP_S = 240  # two instances start side by side on 2 cores in about 50 s


@dataclass
class VllmWorker:
    address: str
    store_url: str
    prefix: str
    log: Path
    proc: Any

    def starts(self) -> Counter[str]:
        """How many times each instance came up."""
        return Counter(re.findall(r"engine instance (\w+) up", self.log.read_text()))

    def wait_up(self, starts: dict[str, int], timeout_s: float = ENGINES_UP_S) -> None:
        deadline = time.monotonic() + timeout_s
        while any(self.starts()[i] < n for i, n in starts.items()):
            log = self.log.read_text()
            assert self.proc.poll() is None, f"the worker exited: {log[-3000:]}"
            assert "failed to start" not in log, f"an engine failed to start: {log[-3000:]}"
            assert time.monotonic() < deadline, "vLLM engines did not start"
            time.sleep(0.5)


@pytest.fixture(scope="module")
def vllm_worker(
    temporal_address: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmWorker]:
    require_vllm()
    root = tmp_path_factory.mktemp("vllm-rollout")
    vllm_env(root)
    model = tiny_model(tmp_path_factory)
    cluster = ClusterConfig(
        num_gpus=2,
        max_num_seqs=16,
        max_num_batched_tokens=2048,
        engine=EngineConfig(kind="vllm", model_path=str(model), max_model_len=8192, kv_cache_gib=1),
    )
    store_url = f"sqlite:///{root / 'store.db'}"
    prefix = f"v{uuid.uuid4().hex[:8]}-"
    log = root / "worker.log"
    proc = worker_process(temporal_address, store_url, prefix, log, time_scale=1.0, cluster=cluster)
    worker = VllmWorker(temporal_address, store_url, prefix, log, proc)
    try:
        worker.wait_up({"i0": 1, "i1": 1})
        yield worker
    finally:
        kill_process(proc)


def _spec(tid: str, prompt: int, steps: list[tuple[int, int]], final: int) -> TrajectorySpec:
    """`steps`: (output tokens, tool output tokens) of each turn that calls a tool."""
    body = [StepSpec(out, "python", 0.3, "ok", tool_out) for out, tool_out in steps]
    return TrajectorySpec(tid, f"g-{tid[0]}", prompt, (*body, StepSpec(final)), "coding")


async def _run(
    worker: VllmWorker,
    specs: list[TrajectorySpec],
    policy: str,
    meanwhile: Callable[[HeddleClient, str], Awaitable[None]] | None = None,
) -> Any:
    """Roll `specs` out; `meanwhile(client, batch_id)` runs while the batch does. Returns
    the report, each trajectory's steps from the store, and its history."""
    client = await HeddleClient.connect(
        worker.address, store_url=worker.store_url, queue_prefix=worker.prefix
    )
    async with client:
        handle = await client.start_rollout(
            records=[TraceRecord(spec=s) for s in specs], options=RolloutOptions(policy=policy)
        )
        if meanwhile is not None:
            await meanwhile(client, handle.batch_id)
        report = await asyncio.wait_for(handle.report(), 300)
        steps = {}
        for s in specs:
            row = await client.inspect_trajectory(handle.batch_id, s.trajectory_id)
            assert row is not None
            steps[s.trajectory_id] = row["steps"]
        history = {
            s.trajectory_id: await client.temporal.get_workflow_handle(
                f"{handle.batch_id}/{s.trajectory_id}"
            ).fetch_history()
            for s in specs
        }
        return report, steps, history


def test_a_trace_replays_token_for_token_and_turns_hit_the_prefix_cache(
    vllm_worker: VllmWorker,
) -> None:
    specs = [
        _spec("a0", 300, [(60, 40), (30, 20)], 25),
        _spec("a1", 300, [(45, 150)], 64),
        _spec("b0", 180, [], 120),
        _spec("b1", 520, [(200, 30), (10, 10), (80, 12)], 33),
    ]
    # verl keeps a trajectory on its instance: its next turn finds its context cached.
    report, steps, _ = asyncio.run(_run(vllm_worker, specs, "verl"))
    assert (report.completed, report.failed) == (4, 0)
    assert report.generated_tokens == sum(s.generated_tokens for s in specs)
    for spec in specs:
        rows = steps[spec.trajectory_id]
        assert [r["output_tokens"] for r in rows] == [st.output_tokens for st in spec.steps]
        assert rows[0]["cached_tokens"] == 0
        for before, after in itertools.pairwise(rows):
            assert after["instance_id"] == before["instance_id"]
            # Every whole KV block of the earlier turn (128 tokens on CPU) is reused.
            reused = (before["context_tokens"] + before["output_tokens"] - 1) // 128 * 128
            assert after["cached_tokens"] >= reused
        if len(rows) > 1:
            assert max(r["cached_tokens"] for r in rows[1:]) > 0


def _activities(history: dict[str, Any]) -> dict[str, list[str]]:
    """Each trajectory's activity events (time, event, failure), for a failure message."""
    out: dict[str, list[str]] = {}
    for tid, h in history.items():
        for e in h.events:
            kind = e.WhichOneof("attributes") or ""
            if kind.startswith("activity_task"):
                attrs = getattr(e, kind)
                failure = attrs.failure.message if hasattr(attrs, "failure") else ""
                when = e.event_time.ToDatetime()
                what = kind.removeprefix("activity_task_").removesuffix("_event_attributes")
                out.setdefault(tid, []).append(f"{when:%H:%M:%S} {what} {failure}")
    return out


def _engine_core_pids(worker_pid: int) -> list[int]:
    import psutil

    return [
        p.pid
        for p in psutil.Process(worker_pid).children(recursive=True)
        if "EngineCore" in p.name() or "EngineCore" in " ".join(p.cmdline())
    ]


async def _until_decoding(core_pid: int, timeout_s: float = 60.0) -> None:
    """Until the engine under `core_pid` decodes: its model worker process burns CPU
    (idle, it uses none). Watched from outside, so no RPC is needed while the machine is
    at its busiest. On a loaded machine the worker may get under 0.1 s of CPU in any
    0.25 s, so half a second used since the call also counts: in a CI run beside two
    benchmark processes every step finished and none saw its engine die."""
    import psutil

    workers = psutil.Process(core_pid).children(recursive=True)
    assert workers, "the engine core has no worker process"

    def used() -> float:
        return sum(sum(w.cpu_times()[:2]) for w in workers)

    deadline = time.monotonic() + timeout_s
    start = before = used()
    while time.monotonic() < deadline:
        await asyncio.sleep(0.25)
        now = used()
        if now - before > 0.1 or now - start > 0.5:
            return
        before = now
    raise AssertionError("the engine never started decoding")


def test_an_engine_killed_mid_step_costs_no_trajectory(vllm_worker: VllmWorker) -> None:
    import psutil

    # Long first steps, two per instance (3,000 tokens each: seconds of decoding on a
    # shared core), and the kill once the victim decodes.
    specs = [_spec(f"k{k}", 100, [(3_000, 20)], 300) for k in range(4)]
    cores = _engine_core_pids(vllm_worker.proc.pid)
    assert len(cores) == 2, cores

    async def kill_mid_step(client: HeddleClient, batch_id: str) -> None:
        await _until_decoding(cores[0])
        psutil.Process(cores[0]).kill()

    report, steps, history = asyncio.run(
        _run(vllm_worker, specs, "least_loaded", meanwhile=kill_mid_step)
    )
    assert (report.completed, report.failed) == (4, 0), _activities(history)
    assert report.generated_tokens == sum(s.generated_tokens for s in specs)
    for spec in specs:
        rows = steps[spec.trajectory_id]
        assert [r["output_tokens"] for r in rows] == [st.output_tokens for st in spec.steps]
    # Some step lost its engine and went on elsewhere: an EngineDead failure in its history.
    dead = [
        tid
        for tid, h in history.items()
        for e in h.events
        if e.HasField("activity_task_failed_event_attributes")
        and e.activity_task_failed_event_attributes.failure.application_failure_info.type
        == "EngineDead"
    ]
    assert dead, f"no step saw its engine die: {_activities(history)}"
    assert "died; restarting it" in vllm_worker.log.read_text()
    deadline = time.monotonic() + ENGINES_UP_S
    while sum(vllm_worker.starts().values()) < 3:
        assert time.monotonic() < deadline, "the dead instance was not restarted"
        time.sleep(0.5)
    assert sum(vllm_worker.starts().values()) == 3  # the host brought it back
