"""The predictor reads what real trajectories add: hashed n-grams of the latest output
and observation, and the tool call's argument size; traces without text fit as before."""

from __future__ import annotations

import dataclasses
import json
import random

import numpy as np

from heddle.store.db import spec_from_json, spec_to_json
from heddle.textfeatures import NGRAM_BUCKETS, hashed_ngrams
from heddle.trace import dump_record, parse_line
from heddle.types import StepSpec, TrajectorySpec
from heddle.workloads import generate
from scheduler.predictor import FEATURES, RemainingPredictor, evaluate, training_rows

# Two kinds of first turn, alike in length: a plan that many turns follow, and a quick
# answer. Only the words tell them apart.
PLAN = "let me write the function then run the tests and fix what fails"
QUICK = "the answer is 42 so I am done"


def _batch(seed: int, n: int = 400) -> list[TrajectorySpec]:
    rng = random.Random(seed)
    specs = []
    for i in range(n):
        planning = rng.random() < 0.5
        first = rng.randint(80, 200)
        text = PLAN if planning else QUICK
        rest = [StepSpec(rng.randint(150, 400), "python", 0.1, "ok", 30)
                for _ in range(rng.randint(5, 8) if planning else 0)]  # fmt: skip
        line = {
            "trajectory_id": f"t{i}", "group_id": f"g{i}", "prompt_tokens": 200,
            "steps": [
                {"output_tokens": first, "tool": "python", "tool_latency_s": 0.1,
                 "tool_output_tokens": 30, "text": text, "tool_input": "print(1)",
                 "observation": "1"},
                *({"output_tokens": s.output_tokens, "tool": "python", "tool_latency_s": 0.1,
                   "tool_output_tokens": 30} for s in rest),
                {"output_tokens": rng.randint(20, 60)},
            ],
        }  # fmt: skip
        specs.append(parse_line(line, path="mem", line=i + 1).spec)
    return specs


def _without_text(specs: list[TrajectorySpec]) -> list[TrajectorySpec]:
    return [dataclasses.replace(s, steps=tuple(dataclasses.replace(t, text=None) for t in s.steps))
            for s in specs]  # fmt: skip


def _r_after_first_step(predictor: RemainingPredictor, test: list[TrajectorySpec]) -> float:
    x, _, _ = training_rows(test)
    return evaluate({"m": list(predictor.predict_rows(x))}, test, at_steps=(1,))["m@1"]["pearson_r"]


def test_the_words_of_the_latest_output_inform_the_forecast() -> None:
    history, test = _batch(0), _batch(1)
    with_text = _r_after_first_step(RemainingPredictor.train(history), test)
    blind = RemainingPredictor.train(_without_text(history))
    without = _r_after_first_step(blind, _without_text(test))
    assert with_text > 0.8
    assert with_text > without + 0.3


def test_a_trace_without_text_is_fit_on_the_features_it_had_before() -> None:
    history = [r.spec for r in generate("coding", prompts=20, seed=0)]
    predictor = RemainingPredictor.train(history)
    assert [FEATURES[c] for c in predictor.columns] == list(
        FEATURES[: FEATURES.index("last_input_chars")]
    )
    x, _, _ = training_rows(history)
    assert np.isnan(x[:, FEATURES.index("last_input_chars") :]).all()


def test_step_text_comes_from_the_trace_and_survives_the_store_and_the_dump() -> None:
    line = {
        "trajectory_id": "t", "group_id": "g", "workload": "coding", "prompt_tokens": 10,
        "steps": [{"output_tokens": 5, "tool": "python", "tool_latency_s": 0.1,
                   "tool_status": "ok", "tool_output_tokens": 3, "text": "x = 1",
                   "tool_input": "print(x)", "observation": "NameError"},
                  {"output_tokens": 2, "text": "done"}],
    }  # fmt: skip
    record = parse_line(line, path="mem", line=1)
    first, last = record.spec.steps
    assert first.text is not None
    assert last.text is not None
    assert first.text.output_ngrams == hashed_ngrams("x = 1")
    assert first.text.observation_ngrams == hashed_ngrams("NameError")
    assert first.text.tool_input_chars == len("print(x)")
    assert len(first.text.output_ngrams) == NGRAM_BUCKETS
    assert abs(sum(first.text.output_ngrams) - 1.0) < 0.01
    assert last.text.observation_ngrams == ()
    assert spec_from_json(spec_to_json(record.spec)) == record.spec
    assert json.loads(json.dumps(dump_record(record))) == line


def test_hashed_ngrams_are_stable_and_empty_for_no_text() -> None:
    assert hashed_ngrams(None) == hashed_ngrams("") == hashed_ngrams("   ") == ()
    # CRC-32, not Python's per-process hash: the same buckets in every worker.
    assert hashed_ngrams("Traceback (most recent call last)") == hashed_ngrams(
        "traceback (most recent call last)"
    )
    assert hashed_ngrams(PLAN) != hashed_ngrams(QUICK)
