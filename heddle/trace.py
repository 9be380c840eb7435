"""Trace files: JSON Lines, one trajectory a line (DESIGN.md, "Traces").

A trace is validated whole before anything uses it: the first bad line raises a
`TraceError` naming the file, the line and the field, and nothing is half-loaded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from heddle.errors import TraceError
from heddle.jsonl import json_lines
from heddle.textfeatures import hashed_ngrams
from heddle.types import TOOL_STATUSES, StepSpec, StepText, TrajectorySpec

_TOP_FIELDS = {
    "trajectory_id",
    "group_id",
    "workload",
    "prompt_tokens",
    "prompt_text",
    "steps",
    "reward",
}
_STEP_FIELDS = {
    "output_tokens",
    "tool",
    "tool_latency_s",
    "tool_status",
    "tool_output_tokens",
    "text",
    "tool_input",
    "observation",
}


@dataclass(frozen=True)
class TraceRecord:
    """A validated trace line: the compact spec plus the texts the store keeps."""

    spec: TrajectorySpec
    prompt_text: str | None = None
    step_texts: tuple[str | None, ...] = ()
    reward: float | None = None
    # Each step's tool observation, where the trace has it (`heddle trace from-batch`).
    step_observations: tuple[str | None, ...] = ()
    raw: dict[str, Any] = field(default_factory=dict, compare=False)


def _int(value: Any, *, path: str, line: int, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TraceError(path, line, name, f"must be an integer, got {value!r}")
    if value < minimum:
        raise TraceError(path, line, name, f"must be >= {minimum}, got {value}")
    return value


def _float(value: Any, *, path: str, line: int, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TraceError(path, line, name, f"must be a finite number, got {value!r}")
    if value < 0:
        raise TraceError(path, line, name, f"must be >= 0, got {value}")
    return float(value)


def _str(value: Any, *, path: str, line: int, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise TraceError(path, line, name, f"must be a non-empty string, got {value!r}")
    return value


def parse_line(obj: Any, *, path: str, line: int) -> TraceRecord:
    """Validate one decoded trace line."""
    if not isinstance(obj, dict):
        raise TraceError(path, line, None, "a trace line must be a JSON object")
    unknown = sorted(set(obj) - _TOP_FIELDS)
    if unknown:
        raise TraceError(path, line, unknown[0], "is not a trace field")
    for required in ("trajectory_id", "group_id", "prompt_tokens", "steps"):
        if required not in obj:
            raise TraceError(path, line, required, "is required")
    trajectory_id = _str(obj["trajectory_id"], path=path, line=line, name="trajectory_id")
    group_id = _str(obj["group_id"], path=path, line=line, name="group_id")
    workload = _str(obj.get("workload", "unknown"), path=path, line=line, name="workload")
    prompt_tokens = _int(
        obj["prompt_tokens"], path=path, line=line, name="prompt_tokens", minimum=1
    )
    prompt_text = obj.get("prompt_text")
    if prompt_text is not None and not isinstance(prompt_text, str):
        raise TraceError(path, line, "prompt_text", "must be a string")
    reward = obj.get("reward")
    if reward is not None:
        reward = _float(reward, path=path, line=line, name="reward")
    steps_raw = obj["steps"]
    if not isinstance(steps_raw, list) or not steps_raw:
        raise TraceError(path, line, "steps", "must be a non-empty list")
    steps: list[StepSpec] = []
    texts: list[str | None] = []
    observations: list[str | None] = []
    last = len(steps_raw) - 1
    for i, step in enumerate(steps_raw):
        where = f"steps[{i}]"
        if not isinstance(step, dict):
            raise TraceError(path, line, where, "must be a JSON object")
        unknown = sorted(set(step) - _STEP_FIELDS)
        if unknown:
            raise TraceError(path, line, f"{where}.{unknown[0]}", "is not a step field")
        if "output_tokens" not in step:
            raise TraceError(path, line, f"{where}.output_tokens", "is required")
        output_tokens = _int(
            step["output_tokens"], path=path, line=line, name=f"{where}.output_tokens", minimum=1
        )
        text = step.get("text")
        if text is not None and not isinstance(text, str):
            raise TraceError(path, line, f"{where}.text", "must be a string")
        observation = step.get("observation")
        if observation is not None and not isinstance(observation, str):
            raise TraceError(path, line, f"{where}.observation", "must be a string")
        tool = step.get("tool")
        if tool is None:
            for name in ("tool_latency_s", "tool_output_tokens", "tool_status", "tool_input",
                         "observation"):  # fmt: skip
                if name in step:
                    raise TraceError(
                        path, line, f"{where}.{name}", "is set on a step without a tool"
                    )
            if i != last:
                raise TraceError(
                    path, line, f"{where}.tool", "is required on every step but the last"
                )
            steps.append(StepSpec(output_tokens=output_tokens, text=_step_text(text, None, None)))
        else:
            if i == last:
                raise TraceError(path, line, f"{where}.tool", "the last step must not call a tool")
            tool = _str(tool, path=path, line=line, name=f"{where}.tool")
            for name in ("tool_latency_s", "tool_output_tokens"):
                if name not in step:
                    raise TraceError(
                        path, line, f"{where}.{name}", "is required on a step with a tool"
                    )
            status = step.get("tool_status", "ok")
            if status not in TOOL_STATUSES:
                raise TraceError(
                    path,
                    line,
                    f"{where}.tool_status",
                    f"must be one of {list(TOOL_STATUSES)}, got {status!r}",
                )
            tool_input = step.get("tool_input")
            if tool_input is not None and not isinstance(tool_input, str):
                raise TraceError(path, line, f"{where}.tool_input", "must be a string")
            steps.append(
                StepSpec(
                    output_tokens=output_tokens,
                    tool=tool,
                    tool_latency_s=_float(
                        step["tool_latency_s"], path=path, line=line, name=f"{where}.tool_latency_s"
                    ),
                    tool_status=status,
                    tool_output_tokens=_int(
                        step["tool_output_tokens"],
                        path=path,
                        line=line,
                        name=f"{where}.tool_output_tokens",
                        minimum=0,
                    ),
                    tool_input=tool_input,
                    text=_step_text(text, observation, tool_input),
                )
            )
        texts.append(text)
        observations.append(observation)
    spec = TrajectorySpec(
        trajectory_id=trajectory_id,
        group_id=group_id,
        prompt_tokens=prompt_tokens,
        steps=tuple(steps),
        workload=workload,
    )
    return TraceRecord(
        spec=spec,
        prompt_text=prompt_text,
        step_texts=tuple(texts),
        reward=reward,
        raw=obj,
        step_observations=tuple(observations) if any(observations) else (),
    )


def _step_text(
    text: str | None, observation: str | None, tool_input: str | None
) -> StepText | None:
    """What the predictor reads of a step's texts; None for a step without any."""
    if text is None and observation is None and tool_input is None:
        return None
    return StepText(hashed_ngrams(text), hashed_ngrams(observation), len(tool_input or ""))


