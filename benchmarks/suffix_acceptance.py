"""How often vLLM accepts suffix-tree drafts on a real model's sampled turns: the taught
tiny agent model (`heddle model tiny --teach agent`) answering the bundled math tasks'
first turns at temperature 1, with vLLM's `suffix` method (arctic-inference) on the CPU
build. The acceptance the cost model is told (`speculation.acceptance`) is a guess about a
workload; this measures it on one.

    python benchmarks/suffix_acceptance.py [--tasks heddle/data/tasks/math.jsonl]
                                           [--samples 8] [--draft-tokens 4]

Three rounds on one engine, so the suffix tree holds the rounds before: the first half
of the tasks, then the second half (other prompts: a campaign's next batch), then the
first half again (the same prompts: an epoch). Per round it prints the drafts, the
accepted share of drafted tokens, the tokens a decode pass made on average (passes that
found nothing to draft included), and the per-token acceptance `a` that gives as many
under the cost model's geometric model with k drafts.
Needs the real-engine set-up (vLLM's CPU build and arctic-inference).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any


def _fit_acceptance(tokens_per_verify: float, k: int) -> float:
    """The `a` whose (1 - a^(k+1)) / (1 - a) is the measured tokens per verify pass."""
    from heddle.hardware import Speculation

    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        if Speculation(draft_tokens=k, acceptance=mid).tokens_per_verify < tokens_per_verify:
            lo = mid
        else:
            hi = mid
    return lo


def _counters(llm: Any) -> dict[str, float]:
    names = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
    out = dict.fromkeys(names, 0.0)
    for metric in llm.get_metrics():
        for name in names:
            if metric.name == f"vllm:spec_decode_{name}":
                out[name] = float(metric.value)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--tasks", default="heddle/data/tasks/math.jsonl")
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--draft-tokens", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="suffix-acceptance-"))
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CACHE_ROOT", str(root / "vllm-cache"))

    from vllm import LLM, SamplingParams

    from engines.chat import ChatRenderer
    from heddle.tasks import load_tasks
    from heddle.teach import cached_agent_model
    from heddle.toolcalls import tool_schemas

    model = cached_agent_model()
    renderer = ChatRenderer.from_model(str(model))
    tasks = load_tasks(args.tasks)
    prompts = [
        renderer.prompt_ids(
            [{"role": m.role, "content": m.content} for m in task.messages],
            tool_schemas(task.tools),
        )
        for task in tasks
    ]
    half = len(prompts) // 2
    rounds = [
        ("first half", prompts[:half]),
        ("second half (other prompts)", prompts[half:]),
        ("first half again (same prompts)", prompts[:half]),
    ]
    k = args.draft_tokens
    llm = LLM(
        model=str(model),
        dtype="bfloat16",
        max_model_len=2048,
        enforce_eager=True,
        disable_log_stats=False,
        seed=0,
        speculative_config={"method": "suffix", "num_speculative_tokens": k},
    )
    # Unseeded: the CPU build cannot seed a request (benchmarks/cpu_seeded_chunks.py);
    # the engine's own seed (LLM(seed=0)) fixes the draw.
    params = SamplingParams(temperature=1.0, max_tokens=args.max_tokens)
    print(f"taught model {model.name}; {len(tasks)} tasks x {args.samples} samples; k = {k}")
    print("| round | prompts | generated | drafts | accepted / drafted | tokens a pass | a |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    before = _counters(llm)
    for label, batch in rounds:
        started = time.perf_counter()
        outs = llm.generate(
            [{"prompt_token_ids": p} for p in batch for _ in range(args.samples)],
            params,
            use_tqdm=False,
        )
        generated = sum(len(o.outputs[0].token_ids) for o in outs)
        now = _counters(llm)
        drafts = now["num_drafts"] - before["num_drafts"]
        drafted = now["num_draft_tokens"] - before["num_draft_tokens"]
        accepted = now["num_accepted_tokens"] - before["num_accepted_tokens"]
        before = now
        # Every decode pass makes one token plus those of its drafts accepted; passes
        # with no draft (no match in the tree) count, as the cost model's `a` must.
        per_pass = generated / (generated - accepted)
        share = accepted / drafted if drafted else 0.0
        print(
            f"| {label} | {len(batch)} | {generated} | {drafts:.0f} | {share:.3f} "
            f"| {per_pass:.2f} | {_fit_acceptance(per_pass, k):.2f} |"
            f"  ({time.perf_counter() - started:.0f} s)"
        )


if __name__ == "__main__":
    main()
