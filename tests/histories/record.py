"""Record the histories `tests/test_replay.py` replays: run from the repository root as
`python -m tests.histories.record` on the code whose histories must keep replaying.

Each batch runs on an in-memory dev server with an in-process worker: a peer (verl), a
batch of two slices, a planned Heddle batch (its scheduler calls on the engine host), a
trajectory moved between instances at each tool call, and a decode moved mid-step.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from temporalio.client import Client

from heddle import search_attributes
from heddle.runtime.stack import (
    ensure_search_attributes,
    free_port,
    temporal_binary,
    wait_for_server,
)
from heddle.trace import TraceRecord
from heddle.types import RolloutOptions, StepSpec, TrajectorySpec
from scheduler import registry
from scheduler.interface import Policy
from scheduler.order import FirstComeFirstServed
from scheduler.split import Homogeneous
from tests.live import live_client
from tests.test_rollout import _MoveLongDecodes, _PingPong

HERE = Path(__file__).parent


def _spec(tid: str, statuses: list[str]) -> TrajectorySpec:
    steps = [StepSpec(30 + 10 * i, "python", 0.2, status, 15) for i, status in enumerate(statuses)]
    return TrajectorySpec(tid, "g0", 80, (*steps, StepSpec(40)), workload="coding")


def _register(name: str, placement: type) -> None:
    registry.POLICIES[name] = lambda ctx: Policy(
        name, FirstComeFirstServed(), placement(), Homogeneous(1)
    )


async def _record(address: str, store_url: str) -> dict[str, list[dict[str, object]]]:
    _register("test-ping-pong", _PingPong)
    _register("test-move", _MoveLongDecodes)
    trio = [TraceRecord(_spec("ok", ["ok", "ok"])), TraceRecord(_spec("err", ["error"]))]
    moving = (*(StepSpec(40, "python", 5.0, "ok", 30) for _ in range(2)), StepSpec(40))
    # Heddle last: it learns from the batch before it. Each on its own stack (prefix):
    # a planned batch reshapes the cluster the others' placements name.
    ping = TraceRecord(TrajectorySpec("m", "g", 200, moving, "coding"))
    long_decode = TraceRecord(TrajectorySpec("t", "g", 200, (StepSpec(6000),), "math"))
    # Over one slice: the batch fans out through slices.
    many = [TraceRecord(_spec(f"s{k}", ["ok"])) for k in range(70)]
    batches = {
        "verl": (trio, "verl"),
        "slices": (many, "verl"),
        "ping-pong": ([ping], "test-ping-pong"),
        "mid-step-move": ([long_decode], "test-move"),
        "heddle": (trio, "heddle"),
    }
    out: dict[str, list[dict[str, object]]] = {}
    for name, (records, policy) in batches.items():
        async with live_client(address, store_url, f"rec-{name}-", time_scale=0.05) as client:
            options = RolloutOptions(policy=policy)
            handle = await client.start_rollout(records=records, options=options)
            report = await asyncio.wait_for(handle.report(), 120)
            assert report.completed == len(records), (name, report)
            ids = [handle.batch_id] + [f"{handle.batch_id}/{r.spec.trajectory_id}" for r in records]
            if len(records) > 64:  # the slices too, and a few of their trajectories
                ids = [handle.batch_id, f"{handle.batch_id}/slice-0", f"{handle.batch_id}/slice-1",
                       *ids[1:4]]  # fmt: skip
            out[name] = [
                json.loads((await client.temporal.get_workflow_handle(w).fetch_history()).to_json())
                for w in ids
            ]
    return out


async def _serve_and_record(address: str) -> dict[str, list[dict[str, object]]]:
    client: Client = await wait_for_server(address)
    await ensure_search_attributes(client)
    with tempfile.TemporaryDirectory() as tmp:
        return await _record(address, f"sqlite:///{tmp}/store.db")


def main() -> None:
    port = free_port()
    argv = [
        temporal_binary(), "server", "start-dev", "--headless", "--ip", "127.0.0.1",
        "--port", str(port), "--log-level", "error", *search_attributes.dev_server_flags(),
    ]  # fmt: skip
    server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        recorded = asyncio.run(_serve_and_record(f"127.0.0.1:{port}"))
    finally:
        server.terminate()
        server.wait(10)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    for name, histories in recorded.items():
        path = HERE / f"{commit.stdout.strip()}-{name}.json"
        path.write_text(json.dumps(histories) + "\n")
        print(f"wrote {path} ({len(histories)} workflows)", file=sys.stderr)


if __name__ == "__main__":
    main()