def load_trace(path: str | Path) -> list[TraceRecord]:
    """Read and validate a whole trace; raise `TraceError` at the first bad line."""
    path_str = str(path)
    records: list[TraceRecord] = []
    seen: dict[str, int] = {}
    for line_no, obj in json_lines(path, TraceError):
        record = parse_line(obj, path=path_str, line=line_no)
        tid = record.spec.trajectory_id
        if tid in seen:
            raise TraceError(
                path_str, line_no, "trajectory_id", f"{tid!r} repeats line {seen[tid]}"
            )
        seen[tid] = line_no
        records.append(record)
    if not records:
        raise TraceError(path_str, None, None, "holds no trajectory")
    return records


def dump_record(record: TraceRecord) -> dict[str, Any]:
    """The JSON object of a trace line (inverse of `parse_line`)."""
    spec = record.spec
    out: dict[str, Any] = {
        "trajectory_id": spec.trajectory_id,
        "group_id": spec.group_id,
        "workload": spec.workload,
        "prompt_tokens": spec.prompt_tokens,
    }
    if record.prompt_text is not None:
        out["prompt_text"] = record.prompt_text
    if record.reward is not None:
        out["reward"] = record.reward
    steps = []
    for i, step in enumerate(spec.steps):
        item: dict[str, Any] = {"output_tokens": step.output_tokens}
        if step.tool is not None:
            item.update(
                tool=step.tool,
                tool_latency_s=step.tool_latency_s,
                tool_status=step.tool_status,
                tool_output_tokens=step.tool_output_tokens,
            )
            if step.tool_input is not None:
                item["tool_input"] = step.tool_input
        text = record.step_texts[i] if i < len(record.step_texts) else None
        if text is not None:
            item["text"] = text
        seen = record.step_observations[i] if i < len(record.step_observations) else None
        if seen is not None:
            item["observation"] = seen
        steps.append(item)
    out["steps"] = steps
    return out
