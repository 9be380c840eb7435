"""Cluster files fail fast, naming file, line and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from heddle.config import BatchSpec, ClusterConfig, load_batch_spec, load_cluster
from heddle.errors import ConfigError


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    return path


def test_valid_cluster(tmp_path: Path) -> None:
    cfg = load_cluster(write(tmp_path, "model: qwen3-14b\ngpu: h200\nnum_gpus: 8\ndefault_tp: 2\n"))
    assert cfg == ClusterConfig(model="qwen3-14b", gpu="h200", num_gpus=8, default_tp=2)
    assert cfg.instance_ids() == ["i0", "i1", "i2", "i3"]


@pytest.mark.parametrize(
    ("text", "line", "field", "words"),
    [
        ("model: qwen3-8b\nnum_gpus: -1\n", 2, "num_gpus", "greater than or equal"),
        ("model: qwen3-8b\ngpu: h100\nmax_num_seqs: many\n", 3, "max_num_seqs", "integer"),
        ("model: llama\n", 1, "model", "unknown model"),
        ("kv_overcommit_per_s: -0.1\n", 1, "kv_overcommit_per_s", "greater than or equal"),
        (
            "gpu: h100\nnum_gpus: 4\ndefault_tp: 3\ntp_choices: [1, 3]\n",
            4,
            "tp_choices",
            "power of two",
        ),
        ("num_gpus: 6\ndefault_tp: 4\n", 1, "num_gpus", "do not divide"),
        ("num_gpus: 4\nspeed: fast\n", 2, "speed", "not a cluster field"),
        ("num_gpus: [4\n", 2, None, "not valid YAML"),
    ],
)
def test_bad_cluster_names_file_line_and_field(
    tmp_path: Path, text: str, line: int, field: str | None, words: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_cluster(path)
    assert info.value.path == str(path)
    assert info.value.line == line
    assert info.value.field == field
    assert words in str(info.value)


def test_batch_spec(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text("workload: search\nprompts: 2\nsamples: 4\nseed: 3\n")
    assert load_batch_spec(path) == BatchSpec(workload="search", prompts=2, samples=4, seed=3)
    path.write_text("workload: search\nprompts: 0\n")
    with pytest.raises(ConfigError) as info:
        load_batch_spec(path)
    assert (info.value.line, info.value.field) == (2, "prompts")
    path.write_text("workload: poetry\n")
    with pytest.raises(ConfigError, match="unknown workload 'poetry'"):
        load_batch_spec(path)
