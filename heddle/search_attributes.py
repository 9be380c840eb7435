"""Search attributes on trajectory workflows, so the Temporal UI and `temporal workflow
list` answer "which trajectories are slow, and where do they run"."""

from __future__ import annotations

from temporalio.common import SearchAttributeKey

BATCH = SearchAttributeKey.for_keyword("HeddleBatch")
GROUP = SearchAttributeKey.for_keyword("HeddleGroup")
WORKLOAD = SearchAttributeKey.for_keyword("HeddleWorkload")
STATUS = SearchAttributeKey.for_keyword("HeddleStatus")
INSTANCE = SearchAttributeKey.for_keyword("HeddleInstance")
TURN = SearchAttributeKey.for_int("HeddleTurn")
GENERATED = SearchAttributeKey.for_int("HeddleGeneratedTokens")
PREDICTED_REMAINING = SearchAttributeKey.for_int("HeddlePredictedRemaining")
# On campaign workflows: which campaign, how far, which weights the engines run. Numbers
# as doubles: the dev server allows three Int attributes, which the trajectories use.
CAMPAIGN = SearchAttributeKey.for_keyword("HeddleCampaign")
ITERATION = SearchAttributeKey.for_float("HeddleIteration")
POLICY_VERSION = SearchAttributeKey.for_float("HeddlePolicyVersion")

ALL = (
    BATCH, GROUP, WORKLOAD, STATUS, INSTANCE, TURN, GENERATED, PREDICTED_REMAINING,
    CAMPAIGN, ITERATION, POLICY_VERSION,
)  # fmt: skip


def dev_server_flags() -> list[str]:
    """`--search-attribute NAME=Type` flags for `temporal server start-dev`."""
    kinds = {"KEYWORD": "Keyword", "INT": "Int", "DOUBLE": "Double"}
    flags: list[str] = []
    for key in ALL:
        flags += ["--search-attribute", f"{key.name}={kinds[key.indexed_value_type.name]}"]
    return flags
