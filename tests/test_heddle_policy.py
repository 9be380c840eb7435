"""Heddle's policy core: presorted DP (optimal on small cases), the TP planner, the
predictor, and migration on a rank change."""

from __future__ import annotations

import random
from dataclasses import replace

import lightgbm
import numpy as np
import pytest

from engines.costmodel import CostModel
from heddle.client import validate_options
from heddle.hardware import ClusterShape
from heddle.types import RolloutOptions, TrajectoryView
from heddle.workloads import generate
from scheduler.heddle import HeddlePlacement, HeddlePlanner, HeddleVariant
from scheduler.interface import InstanceState, PolicyContext
from scheduler.placement_dp import (
    KV_SHARE_CAP,
    InstanceModel,
    brute_force,
    solve,
    solve_leading,
)
from scheduler.predictor import (
    FEATURES,
    NUM_ROUNDS,
    PARAMS,
    RemainingPredictor,
    evaluate,
    pearson,
    training_rows,
)
from scheduler.registry import create_policy
from scheduler.resources import SplitPlanner


def _model(tp: int, model: str = "qwen3-8b") -> InstanceModel:
    return InstanceModel.of(CostModel.for_names(model, "h100", tp), 256)


def _small_case(
    rng: random.Random, n: int, m: int, sigma: float
) -> tuple[list[float], list[float], list[InstanceModel]]:
    """n lognormal lengths sorted longest first, their contexts, m instances widest first."""
    lengths = sorted((rng.lognormvariate(7, sigma) for _ in range(n)), reverse=True)
    contexts = [rng.randint(100, 3000) + x / 2 for x in lengths]
    widths = sorted((rng.choice([1, 2, 4]) for _ in range(m)), reverse=True)
    return lengths, contexts, [_model(tp) for tp in widths]


def test_dp_is_optimal_on_small_cases() -> None:
    rng = random.Random(0)
    for _ in range(300):
        n = rng.randint(1, 9)
        lengths, contexts, models = _small_case(rng, n, rng.randint(1, 4), 1.2)
        part = solve(lengths, contexts, models)
        assert sum(part.sizes) == n
        assert part.makespan_s == pytest.approx(brute_force(lengths, contexts, models), rel=1e-9)


def _group_times(
    lengths: list[float], contexts: list[float], models: list[InstanceModel], sizes: tuple[int, ...]
) -> list[float]:
    edges = np.cumsum((0, *sizes))
    return [
        float(m.group_time_s(lengths[a], sum(lengths[a:b]), b - a, sum(contexts[a:b])))
        if b > a
        else 0.0
        for m, a, b in zip(models, edges[:-1], edges[1:], strict=True)
    ]


def test_ties_behind_a_slowest_first_group_are_split_for_the_rest() -> None:
    """The longest alone is the slowest group: `solve` leaves the second of three
    instances empty (any split of the rest ties), `solve_leading` splits the rest as
    the DP would on its own, and on small cases each rest is the brute-force optimum."""
    lengths, contexts = [40_000.0] + [3_000.0] * 12, [20_000.0] + [2_000.0] * 12
    models = [_model(8)] * 3
    plain, leading = solve(lengths, contexts, models), solve_leading(lengths, contexts, models)
    assert plain.sizes == (1, 0, 12)
    assert leading.sizes == (1, 6, 6)
    assert solve_leading(lengths, contexts, models, depth=0).sizes == plain.sizes  # no chain
    assert leading.makespan_s == plain.makespan_s
    times = _group_times(lengths, contexts, models, leading.sizes)
    assert max(times[1:]) < max(_group_times(lengths, contexts, models, plain.sizes)[1:])
    rng, checked = random.Random(1), 0
    for _ in range(300):
        n = rng.randint(2, 8)
        lengths, contexts, models = _small_case(rng, n, rng.randint(2, 4), 1.5)
        part = solve_leading(lengths, contexts, models)
        assert sum(part.sizes) == n
        assert part.makespan_s == pytest.approx(brute_force(lengths, contexts, models), rel=1e-9)
        if part.rest_s:
            first = part.sizes[0]
            best_rest = brute_force(lengths[first:], contexts[first:], models[1:])
            assert part.rest_s[0] == pytest.approx(best_rest, rel=1e-9)
            times = _group_times(lengths, contexts, models, part.sizes)
            assert max(times[1:]) == pytest.approx(best_rest, rel=1e-9)
            checked += 1
    assert checked > 30


def test_dp_groups_longest_on_the_widest_and_rejects_unsorted() -> None:
    lengths = [40_000, 30_000] + [500] * 200
    part = solve(lengths, [20_000, 15_000] + [800] * 200, [_model(8), _model(1), _model(1)])
    assert part.sizes[0] <= 2  # the tail gets the wide instance nearly to itself
    with pytest.raises(ValueError, match="sorted"):
        solve([1, 2], [1, 1], [_model(1)])


def test_a_group_that_overflows_its_cache_is_timed_by_its_tokens_not_its_longest() -> None:
    """One long trajectory among many short ones whose KV overflows a TP-1 cache: the
    short ones finish and free their room, so the group takes its tokens over the
    fitting batch, not the paper's longest times the overflowed per-token time (which
    charged every member the longest's length). Alike members: the two agree."""
    tp1 = _model(1, "qwen3-14b")
    batch, context = 200, 2.5 * tp1.kv_capacity_tokens
    longest, short = 30_000.0, 2_000.0
    tokens = longest + (batch - 1) * short
    paper = longest * float(tp1.per_token_s(batch, context))
    grouped = float(tp1.group_time_s(longest, tokens, batch, context))
    assert grouped < 0.5 * paper
    fit = 1 / 2.5  # the cache holds 40% of the group at a time
    iteration = float(tp1.per_token_s(batch * fit, context * fit))
    assert grouped == pytest.approx(max(longest, tokens / (batch * fit)) * iteration)
    alike = float(tp1.group_time_s(longest, longest * batch, batch, context))
    assert alike == pytest.approx(paper)
    assert float(tp1.group_time_s(0.0, 0.0, 0, 0.0)) == 0.0


