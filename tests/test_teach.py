"""The taught tiny model is deterministic for its seed: CI caches it by source version
and seed (`heddle.teach.cache_key`), which is only sound if teaching again makes the
same bytes. A short teach (3 steps) checks it; the full 700-step teach was compared by
hand (docs/notes/issue-27-agent-rollouts.md)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from tests.real_engine import require_vllm

pytestmark = [pytest.mark.real_engine, pytest.mark.slow]

FILES = ("model.safetensors", "tokenizer.json", "chat_template.jinja", "config.json")


def _digest(folder: Path) -> dict[str, str]:
    return {name: hashlib.sha256((folder / name).read_bytes()).hexdigest() for name in FILES}


def test_teaching_again_with_the_seed_makes_the_same_model(tmp_path: Path) -> None:
    require_vllm()
    from heddle.teach import cache_key, teach_agent

    first = _digest(teach_agent(tmp_path / "a", seed=0, steps=3))
    again = _digest(teach_agent(tmp_path / "b", seed=0, steps=3))
    other = _digest(teach_agent(tmp_path / "c", seed=1, steps=3))
    assert first == again
    assert other["model.safetensors"] != first["model.safetensors"]
    assert cache_key(0) == cache_key(0) != cache_key(1)
