"""An agent campaign through the whole durable loop on vLLM CPU engines and the taught
tiny model: each iteration's rollout, a real GRPO step, the sync into the running
engines, the record; and it survives its trainer killed mid-step and its engine host
mid-sync. The engines start on the campaign's untied step 0; after each sync the next
iteration's turns are labelled with the new version, and the trainer finds the
rollout's log-probs to be its own starting weights' (the sync reached the engines)."""

from __future__ import annotations

import asyncio
import random
import re
import time
import uuid
from pathlib import Path

import pytest

from heddle.campaign import CampaignSpec
from heddle.client import HeddleClient
from heddle.store import TrajectoryStore
from heddle.tasks import load_tasks
from heddle.toytasks import FILE
from heddle.types import RolloutOptions
from tests.live import kill_process, worker_process
from tests.real_engine import require_vllm, vllm_env
from tests.test_agent_rollout import _cluster, agent_model
from tests.test_vllm_rollout import VllmWorker

pytestmark = [pytest.mark.real_engine, pytest.mark.slow]


def campaign_worker(address: str, store_url: str, prefix: str, log: Path, step0: str) -> VllmWorker:
    """A worker that hosts two vLLM CPU instances on a campaign's step 0 (`step0`, the
    checkpoint's folder) and runs its trainer, logging to `log` (appended)."""
    cluster = _cluster(Path(step0))
    proc = worker_process(address, store_url, prefix, log, time_scale=1.0, cluster=cluster)
    return VllmWorker(address, store_url, prefix, log, proc)


# The first vLLM test of a fresh machine also teaches the tiny model (about 15 min on 2
# cores, cached afterwards): the limit leaves room for both.
@pytest.mark.timeout(2700)
def test_an_agent_campaign_survives_its_trainer_killed_mid_step_and_mid_sync(
    temporal_address: str, tmp_path: Path
) -> None:
    """The worker that runs the trainer and hosts the engines is SIGKILLed mid-step of a
    random iteration, then mid-sync of the next, each time restarted. The campaign
    finishes with every task trained once and every trajectory stored once, and each
    committed step is bit for bit the step an uninterrupted trainer makes from the same
    parent and the same stored rollout."""
    require_vllm()
    from heddle.checkpoints import CheckpointRef, base_checkpoint
    from heddle.grpo import GrpoConfig, train_step
    from heddle.training import training_batch

    rng = random.Random(2028)
    vllm_env(tmp_path)
    root = tmp_path / "ckpt"
    step0 = base_checkpoint(agent_model(), root)
    store_url = f"sqlite:///{tmp_path / 'store.db'}"
    prefix = f"k{uuid.uuid4().hex[:8]}-"
    log = tmp_path / "worker.log"

    def start_worker() -> VllmWorker:
        return campaign_worker(temporal_address, store_url, prefix, log, step0.path)

    iterations = 3
    spec = CampaignSpec(
        name="kills",
        mode="agent",
        iterations=iterations,
        samples=4,
        tasks_per_iteration=4,
        checkpoint_root=str(root),
        model_path=str(agent_model()),
        lr=2e-3,
        seed=3,
        micro_batch=1,  # a micro-batch a sample: the step has points to be killed at
        options=RolloutOptions(
            policy="verl", tools="real", max_turns=3, max_tokens=1024, max_tokens_per_turn=64
        ),
    )
    worker = start_worker()
    killed: list[str] = []

    async def kill_at(heddle: HeddleClient, pattern: str, within_s: float) -> re.Match[str]:
        """SIGKILL the worker a random moment after it logs a line matching `pattern`,
        and start another; returns the match."""
        nonlocal worker
        # A hang guard, not a speed target (the test takes about 200 s alone).
        deadline = time.monotonic() + 1200
        polls = 0
        while (found := re.search(pattern, log.read_text(errors="replace"))) is None:
            assert time.monotonic() < deadline, f"the worker never logged {pattern!r}"
            polls += 1
            if polls % 100 == 0:  # the store, which needs no worker up
                done = len(await heddle.campaign_iterations("kills")) == iterations
                assert not done, f"the campaign ended; no line matched {pattern!r}"
            await asyncio.sleep(0.01)
        await asyncio.sleep(rng.uniform(0.0, within_s))
        state = await heddle.campaign_state("kills")
        kill_process(worker.proc)
        killed.append(f"{state.phase} {state.iteration}")
        worker = start_worker()
        return found

    async def run() -> None:
        heddle = await HeddleClient.connect(
            temporal_address, store_url=store_url, queue_prefix=prefix
        )
        async with heddle:
            # The toy tasks: rewards spread within most groups, not all. A step whose
            # groups all have equal rewards trains on nothing and logs no micro-batch, so
            # the mid-step kill waits for the first step before the last that has one
            # (a random moment after its first micro-batch starts); then mid-sync of the
            # next version's weights.
            handle = await heddle.start_campaign(spec, tasks=load_tasks(FILE))
            before_last = "|".join(str(k) for k in range(1, iterations))
            step = await kill_at(heddle, rf"train step ({before_last}): micro-batch 0", 0.05)
            await kill_at(heddle, f"weight sync to version {int(step[1]) + 1}:", 0.05)
            state = await asyncio.wait_for(handle.result(), 900)
            assert state.phase == "done"
            assert state.policy_version == iterations
            assert len(state.consumed_task_ids) == len(set(state.consumed_task_ids)) == 12
            rows = await heddle.campaign_iterations("kills")
            assert [r["iteration"] for r in rows] == list(range(iterations))
            for r in rows:
                assert r["completed"] == r["trajectories"] == 16
                # The engines ran the very weights the step started from.
                assert r["logprob_gap"] < 0.05

    try:
        worker.wait_up({"i0": 1, "i1": 1})
        asyncio.run(run())
    finally:
        kill_process(worker.proc)
    # Both kills fell where they were aimed.
    assert [k.split()[0] for k in killed] == ["train", "sync"], killed
    store = TrajectoryStore.open(store_url)
    try:
        for iteration in range(iterations):
            turns = store.load_turns(f"kills-it{iteration:04d}")
            assert {t.weight_version for ts in turns.values() for t in ts} == {iteration}
        for step in range(1, iterations + 1):
            batch = f"kills-it{step - 1:04d}"
            ids = [r["trajectory_id"] for r in store.list_trajectories(batch, limit=100)]
            assert len(ids) == len(set(ids)) == 16
            parent = CheckpointRef(str(root / f"step-{step - 1:06d}"), step - 1)
            again, _ = train_step(
                parent, training_batch(store, batch), tmp_path / f"again-{step}",
                GrpoConfig(lr=spec.lr, micro_batch=spec.micro_batch), seed=spec.seed,
            )  # fmt: skip
            for name in ("model.safetensors", "optimizer.pt", "rng.pt"):
                made = (root / f"step-{step:06d}" / name).read_bytes()
                assert (Path(again.path) / name).read_bytes() == made, (step, name)
    finally:
        store.close()


