"""Task sets: what a user brings to an agent rollout, one JSON object a line.

    {"task_id": "math-0001", "workload": "math",
     "prompt": "What is 17 * 23?",               (or chat messages: [{"role", "content"}])
     "tools": ["calculator"],
     "verifier": {"kind": "numeric", "answer": 391},
     "metadata": {"source": "heddle"}}

Verifier kinds: `numeric` (`answer`, optional `tolerance`), `exact` (`answer`, a string),
`unit_tests` (`entry_point`, the function the model writes, and `tests`, Python that
asserts on it), `qa` (`answers`, gold strings; `metric` `exact_match` or `f1`) and
`custom` (`import_path` "module:function" and free `params`). The verifier is kept apart
from the prompt so that nothing a rollout renders for the model can carry an answer or a
hidden test. A file is checked whole before anything starts; the first bad line raises
`TaskError` naming the file, line and field.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from heddle.errors import InputError
from heddle.jsonl import json_lines
from heddle.trace import TraceRecord
from heddle.types import TrajectorySpec

# The tools a task may name (the tool workers' registry serves exactly these).
TASK_TOOLS = ("calculator", "python", "search")
WORKLOADS = ("math", "coding", "search")
VERIFIER_KINDS = ("numeric", "exact", "unit_tests", "qa", "custom")
QA_METRICS = ("exact_match", "f1")
ROLES = ("system", "user", "assistant")

_TOP_FIELDS = {"task_id", "workload", "prompt", "tools", "verifier", "metadata"}
_VERIFIER_FIELDS = {
    "numeric": ({"answer"}, {"tolerance"}),
    "exact": ({"answer"}, {"case_sensitive"}),
    "unit_tests": ({"entry_point", "tests"}, {"timeout_s"}),
    "qa": ({"answers"}, {"metric"}),
    "custom": ({"import_path"}, {"params"}),
}


class TaskError(InputError):
    """A malformed task line."""


@dataclass(frozen=True)
class Message:
    role: str
    content: str


@dataclass(frozen=True)
class Verifier:
    """How a finished trajectory's answer is scored (never shown to the model)."""

    kind: str
    answer: str | float | None = None  # numeric, exact
    tolerance: float = 1e-6  # numeric: absolute, or relative to the answer's size
    case_sensitive: bool = False  # exact
    entry_point: str = ""  # unit_tests: the function under test
    tests: str = ""  # unit_tests: Python that asserts on it
    timeout_s: float = 10.0  # unit_tests
    answers: tuple[str, ...] = ()  # qa: gold answers
    metric: str = "exact_match"  # qa
    import_path: str = ""  # custom: "module:function"
    params: dict[str, Any] = field(default_factory=dict)  # custom


@dataclass(frozen=True)
class Task:
    task_id: str
    workload: str
    messages: tuple[Message, ...]
    tools: tuple[str, ...]
    verifier: Verifier
    metadata: dict[str, Any] = field(default_factory=dict)


def _text(obj: dict[str, Any], name: str, where: str, path: str, line: int) -> str:
    value = obj.get(name)
    if not isinstance(value, str) or not value.strip():
        raise TaskError(path, line, f"{where}{name}", f"must be a non-empty string, got {value!r}")
    return value


def _number(value: Any, name: str, path: str, line: int) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TaskError(path, line, name, f"must be a finite number, got {value!r}")
    return float(value)


def _messages(prompt: Any, path: str, line: int) -> tuple[Message, ...]:
    if isinstance(prompt, str):
        if not prompt.strip():
            raise TaskError(path, line, "prompt", "must not be empty")
        return (Message("user", prompt),)
    if not isinstance(prompt, list) or not prompt:
        raise TaskError(path, line, "prompt", "must be a string or a non-empty list of messages")
    messages = []
    for i, m in enumerate(prompt):
        where = f"prompt[{i}]"
        if not isinstance(m, dict):
            raise TaskError(path, line, where, "must be a JSON object with role and content")
        unknown = sorted(set(m) - {"role", "content"})
        if unknown:
            raise TaskError(path, line, f"{where}.{unknown[0]}", "is not a message field")
        role = m.get("role")
        if role not in ROLES:
            raise TaskError(
                path, line, f"{where}.role", f"must be one of {list(ROLES)}, got {role!r}"
            )
        messages.append(Message(role, _text(m, "content", f"{where}.", path, line)))
    if messages[-1].role != "user":
        raise TaskError(
            path, line, f"prompt[{len(messages) - 1}].role", "the last message must be the user's"
        )
    return tuple(messages)


