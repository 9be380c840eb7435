"""A clockless model of one engine instance, shaped like vLLM v1's scheduler.

Continuous batching under a token budget, a waiting queue in the instance's order (FCFS,
or priority with preemption), a KV-cache capacity in tokens, and a prefix cache that keeps
a trajectory's context between its turns. `step()` runs one iteration and returns what
advanced, what finished and how long the iteration took (from the cost model); the
caller owns the clock: the simulator adds the time to virtual time, the live simulated
engine sleeps it.

Sessions: a request may carry a KV reservation, a forecast of its trajectory's KV.
The engine then holds the trajectory as a session from its first admitted step to its
last (through its tool calls), and admits a trajectory it does not hold only while the
sessions' reservations leave room for it. vLLM admits whatever its free blocks allow,
counting cached prefixes as free: once the contexts of the trajectories that are running
and in tool calls outgrow the cache, each one back from its tool finds its prefix evicted
and prefills it again, and a batch of long contexts spends its time re-prefilling (at
6,400 trajectories on 32B, ten to twenty times the trace's own tokens;
docs/notes/issue-30-robustness.md).
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from engines.costmodel import CostModel, per_token_of_verify
from engines.queues import create_request_queue, rank
from engines.request import EngineRequest
from heddle.hardware import ClusterShape, Speculation

IterationCost = Callable[..., float]  # CostModel.iteration_s


class RequestTooLarge(ValueError):
    """A request whose context and output can never fit in the instance's KV cache."""


@dataclass(frozen=True)
class EngineLimits:
    kv_capacity_tokens: int
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    policy: str = "fcfs"  # "fcfs" or "priority"
    preemption: bool = True  # priority policy: a waiting request may evict a running one
    # How long a reservation outlives its trajectory's last step when no end was
    # announced (an agent turn; a trajectory that failed during its tool call), in
    # engine seconds: longer than the tool calls the families draw (timeouts to 60 s).
    session_ttl_s: float = 120.0
    # Admission past the reservations (additive increase, multiplicative decrease): the
    # engine admits reservations up to `admission_factor` times its cache; the factor
    # grows by `overcommit_per_s` an engine second up to `max_overcommit`, and its excess
    # over 1 halves whenever the engine evicts the cached context of a trajectory it
    # holds. Forecasts reserve each trajectory's mean context, and whether overcommitting
    # them pays depends on the workload (an evicted context's re-prefill against the KV
    # a tool call leaves idle), so the engine measures it instead of fixing a constant.
    # Off by default (the cluster file's `kv_overcommit_per_s` turns it on).
    overcommit_per_s: float = 0.0
    max_overcommit: float = 1.25
    # An instance that evicts the context of a trajectory it holds in a tool call stops
    # holding it: back from its tool, the trajectory waits for room like a new one. A
    # forecast that knows nothing yet (a campaign's first batch) reserves each
    # trajectory about its prompt, the instance takes more than its cache holds, and
    # without this every context is evicted and prefilled again, turn after turn.
    release_evicted: bool = True
    # Speculative decoding: a plain decode iteration of at most `speculation_max_batch`
    # requests verifies drafts instead (`CostModel.speculative_decode_s`). Iterations
    # that prefill do not speculate (vLLM's do; at the low loads where speculation is on,
    # they are one a turn).
    speculation: Speculation | None = None
    speculation_max_batch: int = 0


def modelled_core(
    cluster: ClusterShape,
    tp: int,
    policy: str,
    *,
    session_ttl_s: float = EngineLimits.session_ttl_s,
) -> tuple[EngineCore, CostModel]:
    """A TP-`tp` instance of the cluster as the cost model times it: the one recipe the
    simulator and the live simulated engines share."""
    cost = CostModel.of(cluster, tp)
    if cost.kv_capacity_tokens <= 0:
        raise ValueError(f"{cluster.model} does not fit on TP-{tp} {cluster.gpu} instances")
    spec = cluster.speculation
    limits = EngineLimits(
        kv_capacity_tokens=cost.kv_capacity_tokens,
        max_num_seqs=cluster.max_num_seqs,
        max_num_batched_tokens=cluster.max_num_batched_tokens,
        policy=policy,
        session_ttl_s=session_ttl_s,
        overcommit_per_s=cluster.kv_overcommit_per_s,
        release_evicted=cluster.kv_release_evicted,
        speculation=spec,
        speculation_max_batch=(
            cost.speculation_max_batch(spec, cluster.max_num_seqs) if spec else 0
        ),
    )
    return EngineCore(limits=limits, iteration_cost=cost.iteration_s), cost


