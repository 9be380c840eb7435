"""Policies by name (STYLE.md 8): an unknown name lists the valid ones."""

from __future__ import annotations

from collections.abc import Callable

from scheduler import baselines
from scheduler.interface import Policy, PolicyContext

POLICIES: dict[str, Callable[[PolicyContext], Policy]] = {
    "least_loaded": baselines.least_loaded,
    "verl": baselines.verl,
    "verl_star": baselines.verl_star,
    "slime": baselines.slime,
    "sticky_least_loaded": baselines.sticky_least_loaded,
    "autellix": baselines.autellix,
    "libra": baselines.libra,
    "war": baselines.war,
    **{name: baselines.heddle(name) for name in baselines.HEDDLE_VARIANTS},
}


# Policies that plan the batch and the cluster's split before the first step: live, the
# batch workflow asks the scheduler service to plan and the control workflow to reshape.
PLANS_SPLIT = frozenset(name for name in POLICIES if name.startswith("heddle"))

# What a learning policy's batch runs when no earlier batch exists (a campaign's first
# iteration): Heddle learning from the batch as it runs. No peer stands in: on the
# robustness benchmark's random draws each falls below verl on some (docs/benchmarks.md).
FIRST_BATCH_POLICY = "heddle-cold"
# Heddle's variants that plan without a history: the oracle reads the batch's own
# lengths, the cold start learns from the batch.
WITHOUT_HISTORY = frozenset({"heddle-oracle", FIRST_BATCH_POLICY})


def learns_from_history(name: str) -> bool:
    """Whether the policy plans from an earlier batch (its predictor and its split)."""
    return name in PLANS_SPLIT and name not in WITHOUT_HISTORY


def policy_without_history(name: str) -> str:
    """The policy a batch with no earlier one runs in place of `name`."""
    return FIRST_BATCH_POLICY if learns_from_history(name) else name


def policy_names() -> list[str]:
    return sorted(POLICIES)


def create_policy(name: str, ctx: PolicyContext | None = None) -> Policy:
    try:
        factory = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; valid policies: {policy_names()}") from None
    return factory(ctx or PolicyContext())
