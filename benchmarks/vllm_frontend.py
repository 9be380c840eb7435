"""What a vLLM instance's front end costs the engine host, with and without text.

    python benchmarks/vllm_frontend.py [--seqs 3] [--tokens 7000]

The engine host runs vLLM's `AsyncLLM` front end in its own event loop, beside the
Temporal workers: every engine step's outputs are decoded there. A trace step needs
token ids only, so `engines/vllm.py` asks for no detokenization. This starts one CPU
instance of the tiny model (needs the real-engine extra), decodes `--seqs` sequences of
`--tokens` tokens each way, side by side in one run, and prints the host process's CPU
seconds per way and their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import tempfile
import time
from pathlib import Path
from typing import Any


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _decode(llm: Any, seqs: int, tokens: int, detokenize: bool, tag: str) -> float:
    from engines.vllm import replay_params

    params = replay_params(tokens, detokenize=detokenize)

    async def one(k: int) -> int:
        made = 0
        prompt = {"prompt_token_ids": [5 + k] * 100}
        async for out in llm.generate(prompt, params, f"{tag}-{k}"):
            made += len(out.outputs[0].token_ids)
        return made

    before = _cpu_s()
    made = await asyncio.gather(*(one(k) for k in range(seqs)))
    assert made == [tokens] * seqs, made
    return _cpu_s() - before


async def main(seqs: int, tokens: int) -> None:
    from engines.tiny_model import build_tiny_model
    from engines.vllm import VllmSettings

    root = Path(tempfile.mkdtemp(prefix="heddle-frontend-"))
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm.v1.engine.async_llm import AsyncLLM

    model = build_tiny_model(root / "model")
    settings = VllmSettings(model_path=str(model), max_model_len=8192, kv_cache_gib=1)
    llm = AsyncLLM.from_engine_args(settings.engine_args(1))
    try:
        await _decode(llm, 1, 64, True, "warm")  # first-request costs out of the way
        rows = []
        for detokenize in (True, False):
            started = time.monotonic()
            cpu = await _decode(llm, seqs, tokens, detokenize, f"d{int(detokenize)}")
            rows.append((detokenize, cpu, time.monotonic() - started))
    finally:
        llm.shutdown()
        del llm  # collected now, not at interpreter exit (vLLM's __del__ shuts down again)
    print(f"{seqs} sequences x {tokens} tokens on one CPU instance of the tiny model")
    for detokenize, cpu, wall in rows:
        print(f"  detokenize={detokenize!s:5}  host CPU {cpu:6.2f} s  wall {wall:6.2f} s")
    print(f"host CPU, text / token ids only: {rows[0][1] / rows[1][1]:.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=7000)
    args = parser.parse_args()
    asyncio.run(main(args.seqs, args.tokens))
