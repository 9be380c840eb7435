"""An agent campaign through the whole durable loop on vLLM CPU engines and the taught
tiny model: each iteration's rollout, a real GRPO step, the sync into the running
engines, the record. The engines start on the campaign's untied step 0; after each sync
the next iteration's turns are labelled with the new version, and the trainer finds the
rollout's log-probs to be its own starting weights' (the sync reached the engines)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from heddle.campaign import CampaignSpec
from heddle.client import HeddleClient
from heddle.store import TrajectoryStore
from heddle.tasks import load_tasks
from heddle.types import RolloutOptions
from tests.live import kill_process, worker_process
from tests.real_engine import require_vllm, vllm_env
from tests.test_agent_rollout import DATA, _cluster, agent_model
from tests.test_vllm_rollout import VllmWorker

pytestmark = [pytest.mark.real_engine, pytest.mark.slow]


def test_an_agent_campaign_trains_syncs_and_labels_its_turns(
    temporal_address: str, tmp_path: Path
) -> None:
    require_vllm()
    from heddle.checkpoints import base_checkpoint

    vllm_env(tmp_path)
    root = tmp_path / "ckpt"
    step0 = base_checkpoint(agent_model(), root)  # what the campaign's step 0 is
    store_url = f"sqlite:///{tmp_path / 'store.db'}"
    prefix = f"c{uuid.uuid4().hex[:8]}-"
    log = tmp_path / "worker.log"
    proc = worker_process(
        temporal_address, store_url, prefix, log, time_scale=1.0,
        cluster=_cluster(Path(step0.path)),
    )  # fmt: skip
    worker = VllmWorker(temporal_address, store_url, prefix, log, proc)
    try:
        worker.wait_up({"i0": 1, "i1": 1})
        spec = CampaignSpec(
            name="agent",
            mode="agent",
            iterations=2,
            samples=2,
            tasks_per_iteration=4,
            checkpoint_root=str(root),
            model_path=str(agent_model()),
            lr=5e-3,
            options=RolloutOptions(
                policy="verl", tools="real", max_turns=4, max_tokens=1024, max_tokens_per_turn=128
            ),
        )

        async def run() -> None:
            heddle = await HeddleClient.connect(
                temporal_address, store_url=store_url, queue_prefix=prefix
            )
            async with heddle:
                handle = await heddle.start_campaign(spec, tasks=load_tasks(DATA / "math.jsonl"))
                state = await asyncio.wait_for(handle.result(), 500)
                assert state.phase == "done"
                assert state.policy_version == 2
                assert len(set(state.consumed_task_ids)) == 8
                rows = await heddle.campaign_iterations("agent")
                assert [r["policy_version"] for r in rows] == [0, 1]
                for r in rows:
                    assert r["completed"] == r["trajectories"] == 8
                    # The engines ran the very weights the step started from.
                    assert r["logprob_gap"] < 0.05

        asyncio.run(run())
        store = TrajectoryStore.open(store_url)
        try:
            for iteration, version in ((0, 0), (1, 1)):
                turns = store.load_turns(f"agent-it{iteration:04d}")
                versions = {t.weight_version for ts in turns.values() for t in ts}
                assert versions == {version}
        finally:
            store.close()
        assert (root / "step-000002" / "model.safetensors").exists()
    finally:
        kill_process(worker.proc)
