"""Which instances serve prefill and which decode (Prorsa's lever, `Disaggregation`).

Pure, like the rest of `scheduler/`: the simulator passes the instances and what the
trajectories are doing, and gets back the instances that should serve prefill. Prorsa
publishes only its idea (a short-horizon forecast of both demands from the trajectories'
lifecycles, and engines that switch roles to match); the rules here are ours:

- prefill demand over the next `horizon_s`: every trajectory yet to start prefills its
  prompt, and every trajectory in a tool call, or decoding after one (it is likely to
  call another), prefills a tool result, predicted by the mean result seen so far (a
  trajectory's own is not read before it returns); only prefills of at least
  `min_prefill_tokens` count, as only those leave their decode instance. Counting the
  decoding ones keeps the demand from flickering to nothing each time the few
  trajectories of a tail are all decoding at once;
- a prefill pool pays only by keeping prefills out of decode iterations: while nothing
  decodes (a batch's first burst of prompts) every instance prefills its own;
- enough prefill instances for that demand to be prefilled within the horizon, those
  serving prefill kept first (down to half the demand), then idle ones, narrowest
  first: an instance that holds trajectories is never taken, since its trajectories
  would have to move (on the paper setting, taking the least loaded ones cost sticky
  placements up to a third of their makespan; docs/notes/issue-31-beyond-heddle.md);
  the decode instances left keep room for the KV of the steps decoding now, and at
  most `prefill_share` of the GPUs serve prefill. So the pool forms where decode
  instances fall idle while others still decode (a rollout's tail) or where prompts
  arrive beside running decodes (an asynchronous campaign's admissions).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from heddle.hardware import Disaggregation

PREFILL, DECODE = "prefill", "decode"
# An instance serving prefill keeps serving it while the others cover less than this
# share of the demand: taking one back and forth moves its trajectories each time.
KEEP_FOR = 0.5


@dataclass(frozen=True)
class RoleInstance:
    """One instance as the role planner sees it."""

    instance_id: str
    tp: int
    role: str  # PREFILL or DECODE: what it serves now
    load: int  # trajectories it holds and steps it runs: what taking it for prefill moves
    prefill_tokens_per_s: float  # a full token budget of prefill, per second
    kv_capacity_tokens: int


@dataclass
class PrefillForecast:
    """The prefill that will leave the decode instances within the horizon."""

    min_prefill_tokens: int
    observed_tokens: int = 0
    num_observed: int = 0

    def observe(self, observation_tokens: int) -> None:
        """A tool result as it reaches its trajectory's next step."""
        self.observed_tokens += observation_tokens
        self.num_observed += 1

    @property
    def mean_observation(self) -> float:
        return self.observed_tokens / self.num_observed if self.num_observed else 0.0

    def demand_tokens(self, unstarted_prompts: Sequence[int], num_tool_users: int) -> int:
        """Tokens of prefill due: the prompts yet to start, and a tool result for each
        trajectory in a tool call or decoding after one."""
        threshold = self.min_prefill_tokens
        tokens = sum(p for p in unstarted_prompts if p >= threshold)
        observation = self.mean_observation
        if observation >= threshold:
            tokens += round(observation * num_tool_users)
        return tokens


def prefill_instances(
    instances: Sequence[RoleInstance],
    *,
    demand_tokens: int,
    decoding_kv_tokens: int,
    config: Disaggregation,
) -> set[str]:
    """The instances that should serve prefill: those serving it now are kept first (a
    switch costs a drain), then idle ones, narrowest first."""
    total_gpus = sum(i.tp for i in instances)
    gpu_cap = math.floor(config.prefill_share * total_gpus)
    if config.roles == "static":
        return _static(instances, gpu_cap)
    if not decoding_kv_tokens:
        return set()
    rate_needed = demand_tokens / config.horizon_s
    kv_left = sum(i.kv_capacity_tokens for i in instances)
    candidates = sorted(
        (i for i in instances if i.role == PREFILL or not i.load),
        key=lambda i: (i.role != PREFILL, i.tp, i.instance_id),
    )
    chosen: set[str] = set()
    rate = 0.0
    gpus = 0
    for inst in candidates:
        if rate >= rate_needed * (KEEP_FOR if inst.role == PREFILL else 1.0):
            continue
        if gpus + inst.tp > gpu_cap or len(chosen) + 1 >= len(instances):
            continue
        if kv_left - inst.kv_capacity_tokens < decoding_kv_tokens:
            continue
        chosen.add(inst.instance_id)
        rate += inst.prefill_tokens_per_s
        gpus += inst.tp
        kv_left -= inst.kv_capacity_tokens
    return chosen


def _static(instances: Sequence[RoleInstance], gpu_cap: int) -> set[str]:
    """A fixed prefill pool, kept once chosen: the narrowest instances on at most
    `gpu_cap` GPUs, at least one, never all."""
    current = {i.instance_id for i in instances if i.role == PREFILL}
    if current or len(instances) < 2:
        return current
    order = sorted(instances, key=lambda i: (i.tp, i.load, i.instance_id))
    chosen, gpus = {order[0].instance_id}, order[0].tp
    for inst in order[1:-1]:
        if gpus + inst.tp > gpu_cap:
            break
        chosen.add(inst.instance_id)
        gpus += inst.tp
    return chosen