@dataclass
class StepOutput:
    """What one iteration did."""

    duration_s: float = 0.0
    # request_id -> output tokens made this iteration (0 while its prefill is chunked)
    advanced: dict[str, int] = field(default_factory=dict)
    finished: list[str] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    num_prefill_tokens: int = 0
    num_decode_seqs: int = 0
    speculated: bool = False  # a verify pass of drafts (EngineLimits.speculation)


@dataclass(frozen=True)
class DecodeBlock:
    """A run of plain decode iterations over an unchanging set of running requests.

    The simulator advances it in one event instead of `num_iterations` (it is what makes
    cluster-scale simulation fast). Iteration j (from 0) takes `first_s + j * growth_s`:
    the context, and so the KV read, grows by `num_seqs` tokens an iteration; that is
    linear in j within one regime (memory or compute bound), which the cost model is.
    """

    num_iterations: int
    num_seqs: int
    first_s: float
    growth_s: float
    speculated: bool = False

    def elapsed_s(self, iterations: int) -> float:
        return iterations * self.first_s + self.growth_s * iterations * (iterations - 1) / 2

    def iterations_done_by(self, dt: float) -> int:
        """Iterations finished by `dt` after the block started, counting the one in
        progress (an arrival joins at the next iteration boundary, as in vLLM)."""
        lo, hi = 0, self.num_iterations
        while lo < hi:
            mid = (lo + hi) // 2
            if self.elapsed_s(mid) >= dt:
                hi = mid
            else:
                lo = mid + 1
        return lo


