"""vLLM's suffix speculation on the CPU build (issue 31, WAR's lever): the cluster file's
`speculation:` reaches the engine, drafts from the suffix tree (arctic-inference) are
verified, a replayed step still makes exactly its tokens and an agent turn its log-probs.
The engine starts once for the module, with a small token budget so that prompts are
prefilled over several iterations (chunked), which the CPU build cannot do for a seeded
request."""

from __future__ import annotations

import asyncio
import importlib.util
import math
import os
from collections.abc import Iterator
from typing import Any

import pytest

from engines.request import EngineRequest, Sampling
from heddle.hardware import Speculation
from tests.real_engine import require_vllm, tiny_model, vllm_env

pytestmark = [pytest.mark.real_engine, pytest.mark.slow]


@pytest.fixture(scope="module")
def engine(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Any, asyncio.AbstractEventLoop]]:
    require_vllm()
    if importlib.util.find_spec("arctic_inference") is None:
        if os.environ.get("HEDDLE_REQUIRE_VLLM"):
            pytest.fail("arctic-inference is required for vLLM's suffix speculation (Makefile)")
        pytest.skip("arctic-inference (vLLM's suffix speculation) is not installed")
    from engines.vllm import LocalVllm, TokenSessions, VllmEngine, VllmSettings, read_vocab_size

    root = tmp_path_factory.mktemp("vllm-spec")
    vllm_env(root)
    model = tiny_model(tmp_path_factory)
    settings = VllmSettings(
        model_path=str(model),
        max_num_seqs=4,
        max_num_batched_tokens=256,
        max_model_len=2048,
        speculation=Speculation(method="suffix", draft_tokens=4),
        speculation_max_batch=((1, 4),),
    )
    sessions = TokenSessions(read_vocab_size(str(model)))
    backend = LocalVllm("s0", settings, tp=1)
    eng = VllmEngine(instance_id="s0", backend=backend, sessions=sessions)
    loop = asyncio.new_event_loop()
    loop.run_until_complete(eng.start())
    try:
        yield eng, loop
    finally:
        loop.run_until_complete(eng.stop())
        loop.close()


def test_replayed_steps_make_exactly_their_tokens_from_verified_drafts(engine: Any) -> None:
    eng, loop = engine
    backend = eng.backend
    first = loop.run_until_complete(eng.generate(EngineRequest("a0", "ta", 120, 300)))
    # A second trajectory: the suffix tree holds the first one's response.
    second = loop.run_until_complete(eng.generate(EngineRequest("b0", "tb", 120, 300)))
    assert (first.output_tokens, second.output_tokens) == (300, 300)
    assert len(eng.sessions.ids["tb"]) == 120 + 300
    # The random-weight model repeats itself under greedy decoding: drafts are accepted.
    assert backend.draft_tokens > 0
    assert 0 < backend.accepted_tokens <= backend.draft_tokens


def test_an_agent_turn_under_speculation_returns_a_log_prob_per_token(engine: Any) -> None:
    eng, loop = engine
    prompt = list(range(10, 60))
    request = EngineRequest(
        "c0", "tc", len(prompt), 64, sampling=Sampling(seed=1), prompt_ids=prompt
    )
    result = loop.run_until_complete(eng.generate(request))
    assert 0 < len(result.output_ids) <= 64
    assert len(result.output_logprobs) == len(result.output_ids)
    assert all(math.isfinite(lp) and lp <= 0 for lp in result.output_logprobs)


def test_a_seeded_agent_turn_prefilled_in_chunks_keeps_the_engine_alive(engine: Any) -> None:
    """vLLM 0.32's CPU build kills its engine when a seeded request's prefill spans
    iterations (`CPU Generator does not use offset`): on CPU the turn goes without its
    seed (`engines.vllm.sampled_params`)."""
    eng, loop = engine
    assert eng.backend.seeded is False
    prompt = [10 + (i % 200) for i in range(700)]  # 700 tokens: three chunks of 256
    request = EngineRequest(
        "d0", "td", len(prompt), 16, sampling=Sampling(seed=7), prompt_ids=prompt
    )
    result = loop.run_until_complete(eng.generate(request))
    assert 0 < len(result.output_ids) <= 16
    assert eng.backend.is_healthy