@pytest.mark.timeout(2700)
def test_an_asynchronous_agent_campaign_trains_no_token_older_than_its_bound(
    temporal_address: str, tmp_path: Path
) -> None:
    """With `max_staleness=1` the next batch rolls out while the step before it trains
    and syncs: its turns carry the version they were sampled by (some the one before the
    step that trains them), and the trainer's batch leaves none of them out, since none
    is more than one version old."""
    require_vllm()
    from heddle.checkpoints import base_checkpoint
    from heddle.training import training_batch

    vllm_env(tmp_path)
    root = tmp_path / "ckpt"
    step0 = base_checkpoint(agent_model(), root)
    store_url = f"sqlite:///{tmp_path / 'store.db'}"
    prefix = f"a{uuid.uuid4().hex[:8]}-"
    log = tmp_path / "worker.log"
    iterations = 3
    spec = CampaignSpec(
        name="vllm-ahead",
        mode="agent",
        iterations=iterations,
        samples=4,
        tasks_per_iteration=4,
        checkpoint_root=str(root),
        model_path=str(agent_model()),
        lr=2e-3,
        seed=5,
        max_staleness=1,
        options=RolloutOptions(
            policy="verl", tools="real", max_turns=3, max_tokens=1024, max_tokens_per_turn=64
        ),
    )
    worker = campaign_worker(temporal_address, store_url, prefix, log, step0.path)

    async def run() -> None:
        heddle = await HeddleClient.connect(
            temporal_address, store_url=store_url, queue_prefix=prefix
        )
        async with heddle:
            handle = await heddle.start_campaign(spec, tasks=load_tasks(FILE))
            state = await asyncio.wait_for(handle.result(), 900)
            assert state.phase == "done"
            assert state.policy_version == iterations
            assert len(state.consumed_task_ids) == len(set(state.consumed_task_ids)) == 12

    try:
        worker.wait_up({"i0": 1, "i1": 1})
        asyncio.run(run())
    finally:
        kill_process(worker.proc)
    store = TrajectoryStore.open(store_url)
    try:
        behind = 0
        for step in range(iterations):  # batch `step` is trained from version `step`
            batch = f"vllm-ahead-it{step:04d}"
            versions = {t.weight_version for ts in store.load_turns(batch).values() for t in ts}
            assert versions <= {step - 1, step}, (batch, versions)
            behind += (step - 1) in versions
            kept = training_batch(store, batch, oldest_version=step - 1, on_stale="drop")
            assert len(kept) == len(training_batch(store, batch))
        assert behind > 0  # a rollout ran ahead of the step before it
    finally:
        store.close()
