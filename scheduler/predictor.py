"""The progressive runtime predictor: remaining generated tokens of a trajectory,
re-estimated before every step from what the system has seen (DESIGN.md, "Policies").

A LightGBM regressor on log1p(remaining tokens). Features: prompt length, step index,
tokens and tool calls so far, the last tool's name, status and output size, the last
three output lengths, errors so far, the finished siblings of the GRPO group (count,
mean, max), the prompt's record in an earlier iteration (mean and P90 of its
trajectories' lengths), for a step in progress shown to a review, the tokens its turn
has made so far, and, where the trajectory has text (agent batches, traces from them),
the last tool call's argument size and hashed n-grams of the latest output and
observation (`heddle.textfeatures`). A feature the history never has (text, in a
generated trace) is left out of the fit, so text-less batches are fit as before.

Its forecast is an expected count: the exp of a fit on the log is near the median,
which falls short of the mean most where the spread is widest, at the first step. Each
step index gets Duan's smearing factor, mean exp(residual), from out-of-fold residuals
(about 1.6 at step 0 against 1.3 from step 3 on coding). The DP sums work and KV, and
a queue orders first steps against later ones: both need the mean.

A forecast never runs past the longest trajectory of the history: smearing a near-cap
median (a prompt whose samples mostly hit the generation cap) had forecast 55,000
tokens where 40,000 is the most any trajectory may make, and the DP sized the widest
groups for a head that long.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import lightgbm
import numpy as np

from heddle.textfeatures import NGRAM_BUCKETS
from heddle.types import StepSpec, TrajectorySpec, TrajectoryView
from scheduler.interface import REVIEW_MIN_TOKENS
from scheduler.libra import prompt_key

TOOLS = ("python", "search", "calculator")
STATUSES = ("ok", "error", "timeout")
FEATURES = (
    "prompt_tokens", "step_index", "generated", "tool_calls", "last_tool", "last_status",
    "last_tool_output", "recent_1", "recent_2", "recent_3", "mean_output", "errors",
    "siblings_finished", "siblings_mean", "siblings_max", "prior_mean", "prior_p90",
    "step_made", "last_input_chars",
    *(f"output_ngram_{i}" for i in range(NGRAM_BUCKETS)),
    *(f"observation_ngram_{i}" for i in range(NGRAM_BUCKETS)),
)  # fmt: skip
PARAMS = {
    "objective": "regression",
    "num_leaves": 31,
    "learning_rate": 0.05,
    "min_data_in_leaf": 20,
    "feature_fraction": 0.9,
    "verbose": -1,
    "num_threads": 1,
    "deterministic": True,
    "seed": 0,
}
NUM_ROUNDS = 200
# The quantile of remaining tokens an uncertainty-aware rank reads (`upper_rows`): a
# long trajectory ranked short becomes the batch's tail, a short one ranked long only
# finishes early, so a rank may lean toward the upper end of what a forecast allows.
RANK_QUANTILE = 0.9
# Smearing factors per step index, the last bucket for every later step; fit on
# `SMEAR_FOLDS` folds of the history's trajectories, each predicted by a model that did
# not see it (in-sample residuals are narrower than a new iteration's).
STEP_BUCKETS = 4
SMEAR_FOLDS = 2
# Training also describes each turn in progress at these many tokens made (from the
# review's threshold, doubling): a review re-predicts a long decode mid-turn, and rows
# only at step boundaries never show the model a turn that has already run long (a
# 15K-token first turn kept its prompt-only forecast and its narrow instance).
MID_STEP_FIRST = REVIEW_MIN_TOKENS
# A turn-in-progress level counts toward the tail floor (`RemainingPredictor.tail`) once
# the history describes this many turns at it.
TAIL_MIN_ROWS = 20


@dataclass
class GroupMemory:
    """What the predictor knows beyond one trajectory: finished siblings, and the
    prompt's record from an earlier iteration."""

    finished: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    prior: dict[str, tuple[float, float]] = field(default_factory=dict)

    @classmethod
    def from_history(cls, history: Sequence[TrajectorySpec]) -> GroupMemory:
        by_prompt: dict[str, list[int]] = defaultdict(list)
        for spec in history:
            by_prompt[prompt_key(spec.group_id)].append(spec.generated_tokens)
        return cls(prior={k: _mean_p90(v) for k, v in by_prompt.items()})

    def sibling_finished(self, group_id: str, generated_tokens: int) -> None:
        self.finished[group_id].append(generated_tokens)

    def with_prior(
        self, rows: np.ndarray, where: Sequence[tuple[int, int]], specs: Sequence[TrajectorySpec]
    ) -> np.ndarray:
        """`training_rows` of a new iteration (`where` and `specs` as it returned them)
        with the prompt record Heddle sees when it runs, this memory's (the earlier
        iteration's), in place of the group's leave-one-out record; in place."""
        at = FEATURES.index("prior_mean")
        for i, (t, _) in enumerate(where):
            record = self.prior.get(prompt_key(specs[t].group_id), (math.nan, math.nan))
            rows[i, at], rows[i, at + 1] = record
        return rows


