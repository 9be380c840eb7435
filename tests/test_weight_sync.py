"""Weight sync into a running vLLM instance (CPU build): after a train step and a sync,
vLLM samples with the trainer's new weights (its log-probs match the trainer's own
recomputation), labels the turn with the new version, and the step-0 checkpoint's
untied output embedding is what keeps `lm_head` from going stale."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from engines.request import EngineRequest, Sampling
from tests.real_engine import require_vllm, tiny_model, vllm_env

pytestmark = [pytest.mark.real_engine, pytest.mark.slow]

PROMPT = [5, 9, 12, 7, 30, 41]


def _trainer_logprobs(model_dir: str, ids: list[int], prompt_len: int) -> list[float]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].float()
    lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None]).squeeze(-1)
    return lp.tolist()[prompt_len - 1 :]


def test_a_synced_engine_samples_with_the_trained_weights(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    require_vllm()
    from engines.vllm import LocalVllm, TokenSessions, VllmEngine, VllmSettings, read_vocab_size
    from heddle.checkpoints import base_checkpoint
    from heddle.grpo import GrpoConfig, train_step
    from heddle.training import TrainingSample

    vllm_env(tmp_path_factory.mktemp("vllm"))
    base = base_checkpoint(tiny_model(tmp_path_factory), tmp_path / "ckpt")
    settings = VllmSettings(model_path=base.path, max_num_seqs=4, max_model_len=512)
    engine = VllmEngine(
        instance_id="s0",
        backend=LocalVllm("s0", settings, tp=1),
        sessions=TokenSessions(read_vocab_size(base.path)),
    )

    async def sample(rid: str) -> tuple[list[int], list[float], int]:
        request = EngineRequest(
            rid, rid, len(PROMPT), 12, sampling=Sampling(seed=1), prompt_ids=list(PROMPT)
        )
        result = await engine.generate(request)
        return result.output_ids, result.output_logprobs, result.weight_version

    async def run() -> None:
        await engine.start()
        try:
            ids, logprobs, version = await sample("before")
            assert version == 0
            full = PROMPT + ids
            # vLLM's log-probs are the base weights' (bfloat16 against float32).
            gaps = [abs(a - b) for a, b in zip(_trainer_logprobs(base.path, full, len(PROMPT)),
                                                logprobs, strict=True)]  # fmt: skip
            assert max(gaps) < 0.05
            # A large step makes the sampled tokens much likelier.
            sample_row = TrainingSample(
                "t", "g", full, [0.0] * len(PROMPT) + logprobs,
                [0] * len(PROMPT) + [1] * len(ids), 1.0, 1.0, "stop", [0],
            )  # fmt: skip
            trained, _ = train_step(
                base, [sample_row], tmp_path / "ckpt", GrpoConfig(lr=5e-2), seed=0
            )
            await engine.sync_weights(trained.path, trained.step)
            new_logprobs = _trainer_logprobs(trained.path, full, len(PROMPT))
            assert sum(new_logprobs) > sum(logprobs) + 1.0
            ids2, logprobs2, version2 = await sample("after")
            assert version2 == 1
            expected = _trainer_logprobs(trained.path, PROMPT + ids2, len(PROMPT))
            gaps = [abs(a - b) for a, b in zip(expected, logprobs2, strict=True)]
            assert max(gaps) < 0.05, gaps
        finally:
            await engine.stop()

    asyncio.run(run())
