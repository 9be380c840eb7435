"""One GRPO policy update on CPU, from a committed checkpoint to the next.

The loss is GRPO's as the peers run it (REFERENCES.md, "The RL loop"): per sampled token,
-min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A) with rho = exp(log p_new - log
p_rollout), the rollout's log-probs being what vLLM reported when it sampled; averaged
over every sampled token of the batch (token mean), the micro-batches accumulating into
one step; then gradient clipping and one AdamW step. The new log-probs are the trainer's
own forward pass in float32; before the update they are also compared with the
rollout's, which is how a weight sync that did not reach the engines shows.

Everything a step depends on is in the checkpoint it starts from (weights, optimizer,
RNG) and in its inputs, and CPU kernels on a fixed thread count are deterministic, so a
step run again after a crash writes the same bytes as the first attempt would have.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from heddle.checkpoints import (
    CheckpointRef,
    commit,
    committed,
    copy_model_files,
    staging_dir,
    trainer_info,
)
from heddle.training import TrainingSample

# Threads the trainer's kernels use: fixed, so that a rerun sums in the same order.
TRAIN_THREADS = 2


@dataclass(frozen=True)
class GrpoConfig:
    lr: float = 2e-4
    eps_low: float = 0.2
    eps_high: float = 0.28  # DAPO's clip-higher
    max_grad_norm: float = 1.0
    weight_decay: float = 0.0
    micro_batch: int = 8  # trajectories per forward pass


@dataclass(frozen=True)
class StepMetrics:
    samples: int
    tokens: int  # sampled tokens trained on
    loss: float
    grad_norm: float
    clip_fraction: float  # tokens whose ratio was clipped
    # Mean |log p_trainer - log p_rollout| before the update: near 0 when the engines ran
    # the weights the trainer starts from.
    logprob_gap: float
    seconds: float


def token_loss(
    new_logprobs: Any,
    old_logprobs: Any,
    advantages: Any,
    mask: Any,
    eps_low: float,
    eps_high: float,
) -> tuple[Any, Any]:
    """Per-token clipped surrogate (to be summed over the mask) and the clipped flags."""
    import torch

    ratio = torch.exp(new_logprobs - old_logprobs)
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    loss = -torch.minimum(ratio * advantages, clipped * advantages)
    flags = (ratio != clipped).float()
    return loss * mask, flags * mask


def _pad(samples: list[TrainingSample]) -> tuple[Any, Any, Any, Any]:
    """Token ids, rollout log-probs, loss mask and per-token advantages, right-padded."""
    import torch

    width = max(len(s.token_ids) for s in samples)
    ids = torch.zeros(len(samples), width, dtype=torch.long)
    old = torch.zeros(len(samples), width)
    mask = torch.zeros(len(samples), width)
    adv = torch.zeros(len(samples), width)
    for row, s in enumerate(samples):
        n = len(s.token_ids)
        ids[row, :n] = torch.tensor(s.token_ids)
        old[row, :n] = torch.tensor(s.logprobs)
        mask[row, :n] = torch.tensor(s.loss_mask, dtype=torch.float32)
        adv[row, :n] = s.advantage
    return ids, old, mask, adv


def train_step(
    start: CheckpointRef,
    samples: list[TrainingSample],
    root: Path,
    config: GrpoConfig,
    *,
    seed: int,
    on_micro_batch: Callable[[int], None] = lambda _: None,
) -> tuple[CheckpointRef, StepMetrics]:
    """Train `start` on `samples` and commit step `start.step + 1` under `root`; a step
    already committed is returned as it is, with the metrics it recorded."""
    step = start.step + 1
    done = committed(root, step)
    if done is not None:
        return done, StepMetrics(**trainer_info(done.path)["metrics"])
    import torch
    from transformers import AutoModelForCausalLM

    began = time.monotonic()
    torch.set_num_threads(TRAIN_THREADS)
    model = AutoModelForCausalLM.from_pretrained(start.path, torch_dtype=torch.float32)
    model.train()
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.lr, weight_decay=config.weight_decay
    )
    state_file = Path(start.path) / "optimizer.pt"
    if state_file.exists():
        optimizer.load_state_dict(torch.load(state_file, weights_only=True))
    torch.manual_seed(seed * 1_000_003 + step)
    # Zero advantages (a group whose rewards are equal) teach nothing: left out, as
    # verl's and DAPO's filters do, so they do not dilute the token mean.
    useful = sorted((s for s in samples if s.advantage != 0.0), key=lambda s: s.trajectory_id)
    tokens = sum(sum(s.loss_mask[1:]) for s in useful)
    total_loss = gap = clipped = 0.0
    optimizer.zero_grad()
    for index in range(0, len(useful), config.micro_batch):
        on_micro_batch(index // config.micro_batch)
        ids, old, mask, adv = _pad(useful[index : index + config.micro_batch])
        # Right padding needs no attention mask: causal attention never lets a real
        # token see the pads after it, and the pads' own outputs are masked out.
        logits = model(input_ids=ids).logits[:, :-1].float()
        new = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        m = mask[:, 1:]
        loss, flags = token_loss(new, old[:, 1:], adv[:, 1:], m, config.eps_low, config.eps_high)
        (loss.sum() / max(tokens, 1)).backward()
        total_loss += float(loss.detach().sum())
        gap += float(((new.detach() - old[:, 1:]).abs() * m).sum())
        clipped += float(flags.sum())
    grad_norm = 0.0
    if useful:
        grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm))
        if math.isfinite(grad_norm):
            optimizer.step()
    metrics = StepMetrics(
        samples=len(useful),
        tokens=int(tokens),
        loss=total_loss / max(tokens, 1),
        grad_norm=grad_norm,
        clip_fraction=clipped / max(tokens, 1),
        logprob_gap=gap / max(tokens, 1),
        seconds=time.monotonic() - began,
    )
    staging = staging_dir(root, step)
    model.save_pretrained(staging)
    copy_model_files(Path(start.path), staging)
    torch.save(optimizer.state_dict(), staging / "optimizer.pt")
    torch.save(torch.get_rng_state(), staging / "rng.pt")
    info = {
        "parent": start.path,
        "seed": seed,
        "config": asdict(config),
        "metrics": asdict(metrics),
    }
    return commit(staging, root, step, info), metrics
