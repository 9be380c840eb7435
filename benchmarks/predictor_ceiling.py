"""How far can any predictor rank on the synthetic workloads? The observable features
against the same model given what the generator hides.

    python benchmarks/predictor_ceiling.py [--workloads coding search math] [--prompts 400]

Issue 4 asks for longest-20% recall >= 0.8 from step 2. Each synthetic trajectory draws
hidden variables the system never sees: its prompt's difficulty (shared by the GRPO
group), its own verbosity (shared by its turns) and its number of turns. This trains
the predictor's LightGBM model (same features, parameters and rounds) three ways, on
iteration 0 and tested on iteration 1 as `heddle_policy.py` does:

- `observable`: the predictor's own features (what Heddle runs);
- `+difficulty,verbosity`: plus the true log difficulty and log verbosity;
- `+turns`: plus the true number of planned turns as well.

The hidden variables are read back by replaying each trajectory's random state: the
generator's first draws for a trajectory are its turn count and its verbosity.
"""

from __future__ import annotations

import argparse
import math
import random
from typing import Any

import lightgbm
import numpy as np

import heddle.workloads as workloads
from heddle.types import TrajectorySpec
from scheduler import predictor

# trajectory id -> (log difficulty, log verbosity, planned turns)
HIDDEN: dict[str, tuple[float, float, int]] = {}
_generate_one = workloads._trajectory


def _recording(rng: random.Random, shape: workloads.WorkloadShape, tid: str, *args: Any) -> Any:
    difficulty = args[-1]
    state = rng.getstate()
    turns = rng.randint(*shape.base_turns)
    verbosity = rng.lognormvariate(0, shape.verbosity_sigma)
    rng.setstate(state)  # the trajectory draws the same values again
    HIDDEN[tid] = (math.log(difficulty), math.log(verbosity), turns)
    return _generate_one(rng, shape, tid, *args)


def _rows(specs: list[TrajectorySpec], hidden: int) -> tuple[np.ndarray, np.ndarray, list]:
    x, y, where = predictor.training_rows(specs)
    x = x[:, predictor.used_columns(x)]  # these traces have no text
    if hidden:
        extra = [HIDDEN[specs[t].trajectory_id][:hidden] for t, _ in where]
        x = np.hstack([x, np.asarray(extra, dtype=np.float64)])
    return x, y, where


def ceiling(workload: str, prompts: int) -> None:
    workloads._trajectory = _recording  # type: ignore[assignment]
    try:
        history = [r.spec for r in workloads.generate(workload, prompts=prompts, iteration=0)]
        test = [r.spec for r in workloads.generate(workload, prompts=prompts, iteration=1)]
    finally:
        workloads._trajectory = _generate_one
    memory = predictor.GroupMemory.from_history(history)
    print(
        f"\n{workload}: Pearson r on total length / longest-20% recall, after step k; "
        "residual sigma (log remaining tokens) at step k"
    )
    for hidden, name in ((0, "observable"), (2, "+difficulty,verbosity"), (3, "+turns")):
        x, y, _ = _rows(history, hidden)
        data = lightgbm.Dataset(x, y)
        booster = lightgbm.train(predictor.PARAMS, data, num_boost_round=predictor.NUM_ROUNDS)
        xt, yt, where = _rows(test, hidden)
        memory.with_prior(xt, where, test)  # the earlier iteration's record, as at run time
        fit = booster.predict(xt)
        remaining = np.expm1(fit).clip(min=1.0)
        result = predictor.evaluate({"m": list(remaining)}, test)
        cells = "  ".join(
            f"@{k} {result[f'm@{k}']['pearson_r']:.3f}/{result[f'm@{k}']['tail_recall']:.3f}"
            for k in (1, 2, 3)
        )
        # The residual's spread (log remaining tokens) before the first and second steps:
        # the forecast error `benchmarks/forecast_noise.py` runs Heddle under.
        step = np.asarray([k for _, k in where])
        spread = "  ".join(f"sigma@{k} {(yt - fit)[step == k].std():.2f}" for k in (0, 1))
        print(f"  {name:22} {cells}  {spread}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=["coding", "search", "math"])
    parser.add_argument("--prompts", type=int, default=400)
    args = parser.parse_args()
    for workload in args.workloads:
        ceiling(workload, args.prompts)


if __name__ == "__main__":
    main()
