"""What a simulated rollout reports (DESIGN.md, "Measures"); the lower bound is in
`heddle/sim/bound.py`."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SimResult:
    policy: str
    makespan_s: float
    generated_tokens: int
    trajectories: int
    completion_s: dict[str, float]
    migrations: int
    migration_s: float  # KV transfer time; a recomputed move's prefill is in its step
    reconfigurations: int
    reconfiguration_s: float
    gpu_busy_frac: float
    # Mean queueing time (submit to first scheduled, summed over steps) of the longest 10%.
    tail_queueing_s: float
    instances: list[dict[str, object]] = field(default_factory=list)
    completion_times: list[float] = field(default_factory=list)
    # (instance_id, start, end) busy intervals, merged when contiguous.
    busy_intervals: list[tuple[str, float, float]] = field(default_factory=list)
    # (time, tokens) at each finished step: throughput over time.
    token_events: list[tuple[float, int]] = field(default_factory=list)
    wall_s: float = 0.0
    recomputed_moves: int = 0  # of `migrations`, those whose target prefilled the context
    # Tokens the engines prefilled: the trace's prompts and tool outputs once each, plus
    # every context recomputed after its cached prefix was evicted or moved.
    prefill_tokens: int = 0
    # Generated tokens made by verify passes of drafts (the cluster's `speculation`).
    speculated_tokens: int = 0
    # Disaggregated prefill (the cluster's `disaggregation`): prefills handed to decode
    # instances, the KV transfer time of those and of their pulls, the tokens prefilled
    # on prefill instances, and instances that switched role.
    kv_handoffs: int = 0
    handoff_s: float = 0.0
    offloaded_prefill_tokens: int = 0
    role_switches: int = 0

    @property
    def throughput_tok_s(self) -> float:
        return self.generated_tokens / self.makespan_s if self.makespan_s > 0 else 0.0

    def summary(self) -> dict[str, object]:
        return {
            "makespan_s": self.makespan_s,
            "throughput_tok_s": self.throughput_tok_s,
            "generated_tokens": self.generated_tokens,
            "trajectories": self.trajectories,
            "completion_s": self.completion_s,
            "migrations": self.migrations,
            "migration_s": self.migration_s,
            "recomputed_moves": self.recomputed_moves,
            "prefill_tokens": self.prefill_tokens,
            "speculated_tokens": self.speculated_tokens,
            "kv_handoffs": self.kv_handoffs,
            "handoff_s": self.handoff_s,
            "offloaded_prefill_tokens": self.offloaded_prefill_tokens,
            "role_switches": self.role_switches,
            "reconfigurations": self.reconfigurations,
            "reconfiguration_s": self.reconfiguration_s,
            "gpu_busy_frac": self.gpu_busy_frac,
            "tail_queueing_s": self.tail_queueing_s,
            "instances": self.instances,
            "sim_wall_s": self.wall_s,
        }
