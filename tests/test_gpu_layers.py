"""`benchmarks/gpu_layers.py`, the GPU timing of issue 30's item 6, run on a CPU at a
tiny shape: the script a lent GPU gets one short call for works before it is lent."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.real_engine import require_vllm

pytestmark = [pytest.mark.real_engine]


def test_the_layer_timings_run_on_a_cpu_at_a_tiny_shape(tmp_path: Path) -> None:
    require_vllm()  # torch comes with the real-engine extra
    import torch

    from benchmarks.gpu_layers import TINY, run, table

    result = run(TINY, 2, torch.device("cpu"), 1, "h100", (1, 4), (64, 128), (64,))
    rows = result["rows"]
    assert [(r["kind"], r["batch"], r["context"]) for r in rows] == [  # type: ignore[attr-defined]
        ("decode", 1, 64), ("decode", 1, 128), ("decode", 4, 64), ("decode", 4, 128),
        ("prefill", 1, 64),
    ]  # fmt: skip
    assert all(r["measured_ms"] > 0 for r in rows)  # type: ignore[attr-defined]
    # The cost model speaks of Qwen3-8B only: a tiny shape is compared with nothing.
    assert all(r["model_ms"] is None for r in rows)  # type: ignore[attr-defined]
    assert table(result).count("\n| decode |") == 4