def _mean_p90(values: Sequence[int]) -> tuple[float, float]:
    ordered = sorted(values)
    return statistics.fmean(ordered), float(ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)])


def _row(
    *,
    prompt_tokens: int,
    step_index: int,
    generated: int,
    tool_calls: int,
    last_tool: str | None,
    last_status: str | None,
    last_tool_output: int,
    recent: Sequence[int],
    errors: int,
    siblings: Sequence[int],
    prior: tuple[float, float] | None,
    step_made: int = 0,
    input_chars: int = 0,
    output_ngrams: Sequence[float] = (),
    observation_ngrams: Sequence[float] = (),
) -> list[float]:
    nan = math.nan
    r = list(recent)[-3:][::-1] + [nan] * 3
    missing = [nan] * NGRAM_BUCKETS
    return [
        prompt_tokens, step_index, generated, tool_calls,
        TOOLS.index(last_tool) if last_tool in TOOLS else (nan if last_tool is None else -1),
        STATUSES.index(last_status) if last_status in STATUSES else nan,
        last_tool_output, r[0], r[1], r[2],
        generated / step_index if step_index else nan, errors,
        len(siblings), statistics.fmean(siblings) if siblings else nan,
        max(siblings) if siblings else nan,
        prior[0] if prior else nan, prior[1] if prior else nan, step_made,
        input_chars or nan, *(output_ngrams or missing), *(observation_ngrams or missing),
    ]  # fmt: skip


def _text_of(step: StepSpec | None) -> dict[str, Any]:
    """A step's text features as `_row` takes them (none before the first step)."""
    text = step.text if step is not None else None
    if text is None:
        return {}
    return {"input_chars": text.tool_input_chars, "output_ngrams": text.output_ngrams,
            "observation_ngrams": text.observation_ngrams}  # fmt: skip


def training_rows(
    specs: Sequence[TrajectorySpec], *, mid_step: bool = False
) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int]]]:
    """One row per (trajectory, step) of a finished trace, with log1p(remaining).

    Finished siblings at a point are taken to be those shorter than what the trajectory
    has generated so far (shorter trajectories finish first); the prompt record is the
    leave-one-out mean and P90 of the group (another sample of the same prompt, as the
    earlier iteration is at prediction time). With `mid_step`, each turn long enough is
    also described in progress, at `MID_STEP_FIRST` tokens made and each doubling, as a
    review shows it. Returns rows, targets and, per row, the (trajectory index, step
    index) it describes (step boundaries only without `mid_step`: what `evaluate` scores).
    """
    groups: dict[str, list[int]] = defaultdict(list)
    for s in specs:
        groups[s.group_id].append(s.generated_tokens)
    rows: list[list[float]] = []
    targets: list[float] = []
    where: list[tuple[int, int]] = []
    for t_index, spec in enumerate(specs):
        total = spec.generated_tokens
        group = list(groups[spec.group_id])
        group.remove(total)
        prior = _mean_p90(group) if group else None
        generated = tool_calls = errors = 0
        recent: list[int] = []
        last = None
        for k, step in enumerate(spec.steps):
            made = 0
            while True:
                so_far = generated + made
                rows.append(
                    _row(
                        prompt_tokens=spec.prompt_tokens, step_index=k, generated=so_far,
                        tool_calls=tool_calls, last_tool=last.tool if last else None,
                        last_status=last.tool_status if last else None,
                        last_tool_output=last.tool_output_tokens if last else 0,
                        recent=recent, errors=errors,
                        siblings=[g for g in group if g <= so_far] if so_far else [],
                        prior=prior, step_made=made, **_text_of(last),
                    )
                )  # fmt: skip
                targets.append(math.log1p(total - so_far))
                where.append((t_index, k))
                made = made * 2 if made else MID_STEP_FIRST
                if not mid_step or made >= step.output_tokens:
                    break
            generated += step.output_tokens
            recent.append(step.output_tokens)
            if step.tool is not None:
                tool_calls += 1
                errors += step.tool_status != "ok"
            last = step
    return np.asarray(rows, dtype=np.float64), np.asarray(targets), where