class EngineCore:
    def __init__(self, *, limits: EngineLimits, iteration_cost: IterationCost) -> None:
        self.limits = limits
        self._iteration_cost = iteration_cost
        self.waiting = create_request_queue(limits.policy)
        self.running: list[EngineRequest] = []
        # prefix_key -> tokens of KV kept for a trajectory that is not running (LRU order)
        self.prefix_cache: OrderedDict[str, int] = OrderedDict()
        self.num_cached_kv_tokens = 0
        self.num_running_kv_tokens = 0
        self._arrivals = 0
        self._by_id: dict[str, EngineRequest] = {}
        # Requests of trajectories not held yet, waiting for room to be reserved.
        self.admitting = create_request_queue(limits.policy)
        # Sessions: prefix_key -> KV tokens reserved; those with no request here (in a
        # tool call), by the engine time their last step ended.
        self.sessions: dict[str, int] = {}
        self.num_reserved_kv_tokens = 0
        self._idle_since: OrderedDict[str, float] = OrderedDict()
        self.admission_factor = 1.0  # reservations admitted, in caches (EngineLimits)
        self.clock_s = 0.0  # engine time: the sum of its iterations' durations

    # ---- requests in and out -------------------------------------------------------
    def add_request(self, request: EngineRequest) -> None:
        need = request.context_tokens + request.max_new_tokens
        if need > self.limits.kv_capacity_tokens:
            raise RequestTooLarge(
                f"request {request.request_id} needs {need} KV tokens; "
                f"the instance holds {self.limits.kv_capacity_tokens}"
            )
        if request.request_id in self._by_id:
            raise ValueError(f"request {request.request_id} is already in the engine")
        request.arrival_seq = self._arrivals
        self._arrivals += 1
        self._by_id[request.request_id] = request
        key = request.prefix_key
        if key in self.sessions:
            self._idle_since.pop(key, None)
            if request.reserve_kv_tokens:  # re-forecast: the reservation follows
                self._reserve(key, request.reserve_kv_tokens)
        elif (
            request.reserve_kv_tokens
            and key in self.prefix_cache
            and self._factor_to_fit(request) <= self.limits.max_overcommit
        ):
            # Its context is here already (it moved in, or its hold lapsed while the
            # context stayed): the hold follows the context, without waiting for room,
            # up to the overcommit's cap (a cold start's reshaping moves hundreds at once).
            self._reserve(key, request.reserve_kv_tokens)
        elif request.reserve_kv_tokens:
            self.admitting.push(request)
            return
        self.waiting.push(request)

    def abort(self, request_id: str) -> bool:
        request = self._by_id.pop(request_id, None)
        if request is None:
            return False
        if request in self.running:
            self._release(request)
        elif self.waiting.remove(request_id) is None:
            self.admitting.remove(request_id)
        if request.prefix_key in self.sessions:
            self._idle_since[request.prefix_key] = self.clock_s
        return True

    def cached_tokens(self, prefix_key: str) -> int:
        """Tokens of a trajectory's context kept here as a cached prefix."""
        return self.prefix_cache.get(prefix_key, 0)

    @property
    def prefill_backlog_tokens(self) -> int:
        """Context tokens still to prefill: the running requests' rest and the queued
        requests' whole contexts (what an instance serving prefill has ahead of it)."""
        tokens = sum(r.context_tokens - r.num_computed_tokens for r in self.running)
        return tokens + sum(r.context_tokens for r in self.queued())

    def queued(self) -> list[EngineRequest]:
        """Requests not running: those waiting for a seat, then those waiting for room."""
        return [*self.waiting, *self.admitting]

    def request(self, request_id: str) -> EngineRequest | None:
        """A request here, waiting or running."""
        return self._by_id.get(request_id)

    def __contains__(self, request_id: str) -> bool:
        """Whether a request is here, waiting or running."""
        return request_id in self._by_id

    @property
    def num_requests(self) -> int:
        return len(self._by_id)

    @property
    def kv_free_tokens(self) -> int:
        return (
            self.limits.kv_capacity_tokens - self.num_running_kv_tokens - self.num_cached_kv_tokens
        )

    @property
    def kv_usage(self) -> float:
        """Fraction of the KV capacity that running requests hold, as vLLM v1 reports
        it: cached prefixes are evictable, so they count as free."""
        capacity = self.limits.kv_capacity_tokens
        return self.num_running_kv_tokens / capacity if capacity else 0.0

    def has_work(self) -> bool:
        return bool(self._by_id)

    def put_prefix(self, key: str, tokens: int) -> bool:
        """A trajectory's KV arrives (migration): keep it as a cached prefix if it fits."""
        if tokens > self.limits.kv_capacity_tokens - self.num_running_kv_tokens:
            return False
        self._cache_put(key, 0)
        if not self._allocate(tokens):
            return False
        self.num_running_kv_tokens -= tokens  # _allocate counted it as running
        self._cache_put(key, tokens)
        return True

    def drop_prefix(self, key: str) -> int:
        """Forget a trajectory's cached KV (it moved elsewhere), and its session; return
        the tokens freed."""
        self._end_session(key)
        return self._cache_take(key)

    def reset_kv(self) -> list[str]:
        """New weights: every KV the old ones computed is void (vLLM's
        `pause_generation` then `reset_prefix_cache`; AReaL recomputes an interrupted
        rollout's KV). Running requests go back to the queue with the tokens they made
        and prefill their contexts again; the reservations stay. Returns those preempted."""
        out = StepOutput()
        for request in list(self.running):
            self._preempt(request, out)
        self.prefix_cache.clear()
        self.num_cached_kv_tokens = 0
        return out.preempted

    # ---- sessions ---------------------------------------------------------------------
    def _reserve(self, key: str, tokens: int) -> None:
        tokens = min(tokens, self.limits.kv_capacity_tokens)
        self.num_reserved_kv_tokens += tokens - self.sessions.get(key, 0)
        self.sessions[key] = tokens

    def _end_session(self, key: str) -> None:
        tokens = self.sessions.pop(key, None)
        if tokens is not None:
            self.num_reserved_kv_tokens -= tokens
            self._idle_since.pop(key, None)

    def _session_step_done(self, request: EngineRequest) -> None:
        key = request.prefix_key
        if key in self.sessions:
            if request.ends_session:
                self._end_session(key)
            else:
                self._idle_since[key] = self.clock_s

    def _fits(self, request: EngineRequest) -> bool:
        return self._factor_to_fit(request) <= self.admission_factor

    def _factor_to_fit(self, request: EngineRequest) -> float:
        """The admission factor at which `request`'s reservation fits beside the held."""
        capacity = self.limits.kv_capacity_tokens
        return (self.num_reserved_kv_tokens + min(request.reserve_kv_tokens, capacity)) / capacity

    def _advance_clock(self, duration_s: float) -> None:
        self.clock_s += duration_s
        # Once per iteration: with overcommit off (the default) the factor stays at 1.
        if self.limits.overcommit_per_s and self.admission_factor < self.limits.max_overcommit:
            self.admission_factor = min(
                self.limits.max_overcommit,
                self.admission_factor + self.limits.overcommit_per_s * duration_s,
            )

    def _expire_idle(self) -> bool:
        """End the sessions idle past the TTL (their trajectory ended unannounced)."""
        expired = False
        horizon = self.clock_s - self.limits.session_ttl_s
        while self._idle_since:
            key, since = next(iter(self._idle_since.items()))
            if since > horizon:
                break
            self._end_session(key)
            expired = True
        return expired

    def _admit(self) -> None:
        """Trajectories waiting for room join the queue, in its order, while the sessions'
        reservations leave room for them. When nothing here runs or waits, the first one
        joins anyway: the engine never idles with work."""
        admitting = self.admitting
        while admitting:
            request = admitting.peek()
            if not self._fits(request):
                if self._expire_idle():
                    continue  # sessions ended: look again
                if self.running or self.waiting:
                    return
            admitting.pop()
            self._reserve(request.prefix_key, request.reserve_kv_tokens)
            self.waiting.push(request)

    # ---- KV bookkeeping -------------------------------------------------------------
    def _cache_put(self, key: str, tokens: int) -> None:
        old = self.prefix_cache.pop(key, 0)
        self.num_cached_kv_tokens -= old
        if tokens > 0:
            self.prefix_cache[key] = tokens
            self.num_cached_kv_tokens += tokens

    def _cache_take(self, key: str) -> int:
        tokens = self.prefix_cache.pop(key, 0)
        self.num_cached_kv_tokens -= tokens
        return tokens

    def _allocate(self, num_tokens: int) -> bool:
        """Reserve KV for `num_tokens`, evicting cached prefixes (LRU) if needed."""
        while self.kv_free_tokens < num_tokens and self.prefix_cache:
            key, tokens = self.prefix_cache.popitem(last=False)
            self.num_cached_kv_tokens -= tokens
            if key in self.sessions:  # a held context lost: admit less
                self.admission_factor = 1.0 + (self.admission_factor - 1.0) / 2
                if self.limits.release_evicted and key in self._idle_since:
                    self._end_session(key)
        if self.kv_free_tokens < num_tokens:
            return False
        self.num_running_kv_tokens += num_tokens
        return True

    def _release(self, request: EngineRequest) -> None:
        """Take a request off the running list; its KV stays as an evictable prefix."""
        self.running.remove(request)
        self.num_running_kv_tokens -= request.num_computed_tokens
        self._cache_put(request.prefix_key, request.num_computed_tokens)
        request.num_computed_tokens = 0

    def _insert_running(self, request: EngineRequest) -> None:
        if self.limits.policy == "priority":
            at = bisect.bisect_right(self.running, rank(request), key=rank)
            self.running.insert(at, request)
        else:
            self.running.append(request)

    def _preempt(self, request: EngineRequest, out: StepOutput) -> None:
        self._release(request)
        request.num_preemptions += 1
        self.waiting.push(request)
        out.preempted.append(request.request_id)

    @staticmethod
    def _prefill_target(request: EngineRequest) -> int:
        return request.num_tokens - (1 if request.num_output_tokens else 0)

    # ---- one iteration --------------------------------------------------------------
    def step(self) -> StepOutput:
        limits = self.limits
        out = StepOutput()
        token_budget = limits.max_num_batched_tokens
        scheduled: list[tuple[EngineRequest, int]] = []
        if self.admitting:
            self._admit()

        # Progressive priority (Heddle Alg. 1): a waiting request that outranks the
        # lowest-ranked running one takes its seat; the evicted request keeps its KV as
        # a cached prefix and waits.
        if limits.policy == "priority" and limits.preemption:
            while (
                self.waiting
                and self.running
                and len(self.running) >= limits.max_num_seqs
                and rank(self.waiting.peek()) < rank(self.running[-1])
            ):
                self._preempt(self.running[-1], out)

        # Running requests first, in rank order; the tail is preempted when KV runs out.
        # Most iterations need no eviction: when the free KV covers every running
        # request's tokens, they are reserved at once (the same outcome as one at a time,
        # without a Python call per sequence: this loop is the simulator's hot path).
        planned: list[tuple[EngineRequest, int]] = []
        budget_left = token_budget
        for request in self.running:
            if budget_left <= 0:
                break
            made = request.num_output_tokens
            target = request.context_tokens + made - (1 if made else 0)
            computed = request.num_computed_tokens
            num_new = min(target - computed, budget_left) if computed < target else 1
            planned.append((request, num_new))
            budget_left -= num_new
        need = token_budget - budget_left
        if need <= self.kv_free_tokens:
            self.num_running_kv_tokens += need
            scheduled = planned
            token_budget = budget_left
            idx = len(self.running)  # the slow path below has nothing left to do
        else:
            idx = 0
        while idx < len(self.running) and token_budget > 0:
            request = self.running[idx]
            if request.is_prefilling:
                num_new = min(
                    self._prefill_target(request) - request.num_computed_tokens, token_budget
                )
            else:
                num_new = 1
            while not self._allocate(num_new):
                victim = self.running[-1]
                self._preempt(victim, out)
                if victim is request:
                    break
            else:
                scheduled.append((request, num_new))
                token_budget -= num_new
                idx += 1
                continue
            break  # the request itself was preempted: nothing after it can fit either

        # Then waiting requests, while seats, budget and KV last.
        while self.waiting and token_budget > 0 and len(self.running) < limits.max_num_seqs:
            request = self.waiting.peek()
            hit = min(self._cache_take(request.prefix_key), self._prefill_target(request))
            if request.num_preemptions == 0 and request.num_output_tokens == 0:
                request.num_cached_tokens = hit
            self.num_running_kv_tokens += hit
            request.num_computed_tokens = hit
            num_new = min(self._prefill_target(request) - hit, token_budget)
            if num_new == 0:
                num_new = 1  # the whole context is cached: go straight to decode
            if not self._allocate(num_new):
                # Put the prefix back; the request waits for KV to free up.
                self.num_running_kv_tokens -= hit
                request.num_computed_tokens = 0
                self._cache_put(request.prefix_key, hit)
                break
            self.waiting.pop()
            self._insert_running(request)
            scheduled.append((request, num_new))
            token_budget -= num_new

        if not scheduled:
            return out

        # Cost of the iteration, then advance state (vLLM `update_from_output`).
        decode_ctx = prefill_cached = 0
        prefill_attended = 0.0
        for request, num_new in scheduled:
            made = request.num_output_tokens
            if request.num_computed_tokens < request.context_tokens + made - (1 if made else 0):
                out.num_prefill_tokens += num_new
                prefill_cached += request.num_computed_tokens
                prefill_attended += num_new * (request.num_computed_tokens + num_new / 2)
            else:
                out.num_decode_seqs += 1
                decode_ctx += request.num_computed_tokens
        if out.num_prefill_tokens == 0:
            out.duration_s, out.speculated = self._decode_cost(out.num_decode_seqs, decode_ctx)
        else:
            out.duration_s = self._iteration_cost(
                num_decode_seqs=out.num_decode_seqs,
                decode_context_tokens=decode_ctx,
                num_prefill_tokens=out.num_prefill_tokens,
                prefill_attended_tokens=prefill_attended / out.num_prefill_tokens,
                prefill_cached_tokens=prefill_cached,
            )
        self._advance_clock(out.duration_s)
        self._update_from_output(scheduled, out)
        self._check_invariants(scheduled)
        return out

    # ---- fast-forward (simulator) -----------------------------------------------------
    def decode_block(self, max_iterations: int = 1 << 30) -> DecodeBlock | None:
        """The decode block starting now, if the next iterations are plain decodes of the
        same requests; None when the next iteration must be a full `step()`."""
        limits = self.limits
        running = self.running
        num_seqs = len(running)
        if num_seqs == 0 or num_seqs > limits.max_num_batched_tokens:
            return None
        if self.admitting and self._fits(self.admitting.peek()):
            return None  # a trajectory can be admitted: a full step does it
        for r in running:  # any still prefilling (inlined: called once per event)
            made = r.num_output_tokens
            if r.num_computed_tokens < r.context_tokens + made - (1 if made else 0):
                return None
        if self.waiting:
            # Waiting requests stay put only while every seat is taken and none outranks
            # a running one (ranks do not change inside a block).
            if num_seqs < limits.max_num_seqs:
                return None
            if (
                limits.policy == "priority"
                and limits.preemption
                and rank(self.waiting.peek()) < rank(running[-1])
            ):
                return None
        iterations = min(r.max_new_tokens - r.num_output_tokens for r in running)
        kv_room = limits.kv_capacity_tokens - self.num_running_kv_tokens
        iterations = min(iterations, kv_room // num_seqs, max_iterations)
        if iterations < 2:
            return None
        block = self._decode_block_of(iterations)
        if self.admitting:
            # The admission factor grows with engine time: the block ends at the
            # iteration after which the trajectory waiting for room would fit.
            need = self._factor_to_fit(self.admitting.peek())
            if need <= limits.max_overcommit and limits.overcommit_per_s > 0:
                until = block.iterations_done_by(
                    (need - self.admission_factor) / limits.overcommit_per_s
                )
                if until < 2:
                    return None
                if until < iterations:
                    block = self._decode_block_of(until)
        return block

    def _decode_cost(self, num_seqs: int, context_tokens: int) -> tuple[float, bool]:
        """A plain decode iteration's time, and whether it speculates: a verify pass,
        charged per token it makes on average (`CostModel.speculative_decode_s`)."""
        spec = self.limits.speculation
        if spec is not None and num_seqs <= self.limits.speculation_max_batch:
            return per_token_of_verify(self._iteration_cost, spec, num_seqs, context_tokens), True
        cost = self._iteration_cost(num_decode_seqs=num_seqs, decode_context_tokens=context_tokens)
        return cost, False

    def _decode_block_of(self, iterations: int) -> DecodeBlock:
        num_seqs = len(self.running)
        context = self.num_running_kv_tokens
        first, speculated = self._decode_cost(num_seqs, context)
        last, _ = self._decode_cost(num_seqs, context + (iterations - 1) * num_seqs)
        return DecodeBlock(
            iterations, num_seqs, first, (last - first) / (iterations - 1), speculated
        )

    def advance_decode(self, block: DecodeBlock, iterations: int) -> StepOutput:
        """Apply the first `iterations` of `block` (state as `step()` would leave it)."""
        if not 0 < iterations <= block.num_iterations or len(self.running) != block.num_seqs:
            raise ValueError("the block no longer matches the engine's state")
        out = StepOutput(
            duration_s=block.elapsed_s(iterations),
            num_decode_seqs=block.num_seqs,
            speculated=block.speculated,
        )
        if not self._allocate(iterations * block.num_seqs):
            raise AssertionError("a decode block outgrew the KV cache")
        self._advance_clock(out.duration_s)
        for request in list(self.running):
            request.num_computed_tokens += iterations
            request.num_output_tokens += iterations
            out.advanced[request.request_id] = iterations
            if request.is_finished:
                self._release(request)
                del self._by_id[request.request_id]
                self._session_step_done(request)
                out.finished.append(request.request_id)
        self._check_invariants([])
        return out

    def _update_from_output(
        self, scheduled: list[tuple[EngineRequest, int]], out: StepOutput
    ) -> None:
        advanced = out.advanced
        for request, num_new in scheduled:
            made = request.num_output_tokens
            target = request.context_tokens + made - (1 if made else 0)
            was_prefilling = request.num_computed_tokens < target
            request.num_computed_tokens += num_new
            if not was_prefilling or request.num_computed_tokens >= target:
                request.num_output_tokens = made = made + 1
                advanced[request.request_id] = 1
            else:
                advanced[request.request_id] = 0
            if made >= request.max_new_tokens:
                self._release(request)
                del self._by_id[request.request_id]
                self._session_step_done(request)
                out.finished.append(request.request_id)

    def _check_invariants(self, scheduled: list[tuple[EngineRequest, int]]) -> None:
        limits = self.limits
        if sum(n for _, n in scheduled) > limits.max_num_batched_tokens:
            raise AssertionError("token budget exceeded")
        if len(self.running) > limits.max_num_seqs:
            raise AssertionError("max_num_seqs exceeded")
        if self.num_running_kv_tokens + self.num_cached_kv_tokens > limits.kv_capacity_tokens:
            raise AssertionError("KV capacity exceeded")
