"""What drafting from a suffix tree costs the host per decoding request per step: the
cost model's `DRAFT_S_PER_SEQ` (engines/costmodel.py). arctic-inference's tree (vLLM's
`suffix` method), filled with 2,000 earlier responses of 2,000 tokens each.

    python benchmarks/suffix_draft_cost.py   # needs arctic-inference (the real-engine set-up)

Prints the time of one `speculate` (4 tokens at most, from the last 24 of a 4,000-token
context) and of appending one generated token, averaged over 20,000 calls.
"""

from __future__ import annotations

import random
import time

import numpy as np
from arctic_inference.suffix_decoding import SuffixDecodingCache

VOCAB = 32_000


def main() -> None:
    rng = random.Random(0)

    def tokens(n: int) -> list[int]:  # Zipf-like: a few ids are common, as in text
        return [min(int(rng.paretovariate(1.1)), VOCAB - 1) for _ in range(n)]

    cache = SuffixDecodingCache(max_tree_depth=24, max_cached_requests=10_000)
    for r in range(2000):
        cache.start_request(f"old{r}", tokens(500))
        cache.add_active_response(f"old{r}", tokens(2000))
        cache.stop_request(f"old{r}")
    context = tokens(4000)
    cache.start_request("now", context[:500])
    cache.add_active_response("now", context[500:])
    calls = 20_000
    tail = np.asarray(context[-24:], dtype=np.int32)
    started = time.perf_counter()
    for _ in range(calls):
        draft = cache.speculate("now", tail, max_spec_tokens=4)
    speculate_s = (time.perf_counter() - started) / calls
    started = time.perf_counter()
    for i in range(calls):
        cache.add_active_response("now", [context[i % len(context)]])
    append_s = (time.perf_counter() - started) / calls
    drafted = len(draft.token_ids)
    print(f"speculate: {speculate_s * 1e6:.1f} us a request a step ({drafted} drafted)")
    print(f"append one token: {append_s * 1e6:.1f} us")
    print(f"together: {(speculate_s + append_s) * 1e6:.1f} us")


if __name__ == "__main__":
    main()
