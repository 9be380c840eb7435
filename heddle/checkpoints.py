"""A campaign's checkpoints on disk: one folder per train step, committed by a rename.

    <root>/step-000003/        model.safetensors, config.json, the tokenizer (a model
                               folder vLLM and transformers load by path), optimizer.pt,
                               rng.pt, trainer.json (step, parent, metrics)

A step is written under `.step-000003.<pid>` and renamed into place when every file is
on disk, so a folder named `step-N` is complete: the rename is the commit (verl and
SkyRL write a "latest" marker last for the same reason). A train step whose folder
exists returns it instead of training again, which makes the trainer's activity safe
to retry after any crash.

Step 0 is the campaign's base model with its output embedding untied from the input
one: vLLM's CPU build packs a tied `lm_head` once at load, so an in-place weight reload
would leave it stale (REFERENCES.md, "The RL loop").
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TRAINER_FILE = "trainer.json"
# What a model folder carries besides its weights: vLLM and transformers read these.
MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
)


@dataclass(frozen=True)
class CheckpointRef:
    """A committed checkpoint: where it is and the train step that wrote it."""

    path: str
    step: int


def step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:06d}"


def committed(root: Path, step: int) -> CheckpointRef | None:
    """The committed checkpoint of `step`, if its folder has been renamed into place."""
    path = step_dir(root, step)
    if (path / TRAINER_FILE).exists():
        return CheckpointRef(str(path), step)
    return None


def trainer_info(path: str | Path) -> dict[str, Any]:
    return json.loads((Path(path) / TRAINER_FILE).read_text())


def staging_dir(root: Path, step: int) -> Path:
    """An empty folder to write `step` into; a crashed writer's leftovers are removed."""
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(f".step-{step:06d}.*"):
        shutil.rmtree(stale, ignore_errors=True)
    path = root / f".step-{step:06d}.{os.getpid()}"
    path.mkdir()
    return path


def commit(staging: Path, root: Path, step: int, info: dict[str, Any]) -> CheckpointRef:
    """Write the trainer file last, flush every file, then rename the folder into place.
    If another writer committed the step first, its checkpoint stands and ours goes."""
    (staging / TRAINER_FILE).write_text(json.dumps({"step": step, **info}, sort_keys=True))
    for f in staging.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    target = step_dir(root, step)
    try:
        staging.rename(target)
    except OSError:
        if committed(root, step) is None:
            raise
        shutil.rmtree(staging, ignore_errors=True)
    _fsync_dir(root)
    return CheckpointRef(str(target), step)


def copy_model_files(source: Path, staging: Path) -> None:
    """The tokenizer and config files a model folder needs, from `source`, where the
    weights' own save did not write them."""
    for name in MODEL_FILES:
        if (source / name).exists() and not (staging / name).exists():
            shutil.copy(source / name, staging / name)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def base_checkpoint(model_dir: Path, root: Path) -> CheckpointRef:
    """Step 0: the model with untied embeddings, in float32 (the trainer's master
    weights; vLLM casts to its dtype at load). Made once; later calls return it."""
    done = committed(root, 0)
    if done is not None:
        return done
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    if tied:
        # A separate output embedding, equal to the input one at the start.
        model.config.tie_word_embeddings = False
        embedding = model.get_input_embeddings().weight
        model.lm_head.weight = torch.nn.Parameter(embedding.detach().clone())  # type: ignore[union-attr,operator]
    staging = staging_dir(root, 0)
    model.save_pretrained(staging)
    copy_model_files(model_dir, staging)
    return commit(staging, root, 0, {"parent": str(model_dir), "untied": tied})