class RemainingPredictor:
    def __init__(
        self,
        booster: lightgbm.Booster,
        memory: GroupMemory,
        smear: Sequence[float] = (),
        longest: float = math.inf,
        tail: tuple[float, float] | None = None,
        columns: Sequence[int] | None = None,
        upper: lightgbm.Booster | None = None,
    ) -> None:
        self.booster = booster
        # A fit of the `RANK_QUANTILE` quantile of the same target, when asked for
        # (`train(upper=True)`): what the uncertainty allows, for a rank.
        self.upper = upper
        # The features the fit reads (`used_columns`), as indices into a full row.
        self.columns = np.asarray(
            range(len(FEATURES)) if columns is None else columns, dtype=np.int64
        )
        self.memory = memory
        self.smear = np.asarray(smear or [1.0] * STEP_BUCKETS, dtype=np.float64)
        # The most generated tokens of any history trajectory: a total no forecast passes.
        self.longest = longest
        # (tokens made, remaining per token made): the longest turn in progress the
        # history describes often enough, and its trajectories' mean remaining tokens
        # over what the turn had made. Past it the trees cannot extrapolate (a search
        # first turn at 8,192 tokens made was forecast 3,521 more; it made 31,808), so
        # there a forecast is at least that ratio times what the turn has made.
        self.tail = tail
        # The fit for prompts without a record in the history (`train`); None: this fit
        # serves every row.
        self.without_prior: RemainingPredictor | None = None

    @classmethod
    def train(
        cls,
        history: Sequence[TrajectorySpec],
        *,
        num_rounds: int = NUM_ROUNDS,
        seed: int = 0,
        upper: bool = False,
    ) -> RemainingPredictor:
        """Fit on a finished iteration; its prompts' record becomes the prior. `seed`
        drives LightGBM's feature sampling: the fit is deterministic for each.

        Two fits: one reading the prompt's record, for prompts the history holds, and one
        without it, for new prompts (`without_prior`). Every training row has a record
        (its group's other samples), so a single fit had never seen one missing: on a
        batch of prompts the history does not hold (a campaign drawing from a data set)
        it forecast 37 tokens for first steps whose median was 1,595
        (docs/notes/issue-30-robustness.md). `upper` also fits each one's
        `RANK_QUANTILE` quantile (`upper_rows`)."""
        if not history:
            raise ValueError("the predictor needs a history of finished trajectories")
        x, y, where = training_rows(history, mid_step=True)
        predictor = cls._fit(history, x, y, where, num_rounds, seed, upper)
        at = FEATURES.index("prior_mean")
        blind = x.copy()
        blind[:, at : at + 2] = math.nan
        predictor.without_prior = cls._fit(history, blind, y, where, num_rounds, seed, upper)
        return predictor

    @classmethod
    def _fit(
        cls,
        history: Sequence[TrajectorySpec],
        x: np.ndarray,
        y: np.ndarray,
        where: Sequence[tuple[int, int]],
        num_rounds: int,
        seed: int,
        upper: bool = False,
    ) -> RemainingPredictor:
        longest = float(max(s.generated_tokens for s in history))
        params = PARAMS | {"seed": seed}
        columns = used_columns(x)
        names = [FEATURES[c] for c in columns]

        def fit(rows: np.ndarray, **objective: Any) -> lightgbm.Booster:
            data = lightgbm.Dataset(x[rows][:, columns], y[rows], feature_name=names)
            return lightgbm.train(params | objective, data, num_boost_round=num_rounds)

        fold = np.asarray([t for t, _ in where]) % SMEAR_FOLDS
        every = np.ones(len(y), dtype=bool)
        out_of_fold = np.empty_like(y)
        for k in range(SMEAR_FOLDS):
            held = fold == k
            if held.all():  # one trajectory: nothing to fit the others on
                return cls(
                    fit(every), GroupMemory.from_history(history), longest=longest,
                    columns=columns,
                )  # fmt: skip
            out_of_fold[held] = fit(~held).predict(x[held][:, columns], num_threads=1)
        ratio = np.exp(y - out_of_fold)
        # Fit on step boundaries; a turn in progress takes its step's factor.
        bucket = np.where(x[:, FEATURES.index("step_made")] > 0, -1, _bucket(x))
        smear = [float(ratio[bucket == b].mean()) if (bucket == b).any() else 1.0
                 for b in range(STEP_BUCKETS)]  # fmt: skip
        quantile = fit(every, objective="quantile", alpha=RANK_QUANTILE) if upper else None
        return cls(
            fit(every), GroupMemory.from_history(history), smear, longest, _tail(x, y),
            columns, quantile,
        )  # fmt: skip

    def event_row(self, event: TrajectoryView) -> list[float]:
        """The features of an event. Stateless: a trajectory may be shown more than once
        per step (a mid-step review, the re-prediction during its tool call)."""
        return _row(
            prompt_tokens=event.prompt_tokens,
            step_index=event.step_index,
            generated=event.generated_tokens,
            tool_calls=event.num_tool_calls,
            last_tool=event.last_tool,
            last_status=event.last_tool_status,
            last_tool_output=event.last_tool_output_tokens,
            recent=event.recent_output_tokens,
            errors=sum(1 for state in event.tool_path if not state.endswith(":ok")),
            siblings=self.memory.finished.get(event.group_id, []),
            prior=self.memory.prior.get(prompt_key(event.group_id)),
            step_made=event.step_tokens,
            input_chars=event.last_tool_input_chars,
            output_ngrams=event.last_output_ngrams,
            observation_ngrams=event.last_observation_ngrams,
        )

    def median_rows(self, rows: np.ndarray) -> np.ndarray:
        """The fit's own forecast, before smearing: near the median remaining tokens."""
        return np.expm1(self.booster.predict(rows[:, self.columns], num_threads=1)).clip(min=1.0)

    def predict_rows(self, rows: np.ndarray) -> np.ndarray:
        """Expected remaining generated tokens for each row, up to what is left of the
        history's longest total; a trajectory already past it keeps the fit's forecast
        (the cap it was generated under is unknown, not reached). A row whose prompt the
        history does not hold is forecast by the fit made without that record."""
        return self._by_record(rows, RemainingPredictor._predict_rows)

    def upper_rows(self, rows: np.ndarray) -> np.ndarray:
        """The `RANK_QUANTILE` quantile of each row's remaining tokens, never below the
        expected count and with the same cap and tail floor: what a rank may assume
        when a forecast is uncertain. Without the quantile fit, the expected count."""
        return self._by_record(rows, RemainingPredictor._upper_rows)

    def _by_record(
        self, rows: np.ndarray, forecast: Callable[[RemainingPredictor, np.ndarray], np.ndarray]
    ) -> np.ndarray:
        """`forecast` of each row by this fit, or, for a row whose prompt the history
        does not hold, by the fit made without that record (`without_prior`)."""
        blind = self.without_prior
        if blind is not None:
            new = np.isnan(rows[:, FEATURES.index("prior_mean")])
            if new.any():
                out = np.empty(len(rows))
                out[new] = forecast(blind, rows[new])
                if (~new).any():
                    out[~new] = forecast(self, rows[~new])
                return out
        return forecast(self, rows)

    def _upper_rows(self, rows: np.ndarray) -> np.ndarray:
        expected = self._predict_rows(rows)
        if self.upper is None:
            return expected
        quantile = np.expm1(self.upper.predict(rows[:, self.columns], num_threads=1))
        return self._bounded(rows, np.maximum(expected, quantile))

    def _predict_rows(self, rows: np.ndarray) -> np.ndarray:
        median = np.exp(self.booster.predict(rows[:, self.columns], num_threads=1))
        return self._bounded(rows, median * self.smear[_bucket(rows)] - 1.0)

    def _bounded(self, rows: np.ndarray, expected: np.ndarray) -> np.ndarray:
        """A forecast at least the tail floor and at most what is left of the history's
        longest total (`__init__`)."""
        if self.tail is not None:
            level, ratio = self.tail
            made = rows[:, FEATURES.index("step_made")]
            expected = np.where(made > level, np.maximum(expected, made * ratio), expected)
        left = self.longest - rows[:, FEATURES.index("generated")]
        return np.where(left > 0, np.minimum(expected, left), expected).clip(min=1.0)

    def predict(self, event: TrajectoryView) -> float:
        return float(self.predict_rows(np.asarray([self.event_row(event)]))[0])

    def predict_upper(self, event: TrajectoryView) -> float:
        return float(self.upper_rows(np.asarray([self.event_row(event)]))[0])


