"""What the text features add on real agent work: the predictor trained on one agent
batch's trace and scored on another's, with the text features (hashed n-grams of the
latest output and observation, the argument size) and without, side by side.

    python benchmarks/predictor_text.py TRAIN.jsonl TEST.jsonl [--seeds 5]

The traces come from `heddle trace from-batch` (two agent batches of the same tasks,
e.g. two runs of `make agent`: `heddle trace from-batch BATCH --state-dir .heddle-agent`).
Prints Pearson r and longest-20% recall of the predicted total after steps 1 and 2,
for LightGBM seeds 0..N-1 (mean and spread): a difference inside the seeds' spread is
no difference.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics

from heddle.trace import load_trace
from heddle.types import TrajectorySpec
from scheduler.predictor import RemainingPredictor, evaluate, training_rows


def without_text(specs: list[TrajectorySpec]) -> list[TrajectorySpec]:
    return [
        dataclasses.replace(s, steps=tuple(dataclasses.replace(t, text=None) for t in s.steps))
        for s in specs
    ]


def scores(history: list[TrajectorySpec], test: list[TrajectorySpec], seed: int) -> dict:
    predictor = RemainingPredictor.train(history, seed=seed)
    x, _, _ = training_rows(test)
    return evaluate({"m": list(predictor.predict_rows(x))}, test, at_steps=(1, 2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("train")
    parser.add_argument("test")
    parser.add_argument("--seeds", type=int, default=5)
    args = parser.parse_args()
    history = [r.spec for r in load_trace(args.train)]
    test = [r.spec for r in load_trace(args.test)]
    print(f"train {len(history)} trajectories, test {len(test)}; seeds 0..{args.seeds - 1}")
    for name, (h, t) in {
        "with text": (history, test),
        "without": (without_text(history), without_text(test)),
    }.items():
        runs = [scores(h, t, seed) for seed in range(args.seeds)]
        cells = []
        for k in (1, 2):
            for measure in ("pearson_r", "tail_recall"):
                values = [r[f"m@{k}"][measure] for r in runs]
                spread = statistics.pstdev(values) if len(values) > 1 else 0.0
                cells.append(f"{measure}@{k} {statistics.fmean(values):.3f}±{spread:.3f}")
        n = int(runs[0]["m@1"]["n"])
        print(f"  {name:10} {'  '.join(cells)}  (n@1 {n})")


if __name__ == "__main__":
    main()
