"""The trainer's GRPO step on CPU: the loss as the peers define it, the untied step-0
checkpoint, commits that a rerun finds, and bytes that a rerun makes again."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from heddle.training import TrainingSample, group_advantages
from tests.real_engine import require_vllm

pytestmark = [pytest.mark.real_engine]


def _digest(path: str | Path) -> str:
    return hashlib.sha256((Path(path) / "model.safetensors").read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_vllm()  # torch comes with the real-engine extra
    from engines.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny"))


def _samples(model_dir: str, n: int = 6) -> list[TrainingSample]:
    """Sequences the model itself samples, with its log-probs: what a rollout returns.
    Odd samples are rewarded, in groups of two."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    rows = []
    for i in range(n):
        prompt = torch.tensor([[5 + i, 9, 12, 7]])
        out = model.generate(prompt, max_new_tokens=6, do_sample=True, min_new_tokens=6)
        ids = out[0].tolist()
        logits = model(input_ids=out).logits[0, :-1]
        lp = torch.log_softmax(logits, -1).gather(-1, out[0, 1:, None]).squeeze(-1).tolist()
        logprobs = [0.0] * 4 + lp[3:]
        rows.append((ids, logprobs, [0] * 4 + [1] * 6, float(i % 2)))
    advantages = group_advantages({str(i): (str(i // 2), r[3]) for i, r in enumerate(rows)})
    return [
        TrainingSample(str(i), str(i // 2), ids, lps, mask, reward, advantages[str(i)], "stop", [0])
        for i, (ids, lps, mask, reward) in enumerate(rows)
    ]


def test_the_clipped_surrogate_is_grpos() -> None:
    require_vllm()
    import torch

    from heddle.grpo import token_loss

    new = torch.log(torch.tensor([1.5, 0.5, 1.0]))
    old = torch.zeros(3)
    adv = torch.tensor([1.0, -1.0, 2.0])
    loss, flags = token_loss(new, old, adv, torch.ones(3), 0.2, 0.28)
    # rho 1.5 with A > 0 is clipped to 1.28; rho 0.5 with A < 0 to 0.8 (min of -0.5*-1
    # and -0.8*-1 is taken with the sign: -min(0.5*-1, 0.8*-1) = 0.8); rho 1 is itself.
    assert loss.tolist() == pytest.approx([-1.28, 0.8, -2.0])
    assert flags.tolist() == [1.0, 1.0, 0.0]


def test_step_zero_unties_the_embeddings(base: Path, tmp_path: Path) -> None:
    import json

    from heddle.checkpoints import base_checkpoint

    ref = base_checkpoint(base, tmp_path / "ckpt")
    config = json.loads((Path(ref.path) / "config.json").read_text())
    assert json.loads((base / "config.json").read_text())["tie_word_embeddings"] is True
    assert config["tie_word_embeddings"] is False
    from safetensors.torch import load_file

    weights = load_file(str(Path(ref.path) / "model.safetensors"))
    assert "lm_head.weight" in weights
    assert (weights["lm_head.weight"] == weights["model.embed_tokens.weight"]).all()
    assert base_checkpoint(base, tmp_path / "ckpt") == ref  # made once


def test_a_step_learns_commits_and_is_made_again_bit_for_bit(base: Path, tmp_path: Path) -> None:
    from heddle.checkpoints import base_checkpoint, committed
    from heddle.grpo import GrpoConfig, train_step

    start = base_checkpoint(base, tmp_path / "a")
    samples = _samples(start.path)
    config = GrpoConfig(lr=1e-2, micro_batch=4)
    seen: list[int] = []
    first, metrics = train_step(
        start, samples, tmp_path / "a", config, seed=3, on_micro_batch=seen.append
    )
    assert first.step == 1
    assert committed(tmp_path / "a", 1) == first
    assert seen == [0, 1]  # six useful samples in micro-batches of four
    assert metrics.samples == 6
    assert metrics.tokens == 36
    # The samples' log-probs are the model's own: the trainer recomputes them.
    assert metrics.logprob_gap < 1e-4
    # A second update on the same data from the new weights: the rewarded samples are
    # now likelier than the others were.
    second, after = train_step(first, samples, tmp_path / "a", config, seed=3)
    assert after.logprob_gap > metrics.logprob_gap
    assert after.loss < metrics.loss

    # A rerun from the same start returns the committed step, training nothing.
    again, again_metrics = train_step(start, samples, tmp_path / "a", config, seed=3)
    assert again == first
    assert again_metrics == metrics

    # In a fresh folder, the same inputs make the same bytes; another seed's optimizer
    # is not in play, but another config is.
    other = base_checkpoint(base, tmp_path / "b")
    redo, _ = train_step(other, samples, tmp_path / "b", config, seed=3)
    assert _digest(redo.path) == _digest(first.path)
    redo2, _ = train_step(redo, samples, tmp_path / "b", config, seed=3)
    assert _digest(redo2.path) == _digest(second.path)
    assert _digest(first.path) != _digest(start.path)
    assert not list((tmp_path / "a").glob(".step-*"))  # no staging left behind
