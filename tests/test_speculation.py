"""Speculative decoding (issue 31, WAR's lever): the cost of a verify pass, the batch
below which it pays per instance shape, the engine core and the simulator speculating
there and nowhere else, the cluster file's `speculation:` and the live simulated engines.
vLLM's own suffix speculation is in tests/test_vllm_speculation.py."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from engines.core import modelled_core
from engines.costmodel import CostModel
from engines.request import EngineRequest
from engines.vllm import VllmSettings
from heddle.config import ClusterConfig, SpeculationConfig, load_cluster
from heddle.errors import ConfigError
from heddle.hardware import ClusterShape, Speculation
from heddle.sim import SimResult, lower_bound, simulate
from heddle.types import RolloutOptions, StepSpec, TrajectorySpec
from heddle.workloads import generate
from scheduler.interface import PolicyContext
from scheduler.registry import create_policy


def test_a_verify_pass_makes_the_accepted_run_plus_its_own_token() -> None:
    assert Speculation(acceptance=0.0).tokens_per_verify == 1.0
    assert Speculation(acceptance=1.0, draft_tokens=4).tokens_per_verify == 5.0
    assert Speculation(acceptance=0.5, draft_tokens=4).tokens_per_verify == pytest.approx(
        1 + 0.5 + 0.25 + 0.125 + 0.0625
    )


def test_speculation_pays_on_a_memory_bound_batch_and_not_on_a_compute_bound_one() -> None:
    cost = CostModel.for_names("qwen3-8b", "h200", 8)
    spec = Speculation(acceptance=0.3, draft_tokens=4)
    # Short contexts: a large batch is compute bound, so drafts that are mostly
    # rejected cost more than they make.
    limit = cost.speculation_max_batch(spec, 256, context_tokens=1024)
    assert 0 < limit < 256
    at = {"num_decode_seqs": limit, "decode_context_tokens": limit * 1024}
    assert cost.speculative_decode_s(spec, **at) < cost.iteration_s(**at)
    past = {"num_decode_seqs": limit + 8, "decode_context_tokens": (limit + 8) * 1024}
    assert cost.speculative_decode_s(spec, **past) >= cost.iteration_s(**past)
    # Nothing ever accepted: a verify pass only costs more.
    assert cost.speculation_max_batch(Speculation(acceptance=0.0), 256) == 0
    # A limit the cluster file sets wins, up to the seats.
    assert cost.speculation_max_batch(dataclasses.replace(spec, max_batch=12), 256) == 12
    assert cost.speculation_max_batch(dataclasses.replace(spec, max_batch=999), 64) == 64


def _decode_alone(cluster: ClusterShape, requests: int, tokens: int) -> tuple[float, list[bool]]:
    """Engine time to decode `tokens` for each of `requests` at once, and which iterations
    (or blocks) speculated."""
    core, _ = modelled_core(cluster, 1, "fcfs")
    for k in range(requests):
        core.add_request(EngineRequest(f"r{k}", f"t{k}", 1000, tokens))
    spans: list[bool] = []
    while core.has_work():
        block = core.decode_block()
        out = core.advance_decode(block, block.num_iterations) if block else core.step()
        spans.append(out.speculated)
    return core.clock_s, spans


def test_the_engine_speculates_below_its_batch_limit_and_decodes_plainly_above() -> None:
    plain = ClusterShape(model="qwen3-8b", gpu="h100", num_gpus=1)
    spec = Speculation(acceptance=0.5, draft_tokens=4, max_batch=1)
    fast = dataclasses.replace(plain, speculation=spec)
    alone_plain, _ = _decode_alone(plain, 1, 2000)
    alone_fast, spans = _decode_alone(fast, 1, 2000)
    assert any(spans)
    assert not spans[0]  # the prefill iteration does not speculate
    # Memory bound at batch 1: the verify pass costs about a plain iteration and makes
    # 1.94 tokens.
    assert alone_plain / 2.0 < alone_fast < alone_plain / 1.7
    # Two at once is past the limit: the same iterations at the same cost.
    two_plain, _ = _decode_alone(plain, 2, 2000)
    two_fast, spans = _decode_alone(fast, 2, 2000)
    assert not any(spans)
    assert two_fast == two_plain


def _run(cluster: ClusterShape, trace: list[TrajectorySpec], policy: str = "verl") -> SimResult:
    ctx = PolicyContext(cluster, (), tuple(trace), 0)
    return simulate(trace, create_policy(policy, ctx), cluster)


def test_the_simulator_speculates_in_the_tail_and_shortens_the_rollout() -> None:
    trace = [r.spec for r in generate("coding", prompts=4, samples=8, seed=3)]
    cluster = ClusterShape(model="qwen3-14b", gpu="h100", num_gpus=8)
    plain = _run(cluster, trace)
    spec = Speculation(acceptance=0.5, draft_tokens=4, max_batch=4)
    fast = _run(dataclasses.replace(cluster, speculation=spec), trace)
    assert plain.speculated_tokens == 0
    assert 0 < fast.speculated_tokens < fast.generated_tokens
    assert fast.generated_tokens == plain.generated_tokens
    assert fast.makespan_s < plain.makespan_s
    # The lower bound stays one: below the plain bound, by the tokens a pass makes.
    bound = lower_bound(trace, dataclasses.replace(cluster, speculation=spec))
    assert bound["lower_bound_s"] <= fast.makespan_s
    assert bound["speculation_speedup"] == spec.tokens_per_verify
    # A limit of no batch at all is the plain rollout, to the last digit.
    never = dataclasses.replace(spec, max_batch=0)
    off = _run(dataclasses.replace(cluster, speculation=never), trace)
    assert off.makespan_s == plain.makespan_s
    assert off.speculated_tokens == 0


def test_the_cluster_file_turns_speculation_on(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(
        "model: qwen3-14b\ngpu: h100\nnum_gpus: 8\n"
        "speculation:\n  method: ngram\n  draft_tokens: 3\n  acceptance: 0.6\n"
    )
    shape = load_cluster(path).shape()
    assert shape.speculation == Speculation(method="ngram", draft_tokens=3, acceptance=0.6)
    path.write_text("num_gpus: 4\nspeculation:\n  method: suffix\n  acceptance: 1.5\n")
    with pytest.raises(ConfigError) as info:
        load_cluster(path)
    assert (info.value.line, info.value.field) == (4, "speculation.acceptance")
    path.write_text("num_gpus: 4\nspeculation:\n  method: eagle\n")
    with pytest.raises(ConfigError) as info:
        load_cluster(path)
    assert info.value.field == "speculation.method"


def test_vllm_suffix_speculation_without_its_package_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where arctic-inference is not installed, the cluster file says so before any
    engine starts (the package is installed here: its absence is staged)."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "arctic_inference" else real(name, *a),
    )
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    path = tmp_path / "cluster.yaml"
    path.write_text(
        f"num_gpus: 2\nspeculation:\n  method: suffix\nengine:\n  kind: vllm\n"
        f"  model_path: {model}\n"
    )
    with pytest.raises(ConfigError) as info:
        load_cluster(path)
    assert "arctic-inference" in str(info.value)
    path.write_text(path.read_text().replace("method: suffix", "method: ngram"))
    assert load_cluster(path).shape().speculation == Speculation(method="ngram")


def test_vllm_drafts_only_up_to_the_batch_where_it_pays() -> None:
    spec = Speculation(method="suffix", draft_tokens=4, acceptance=0.5)
    settings = VllmSettings(
        model_path="m", max_num_seqs=64, speculation=spec, speculation_max_batch=((1, 8), (2, 0))
    )
    assert settings.speculative_config(1) == {
        "method": "suffix",
        "num_speculative_tokens": 4,
        "num_speculative_tokens_per_batch_size": [(1, 8, 4), (9, 64, 0)],
    }
    assert settings.speculative_config(2) is None  # it never pays on TP-2
    # Paying at every batch: no schedule.
    assert settings.speculative_config(4) == {"method": "suffix", "num_speculative_tokens": 4}
    assert VllmSettings(model_path="m").speculative_config(1) is None


def test_live_simulated_engines_speculate(
    temporal_address: str, store_url: str, queue_prefix: str
) -> None:
    """On the live stack a lone decode, as the tail leaves it, runs at the verify pass's
    pace: its step takes a fraction of the cost model's plain decode."""
    from heddle.client import HeddleClient
    from heddle.trace import TraceRecord
    from tests.live import in_process_worker

    spec = SpeculationConfig(method="suffix", draft_tokens=4, acceptance=0.8)
    cluster = ClusterConfig(model="qwen3-8b", gpu="h100", num_gpus=1, speculation=spec)
    tokens, time_scale = 4000, 0.25
    record = TraceRecord(TrajectorySpec("lone", "g", 500, (StepSpec(tokens),), "coding"))
    cost = CostModel.for_names("qwen3-8b", "h100", 1)
    plain_s = tokens * cost.decode_token_s(1, 500 + tokens // 2)

    async def run() -> dict[str, Any]:
        async with in_process_worker(
            temporal_address, store_url, queue_prefix, time_scale=time_scale, cluster=cluster
        ):
            client = await HeddleClient.connect(
                temporal_address, store_url=store_url, queue_prefix=queue_prefix
            )
            async with client:
                handle = await client.start_rollout(records=[record], options=RolloutOptions())
                report = await asyncio.wait_for(handle.report(), 120)
                assert report.completed == 1
                row = client.store.get_trajectory(handle.batch_id, "lone")
                assert row is not None
                return row["steps"][0]

    step = asyncio.run(run())
    engine_s = (step["gen_finished_at"] - step["gen_started_at"]) / time_scale
    # 3.36 tokens a verify pass; the step's own overheads (wall time, scaled) on top.
    assert engine_s < plain_s / 2
