"""The engine's view of one LLM step (vLLM v1 `Request`, reduced to counts)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Sampling:
    """How an agent turn samples. A replayed trace step has none: it makes exactly its
    recorded token count."""

    temperature: float = 1.0
    top_p: float = 1.0
    # Per turn, so a turn started over samples the same again (on GPUs: vLLM's CPU build
    # cannot seed a request whose prefill is chunked, so it goes unseeded there).
    seed: int | None = None


@dataclass(eq=False)
class EngineRequest:
    request_id: str
    # Trajectory the step belongs to: the prefix cache keeps its context between turns.
    prefix_key: str
    # Tokens before generation: prompt plus every earlier turn and tool output.
    context_tokens: int
    max_new_tokens: int
    priority: int = 0
    arrival_seq: int = 0
    # KV the policy reserves for the trajectory (a forecast of what it holds while it
    # runs): while it is not 0, the engine admits a trajectory it does not hold yet
    # only if the ones it holds leave that much room (`engines.core`, "Sessions").
    reserve_kv_tokens: int = 0
    # No step of the trajectory follows this one (no tool call): its reservation ends
    # with it. Unknown (an agent turn), the reservation lapses after the session TTL.
    ends_session: bool = False
    # An agent turn: its context as token ids (the host's renderer made them), sampled
    # until the end-of-turn token or `max_new_tokens`.
    sampling: Sampling | None = None
    prompt_ids: list[int] = field(default_factory=list)
    # Progress. KV held = num_computed_tokens; generation starts once the context is in.
    num_computed_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_tokens: int = 0  # prefix-cache hit when first admitted
    num_preemptions: int = 0

    @property
    def num_tokens(self) -> int:
        """Tokens whose KV this request needs now: context plus what it generated."""
        return self.context_tokens + self.num_output_tokens

    @property
    def is_prefilling(self) -> bool:
        return self.num_computed_tokens < self.num_tokens - (1 if self.num_output_tokens else 0)

    @property
    def is_finished(self) -> bool:
        return self.num_output_tokens >= self.max_new_tokens
