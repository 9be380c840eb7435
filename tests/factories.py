"""Small builders for tests (vLLM `tests/v1/core/utils.py` style)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engines.core import EngineCore, EngineLimits
from engines.costmodel import CostModel
from engines.request import EngineRequest
from heddle.trace import TraceRecord, dump_record


def create_core(
    *,
    kv_capacity_tokens: int = 100_000,
    max_num_seqs: int = 16,
    max_num_batched_tokens: int = 2048,
    policy: str = "fcfs",
    preemption: bool = True,
    session_ttl_s: float = 120.0,
    overcommit_per_s: float = EngineLimits.overcommit_per_s,
    max_overcommit: float = EngineLimits.max_overcommit,
    release_evicted: bool = EngineLimits.release_evicted,
) -> EngineCore:
    cost = CostModel.for_names("qwen3-8b", "h100", 1)
    return EngineCore(
        limits=EngineLimits(
            kv_capacity_tokens=kv_capacity_tokens,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            policy=policy,
            preemption=preemption,
            session_ttl_s=session_ttl_s,
            overcommit_per_s=overcommit_per_s,
            max_overcommit=max_overcommit,
            release_evicted=release_evicted,
        ),
        iteration_cost=cost.iteration_s,
    )


def request(
    rid: str,
    context: int = 100,
    new: int = 10,
    *,
    key: str | None = None,
    priority: int = 0,
    reserve: int = 0,
    ends: bool = False,
) -> EngineRequest:
    return EngineRequest(
        rid, key or rid, context, new, priority=priority, reserve_kv_tokens=reserve,
        ends_session=ends,
    )  # fmt: skip


def run_until_done(core: EngineCore, max_steps: int = 100_000) -> dict[str, int]:
    """Step until idle; return output tokens made per request."""
    made: dict[str, int] = {}
    for _ in range(max_steps):
        if not core.has_work():
            return made
        out = core.step()
        for rid, n in out.advanced.items():
            made[rid] = made.get(rid, 0) + n
    raise AssertionError("engine did not drain")


def write_trace(path: Path, lines: list[dict[str, Any] | str]) -> Path:
    with path.open("w") as fh:
        for line in lines:
            fh.write((line if isinstance(line, str) else json.dumps(line)) + "\n")
    return path


def write_records(path: Path, records: list[TraceRecord]) -> Path:
    return write_trace(path, [dump_record(r) for r in records])


def traj(
    tid: str, steps: list[dict[str, Any]], *, group: str = "g0", prompt: int = 50
) -> dict[str, Any]:
    return {"trajectory_id": tid, "group_id": group, "prompt_tokens": prompt, "steps": steps}
