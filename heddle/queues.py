"""Task-queue names, in one place for workers, starters and tests (STYLE.md 7).

A prefix keeps stacks (and tests) sharing one Temporal namespace apart.
"""

from __future__ import annotations

TRAJECTORIES = "trajectories"  # workflows, store and scheduler activities
TOOLS = "tools"
CONTROL = "control"
TRAINER = "trainer"


def trajectories_queue(prefix: str = "") -> str:
    return f"{prefix}{TRAJECTORIES}"


def tools_queue(prefix: str = "") -> str:
    return f"{prefix}{TOOLS}"


def control_queue(prefix: str = "") -> str:
    return f"{prefix}{CONTROL}"


def engine_queue(instance_id: str, prefix: str = "") -> str:
    return f"{prefix}engine.{instance_id}"


def control_workflow_id(prefix: str = "") -> str:
    """The cluster's one control workflow (per prefix)."""
    return f"{prefix}heddle-cluster-control"


def trainer_queue(prefix: str = "") -> str:
    """The trainer worker's: a campaign's train steps (torch), apart from the engines."""
    return f"{prefix}{TRAINER}"


def campaign_workflow_id(name: str, prefix: str = "") -> str:
    """A campaign's one workflow: its id is its name."""
    return f"{prefix}campaign-{name}"
