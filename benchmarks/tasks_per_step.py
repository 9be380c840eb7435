"""Temporal tasks per LLM step, counted from recorded trajectory histories.

    python benchmarks/tasks_per_step.py [tests/histories/*.json ...]

The histories are those `python -m tests.histories.record` writes (a peer, a planned
Heddle batch, a trajectory moved at each tool call, a decode moved mid-step), named
by the commit that recorded them: 1f142af is the step path before the lean one. Per
recording and trajectory workflow: workflow tasks, activity tasks and timers (each a
server round trip: a task dispatched to a worker and its completion), and local
activities (in the worker, no round trip), each divided by the trajectory's LLM steps;
and the workflow tasks that upsert search attributes (a patch marker's version counts
too), each a visibility write on the server, which at a thousand trajectories and more
cost it more than the task itself.
"""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path
from typing import Any

HISTORIES = Path(__file__).resolve().parents[1] / "tests" / "histories"


def _steps(started: dict[str, Any]) -> int:
    payload = started["input"]["payloads"][0]["data"]
    return len(json.loads(base64.b64decode(payload))["spec"]["steps"])


def count(history: dict[str, Any]) -> dict[str, int] | None:
    """Tasks of one trajectory workflow's history (None for other workflows)."""
    events = history["events"]
    started = events[0]["workflowExecutionStartedEventAttributes"]
    if started["workflowType"]["name"] != "TrajectoryWorkflow":
        return None
    kinds = [next(k for k in e if k.endswith("EventAttributes")) for e in events]
    markers = [
        e["markerRecordedEventAttributes"]["markerName"]
        for e in events
        if "markerRecordedEventAttributes" in e
    ]
    upserting_tasks = {
        e["upsertWorkflowSearchAttributesEventAttributes"]["workflowTaskCompletedEventId"]
        for e in events
        if "upsertWorkflowSearchAttributesEventAttributes" in e
    }
    return {
        "steps": _steps(started),
        "workflow_tasks": kinds.count("workflowTaskCompletedEventAttributes"),
        "activity_tasks": kinds.count("activityTaskScheduledEventAttributes"),
        "timers": kinds.count("timerStartedEventAttributes"),
        "local_activities": markers.count("core_local_activity"),
        "visibility_updates": len(upserting_tasks),
    }


def table(paths: list[Path]) -> list[dict[str, Any]]:
    rows = []
    for path in paths:
        counts = [c for h in json.loads(path.read_text()) if (c := count(h)) is not None]
        steps = sum(c["steps"] for c in counts)
        per = {k: sum(c[k] for c in counts) / steps for k in counts[0] if k != "steps"}
        trips = per["workflow_tasks"] + per["activity_tasks"] + per["timers"]
        rows.append({"recording": path.stem, "steps": steps, **per, "server_round_trips": trips})
    return rows


def main() -> None:
    paths = [Path(p) for p in sys.argv[1:]] or sorted(HISTORIES.glob("*.json"))
    rows = table(paths)
    keys = ["workflow_tasks", "activity_tasks", "timers", "server_round_trips", "local_activities",
            "visibility_updates"]  # fmt: skip
    print("| recording | LLM steps | " + " | ".join(k.replace("_", " ") for k in keys) + " |")
    print("|---|---:|" + "---:|" * len(keys))
    for r in rows:
        cells = " | ".join(f"{r[k]:.2f}" for k in keys)
        print(f"| {r['recording']} | {r['steps']} | {cells} |")


if __name__ == "__main__":
    main()