def test_an_aggregated_dp_plans_every_trajectory() -> None:
    lengths = list(range(1_000, 0, -1))
    part = solve(lengths, [100.0] * 1_000, [_model(8), _model(1)], exact=96, max_items=256)
    assert sum(part.sizes) == 1_000  # the chunked short ones count too
    # With no room left for chunks, the short ones would drop out of the plan unseen.
    with pytest.raises(ValueError, match="must exceed exact"):
        solve(lengths, [100.0] * 1_000, [_model(1)], exact=256, max_items=256)


def test_split_planner_returns_a_valid_split_no_worse_than_homogeneous() -> None:
    lengths = sorted(np.random.default_rng(1).lognormal(8, 1, 2000), reverse=True)
    contexts = [1000 + x / 2 for x in lengths]
    planner = SplitPlanner(
        ClusterShape(model="qwen3-14b", gpu="h100", num_gpus=32, tp_choices=(1, 2, 4, 8))
    )
    plan = planner.plan(lengths, contexts, iterations=120)
    assert sum(plan.tps) == 32
    assert set(plan.tps) <= {1, 2, 4, 8}
    assert list(plan.tps) == sorted(plan.tps, reverse=True)
    models = planner.models()
    homogeneous = solve(lengths, contexts, [models[1]] * 32)
    assert plan.partition.makespan_s <= homogeneous.makespan_s


