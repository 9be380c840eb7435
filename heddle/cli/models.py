"""`heddle model tiny`: a model folder vLLM's CPU build runs."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Annotated

import typer

from heddle.cli.common import console, fail

app = typer.Typer(help="Models for vLLM engines.", no_args_is_help=True)


@app.command("tiny")
def model_tiny(
    out: Annotated[Path, typer.Option(help="Folder to write the model into.")],
    seed: int = 0,
    teach: Annotated[
        str | None,
        typer.Option(
            help="'agent': teach it the agent format (tool calls, answers): about 10 "
            "minutes on 2 cores the first time, then from the cache (~/.cache/heddle/models)."
        ),
    ] = None,
) -> None:
    """Build a tiny Qwen2 (random weights, a locally trained tokenizer) for CPU vLLM;
    with --teach agent, one that calls tools and answers."""
    if teach not in (None, "agent"):
        raise fail(f"--teach must be 'agent', got {teach!r}")
    try:
        from engines.tiny_model import build_tiny_model
    except ImportError as exc:  # pragma: no cover - depends on the extra
        raise fail(f"needs the vllm extra (torch, transformers): {exc}") from None
    try:
        if teach == "agent":
            from heddle.teach import cached_agent_model

            # Taught once per source version and seed, then copied (`make test` has
            # usually taught it already).
            shutil.copytree(cached_agent_model(seed=seed), out, dirs_exist_ok=True)
        else:
            build_tiny_model(out, seed=seed)
    except ModuleNotFoundError as exc:
        raise fail(f"needs the vllm extra (torch, transformers, tokenizers): {exc}") from None
    console.print(f"tiny model written to {out}")