def _verifier(obj: Any, path: str, line: int) -> Verifier:
    if not isinstance(obj, dict):
        raise TaskError(path, line, "verifier", "must be a JSON object with a kind")
    kind = obj.get("kind")
    if kind not in VERIFIER_KINDS:
        raise TaskError(
            path, line, "verifier.kind", f"must be one of {list(VERIFIER_KINDS)}, got {kind!r}"
        )
    required, optional = _VERIFIER_FIELDS[kind]
    unknown = sorted(set(obj) - required - optional - {"kind"})
    if unknown:
        raise TaskError(
            path, line, f"verifier.{unknown[0]}", f"is not a field of a {kind} verifier"
        )
    for name in sorted(required):
        if name not in obj:
            raise TaskError(path, line, f"verifier.{name}", f"is required for a {kind} verifier")
    if kind == "numeric":
        tolerance = _number(obj.get("tolerance", 1e-6), "verifier.tolerance", path, line)
        if tolerance < 0:
            raise TaskError(path, line, "verifier.tolerance", "must be >= 0")
        return Verifier(kind, answer=_number(obj["answer"], "verifier.answer", path, line),
                        tolerance=tolerance)  # fmt: skip
    if kind == "exact":
        sensitive = obj.get("case_sensitive", False)
        if not isinstance(sensitive, bool):
            raise TaskError(path, line, "verifier.case_sensitive", "must be true or false")
        return Verifier(kind, answer=_text(obj, "answer", "verifier.", path, line),
                        case_sensitive=sensitive)  # fmt: skip
    if kind == "unit_tests":
        entry = _text(obj, "entry_point", "verifier.", path, line)
        if not entry.isidentifier():
            raise TaskError(
                path, line, "verifier.entry_point", f"must be a Python name, got {entry!r}"
            )
        tests = _text(obj, "tests", "verifier.", path, line)
        try:
            compile(tests, f"{path}:{line}:verifier.tests", "exec")
        except SyntaxError as exc:
            raise TaskError(
                path, line, "verifier.tests", f"is not valid Python: {exc.msg}"
            ) from exc
        timeout = _number(obj.get("timeout_s", 10.0), "verifier.timeout_s", path, line)
        if timeout <= 0:
            raise TaskError(path, line, "verifier.timeout_s", "must be > 0")
        return Verifier(kind, entry_point=entry, tests=tests, timeout_s=timeout)
    if kind == "qa":
        answers = obj["answers"]
        if (
            not isinstance(answers, list)
            or not answers
            or not all(isinstance(a, str) and a.strip() for a in answers)
        ):
            raise TaskError(path, line, "verifier.answers", "must be a non-empty list of strings")
        metric = obj.get("metric", "exact_match")
        if metric not in QA_METRICS:
            raise TaskError(
                path, line, "verifier.metric", f"must be one of {list(QA_METRICS)}, got {metric!r}"
            )
        return Verifier(kind, answers=tuple(answers), metric=metric)
    import_path = _text(obj, "import_path", "verifier.", path, line)
    module, _, function = import_path.partition(":")
    if not module or not function.isidentifier():
        raise TaskError(
            path, line, "verifier.import_path", f"must be 'module:function', got {import_path!r}"
        )
    params = obj.get("params", {})
    if not isinstance(params, dict):
        raise TaskError(path, line, "verifier.params", "must be a JSON object")
    return Verifier(kind, import_path=import_path, params=params)


def parse_task(obj: Any, *, path: str, line: int) -> Task:
    """Validate one decoded task line."""
    if not isinstance(obj, dict):
        raise TaskError(path, line, None, "a task line must be a JSON object")
    unknown = sorted(set(obj) - _TOP_FIELDS)
    if unknown:
        raise TaskError(path, line, unknown[0], "is not a task field")
    for required in ("task_id", "workload", "prompt", "verifier"):
        if required not in obj:
            raise TaskError(path, line, required, "is required")
    task_id = _text(obj, "task_id", "", path, line)
    workload = obj["workload"]
    if workload not in WORKLOADS:
        raise TaskError(
            path, line, "workload", f"must be one of {list(WORKLOADS)}, got {workload!r}"
        )
    tools = obj.get("tools", [])
    if not isinstance(tools, list):
        raise TaskError(path, line, "tools", "must be a list of tool names")
    for i, tool in enumerate(tools):
        if tool not in TASK_TOOLS:
            raise TaskError(
                path, line, f"tools[{i}]", f"must be one of {list(TASK_TOOLS)}, got {tool!r}"
            )
    if len(set(tools)) != len(tools):
        raise TaskError(path, line, "tools", "names a tool twice")
    metadata = obj.get("metadata", {})
    if not isinstance(metadata, dict):
        raise TaskError(path, line, "metadata", "must be a JSON object")
    return Task(
        task_id=task_id,
        workload=workload,
        messages=_messages(obj["prompt"], path, line),
        tools=tuple(tools),
        verifier=_verifier(obj["verifier"], path, line),
        metadata=metadata,
    )