def used_columns(x: np.ndarray) -> list[int]:
    """The features a fit on rows `x` reads: all but the text features no row has.
    Dropping those (a text-less trace) keeps the fit what it was before they existed:
    LightGBM samples features per tree, so even a column it never splits on changes it."""
    first_text = FEATURES.index("last_input_chars")
    return [c for c in range(x.shape[1]) if c < first_text or not np.isnan(x[:, c]).all()]


def _tail(x: np.ndarray, y: np.ndarray) -> tuple[float, float] | None:
    """The tail floor's level and ratio (`RemainingPredictor.tail`) from training rows:
    the most tokens made in a turn in progress that `TAIL_MIN_ROWS` rows describe, and
    their mean remaining tokens over it."""
    made = x[:, FEATURES.index("step_made")]
    levels, counts = np.unique(made[made > 0], return_counts=True)
    described = levels[counts >= TAIL_MIN_ROWS]
    if len(described) == 0:
        return None
    level = float(described[-1])
    return level, float(np.expm1(y[made == level]).mean() / level)


def _bucket(rows: np.ndarray) -> np.ndarray:
    """Each row's smearing bucket: its step index, later steps sharing the last."""
    step = rows[:, FEATURES.index("step_index")]
    return np.minimum(step, STEP_BUCKETS - 1).astype(np.int64)


