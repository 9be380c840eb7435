"""Hashed n-grams of a text: what the predictor reads of a real trajectory's words.

A model's latest output and the tool's latest observation say more about the work left
than their lengths do (a traceback, "Final answer", a half-written function). Each text
becomes `NGRAM_BUCKETS` shares: its word unigrams and bigrams hashed (CRC-32, the same
in every process, unlike `hash`) into buckets, each bucket's count over the total.
Shares, not counts, so that the buckets say what the text is about and its length stays
the length features' business. Pure and stdlib-only: the trace loader, the engine host
and the tool worker compute them; the view and the spec carry them.
"""

from __future__ import annotations

import itertools
import re
import zlib

NGRAM_BUCKETS = 8
# Words and single punctuation marks: code and prose alike.
_TOKEN = re.compile(r"\w+|[^\w\s]")


def hashed_ngrams(text: str | None) -> tuple[float, ...]:
    """The text's unigram and bigram shares per bucket, rounded to 3 places (they
    travel in payloads); () for no text, which the predictor reads as missing."""
    if not text:
        return ()
    words = _TOKEN.findall(text.lower())
    if not words:
        return ()
    grams = [*words, *(f"{a} {b}" for a, b in itertools.pairwise(words))]
    counts = [0] * NGRAM_BUCKETS
    for gram in grams:
        counts[zlib.crc32(gram.encode("utf-8")) % NGRAM_BUCKETS] += 1
    return tuple(round(c / len(grams), 3) for c in counts)
