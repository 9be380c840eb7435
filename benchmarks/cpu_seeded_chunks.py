"""vLLM's CPU build and seeded sampling: a seeded request whose prefill is split over
iterations (its prompt longer than the token budget left) kills the engine core, with
`RuntimeError: CPU Generator does not use offset` (vLLM 0.32: the model runner rewinds
the request's generator after a partial prefill, which only CUDA generators allow).
Unseeded, the same requests run. This is why `engines.vllm.sampled_params` leaves an
agent turn's seed out on CPU.

    python benchmarks/cpu_seeded_chunks.py   # needs the real-engine set-up; ~1 minute

Runs eight 300-token prompts with a 256-token budget, seeded then unseeded, each in a
fresh engine process, and prints whether each finished.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import tempfile
from pathlib import Path


def _run(seeded: bool, model: str) -> None:
    from vllm import LLM, SamplingParams

    llm = LLM(model=model, dtype="bfloat16", max_model_len=1024, enforce_eager=True,
              max_num_batched_tokens=256)  # fmt: skip
    prompts = [{"prompt_token_ids": list(range(10, 310 + i))} for i in range(8)]
    params = [SamplingParams(temperature=1.0, max_tokens=16, seed=i if seeded else None)
              for i in range(8)]  # fmt: skip
    llm.generate(prompts, params, use_tqdm=False)
    os._exit(0)  # skip the engine's teardown, which can outlast the measurement


def main() -> int:
    from engines.tiny_model import build_tiny_model

    root = Path(tempfile.mkdtemp(prefix="cpu-seeded-"))
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CACHE_ROOT", str(root / "vllm-cache"))
    model = str(build_tiny_model(root / "model"))
    context = multiprocessing.get_context("spawn")
    for seeded in (True, False):
        proc = context.Process(target=_run, args=(seeded, model))
        proc.start()
        proc.join(600)
        state = "finished" if proc.exitcode == 0 else f"failed (exit {proc.exitcode})"
        print(f"{'seeded' if seeded else 'unseeded'}, prefill in chunks: {state}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
