"""Do CPU vLLM engines starve the rest of the machine? A probe's lateness, side by side.

    python benchmarks/cpu_engine_starvation.py [--tokens 7000]

On vLLM's CPU build the engines decode on every core they get. The Temporal server and
worker share those cores, and a step's heartbeat that arrives 10 s late times the step
out. This starts, in a session of its own (as the stack starts a worker), two CPU
instances of the tiny model decoding 3 sequences of `--tokens` tokens each, while a
probe in this process sleeps 10 ms at a time and records how late each sleep ends. Three
ways, one after the other in one run:

- `off`: the engines at the priority they are given (`nice: 0`);
- `threads`: every engine thread at niceness 10, the session left as it is;
- `full`: what Heddle does on CPU, the threads and the session lowered.

It prints the probe's worst and 99th-percentile lateness for each, the seconds it spent
stalled, and the engines' decode time (what the lower priority costs them). Needs the
real-engine extra.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from heddle.stats import percentile


async def _child(model: str, variant: str, tokens: int) -> None:
    """Two instances in this process, decoding; prints the decode time."""
    import engines.vllm as vllm

    if variant == "threads":
        vllm.lower_session = lambda nice: False  # type: ignore[assignment]
    nice = 0 if variant == "off" else 10
    settings = vllm.VllmSettings(
        model_path=model, max_model_len=8192, max_num_seqs=16, kv_cache_gib=1, nice=nice
    )
    instances = [vllm.LocalVllm(f"i{k}", settings, 1) for k in range(2)]
    await asyncio.gather(*(i.start() for i in instances))
    print("UP", flush=True)

    async def one(instance: vllm.LocalVllm, k: int) -> None:
        async for _ in instance.stream(f"r{k}", [5 + k] * 100, tokens, 0):
            pass

    started = time.monotonic()
    await asyncio.gather(*(one(i, k) for i in instances for k in range(3)))
    print(f"DECODED {time.monotonic() - started:.2f}", flush=True)
    for i in instances:
        await i.stop()


def _probe(stop: threading.Event, late_ms: list[float]) -> None:
    while not stop.is_set():
        before = time.monotonic()
        time.sleep(0.01)
        late_ms.append((time.monotonic() - before - 0.01) * 1000)


def run_variant(model: Path, variant: str, tokens: int) -> tuple[list[float], float]:
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "TOKENIZERS_PARALLELISM": "false"}
    argv = [sys.executable, __file__, "--child", variant, "--model", str(model)]
    argv += ["--tokens", str(tokens)]
    child = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        start_new_session=True, env=env,
    )  # fmt: skip
    assert child.stdout is not None
    late_ms: list[float] = []
    stop = threading.Event()
    probe = threading.Thread(target=_probe, args=(stop, late_ms))
    decoded = float("nan")
    for line in child.stdout:
        if line.startswith("UP"):
            probe.start()
        elif line.startswith("DECODED"):
            decoded = float(line.split()[1])
            stop.set()
    stop.set()
    if probe.is_alive():
        probe.join()
    if child.wait() != 0:
        raise SystemExit(f"the {variant} engines failed (exit {child.returncode})")
    return late_ms, decoded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=7000)
    parser.add_argument("--child", choices=["off", "threads", "full"], help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        asyncio.run(_child(args.model, args.child, args.tokens))
        return
    from engines.tiny_model import build_tiny_model

    model = build_tiny_model(Path(tempfile.mkdtemp(prefix="heddle-starve-")) / "model")
    print(f"two CPU instances, 6 x {args.tokens} tokens; a probe sleeping 10 ms at a time")
    for variant in ("off", "threads", "full"):
        late, decoded = run_variant(model, variant, args.tokens)
        stalled = [ms for ms in late if ms > 100]
        print(
            f"  {variant:8} probe: worst {max(late):6.0f} ms late, p99 "
            f"{percentile(sorted(late), 99):6.1f} ms, {sum(stalled) / 1000:5.1f} s stalled "
            f"(sleeps >100 ms late) in {decoded:.1f} s of decoding",
            flush=True,
        )


if __name__ == "__main__":
    main()
