"""Small statistics shared by the workflows' reports and the simulator's (pure, no imports
beyond the standard library, so the workflow sandbox can load it)."""

from __future__ import annotations

from collections.abc import Sequence


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an ascending sequence (0 for an empty one)."""
    if not sorted_values:
        return 0.0
    rank = max(1, -(-len(sorted_values) * q // 100))
    return float(sorted_values[min(int(rank), len(sorted_values)) - 1])
