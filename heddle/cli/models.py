"""`heddle model tiny`: a model folder vLLM's CPU build runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from heddle.cli.common import console, fail

app = typer.Typer(help="Models for vLLM engines.", no_args_is_help=True)


@app.command("tiny")
def model_tiny(
    out: Annotated[Path, typer.Option(help="Folder to write the model into.")],
    seed: int = 0,
) -> None:
    """Build a tiny Qwen2 (random weights, a locally trained tokenizer) for CPU vLLM."""
    try:
        from engines.tiny_model import build_tiny_model
    except ImportError as exc:  # pragma: no cover - depends on the extra
        raise fail(f"needs the vllm extra (torch, transformers): {exc}") from None
    try:
        build_tiny_model(out, seed=seed)
    except ModuleNotFoundError as exc:
        raise fail(f"needs the vllm extra (torch, transformers, tokenizers): {exc}") from None
    console.print(f"tiny model written to {out}")
