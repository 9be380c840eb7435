"""A simulated campaign on a file-backed stack survives SIGKILLs: the worker that hosts
the engines and the trainer mid-rollout, then the Temporal server itself mid-iteration,
each restarted. The campaign finishes with every iteration recorded once, one batch per
iteration, and every trajectory of every batch completed; synchronous, and asynchronous
with a rollout one version ahead."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from pathlib import Path

import pytest

from heddle.campaign import CampaignSpec
from heddle.client import HeddleClient
from heddle.runtime.stack import EmbeddedStack, free_port
from heddle.types import RolloutOptions
from tests.live import SMALL_CLUSTER

ITERATIONS = 4


async def _phase(client: HeddleClient, name: str, phase: str, iteration: int) -> None:
    deadline = time.monotonic() + 180
    while True:
        try:
            state = await client.campaign_state(name)
            if state.phase == phase and state.iteration >= iteration:
                return
        except Exception:  # a server still coming back
            pass
        assert time.monotonic() < deadline, f"the campaign never reached {phase} {iteration}"
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("max_staleness", [0, 1])
def test_a_campaign_survives_its_worker_and_server_being_killed(
    tmp_path: Path, max_staleness: int
) -> None:
    rng = random.Random(28)
    stack = EmbeddedStack(
        state_dir=tmp_path / "stack",
        port=free_port(),
        headless=True,
        cluster=SMALL_CLUSTER,
        time_scale=0.05,
    )
    spec = CampaignSpec(
        name="crash",
        mode="simulated",
        iterations=ITERATIONS,
        samples=2,
        tasks_per_iteration=3,
        workload="math",
        checkpoint_root=str(tmp_path / "ckpt"),
        options=RolloutOptions(policy="verl"),
        iterations_per_run=3,
        max_staleness=max_staleness,
    )

    async def connect() -> HeddleClient:
        return await HeddleClient.connect(stack.address, store_url=stack.store_url)

    async def run() -> None:
        await stack.start()
        client = await connect()
        handle = await client.start_campaign(spec)
        # The engine host (and trainer) killed mid-rollout of a random iteration.
        await _phase(client, "crash", "rollout", rng.randrange(0, 2))
        await asyncio.sleep(rng.uniform(0.0, 0.5))
        stack.kill_worker()
        await asyncio.sleep(1.0)
        stack.start_worker()
        # Then the server, mid-iteration, after the continue-as-new.
        await _phase(client, "crash", "rollout", 3)
        await asyncio.sleep(rng.uniform(0.0, 0.5))
        assert stack.server is not None
        os.killpg(stack.server.pid, signal.SIGKILL)
        stack.server.wait()
        client.store.close()
        stack.stop()
        await stack.start()
        client = await connect()
        async with client:
            handle = client.campaign("crash")
            deadline = time.monotonic() + 240
            while (await handle.describe()).status.name == "RUNNING":  # type: ignore[union-attr]
                assert time.monotonic() < deadline, "the campaign did not finish"
                await asyncio.sleep(0.5)
            state = await client.campaign_state("crash")
            assert state.phase == "done"
            assert state.iteration == ITERATIONS
            assert state.policy_version == ITERATIONS
            rows = await client.campaign_iterations("crash")
            assert [r["iteration"] for r in rows] == list(range(ITERATIONS))
            lags = [r["iteration"] - r["policy_version"] for r in rows]
            assert all(0 <= lag <= max_staleness for lag in lags), lags
            batches = sorted(
                b["batch_id"]
                for b in await client.list_batches()
                if b["batch_id"].startswith("crash-")
            )
            assert batches == [f"crash-it{i:04d}" for i in range(ITERATIONS)]
            for batch in batches:
                progress = await asyncio.to_thread(client.store.batch_progress, batch)
                assert progress["completed"] == 6, (batch, progress)
                assert progress["failed"] == 0
            for step in range(1, ITERATIONS + 1):
                assert (tmp_path / "ckpt" / f"step-{step:06d}" / "trainer.json").exists()
            assert not list((tmp_path / "ckpt").glob(".step-*"))

    try:
        asyncio.run(run())
    finally:
        stack.stop()
