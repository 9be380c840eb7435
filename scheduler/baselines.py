"""The peers' policies, assembled from the interfaces (REFERENCES.md "The peers' rules").

All of them run every instance at the cluster's `default_tp` (the peers' homogeneous TP)
except Libra, whose two buckets need two widths.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from scheduler.interface import Policy, PolicyContext
from scheduler.libra import LibraPlacement, MultiLevelFeedback
from scheduler.order import FirstComeFirstServed, LeastAttainedServiceFirst
from scheduler.placement import (
    CacheAware,
    LeastLoaded,
    SkewSwitch,
    StickyLeastSessions,
    StickySessions,
)
from scheduler.split import Buckets, Homogeneous
from scheduler.war import FewestTurnsLeft, WarPlacement

if TYPE_CHECKING:
    from scheduler.heddle import HeddleVariant


def least_loaded(ctx: PolicyContext) -> Policy:
    return Policy(
        "least_loaded",
        FirstComeFirstServed(),
        LeastLoaded(),
        Homogeneous(ctx.cluster.default_tp),
        "per-step least-loaded, FCFS (the walking skeleton's placeholder)",
    )


def verl(ctx: PolicyContext) -> Policy:
    return Policy(
        "verl",
        FirstComeFirstServed(),
        StickySessions(),
        Homogeneous(ctx.cluster.default_tp),
        "sticky sessions, least in-flight for new ones, FCFS (verl agent loop)",
    )


def verl_star(ctx: PolicyContext) -> Policy:
    return Policy(
        "verl_star",
        FirstComeFirstServed(),
        SkewSwitch(),
        Homogeneous(ctx.cluster.default_tp),
        "least-load when in-flight skew > 32, else sticky (Heddle paper's verl*)",
    )


def slime(ctx: PolicyContext) -> Policy:
    return Policy(
        "slime",
        FirstComeFirstServed(),
        CacheAware(),
        Homogeneous(ctx.cluster.default_tp),
        "SGLang router cache_aware: prefix match unless imbalanced (slime)",
    )


def sticky_least_loaded(ctx: PolicyContext) -> Policy:
    return Policy(
        "sticky_least_loaded",
        FirstComeFirstServed(),
        StickyLeastSessions(),
        Homogeneous(ctx.cluster.default_tp),
        "fewest active sessions for a new session, then sticky (SkyRL, vllm-router)",
    )


def autellix(ctx: PolicyContext) -> Policy:
    return Policy(
        "autellix",
        LeastAttainedServiceFirst(),
        LeastLoaded(),
        Homogeneous(ctx.cluster.default_tp),
        "program-level least attained service first, preemptive (Autellix)",
    )


def libra(ctx: PolicyContext) -> Policy:
    wide = [tp for tp in ctx.cluster.tp_choices if tp > ctx.cluster.default_tp]
    long_tp = min((tp for tp in wide if tp >= 4), default=max(wide, default=ctx.cluster.default_tp))
    placement = LibraPlacement()
    placement.learn(ctx.history)
    return Policy(
        "libra",
        MultiLevelFeedback(),
        placement,
        Buckets(ctx.cluster.default_tp, long_tp),
        "causal prefix tree of residuals, short/long TP buckets (Libra C-MLFQ)",
    )


def war(ctx: PolicyContext) -> Policy:
    placement = WarPlacement(seats_per_instance=ctx.cluster.max_num_seqs)
    return Policy(
        "war",
        FewestTurnsLeft(placement.turns),
        placement,
        Homogeneous(ctx.cluster.default_tp),
        "sticky below a load threshold; cache/load score and turns-left order above (WAR)",
    )


# ---- Heddle and its ablations --------------------------------------------------------------
# Each of Heddle's registered variants: the parts it turns off or on (`HeddleVariant`'s
# fields).
HEDDLE_VARIANTS: dict[str, dict[str, bool]] = {
    # Progressive prediction and priority, presorted-DP placement with migration,
    # heterogeneous TP (Heddle paper), and the engines' KV reservations.
    "heddle": {},
    "heddle-no-pps": {"pps": False},
    "heddle-no-placement": {"dp": False},
    "heddle-no-migrate": {"migrate": False},
    # The default TP everywhere, kept through the rollout: a fixed split stays fixed.
    "heddle-fixed-tp": {"plan_tp": False, "reshape": False},
    # The split planned at batch start is kept through the rollout (the paper's Heddle).
    "heddle-no-reshape": {"reshape": False},
    # The engines admit as vLLM does, whatever the trajectories they hold will need.
    "heddle-no-reserve": {"reserve_kv": False},
    # A campaign's first iteration (no history): forecasts learned from the batch as it
    # runs (`BatchLengths`). It starts on the default TP, since nothing yet says what a
    # wider split would pay for, and reshapes as the batch drains. Its queues stay on the
    # predicted total: what it knows of the remaining is what a trajectory has made, and
    # the remaining key until an eviction cost it 13% on robustness draw 1000 at 6,400.
    "heddle-cold": {"online": True, "plan_tp": False, "queue_adapts": False},
    "heddle-oracle": {"oracle": True},
}


def heddle_variant(name: str) -> HeddleVariant:
    """The variant a registered Heddle policy runs; imported here so that naming a peer
    does not load LightGBM."""
    from scheduler.heddle import HeddleVariant

    return HeddleVariant(**HEDDLE_VARIANTS[name])


def heddle(name: str) -> Callable[[PolicyContext], Policy]:
    """The factory of a registered Heddle variant (`HEDDLE_VARIANTS`)."""

    def create(ctx: PolicyContext) -> Policy:
        from scheduler.heddle import heddle_policy

        return heddle_policy(ctx, name, heddle_variant(name))

    return create