# ---- evaluation --------------------------------------------------------------------------
def pearson(a: Sequence[float], b: Sequence[float]) -> float:
    if len(a) < 2:
        return math.nan
    return float(np.corrcoef(np.asarray(a, float), np.asarray(b, float))[0, 1])


def tail_recall(true: Sequence[float], pred: Sequence[float], frac: float = 0.2) -> float:
    """Of the longest `frac` by truth, the share also in the longest `frac` by prediction."""
    n = max(1, round(len(true) * frac))
    top_true = set(np.argsort(-np.asarray(true))[:n])
    top_pred = set(np.argsort(-np.asarray(pred))[:n])
    return len(top_true & top_pred) / n


def evaluate(
    estimate: dict[str, list[float]],
    specs: Sequence[TrajectorySpec],
    at_steps: Sequence[int] = (1, 2, 3),
) -> dict[str, dict[str, float]]:
    """Pearson r and longest-20% recall of predicted total length, among trajectories
    still running after `k` steps, for each estimator's per-row predictions of
    remaining tokens (rows as `training_rows` orders them)."""
    _, _, where = training_rows(specs)
    out: dict[str, dict[str, float]] = {}
    for name, remaining in estimate.items():
        for k in at_steps:
            true, pred = [], []
            for (t_index, step), rem in zip(where, remaining, strict=True):
                if step != k:
                    continue
                spec = specs[t_index]
                done = sum(s.output_tokens for s in spec.steps[:k])
                true.append(spec.generated_tokens)
                pred.append(done + rem)
            out[f"{name}@{k}"] = {
                "pearson_r": pearson(true, pred),
                "tail_recall": tail_recall(true, pred),
                "n": float(len(true)),
            }
    return out


def prediction_latency_ms(predictor: RemainingPredictor, row: list[float], n: int = 2000) -> float:
    arr = np.asarray([row])
    started = time.perf_counter()
    for _ in range(n):
        predictor.predict_rows(arr)
    return (time.perf_counter() - started) / n * 1e3
