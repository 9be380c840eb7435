"""An agent trajectory as the conversation it was: the task's messages, each model turn
and the tool results it read, with the calls' status and the reward. Built from the
store (turn texts, steps' tool calls, observation texts); `heddle trajectories show`
prints it, and the tests check its tokens against it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from heddle.store import TrajectoryStore
from heddle.tasks import Task


@dataclass
class Conversation:
    trajectory_id: str
    task: Task
    messages: list[dict[str, str]]  # system/user, then assistant and tool turns
    calls: list[list[dict[str, Any]]] = field(default_factory=list)  # per turn
    record: dict[str, Any] = field(default_factory=dict)  # the stored trajectory


def conversation(store: TrajectoryStore, batch_id: str, trajectory_id: str) -> Conversation:
    """The stored conversation of an agent trajectory (KeyError if it is none)."""
    record = store.get_trajectory(batch_id, trajectory_id)
    if record is None or not record.get("task_id"):
        raise KeyError(f"no agent trajectory {trajectory_id!r} in batch {batch_id!r}")
    task = store.get_task(batch_id, record["task_id"])
    turns = store.load_turns(batch_id, trajectory_id).get(trajectory_id, [])
    steps = {st["step_index"]: st for st in record["steps"]}
    refs = [c["observation_ref"] for st in steps.values() for c in st["calls"]]
    texts = store.get_texts(refs)
    messages = [{"role": m.role, "content": m.content} for m in task.messages]
    calls = []
    for turn in turns:
        messages.append({"role": "assistant", "content": turn.text})
        step_calls = steps.get(turn.step_index, {}).get("calls", [])
        calls.append(step_calls)
        for call in step_calls:
            content = texts.get(call["observation_ref"], "")
            messages.append({"role": "tool", "content": content})
    return Conversation(trajectory_id, task, messages, calls, record)


def render_text(conv: Conversation) -> str:
    """The conversation for a terminal: each message under its role, calls' status."""
    lines: list[str] = []
    r = conv.record
    lines.append(
        f"{conv.trajectory_id} on task {conv.task.task_id} ({conv.task.workload}): "
        f"{r['status']} ({r['finish_reason']}), {r['turns']} turns, "
        f"{r['generated_tokens']} tokens, {r['tool_calls']} tool calls"
    )
    turn = 0
    for m in conv.messages:
        if m["role"] == "assistant":
            turn += 1
            lines.append(f"--- assistant (turn {turn})")
        elif m["role"] == "tool":
            lines.append("--- tool result")
        else:
            lines.append(f"--- {m['role']}")
        lines.append(m["content"])
    for k, step_calls in enumerate(conv.calls, 1):
        for c in step_calls:
            detail = c["error"] or f"{c['latency_s']:.3f} s"
            lines.append(f"[turn {k}] {c['name'] or '?'}: {c['status']} ({detail})")
    reward = r["reward"] if r["reward"] is not None else "-"
    why = r.get("reward_reason") or ""
    if r.get("reward_error"):
        why += f"; verifier error: {r['reward_error']}"
    lines.append(f"reward {reward}: {why}")
    return "\n".join(lines)
