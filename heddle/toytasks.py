"""A toy task set on which a training campaign's learning shows in a few iterations.

The bundled tasks are too hard for the taught tiny model (it almost never answers a math
task right), so every GRPO group has equal rewards and nothing is learned. Here each
task is a bundled math problem that asks for an answer whose first digit is 1, scored
by `leading_digit`. The taught model does so in about 5-20% of its samples at
temperature 1 (the answers it writes have no such bias), so groups have spread, and its
best is 100%: a campaign whose weights reach the engines climbs well above the start
within a few iterations, and one with the sync off stays where it began.

    python -m heddle.toytasks      # writes heddle/data/tasks/leading-one.jsonl
"""

from __future__ import annotations

import dataclasses
from typing import Any

from heddle.tasks import Message, Task, Verifier, dump_task
from heddle.tasksets import DATA, math_tasks, render
from heddle.toolcalls import final_answer

FILE = DATA / "tasks" / "leading-one.jsonl"
INSTRUCTION = " Then answer with a number that starts with the digit 1."


def leading_digit(text: str, params: dict[str, Any]) -> tuple[float, str]:
    """1 when the final answer starts with `params["digit"]` (a custom verifier)."""
    answer = final_answer(text).strip()
    digit = str(params.get("digit", "1"))
    ok = answer.startswith(digit)
    verdict = "starts" if ok else "does not start"
    return float(ok), f"answered {answer[:40]!r}, {verdict} with {digit}"


def leading_one_tasks(n: int = 120) -> list[Task]:
    """The first `n` bundled math problems, each asking for an answer starting with 1."""
    tasks = []
    for t in math_tasks(n):
        system, user = t.messages
        tasks.append(dataclasses.replace(
            t,
            task_id=t.task_id.replace("math", "leading-one"),
            messages=(system, Message("user", user.content + INSTRUCTION)),
            verifier=Verifier(
                "custom", import_path="heddle.toytasks:leading_digit", params={"digit": "1"}
            ),
        ))  # fmt: skip
    return tasks


def main() -> None:
    FILE.write_text(render([dump_task(t) for t in leading_one_tasks()]), encoding="utf-8")
    print(f"wrote {FILE}")


if __name__ == "__main__":
    main()