def load_tasks(path: str | Path) -> list[Task]:
    """Read and validate a whole task file; raise `TaskError` at the first bad line."""
    path_str = str(path)
    tasks: list[Task] = []
    seen: dict[str, int] = {}
    for line_no, obj in json_lines(path, TaskError):
        task = parse_task(obj, path=path_str, line=line_no)
        if task.task_id in seen:
            raise TaskError(
                path_str, line_no, "task_id", f"{task.task_id!r} repeats line {seen[task.task_id]}"
            )
        seen[task.task_id] = line_no
        tasks.append(task)
    if not tasks:
        raise TaskError(path_str, None, None, "holds no task")
    return tasks


def dump_task(task: Task) -> dict[str, Any]:
    """A task as its JSON line (`load_tasks` reads it back equal)."""
    v = task.verifier
    verifier: dict[str, Any] = {"kind": v.kind}
    if v.kind == "numeric":
        verifier |= {"answer": v.answer, "tolerance": v.tolerance}
    elif v.kind == "exact":
        verifier |= {"answer": v.answer, "case_sensitive": v.case_sensitive}
    elif v.kind == "unit_tests":
        verifier |= {"entry_point": v.entry_point, "tests": v.tests, "timeout_s": v.timeout_s}
    elif v.kind == "qa":
        verifier |= {"answers": list(v.answers), "metric": v.metric}
    else:
        verifier |= {"import_path": v.import_path, "params": v.params}
    prompt: str | list[dict[str, str]]
    if len(task.messages) == 1 and task.messages[0].role == "user":
        prompt = task.messages[0].content
    else:
        prompt = [{"role": m.role, "content": m.content} for m in task.messages]
    line: dict[str, Any] = {"task_id": task.task_id, "workload": task.workload, "prompt": prompt,
                            "tools": list(task.tools), "verifier": verifier}  # fmt: skip
    if task.metadata:
        line["metadata"] = task.metadata
    return line


def task_stats(tasks: list[Task]) -> dict[str, Any]:
    """What a task set holds: counts by workload, verifier and tool, prompt sizes."""
    chars = sorted(sum(len(m.content) for m in t.messages) for t in tasks)
    return {
        "tasks": len(tasks),
        "workloads": dict(sorted(Counter(t.workload for t in tasks).items())),
        "verifiers": dict(sorted(Counter(t.verifier.kind for t in tasks).items())),
        "tools": dict(sorted(Counter(tool for t in tasks for tool in t.tools).items())),
        "prompt_chars": {
            "mean": round(sum(chars) / len(chars), 1),
            "p50": chars[len(chars) // 2],
            "max": chars[-1],
        },
    }


def count_tokens(text: str) -> int:
    """A text's tokens where no tokenizer is at hand: ~4 bytes a token (BPE average)."""
    return max(1, (len(text.encode("utf-8")) + 3) // 4) if text else 0


def prompt_tokens(task: Task) -> int:
    """The prompt's tokens as the scheduler estimates them before the engine host
    renders it (the first turn's result gives the real count)."""
    return max(1, count_tokens("".join(m.content for m in task.messages)))


def agent_records(tasks: list[Task], samples: int) -> list[TraceRecord]:
    """`samples` agent trajectories per task, each task's samples one GRPO group."""
    return [
        TraceRecord(
            TrajectorySpec(
                trajectory_id=f"{task.task_id}.{k}",
                group_id=task.task_id,
                prompt_tokens=prompt_tokens(task),
                steps=(),
                workload=task.workload,
                task_id=task.task_id,
            )
        )
        for task in tasks
        for k in range(samples)
    ]
