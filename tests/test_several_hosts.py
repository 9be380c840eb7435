"""The stack split across machines, each a network namespace with its own address on a
private link (`tests/netns.py`): the Temporal server with the PostgreSQL store, the
engine host, and two trajectory workers. A batch completes with every decide served by
the engine host's scheduler; one worker's link is cut mid-batch and restored, and
nothing is lost or duplicated."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from heddle import search_attributes
from heddle.client import HeddleClient
from heddle.queues import trajectories_queue
from heddle.runtime.stack import ensure_search_attributes, temporal_binary, wait_for_server
from heddle.workloads import generate
from tests import netns
from tests.live import PostgresServer, kill_process, pg_bindir, wait_for_poller, worker_process

WHY_NOT = netns.available() or ("" if pg_bindir() else "needs Debian's postgresql")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        bool(WHY_NOT) and not os.environ.get("HEDDLE_REQUIRE_NETNS"), reason=WHY_NOT
    ),
]
TEMPORAL_PORT = 7233
METRICS_PORT = 9464


@pytest.fixture
def network() -> Iterator[netns.Network]:
    net = netns.Network()
    try:
        yield net
    finally:
        net.close()


def decides(address: str) -> float:
    """Decides the scheduler served in the process whose metrics are at `address`."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("heddle_decide_seconds_count")
    )


def test_a_batch_across_hosts_survives_a_worker_cut_off_mid_batch(
    network: netns.Network, tmp_path: Path
) -> None:
    server_ip = network.add_host("srv")
    engines_ip = network.add_host("eng")
    worker_ips = [network.add_host("w1"), network.add_host("w2")]
    records = generate("coding", prompts=4, samples=16, seed=41)
    address = f"{server_ip}:{TEMPORAL_PORT}"
    store = PostgresServer(host=server_ip, netns=network.netns("srv"))
    # The dev server binds every address of its machine: its services dial one another
    # on loopback, which a server bound to the link's address alone refused.
    server = subprocess.Popen(
        [*network.run_in("srv"), temporal_binary(), "server", "start-dev", "--headless",
         "--ip", "0.0.0.0", "--port", str(TEMPORAL_PORT), "--log-level", "error",
         "--db-filename", str(tmp_path / "temporal.db"), *search_attributes.dev_server_flags()],
        stdout=(tmp_path / "server.log").open("wb"), stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    procs: list[subprocess.Popen[bytes]] = []

    def worker(host: str, ip: str, engines: bool) -> subprocess.Popen[bytes]:
        extra = ["--metrics", f"{ip}:{METRICS_PORT}"]
        if engines:
            extra += ["--scheduler-host", ip]
        proc = worker_process(
            address, store.url, "", tmp_path / f"{host}.log", time_scale=0.12,
            engines=engines, extra=tuple(extra), run_with=tuple(network.run_in(host)),
        )  # fmt: skip
        procs.append(proc)
        return proc

    async def run() -> None:
        client_temporal = await wait_for_server(address)
        await ensure_search_attributes(client_temporal)
        worker("eng", engines_ip, engines=True)
        w1 = worker("w1", worker_ips[0], engines=False)
        worker("w2", worker_ips[1], engines=False)
        client = await HeddleClient.connect(address, store_url=store.url)
        async with client:
            deadline = time.monotonic() + 60
            while not (plan := await _plan(client)) or not plan.scheduler_address:
                assert time.monotonic() < deadline, "the engine host never announced itself"
                await asyncio.sleep(0.3)
            assert plan.scheduler_address.startswith(f"{engines_ip}:")
            # Workflow tasks go only to processes already polling for them.
            await wait_for_poller(client.temporal, trajectories_queue(), w1.pid)
            handle = await client.start_rollout(records=records)
            while (await handle.progress())["completed"] < 4:
                assert time.monotonic() < deadline + 120, "the batch made no progress"
                await asyncio.sleep(0.2)
            network.cut("w1")  # its machine drops off the network mid-batch
            await asyncio.sleep(8.0)
            network.restore("w1")
            report = await asyncio.wait_for(handle.report(), 300)
            rows = await client.list_trajectories(handle.batch_id, limit=1000)
            runners = await _runners(client, handle.batch_id, records)
        expected = {r.spec.trajectory_id: r.spec for r in records}
        assert sorted(r["trajectory_id"] for r in rows) == sorted(expected)
        assert (report.completed, report.failed) == (len(records), 0)
        for row in rows:
            assert row["generated_tokens"] == expected[row["trajectory_id"]].generated_tokens
        assert report.generated_tokens == sum(s.generated_tokens for s in expected.values())
        # Decides: all by the engine host's scheduler, none by the workers'.
        steps = sum(len(s.steps) for s in expected.values())
        assert decides(f"{engines_ip}:{METRICS_PORT}") >= steps
        for ip in worker_ips:
            assert decides(f"{ip}:{METRICS_PORT}") == 0
        # The cut-off worker ran trajectories, before or after its link came back.
        assert any(r.startswith(f"{w1.pid}@") for r in runners), runners

    try:
        asyncio.run(run())
    finally:
        for proc in procs:
            kill_process(proc, signal.SIGKILL)
        server.send_signal(signal.SIGKILL)
        server.wait(10)
        store.close()


async def _plan(client: HeddleClient):  # type: ignore[no-untyped-def]
    try:
        return await client.cluster_plan()
    except Exception:  # the control workflow not started yet
        return None


async def _runners(client: HeddleClient, batch_id: str, records: list) -> set[str]:  # type: ignore[type-arg]
    """The worker identities that completed workflow tasks of the batch's trajectories."""
    identities: set[str] = set()
    for r in records:
        history = await client.temporal.get_workflow_handle(
            f"{batch_id}/{r.spec.trajectory_id}"
        ).fetch_history()
        identities |= {
            e.workflow_task_completed_event_attributes.identity
            for e in history.events
            if e.HasField("workflow_task_completed_event_attributes")
        }
    return identities