@pytest.mark.parametrize("sigma", [0.3, 1.0])
def test_the_split_planner_is_no_worse_than_any_homogeneous_split(sigma: float) -> None:
    """The annealing starts from the best homogeneous split: from the narrowest one,
    its 120 single moves had missed an all-TP-4 split the DP rated 8% better (14B
    coding). Long, alike trajectories want wide instances everywhere."""
    lengths = sorted(np.random.default_rng(2).lognormal(9.5, sigma, 3000), reverse=True)
    contexts = [2000 + x / 2 for x in lengths]
    planner = SplitPlanner(
        ClusterShape(model="qwen3-14b", gpu="h100", num_gpus=64, tp_choices=(1, 2, 4, 8))
    )
    plan = planner.plan(lengths, contexts)
    models = planner.models()
    for tp in (1, 2, 4, 8):
        uniform = solve(lengths, contexts, [models[tp]] * (64 // tp), max_kv_share=KV_SHARE_CAP)
        assert plan.partition.makespan_s <= uniform.makespan_s * 1.01, tp


def test_the_split_planner_polish_merges_narrow_instances_in_one_move() -> None:
    # A heavy tail on 16 TP-1s: a TP-8 pays, but reaching it pair by pair (TP-2, TP-4,
    # then TP-8) passes through splits the annealing may refuse.
    lengths = [40_000.0] * 8 + [2_000.0] * 2_000
    contexts = [30_000.0] * 8 + [1_500.0] * 2_000
    planner = SplitPlanner(
        ClusterShape(model="qwen3-14b", gpu="h100", num_gpus=16, tp_choices=(1, 2, 4, 8))
    )
    models = planner.models()

    def makespan(tps: tuple[int, ...]) -> float:
        return solve(lengths, contexts, [models[tp] for tp in tps]).makespan_s

    start = (1,) * 16
    polished = planner.polish(start, (1, 2, 4, 8), makespan)
    assert sum(polished) == 16
    assert 8 in polished
    assert makespan(polished) < makespan(start)
    # The polish never takes a move that does not pay.
    assert planner.polish(polished, (1, 2, 4, 8), makespan) == polished


def test_a_split_of_mixed_widths_is_planned_only_where_it_pays_by_the_margin(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two long trajectories among 4,000 short ones on 16 H100s (32B): the DP finds a
    TP-8 for the two beside TP-2s for the rest 1.4x faster than any homogeneous split,
    and the planner takes it. Where it finds a mixed split faster by less than the
    margin, it keeps the best homogeneous one."""
    from scheduler import resources

    planner = SplitPlanner(
        ClusterShape(model="qwen3-32b", gpu="h100", num_gpus=16, tp_choices=(1, 2, 4, 8))
    )
    models = planner.models()
    lengths = [8000.0] * 2 + [500.0] * 4000
    contexts = [4800.0] * 2 + [300.0] * 4000
    homogeneous = {
        tp: solve(lengths, contexts, [models[tp]] * (16 // tp), max_kv_share=KV_SHARE_CAP)
        for tp in models
    }
    best = min(homogeneous, key=lambda tp: homogeneous[tp].makespan_s)
    mixed = planner.plan(lengths, contexts)
    assert len(set(mixed.tps)) > 1
    gain = homogeneous[best].makespan_s / mixed.partition.makespan_s
    assert gain > 1 / (1 - resources.MIXED_SPLIT_MARGIN)
    monkeypatch.setattr(resources, "MIXED_SPLIT_MARGIN", 1 - 1 / gain + 0.01)
    assert planner.plan(lengths, contexts).tps == (best,) * (16 // best)


def test_predictor_ranks_remaining_work_better_than_the_simple_estimators() -> None:
    history = [r.spec for r in generate("math", prompts=150, seed=0, iteration=0)]
    test = [r.spec for r in generate("math", prompts=150, seed=0, iteration=1)]
    predictor = RemainingPredictor.train(history)
    x, _, where = training_rows(test)
    predicted = list(predictor.predict_rows(x))
    generated = [sum(s.output_tokens for s in test[t].steps[:k]) for t, k in where]
    sibling = [max(1.0, sum(s.generated_tokens for s in test if s.group_id == test[t].group_id)
                   / 16 - g) for (t, _), g in zip(where, generated, strict=True)]  # fmt: skip
    report = evaluate({"lgbm": predicted, "sibling": sibling}, test, at_steps=(2,))
    assert report["lgbm@2"]["pearson_r"] >= 0.7
    assert report["lgbm@2"]["pearson_r"] > report["sibling@2"]["pearson_r"]


def test_the_predictor_seed_is_deterministic_and_reaches_heddle() -> None:
    """`benchmarks/noise.py` varies only the predictor's seed: each seed must give one
    fit, and different seeds different fits, or its spread would measure nothing."""
    history = [r.spec for r in generate("coding", prompts=60, seed=0, iteration=0)]
    x, _, _ = training_rows(history)
    fits = [RemainingPredictor.train(history, seed=s).predict_rows(x) for s in (0, 0, 1)]
    assert (fits[0] == fits[1]).all()
    assert (fits[0] != fits[2]).any()
    ctx = PolicyContext(history=tuple(history), predictor_seed=1)
    planner = create_policy("heddle", ctx).split
    assert (planner.forecast.lengths.predictor.predict_rows(x) == fits[2]).all()


def test_the_forecast_is_the_expected_remaining_not_the_median() -> None:
    """A fit on log tokens predicts near the median; the DP sums work and KV, so each
    step index is scaled by its out-of-fold smearing factor. On a new iteration the
    scaled forecast's total is closer to the true total at every step, and the factor
    is largest at the first step, where the spread is widest."""
    history = [r.spec for r in generate("coding", prompts=200, seed=0, iteration=0)]
    test = [r.spec for r in generate("coding", prompts=200, seed=0, iteration=1)]
    predictor = RemainingPredictor.train(history)
    assert predictor.smear[0] == max(predictor.smear)
    assert min(predictor.smear) > 1.0
    x, y, where = training_rows(test)
    expected = predictor.predict_rows(x)
    median = predictor.median_rows(x)
    true = np.expm1(y)
    step = np.asarray([k for _, k in where])
    for k in (0, 1, 2, 3):
        at = step == k
        bias_expected = abs(np.log(expected[at].sum() / true[at].sum()))
        bias_median = abs(np.log(median[at].sum() / true[at].sum()))
        assert bias_expected < bias_median, k


@pytest.mark.parametrize("seed", [1006, 7])
def test_prompts_the_history_does_not_hold_are_forecast_without_their_record(seed: int) -> None:
    """A campaign draws each batch's prompts from a data set, so the history is of other
    prompts. Every training row has its prompt's record (the group's other samples); a
    fit that reads it forecast these first steps at a fraction of their mean. The fit
    made without the record serves them, and a prompt with a record keeps the other."""
    from heddle.families import generate_family

    trace, history = (
        [r.spec for r in generate_family("random", prompts=50, seed=seed, iteration=it)]
        for it in (1, 0)
    )
    predictor = RemainingPredictor.train(history)
    rows = np.asarray([predictor.event_row(TrajectoryView.first(s)) for s in trace])
    true = np.mean([s.generated_tokens for s in trace])
    assert 0.5 < predictor.predict_rows(rows).mean() / true < 2.0
    assert predictor._predict_rows(rows).mean() / true < 0.5  # the fit with the record
    known, _, _ = training_rows(history)  # rows of prompts with a record
    assert (predictor.predict_rows(known) == predictor._predict_rows(known)).all()


def test_a_turn_past_what_the_history_shows_is_forecast_from_what_it_made() -> None:
    """Trees do not extrapolate: a search turn in progress far past the longest level
    the history describes (4,096 tokens made here) kept the forecast of a shorter one.
    Past that level a forecast is at least the history's remaining-per-made ratio there
    times what the turn has made; below it the fit's forecast stands."""
    history = [r.spec for r in generate("search", prompts=400, seed=2, iteration=0)]
    predictor = RemainingPredictor.train(history)
    assert predictor.tail is not None
    level, ratio = predictor.tail
    assert level == 4_096
    assert ratio > 1.0
    x, _, _ = training_rows(history, mid_step=True)
    made_at = FEATURES.index("step_made")
    row = x[x[:, made_at] == level][:1].copy()
    far = row.copy()
    far[0, made_at] = far[0, FEATURES.index("generated")] = 12_000
    assert predictor.predict_rows(far)[0] >= 12_000 * ratio - 1e-6
    predictor.tail = None  # the trees alone: the same forecast as at the level itself
    assert predictor.predict_rows(far)[0] < 12_000 * ratio
    assert predictor.predict_rows(row)[0] == pytest.approx(
        RemainingPredictor.train(history).predict_rows(row)[0]
    )


def test_no_forecast_runs_past_the_longest_history_trajectory() -> None:
    """Coding prompts whose samples mostly hit the 40,000-token cap: smeared, their
    median would forecast more than any trajectory may make. Capped at what is left of
    the history's longest total; a trajectory past it keeps the fit's own forecast."""
    history = [r.spec for r in generate("coding", prompts=200, seed=0, iteration=0)]
    test = [r.spec for r in generate("coding", prompts=200, seed=0, iteration=1)]
    predictor = RemainingPredictor.train(history)
    predictor.tail = None  # the cap alone (the tail floor: -k past_what)
    longest = max(s.generated_tokens for s in history)
    assert predictor.longest == longest
    x, _, _ = training_rows(test, mid_step=True)
    made = x[:, FEATURES.index("generated")]
    expected = predictor.predict_rows(x)
    bucket = np.minimum(x[:, FEATURES.index("step_index")], len(predictor.smear) - 1)
    uncapped = (predictor.median_rows(x) + 1.0) * predictor.smear[bucket.astype(int)] - 1.0
    assert (uncapped > longest - made).sum() > 50  # the cap is not idle here
    assert (made + expected <= longest + 1e-6).all()
    predictor.longest = 1_000.0  # every trajectory past it: the fit's forecast stands
    past = made > 1_000
    assert np.allclose(predictor.predict_rows(x[past]), uncapped[past].clip(min=1.0))


def test_a_turn_in_progress_is_forecast_from_what_it_has_made() -> None:
    """A review re-predicts a long decode mid-turn. Trained on turns in progress too
    (at 2,048 tokens made and each doubling), the model ranks them better than one fit
    on step boundaries only, which never saw a turn that had already run long."""
    history = [r.spec for r in generate("math", prompts=100, seed=0, iteration=0)]
    test = [r.spec for r in generate("math", prompts=100, seed=0, iteration=1)]
    predictor = RemainingPredictor.train(history)
    x, y, _ = training_rows(history)
    boundary_only = lightgbm.train(PARAMS, lightgbm.Dataset(x, y), num_boost_round=NUM_ROUNDS)
    xt, yt, _ = training_rows(test, mid_step=True)
    in_turn = xt[:, FEATURES.index("step_made")] > 0
    assert in_turn.sum() > 200
    assert len(training_rows(test)[1]) == (~in_turn).sum()  # `evaluate` sees boundaries
    r_with = pearson(np.log(predictor.predict_rows(xt[in_turn])), yt[in_turn])
    r_without = pearson(boundary_only.predict(xt[in_turn]), yt[in_turn])
    assert r_with > r_without + 0.03
    # Live and simulated reviews carry the turn's tokens in the event.
    event = TrajectoryView("t", "g", 0, 4_196, 4_096, prompt_tokens=100, step_tokens=4_096)
    assert predictor.event_row(event)[FEATURES.index("step_made")] == 4_096


def _event(tid: str, step: int, generated: int, prev: str | None) -> TrajectoryView:
    return TrajectoryView(tid, "g", step, 100 + generated, generated, previous_instance=prev,
                     prompt_tokens=100)  # fmt: skip


def test_a_trajectory_whose_rank_changes_migrates_during_its_tool_call() -> None:
    from heddle.types import StepSpec, TrajectorySpec

    def spec(tid: str, tokens: int) -> TrajectorySpec:
        return TrajectorySpec(
            tid, "g", 100, (StepSpec(10, "python", 0.1, "ok", 5), StepSpec(tokens))
        )

    truth = [spec("long", 30_000), *(spec(f"s{i}", 100 + i) for i in range(40))]
    # 12 GPUs: no homogeneous TP-8 split, so the one wide instance is unique (on 16 the
    # planner rightly takes two TP-8s, interchangeable, and s5 need not move).
    ctx = PolicyContext(ClusterShape(num_gpus=12, tp_choices=(1, 2, 4, 8)), truth=tuple(truth))
    planner = HeddlePlanner.for_context(ctx, HeddleVariant(oracle=True))
    placement = planner.placement()
    planner.on_batch_start([_event(s.trajectory_id, 0, 0, None) for s in truth])
    assert planner.plan.tps[0] >= 4  # the long tail gets a wide instance
    wide = planner.plan.instance_ids[0]
    states = [
        InstanceState(i, 0, 0, tp)
        for i, tp in zip(planner.plan.instance_ids, planner.plan.tps, strict=True)
    ]
    first = placement.place(_event("long", 0, 0, None), states, 0.0)
    assert first.instance_id == wide
    short = placement.place(_event("s5", 0, 0, None), states, 0.0)
    assert short.instance_id != wide
    # Re-prediction finds s5 far longer than thought: its rank rises to the top and it
    # moves to the wide instance, carrying its KV (migrate=True) while its tool runs.
    planner.forecast.lengths.truth["s5"] = spec("s5", 50_000)
    moved = placement.place(_event("s5", 1, 10, short.instance_id), states, 1.0)
    assert moved.instance_id == wide
    assert moved.migrate
    assert moved.reason == "rank_moved"


def test_the_split_is_planned_on_the_history_spread_not_the_first_forecasts() -> None:
    """Before the first step the forecasts regress to the mean; the split is planned on
    the history's lengths spread over the batch, so it sees the tail the batch will
    have. The placement still solves on the forecasts; the oracle plans on the truth."""
    history = [r.spec for r in generate("math", prompts=40, seed=0, iteration=0)]
    trace = [r.spec for r in generate("math", prompts=40, seed=0, iteration=1)]
    ctx = PolicyContext(ClusterShape(num_gpus=16, tp_choices=(1, 2, 4, 8)), history=tuple(history))
    planner = HeddlePlanner.for_context(ctx)
    events = [TrajectoryView(s.trajectory_id, s.group_id, 0, s.prompt_tokens, 0,
                        prompt_tokens=s.prompt_tokens) for s in trace]  # fmt: skip
    for e in events:
        planner.forecast.update(e)
    lengths, contexts = planner.forecast.longest_first()
    spread, spread_ctx = planner.plan.split_forecast(events, lengths, contexts, planner.forecast)
    totals = sorted((s.generated_tokens for s in history), reverse=True)
    assert len(spread) == len(trace)
    assert spread[0] == totals[0]
    assert spread[-1] == totals[-1]
    assert spread == sorted(spread, reverse=True)
    assert max(lengths) < 0.8 * totals[0]  # the first forecasts hide the tail
    assert spread_ctx[0] > spread_ctx[-1]
    planner.on_batch_start(events)
    splitter = SplitPlanner(
        ClusterShape(model="qwen3-8b", gpu="h100", num_gpus=16, tp_choices=(1, 2, 4, 8))
    )
    split = splitter.plan(spread, spread_ctx)
    assert planner.plan.tps == split.tps
    # The tail the first forecasts hide: the DP's makespan on them is far shorter.
    assert split.partition.makespan_s > 1.5 * splitter.plan(lengths, contexts).partition.makespan_s
    assert sum(planner.plan.sizes) == len(trace)
    oracle = HeddlePlanner.for_context(replace(ctx, truth=tuple(trace)), HeddleVariant(oracle=True))
    for e in events:
        oracle.forecast.update(e)
    truth, truth_ctx = oracle.forecast.longest_first()
    assert oracle.plan.split_forecast(events, truth, truth_ctx, oracle.forecast) == (
        truth,
        truth_ctx,
    )


def test_live_rollouts_take_every_registered_policy_and_refuse_others() -> None:
    with pytest.raises(ValueError, match="unknown policy 'heddel'"):
        validate_options(RolloutOptions(policy="heddel"))
    validate_options(RolloutOptions(policy="heddle"))
    validate_options(RolloutOptions(policy="verl"))


def test_planner_never_chooses_an_instance_too_small_for_a_trajectory() -> None:
    # Qwen3-32B on one H100 holds ~9K tokens of KV: TP 1 is not a valid choice.
    planner = SplitPlanner(
        ClusterShape(model="qwen3-32b", gpu="h100", num_gpus=16, tp_choices=(1, 2, 4, 8))
    )
    plan = planner.plan([30_000.0, 20_000.0, 500.0], [16_000.0, 11_000.0, 800.0])
    assert 1 not in plan.tps
    assert sum(plan.tps) == 16


def test_the_workflow_and_the_simulator_show_a_policy_one_trajectory_view() -> None:
    """The view grows the same way in both: what the simulator shows a policy at each
    step is what the workflow's transitions make (and sends through Temporal's
    converter intact)."""
    from temporalio.converter import DataConverter

    from heddle.sim import simulate
    from heddle.types import DecideRequest, StepSpec, StepText, TrajectorySpec, TrajectoryView
    from scheduler.interface import Policy
    from scheduler.order import FirstComeFirstServed
    from scheduler.placement import LeastLoaded
    from scheduler.split import Homogeneous

    said = StepText((0.5, 0.5), (0.25, 0.75), 17)
    spec = TrajectorySpec("t", "g", 300, (
        StepSpec(120, "python", 1.0, "ok", 40, text=said),
        StepSpec(700, "search", 2.0, "error", 900), StepSpec(50),
    ))  # fmt: skip
    shown: list[TrajectoryView] = []

    class Recording(LeastLoaded):
        def place(self, event, instances, now):  # type: ignore[no-untyped-def]
            shown.append(event)
            return super().place(event, instances, now)

    policy = Policy("rec", FirstComeFirstServed(), Recording(), Homogeneous(1))
    simulate([spec], policy, ClusterShape(num_gpus=1))
    view, built = TrajectoryView.first(spec), []
    for step in spec.steps:
        built.append(view)
        text = step.text or StepText()
        view = view.after_output(step.output_tokens, text.output_ngrams)
        if step.tool is not None:
            view = view.after_tool(
                step.tool, step.tool_status, step.tool_output_tokens,
                input_chars=text.tool_input_chars, ngrams=text.observation_ngrams,
            )  # fmt: skip
    assert [v.on(None) for v in shown] == built
    assert (built[1].last_output_ngrams, built[1].last_observation_ngrams) == (
        (0.5, 0.5),
        (0.25, 0.75),
    )
    assert built[1].last_tool_input_chars == 17
    assert built[2].last_output_ngrams == ()
    assert built[2].tool_path == ("python:s:ok", "search:m:error")
    assert built[2].recent_output_tokens == (120, 700)
    assert built[2].context_tokens == 300 + 120 + 40 + 700 + 900
    assert built[1].in_progress(30).step_tokens == 30
    converter = DataConverter.default.payload_converter
    request = DecideRequest(built[1].on("i3"), "libra", "b1", planned=True)
    payload = converter.to_payloads([request])
    assert converter.from_payloads(payload, [DecideRequest]) == [request]


def test_priority_buckets_put_urgent_steps_first() -> None:
    from scheduler.service import PriorityBuckets

    buckets = PriorityBuckets(buckets=5, window=100)
    assert buckets.key(0) == 3  # nothing to compare with yet
    for p in range(100):
        buckets.key(p)
    assert buckets.key(-1) == 1
    assert buckets.key(10_000) == 5
    assert buckets.key(50) in (3, 4)
    same = PriorityBuckets()
    assert {same.key(7) for _ in range(10)} == {3}


def test_the_kv_cap_keeps_groups_off_the_critical_path_within_their_share() -> None:
    # One long trajectory and thousands of short ones: the minimax objective alone is
    # indifferent to piling the short ones on a single instance.
    lengths = [30_000.0] + [300.0] * 3000
    contexts = [20_000.0] + [2_000.0] * 3000
    instances = [_model(8)] + [_model(1)] * 8
    free = solve(lengths, contexts, instances)
    capped = solve(lengths, contexts, instances, max_kv_share=2.0)
    total_ctx = sum(contexts)
    capacity = sum(i.kv_capacity_tokens for i in instances)
    start = 0
    for inst, size in zip(instances, capped.sizes, strict=True):
        group = sum(contexts[start : start + size])
        assert group <= 2.0 * inst.kv_capacity_tokens / capacity * total_ctx + 1e-6
        start += size
    assert max(free.sizes[1:]) > max(capped.sizes[1:])
    assert capped.makespan_s >= free.makespan_s  # a constraint never lowers the optimum


def test_a_draining_batch_moves_a_decode_to_where_it_runs_faster() -> None:
    from heddle.types import StepSpec, TrajectorySpec

    truth = [TrajectorySpec(f"l{i}", "g", 100, (StepSpec(30_000),)) for i in range(3)]
    truth += [TrajectorySpec(f"s{i}", "g", 100, (StepSpec(2_000),)) for i in range(60)]
    # 12 GPUs: no homogeneous TP-8 split (on 16 the planner takes two TP-8s).
    ctx = PolicyContext(ClusterShape(num_gpus=12, tp_choices=(1, 2, 4, 8)), truth=tuple(truth))
    planner = HeddlePlanner.for_context(ctx, HeddleVariant(oracle=True))
    placement = planner.placement()
    planner.on_batch_start([_event(s.trajectory_id, 0, 0, None) for s in truth])
    narrow = planner.plan.instance_ids[-1]
    assert planner.plan.tps[-1] < planner.plan.tps[0]
    # s7 decodes on the narrowest instance beside two others; its rank keeps it there.
    decode = _event("s7", 0, 1_000, narrow)
    busy = {i: InstanceState(i, 1, 1, tp, kv_usage=0.01)
            for i, tp in zip(planner.plan.instance_ids, planner.plan.tps, strict=True)}  # fmt: skip
    busy[narrow] = InstanceState(narrow, 3, 3, planner.plan.tps[-1], kv_usage=0.05)
    assert placement.review([decode], list(busy.values()), 10.0) == {}  # no GPU spare

    idle = dict(busy)
    spare = planner.plan.instance_ids[0]
    idle[spare] = InstanceState(spare, 0, 0, planner.plan.tps[0])
    moves = placement.review([decode], list(idle.values()), 15.0)
    assert set(moves) == {"s7"}
    assert moves["s7"].reason == "drain_faster"
    assert moves["s7"].migrate
    assert moves["s7"].instance_id != narrow


def test_the_leading_groups_keep_their_instances_only_where_gpus_are_spare() -> None:
    """Where the batch's memory reads take far less than its longest trajectory alone,
    the DP's first groups run on instances of their own (nothing else is balanced onto
    them); where the reads dominate, every instance of a width takes any rank."""
    from heddle.types import StepSpec, TrajectorySpec

    def spec(tid: str, tokens: int) -> TrajectorySpec:
        return TrajectorySpec(tid, "g", 100, (StepSpec(tokens),))

    def planned(truth: list[TrajectorySpec]) -> tuple[HeddlePlanner, HeddlePlacement]:
        ctx = PolicyContext(
            ClusterShape(num_gpus=32, tp_choices=(8,), default_tp=8), truth=tuple(truth)
        )
        planner = HeddlePlanner.for_context(ctx, HeddleVariant(oracle=True))
        placement = planner.placement()
        planner.on_batch_start([_event(s.trajectory_id, 0, 0, None) for s in truth])
        return planner, placement

    spare = [spec("long", 30_000), *(spec(f"s{i}", 200 + i) for i in range(300))]
    planner, placement = planned(spare)
    first = planner.plan.instance_ids[0]
    assert first in planner.plan.pinned
    assert len(planner.plan.pinned) < len(planner.plan.instance_ids)  # the rest stays open
    states = [InstanceState(i, 0, 0, 8) for i in planner.plan.instance_ids]
    assert placement.place(_event("long", 0, 0, None), states, 0.0).instance_id == first
    # The long one's booked work makes `first` the busiest TP-8; balancing alone would
    # still have sent shorts there once the others filled. Pinned, it takes none.
    for i in range(300):
        decision = placement.place(_event(f"s{i}", 0, 0, None), states, 0.0)
        assert decision.instance_id != first

    busy = [spec(f"m{i}", 8_000 + i) for i in range(3_000)]
    planner, _ = planned(busy)
    assert planner.plan.pinned == frozenset()

    # `pin_groups` (a measure, benchmarks/forecast_noise.py) pins the first k whatever
    # the reads, at batch start and at every re-plan.
    ctx = PolicyContext(ClusterShape(num_gpus=32, tp_choices=(8,), default_tp=8), truth=tuple(busy))
    planner = HeddlePlanner.for_context(ctx, HeddleVariant(oracle=True, pin_groups=2))
    planner.on_batch_start([_event(s.trajectory_id, 0, 0, None) for s in busy])
    assert planner.plan.pinned == frozenset(planner.plan.instance_ids[:2])
    planner.reshaping.replan()
    assert planner.plan.pinned == frozenset(planner.plan.instance_ids[:2])
    assert sum(planner.plan.sizes) == len(busy)


def test_noisy_truth_forecasts_the_truth_times_one_factor_per_trajectory() -> None:
    """`benchmarks/forecast_noise.py`'s forecasts: exact at sigma 0; otherwise each
    trajectory keeps one factor at every step, and the factors average one."""
    from benchmarks.forecast_noise import NoisyTruth

    truth = [r.spec for r in generate("math", prompts=100, seed=0, iteration=1)]
    history = [r.spec for r in generate("math", prompts=100, seed=0, iteration=0)]
    exact = NoisyTruth(truth, history, 0.0)
    noisy = NoisyTruth(truth, history, 0.5)
    spec = max(truth, key=lambda s: s.generated_tokens)
    for made in (0, 1_000, 5_000):
        event = _event(spec.trajectory_id, 0, made, None)
        assert exact.predict(event) == spec.generated_tokens - made
        assert noisy.predict(event) == pytest.approx(
            (spec.generated_tokens - made) * noisy.factor[spec.trajectory_id]
        )
    factors = np.asarray(list(noisy.factor.values()))
    assert abs(factors.mean() - 1.0) < 0.05
    assert np.log(factors).std() == pytest.approx(0.5, abs=0.03)
    assert NoisyTruth(truth, history, 0.5).factor == noisy.factor  # one draw per seed


def test_open_instances_pool_in_the_dp_as_the_placement_balances_them() -> None:
    """k balanced instances run a group of b requests holding KV c as each runs b/k of
    it; after a re-plan with pins, the open instances share one pooled group evenly."""
    base = _model(8)
    pool = base.pooled(5)
    for batch, context in ((5, 50_000.0), (400, 2e6), (1_280, 9e6)):
        assert np.isclose(
            pool.per_token_s(batch, context), base.per_token_s(batch / 5, context / 5)
        )
    assert (pool.max_num_seqs, pool.kv_capacity_tokens) == (
        5 * base.max_num_seqs,
        5 * base.kv_capacity_tokens,
    )

    from heddle.types import StepSpec, TrajectorySpec

    shorts = [TrajectorySpec(f"s{i}", "g", 100, (StepSpec(600 + i),)) for i in range(300)]
    truth = [TrajectorySpec("long", "g", 100, (StepSpec(30_000),)), *shorts]
    ctx = PolicyContext(
        ClusterShape(num_gpus=32, tp_choices=(8,), default_tp=8), truth=tuple(truth)
    )
    planner = HeddlePlanner.for_context(ctx, HeddleVariant(oracle=True))
    planner.on_batch_start([_event(s.trajectory_id, 0, 0, None) for s in truth])
    planner.reshaping.replan()
    assert planner.plan.pinned
    plan = planner.plan
    open_sizes = [size for iid, size in zip(plan.instance_ids, plan.sizes, strict=True)
                  if iid not in plan.pinned]  # fmt: skip
    assert max(open_sizes) - min(open_sizes) <= 1
    assert sum(planner.plan.sizes) == len(truth)


def test_a_replan_pins_as_many_instances_as_the_pooled_dp_finds_fastest() -> None:
    """At a re-plan the pin count is chosen with the open instances pooled: each count
    is solved with the rest as one pool and the fastest predicted wins. Following the
    plain DP's groups instead, the chain ends at the first empty group: at batch start
    here the groups are (1, 0, 1, ...), so one instance is pinned and the next nine
    longest share the open ones with 600 shorts."""
    from heddle.types import StepSpec, TrajectorySpec

    truth = [TrajectorySpec(f"l{i}", "g", 100, (StepSpec(30_000 - 1_000 * i),)) for i in range(10)]
    truth += [TrajectorySpec(f"s{i}", "g", 100, (StepSpec(600 + i),)) for i in range(600)]
    ctx = PolicyContext(
        ClusterShape(num_gpus=64, tp_choices=(8,), default_tp=8), truth=tuple(truth)
    )
    planner = HeddlePlanner.for_context(ctx, HeddleVariant(oracle=True))
    planner.on_batch_start([_event(s.trajectory_id, 0, 0, None) for s in truth])
    assert planner.plan.sizes[:2] == (1, 0)
    assert len(planner.plan.pinned) == 1
    planner.reshaping.replan()
    k = len(planner.plan.pinned)
    assert planner.plan.pinned == frozenset(planner.plan.instance_ids[:k])
    assert k == 7
    assert planner.plan.sizes[:k] == (1, 1, 1, 1, 1, 1, 4)
    open_sizes = planner.plan.sizes[k:]
    assert max(open_sizes) - min(open_sizes) <= 1
    assert sum(planner.plan.sizes) == len(truth)
    lengths, contexts = planner.forecast.longest_first()
    model = planner.plan.shapes.models[8]

    def predicted(pins: int) -> float:
        pool = [model.pooled(8 - pins)]
        return solve(lengths, contexts, [model] * pins + pool, max_kv_share=KV_SHARE_CAP).makespan_s

    assert predicted(5) < predicted(1)
    # Five pins and seven tie (the longest alone is the slowest group); with seven the
    # next longest run apart too (`solve_leading`).
    assert predicted(7) == pytest.approx(predicted(5), rel=1e-9)


def test_a_trajectory_whose_rank_leaves_a_pinned_instance_makes_room_there() -> None:
    """A pinned instance keeps only the ranks the plan maps to it: one re-predicted short
    moves out at its next step, or mid-decode at a review, though the same-width guard
    would keep it where it is on an open instance; and a decode whose rank enters the
    pinned tier moves in at a review."""
    from heddle.types import StepSpec, TrajectorySpec

    def spec(tid: str, tokens: int) -> TrajectorySpec:
        return TrajectorySpec(
            tid, "g", 100, (StepSpec(10, "search", 1.0, "ok", 5), StepSpec(tokens))
        )

    truth = [spec("long", 30_000), *(spec(f"s{i}", 600 + i) for i in range(300))]
    ctx = PolicyContext(
        ClusterShape(num_gpus=32, tp_choices=(8,), default_tp=8), truth=tuple(truth)
    )
    states = [InstanceState(f"h{k}", 0, 0, 8) for k in range(4)]

    def placed() -> tuple[HeddlePlanner, HeddlePlacement, str]:
        planner = HeddlePlanner.for_context(ctx, HeddleVariant(oracle=True))
        placement = planner.placement()
        planner.on_batch_start([_event(s.trajectory_id, 0, 0, None) for s in truth])
        first = planner.plan.instance_ids[0]
        assert first in planner.plan.pinned
        assert placement.place(_event("long", 0, 0, None), states, 0.0).instance_id == first
        return planner, placement, first

    planner, placement, first = placed()
    kept = placement.place(_event("long", 1, 100, first), states, 1.0)
    assert (kept.instance_id, kept.reason) == (first, "rank_kept")
    planner.forecast.lengths.truth["long"] = spec(
        "long", 800
    )  # re-predicted: mid-table, 690 tokens to go
    moved = placement.place(_event("long", 1, 100, first), states, 1.0)
    assert moved.instance_id not in planner.plan.pinned  # `first` among them
    assert (moved.reason, moved.migrate) == ("left_pinned", True)

    planner, placement, first = placed()
    planner.forecast.lengths.truth["long"] = spec("long", 800)
    decode = TrajectoryView("long", "g", 1, 200, 100, previous_instance=first, prompt_tokens=100,
                       step_tokens=90)  # fmt: skip
    moves = placement.review([decode], states, 5.0)
    assert moves["long"].reason == "left_pinned"
    assert moves["long"].instance_id not in planner.plan.pinned

    # The mirror: a decode on an open instance whose re-prediction ranks it into the
    # pinned tier moves there mid-decode, though the instances are as wide.
    planner, placement, first = placed()
    seat = placement.place(_event("s5", 0, 0, None), states, 0.0).instance_id
    assert seat not in planner.plan.pinned
    planner.forecast.lengths.truth["s5"] = spec("s5", 60_000)  # its turn runs on: now the longest
    decode = TrajectoryView("s5", "g", 1, 2_200, 2_100, previous_instance=seat, prompt_tokens=100,
                       step_tokens=2_090)  # fmt: skip
    moves = placement.review([decode], states, 5.0)
    assert (moves["s5"].instance_id, moves["s5"].reason) == (first, "entered_pinned")
    assert moves["s5"].migrate


def test_a_batch_starts_longest_expected_first_by_the_earlier_iteration() -> None:
    """The start order ranks a prompt by its trajectories' mean length in the history;
    a prompt the history lacks ranks at the history's mean; ties keep the given order;
    without a history the order is the given one."""
    from heddle.types import StepSpec, TrajectorySpec
    from scheduler.start_order import longest_expected_first

    def spec(tid: str, group: str, tokens: int = 10) -> TrajectorySpec:
        return TrajectorySpec(tid, group, 10, (StepSpec(tokens),))

    history = [spec("a", "it0-p1", 100), spec("b", "it0-p1", 300), spec("c", "it0-p2", 1000),
               spec("d", "it0-p3", 50)]  # fmt: skip
    batch = [spec("x0", "it1-p3"), spec("x1", "it1-p1"), spec("x2", "it1-p9"),
             spec("x3", "it1-p2"), spec("x4", "it1-p1")]  # fmt: skip
    # p2: 1000, p9 (unknown): the mean 362.5, p1: 200, p3: 50
    assert longest_expected_first(batch, history) == [3, 2, 1, 4, 0]
    assert longest_expected_first(batch, []) == [0, 1, 2, 3, 4]


def test_the_engine_key_is_the_remaining_until_a_context_is_evicted_then_the_total() -> None:
    """The engines' queues order by the predicted remaining (the critical path) while
    the KV cache holds what they run: b, with 9,000 tokens to go, outranks a, half-way
    through 10,000. Once a trajectory finds its context evicted, by the predicted total
    (longest processing time first), so progress alone no longer lowers a trajectory
    and the engine stops rotating among the long ones."""
    from heddle.types import StepSpec, TrajectorySpec

    def spec(tid: str, tokens: int) -> TrajectorySpec:
        return TrajectorySpec(tid, "g", 100, (StepSpec(tokens // 2, "python", 0.1, "ok", 5),
                                              StepSpec(tokens - tokens // 2)))  # fmt: skip

    truth = [spec("a", 10_000), spec("b", 9_000)]
    ctx = PolicyContext(ClusterShape(num_gpus=8, tp_choices=(1, 2, 4, 8)), truth=tuple(truth))
    policy = create_policy("heddle-oracle", ctx)
    policy.on_batch_start([_event(s.trajectory_id, 0, 0, None) for s in truth])
    states = [InstanceState(i.instance_id, 0, 0, i.tp) for i in policy.split.instances(8)]
    started = policy.decide(_event("a", 0, 0, None), states, 0.0)
    waiting = policy.decide(_event("b", 0, 0, None), states, 0.0)
    halfway = _event("a", 1, 5_000, started.instance_id)
    # The engine runs the lowest priority value first.
    assert started.priority < waiting.priority < policy.decide(halfway, states, 1.0).priority
    evicted = replace(halfway, context_evicted=True)
    after = policy.decide(evicted, states, 2.0)
    assert after.priority == started.priority < waiting.priority
    assert after.predicted_remaining == 5_000
    # The switch holds for the rest of the batch.
    assert policy.decide(halfway, states, 3.0).priority == started.priority


def test_a_step_finds_its_context_evicted_when_less_than_half_of_it_was_cached() -> None:
    from heddle.types import TrajectoryView

    view = TrajectoryView("t", "g", 0, 1_000, 0, prompt_tokens=1_000)
    assert not view.found_evicted(0)  # a first step has nothing to find
    view = view.after_output(200).after_tool("python", "ok", 300)
    # It left 1,200 tokens on its instance; the tool's 300 are new.
    assert view.found_evicted(599)
    assert not view.found_evicted(600)
    assert (
        not view.after_output(10, evicted=True).after_tool("python", "ok", 5).found_evicted(1_210)
    )


def test_a_batch_whose_contexts_outgrow_the_cache_switches_the_key_and_one_that_fits_not() -> None:
    """In the simulator, as live: a step that ran where its context was, and found it
    evicted, says so at its next decide, and Heddle's key turns to the total."""
    from heddle.sim import simulate
    from heddle.types import StepSpec, TrajectorySpec

    def batch(prompt: int) -> list[TrajectorySpec]:
        steps = (StepSpec(200, "python", 5.0, "ok", 100), StepSpec(200, "python", 5.0, "ok",
                 100), StepSpec(200))  # fmt: skip
        return [TrajectorySpec(f"t{k}", f"g{k % 8}", prompt, steps) for k in range(64)]

    # Qwen3-8B on one H100 holds some 350,000 tokens: 64 contexts of 1,000 fit, of
    # 8,000 not.
    cluster = ClusterShape(model="qwen3-8b", gpu="h100", num_gpus=1, tp_choices=(1,))
    assert 64 * 1_600 < CostModel.of(cluster, 1).kv_capacity_tokens < 64 * 8_000
    for prompt, switched in ((1_000, False), (8_000, True)):
        trace = batch(prompt)
        policy = create_policy("heddle-oracle", PolicyContext(cluster, truth=tuple(trace)))
        simulate(trace, policy, cluster)
        assert policy.order.evicted_seen is switched  # type: ignore[attr-defined]


def test_the_upper_quantile_covers_what_the_expected_count_misses() -> None:
    """A rank that reads `RANK_QUANTILE` of the remaining tokens: on a new iteration
    it is at least the expected count on every row, and the truth falls at or below it
    on about that share of rows, where the expected count (a mean of a right-skewed
    spread) covers far fewer."""
    history = [r.spec for r in generate("coding", prompts=200, seed=0, iteration=0)]
    test = [r.spec for r in generate("coding", prompts=200, seed=0, iteration=1)]
    predictor = RemainingPredictor.train(history, upper=True)
    x, y, _ = training_rows(test)
    true = np.expm1(y)
    expected, upper = predictor.predict_rows(x), predictor.upper_rows(x)
    assert (upper >= expected).all()
    covered = float((true <= upper).mean())
    assert 0.8 < covered < 0.97, covered
    assert float((true <= expected).mean()) < covered - 0.1
    assert (RemainingPredictor.train(history).upper_rows(x) == expected).all()


def test_a_rank_by_the_upper_quantile_keeps_the_expected_count_for_the_dp() -> None:
    """`rank_upper` changes the rank key alone: the DP's input stays the mean."""
    trace = [r.spec for r in generate("coding", prompts=20, seed=0, iteration=1)]
    history = [r.spec for r in generate("coding", prompts=20, seed=0, iteration=0)]
    ctx = PolicyContext(ClusterShape(num_gpus=8), tuple(history), tuple(trace), 0)
    plain = HeddlePlanner.for_context(ctx, HeddleVariant())
    upper = HeddlePlanner.for_context(ctx, HeddleVariant(rank_upper=True))
    events = [TrajectoryView.first(s) for s in trace]
    for planner in (plain, upper):
        for e in events:
            planner.forecast.update(e)
    tids = [e.trajectory_id for e in events]
    assert [upper.forecast.remaining[t] for t in tids] == [
        plain.forecast.remaining[t] for t in tids
    ]
    assert all(upper.forecast.total(t) >= plain.forecast.total(t) for t in tids)
    assert any(upper.forecast.total(t) > 1.2 * plain.forecast.total(t) for t in tids)


@pytest.mark.parametrize("life_mean", [True, False])
def test_a_reservation_grows_over_what_is_left_not_as_a_whole_life_mean(life_mean: bool) -> None:
    """The reservation's two measures: the mean KV over what is left of a trajectory
    (Heddle's) grows with its context, so half-way through it reserves more than at its
    start; the whole-life mean (`reserve_life_mean`, a measure not kept: too little
    where the longest grow together) stays what it was at the start."""
    from heddle.types import StepSpec, TrajectorySpec
    from scheduler.baselines import heddle_variant
    from scheduler.heddle import heddle_policy

    truth = [TrajectorySpec("a", "g", 100, (StepSpec(5_000, "python", 0.1, "ok", 0),
                                            StepSpec(5_000)))]  # fmt: skip
    ctx = PolicyContext(ClusterShape(num_gpus=8, tp_choices=(1, 2, 4, 8)), truth=tuple(truth))
    variant = replace(heddle_variant("heddle-oracle"), reserve_life_mean=life_mean)
    policy = heddle_policy(ctx, "heddle-oracle", variant)
    policy.on_batch_start([_event("a", 0, 0, None)])
    states = [InstanceState(i.instance_id, 0, 0, i.tp) for i in policy.split.instances(8)]
    start = policy.decide(_event("a", 0, 0, None), states, 0.0)
    halfway = policy.decide(_event("a", 1, 5_000, start.instance_id), states, 1.0)
    assert start.reserve_kv_tokens == 100 + 5_000  # the prompt and half of what it makes
    if life_mean:
        assert halfway.reserve_kv_tokens == start.reserve_kv_tokens
    else:
        assert halfway.reserve_kv_tokens == 5_100 + 2_500
