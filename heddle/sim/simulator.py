"""A rollout batch in virtual time: the shared policy core and engine cores, no Temporal.

Events are kept in one heap: a trajectory arriving for its next LLM step (at time 0, or
when its tool returns), a step submitted to an instance (later than the arrival when the
trajectory's KV migrates), and an instance finishing its current iteration. Plain decode
stretches run as one `DecodeBlock` event; an arrival in the middle of a block
materialises the iterations done so far and joins at the next iteration boundary, as a
request joins vLLM's running batch. Every `REVIEW_EVERY_S` a policy that reviews running
steps sees the long decodes in progress and may move one to another instance mid-step:
its KV is transferred (decoding pauses for the transfer) and it resumes from the tokens
already made, as a retried live step resumes from its heartbeat. A policy whose split
reshapes during rollout retires idle instances and starts a new one in their GPUs, which
takes requests once its restart (the cost model's reconfiguration time) is over.

With the cluster's `disaggregation`, some instances serve prefill only (their roles
switched by `scheduler.roles` every half horizon): a step with enough uncached context
prefills there, its cached KV pulled from its decode instance first and the new KV sent
back after, each at the interconnect's cost; its decode instance (the one the policy
chose) then makes the rest of its tokens. The policies see the decode instances only.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from engines.core import DecodeBlock, EngineCore, StepOutput, modelled_core
from engines.costmodel import CostModel, Move, cheapest_move, same_node
from engines.request import EngineRequest
from heddle.hardware import ClusterShape
from heddle.sim.metrics import SimResult
from heddle.stats import percentile
from heddle.types import Decision, StepText, TrajectorySpec, TrajectoryView
from scheduler.interface import (
    REVIEW_EVERY_S,
    REVIEW_MIN_TOKENS,
    InstanceSpec,
    InstanceState,
    Policy,
)
from scheduler.reallocation import Block
from scheduler.reshape import GpuLayout
from scheduler.roles import DECODE, PREFILL, PrefillForecast, RoleInstance, prefill_instances

ARRIVE, SUBMIT, WAKE, READY, REVIEW, SAMPLE, CALL, PREFILL_IN, HANDOFF, ROLES = range(10)
# An instance lent to a campaign's trainer (`Simulator.lend`): hidden from the policies
# like one serving prefill, and holding no KV.
TRAIN = "train"


@dataclass(frozen=True)
class Occupancy:
    """The instances of one TP degree at one moment: what `sample_every_s` records."""

    time_s: float
    tp: int
    num_instances: int
    num_running: int
    num_waiting: int
    kv_usage: float  # mean over the instances
    num_sessions: int


@dataclass
class _Trajectory:
    """A trajectory in the simulation: what the policy sees of it (`view`, the same record
    the live workflow keeps), and the simulator's own clocks."""

    spec: TrajectorySpec
    view: TrajectoryView
    last_tool_latency_s: float = 0.0
    finished_at: float = -1.0
    queued_s: float = 0.0
    submitted_at: float = 0.0
    ready_at: float = 0.0  # when its tool returned (or 0): no step may start before
    step_offset: int = 0  # tokens of the current step made on instances it moved away from
    in_tool: bool = False  # its tool call runs: no request of it is anywhere
    prefilling_on: str | None = None  # the prefill instance its step prefills on
    decision: Decision | None = None  # where its step decodes once prefilled elsewhere
    dropped: bool = False  # dropped mid-run (`Simulator.drop`): it ends where it is
    stayed: bool = False  # its step runs where its last one ran (`TrajectoryView.found_evicted`)


@dataclass
class _Instance:
    spec: InstanceSpec
    core: EngineCore
    cost: CostModel
    busy_until: float = 0.0
    running: bool = False  # an iteration or block is in progress
    version: int = 0
    paused_until: float = 0.0  # new weights load (`Simulator.pause`): no iteration runs
    block: DecodeBlock | None = None
    block_start: float = 0.0
    pending: StepOutput | None = None
    busy_s: float = 0.0
    in_flight: int = 0
    sessions: int = 0
    # When it first held no trajectory after every trajectory had started (the rollout's
    # tail; -1: never), and how often one came to it after that (Libra's lever).
    emptied_at: float = -1.0
    refilled: int = 0
    peak_kv_tokens: int = 0
    intervals: list[list[float]] = field(default_factory=list)
    serving: str = DECODE  # PREFILL: it takes prefills, and no new decodes; TRAIN: lent
    prefills: set[str] = field(default_factory=set)  # its requests that only prefill

    def add_busy(self, start: float, end: float) -> None:
        self.busy_s += end - start
        if self.intervals and self.intervals[-1][1] >= start - 1e-12:
            self.intervals[-1][1] = end
        else:
            self.intervals.append([start, end])


class Simulator:
    def __init__(
        self,
        *,
        trace: Sequence[TrajectorySpec],
        policy: Policy,
        cluster: ClusterShape,
        record_steps: bool = False,
        sample_every_s: float = 0.0,
        kv_transfer: bool = True,
    ) -> None:
        self.policy = policy
        # Whether instances can send each other KV; without, a move recomputes it.
        self.kv_transfer = kv_transfer
        # Per TP degree every `sample_every_s` (0: never): queues and KV over time.
        self.sample_every_s = sample_every_s
        self.occupancy: list[Occupancy] = []
        # (trajectory_id, step, ready_at, submitted_at, first_scheduled, finished_at, instance)
        self.step_log: list[tuple[str, int, float, float, float, float, str]] | None = (
            [] if record_steps else None
        )
        self.cluster = cluster
        num_gpus = cluster.num_gpus
        self.num_gpus = num_gpus
        self.trajectories = {s.trajectory_id: _Trajectory(s, TrajectoryView.first(s))
                             for s in trace}  # fmt: skip
        if len(self.trajectories) != len(trace):
            raise ValueError("trajectory ids repeat in the trace")
        # A planning policy sees every first step before the split is read.
        policy.on_batch_start([self._event(t) for t in self.trajectories.values()])
        # A static prefill pool sits beside the policy's split, on GPUs the policy does not
        # plan (`ClusterShape.for_placement`); a planner that split every GPU (its
        # PolicyContext made for the whole cluster) gives up its narrowest instead.
        pool_gpus = cluster.prefill_pool_gpus
        split = policy.split.instances(num_gpus - pool_gpus)
        split_gpus = sum(ispec.tp for ispec in split)
        if split_gpus > num_gpus:
            raise ValueError(
                f"policy {policy.name!r} split the cluster into {split_gpus} GPUs of "
                f"instances, but it has {num_gpus}: was its PolicyContext made for another "
                "cluster?"
            )
        pool: list[InstanceSpec] = []
        if pool_gpus and split_gpus + pool_gpus <= num_gpus:
            tp = cluster.default_tp
            pool = [InstanceSpec(f"prefill{k}", tp, PREFILL) for k in range(pool_gpus // tp)]
        self.instances: dict[str, _Instance] = {
            ispec.instance_id: self._new_instance(ispec) for ispec in [*split, *pool]
        }
        for ispec in pool:
            self.instances[ispec.instance_id].serving = PREFILL
        split = [*split, *pool]
        # Which GPUs each instance holds (widest first, as `GpuLayout.pack` lays a split
        # out for the policies that reshape): a move across nodes goes over the NICs.
        self.layout = GpuLayout.pack([i.instance_id for i in split], [i.tp for i in split])
        self.retired: list[_Instance] = []
        self.reconfigurations = 0
        self.reconfiguration_s = 0.0
        self._heap: list[tuple[float, int, int, object]] = []
        self._seq = itertools.count()
        self.now = 0.0
        self.migrations = 0
        self.migration_s = 0.0
        self.recomputed_moves = 0
        self.prefill_tokens = 0
        self.speculated_tokens = 0
        # Disaggregation: KV handoffs from prefill to decode instances, their time, the
        # tokens prefilled on prefill instances, and role switches.
        self.disaggregation = cluster.disaggregation
        if self.disaggregation is not None and not kv_transfer:
            raise ValueError("disaggregation needs KV transfer between instances")
        self.prefill_forecast = PrefillForecast(
            self.disaggregation.min_prefill_tokens if self.disaggregation else 0
        )
        self.kv_handoffs = 0
        self.handoff_s = 0.0
        self.offloaded_prefill_tokens = 0
        self.role_switches = 0
        self.token_events: list[tuple[float, int]] = []
        self._first_scheduled: dict[str, float] = {}
        # The prefix-cache hit of each step's first iteration (`TrajectoryView.found_evicted`).
        self._first_cached: dict[str, int] = {}
        self._state_list: list[InstanceState] | None = None
        self._state_pos: dict[str, int] = {}
        # Called with a trajectory's id as it finishes (not when dropped).
        self.on_finished: Callable[[str], None] | None = None
        self._review_pending = False
        self._roles_pending = False
        self._stopped = False
        if self.disaggregation is not None:
            self._plan_roles()

    def _new_instance(self, ispec: InstanceSpec) -> _Instance:
        core, cost = modelled_core(self.cluster, ispec.tp, self.policy.order.queue)
        return _Instance(ispec, core, cost)

    # ---- events ------------------------------------------------------------------------
    def _push(self, t: float, kind: int, ref: object) -> None:
        heapq.heappush(self._heap, (t, next(self._seq), kind, ref))

    def run(self) -> SimResult:
        started = time.perf_counter()
        for tid in self.trajectories:
            self._push(0.0, ARRIVE, tid)
        self._unfinished = len(self.trajectories)
        self._unstarted = len(self.trajectories)
        self._schedule_review(REVIEW_EVERY_S)
        if self.sample_every_s > 0:
            self._push(0.0, SAMPLE, None)
        self._schedule_roles()
        while self._heap and not self._stopped:
            t, _, kind, ref = heapq.heappop(self._heap)
            self.now = t
            if kind == ARRIVE:
                self._arrive(ref)  # type: ignore[arg-type]
            elif kind == SUBMIT:
                self._submit(*ref)  # type: ignore[misc]
            elif kind == READY:
                self._ready(ref)  # type: ignore[arg-type]
            elif kind == REVIEW:
                self._review()
            elif kind == SAMPLE:
                self._sample()
            elif kind == CALL:
                ref()  # type: ignore[operator]
            elif kind == PREFILL_IN:
                self._prefill_in(*ref)  # type: ignore[misc]
            elif kind == HANDOFF:
                self._handoff(*ref)  # type: ignore[misc]
            elif kind == ROLES:
                self._roles_pending = False
                self._plan_roles()
                if self._unfinished:
                    self._schedule_roles()
            else:
                iid: str
                version: int
                iid, version = ref  # type: ignore[misc]
                inst = self.instances.get(iid)
                if inst is not None and version == inst.version:
                    self._wake(inst)
        unfinished = [t.spec.trajectory_id for t in self.trajectories.values() if t.finished_at < 0]
        if unfinished and not self._stopped:
            raise RuntimeError(f"simulation ended with {len(unfinished)} unfinished trajectories")
        return self._result(time.perf_counter() - started)

    def _sample(self) -> None:
        if not self._unfinished:
            return  # pushed before the last trajectory finished: the batch is over
        by_tp: dict[int, list[_Instance]] = {}
        for inst in self.instances.values():
            by_tp.setdefault(inst.spec.tp, []).append(inst)
        for tp, group in sorted(by_tp.items()):
            self.occupancy.append(
                Occupancy(
                    self.now, tp, len(group), sum(len(i.core.running) for i in group),
                    sum(len(i.core.waiting) + len(i.core.admitting) for i in group),
                    sum(i.core.kv_usage for i in group) / len(group),
                    sum(i.sessions for i in group),
                )
            )  # fmt: skip
        self._push(self.now + self.sample_every_s, SAMPLE, None)

    def _states(self) -> list[InstanceState]:
        """What policies see of the instances; entries are refreshed as counts change, so
        a decision costs no more than the policy's own scan."""
        if self._state_list is None:
            shown = [i for i in self.instances.values() if i.serving == DECODE]
            self._state_list = [self._state(i) for i in shown]
            self._state_pos = {i.spec.instance_id: k for k, i in enumerate(shown)}
        return self._state_list

    @staticmethod
    def _state(inst: _Instance) -> InstanceState:
        return InstanceState(
            inst.spec.instance_id, inst.in_flight, inst.sessions, inst.spec.tp, inst.spec.role,
            kv_usage=inst.core.kv_usage,
        )  # fmt: skip

    def _refresh(self, *instances: _Instance) -> None:
        if self._state_list is None:
            return
        for inst in instances:
            pos = self._state_pos.get(inst.spec.instance_id)
            if pos is not None:
                self._state_list[pos] = self._state(inst)

    def _event(self, traj: _Trajectory, made: int = 0) -> TrajectoryView:
        """What the policy sees of a trajectory; `made`: tokens of a step in progress."""
        return traj.view.in_progress(made) if made else traj.view

    def _arrive(self, tid: str) -> None:
        traj = self.trajectories[tid]
        traj.in_tool = False
        if traj.dropped:  # dropped in its tool call (it ended then) or before its first step
            if traj.finished_at < 0:
                self._end_dropped(traj)
            return
        if traj.view.step_index and traj.view.last_tool is not None:
            self.prefill_forecast.observe(traj.view.last_tool_output_tokens)
        decision = self.policy.decide(self._event(traj), self._states(), self.now)
        if decision.instance_id not in self.instances:
            raise ValueError(
                f"policy {self.policy.name} chose unknown instance {decision.instance_id}"
            )
        decision = self._to_decode_instance(decision)
        # Counted from the decision on: a step in transit keeps its target from looking idle.
        target = self.instances[decision.instance_id]
        target.in_flight += 1
        self._refresh(target)
        prev = traj.view.previous_instance
        if (decision.migrate and prev is not None and prev != decision.instance_id
                and self.instances[prev].serving != TRAIN):  # fmt: skip
            tokens = self.instances[prev].core.drop_prefix(tid)
            move = self._move(prev, decision.instance_id, tokens)
            if not move.recompute:
                # The transfer overlaps the tool call; only what is left of it delays the step.
                delay = max(0.0, move.seconds - traj.last_tool_latency_s)
                self._push(self.now + delay, SUBMIT, (tid, decision, tokens))
                return
        self._submit(tid, decision, 0)

    def _move(self, source: str, target: str, tokens: int) -> Move:
        """Count a move of `tokens` of cached context, by the cheaper way there is: a
        transfer (its time in `migration_s`) or the target's prefill, which the moved
        step then pays on the target."""
        src, dst = self.instances[source], self.instances[target]
        first_gpu = self.layout.first_gpu
        move = cheapest_move(src.cost, dst.cost, tokens,
                             same_node=same_node(first_gpu[source], first_gpu[target]),
                             transfer_path=self.kv_transfer)  # fmt: skip
        self.migrations += 1
        if move.recompute:
            self.recomputed_moves += 1
        else:
            self.migration_s += move.seconds
        return move

    def _submit(self, tid: str, decision: Decision, migrated_tokens: int) -> None:
        traj = self.trajectories[tid]
        decision = self._off_lent(decision)
        inst = self.instances[decision.instance_id]
        if traj.dropped:  # dropped while its KV moved here
            inst.in_flight -= 1
            self._refresh(inst)
            self._end_dropped(traj)
            return
        left: _Instance | None = None
        last = traj.view.previous_instance
        traj.stayed = last == decision.instance_id
        if last != decision.instance_id:
            if last is not None:
                left = self.instances[last]
                left.sessions -= 1
                self._refresh(left)
                self._mark_empty(left)
            inst.sessions += 1
            if inst.emptied_at >= 0:
                inst.refilled += 1
            traj.view = traj.view.on(decision.instance_id)
            if last is None:
                self._unstarted -= 1
                if not self._unstarted:
                    for other in self.instances.values():
                        self._mark_empty(other)
        self._materialise(inst)
        if migrated_tokens:
            inst.core.put_prefix(tid, migrated_tokens)
        if not traj.step_offset:  # a step moved mid-decode keeps its first submission
            traj.submitted_at = self.now
        prefill_on = self._prefill_instance_for(traj, inst)
        if prefill_on is None:
            self._enqueue(traj, inst, decision)
        else:
            holder = left if left is not None and _held(left, tid) > _held(inst, tid) else inst
            self._offload_prefill(traj, decision, holder, prefill_on)
        if left is not None and left.sessions == 0:
            self._reshape()

    def _enqueue(self, traj: _Trajectory, inst: _Instance, decision: Decision) -> None:
        """The step's request into its decode instance's engine."""
        tid = traj.spec.trajectory_id
        index = traj.view.step_index
        step = traj.spec.steps[index]
        inst.core.add_request(
            EngineRequest(
                request_id=f"{tid}#{index}",
                prefix_key=tid,
                context_tokens=traj.view.context_tokens + traj.step_offset,
                max_new_tokens=step.output_tokens - traj.step_offset,
                priority=decision.priority,
                reserve_kv_tokens=decision.reserve_kv_tokens,
                ends_session=step.tool is None,
            )
        )
        self._refresh(inst)
        if not inst.running:
            self._start(inst)

    # ---- disaggregated prefill (`Disaggregation`) -----------------------------------------
    def _prefill_instance_for(self, traj: _Trajectory, home: _Instance) -> _Instance | None:
        """The prefill instance a step's prefill goes to, or None to prefill at home: its
        context uncached there is too short to be worth a handoff, its step makes one
        token, or no instance serves prefill. The least backlogged one takes it."""
        config = self.disaggregation
        if config is None or traj.step_offset:
            return None
        tid = traj.spec.trajectory_id
        if traj.spec.steps[traj.view.step_index].output_tokens < 2:
            return None
        if traj.view.context_tokens - _held(home, tid) < config.min_prefill_tokens:
            return None
        pool = [i for i in self.instances.values() if i.serving == PREFILL]
        if not pool:
            return None
        # The soonest done: its queue, then what it lacks of this context.
        context = traj.view.context_tokens

        def done_in_s(i: _Instance) -> float:
            return (i.core.prefill_backlog_tokens + context - _held(i, tid)) / self._prefill_rate(i)

        return min(pool, key=lambda i: (done_in_s(i), i.spec.instance_id))

    def _prefill_rate(self, inst: _Instance) -> float:
        return inst.cost.prefill_tokens_per_s(self.cluster.max_num_batched_tokens)

    def _kv_seconds(self, source: _Instance, target: _Instance, tokens: int) -> float:
        first_gpu = self.layout.first_gpu
        near = same_node(first_gpu[source.spec.instance_id], first_gpu[target.spec.instance_id])
        return source.cost.migration_s(tokens, same_node=near, target_tp=target.spec.tp)

    def _offload_prefill(
        self, traj: _Trajectory, decision: Decision, holder: _Instance, target: _Instance
    ) -> None:
        """Send the step's prefill to `target`: the context `holder` (its decode instance,
        or the one it left) keeps is pulled over first, what `target` lacks of it."""
        tid = traj.spec.trajectory_id
        traj.prefilling_on = target.spec.instance_id
        traj.decision = decision
        target.in_flight += 1
        held = _held(holder, tid)
        pull = held - _held(target, tid)
        if pull > 0 and holder is not target:
            seconds = self._kv_seconds(holder, target, pull)
            self.handoff_s += seconds
            self._push(self.now + seconds, PREFILL_IN, (tid, held))
        else:
            self._prefill_in(tid, 0)

    def _prefill_in(self, tid: str, pulled: int) -> None:
        traj = self.trajectories[tid]
        target = self.instances[traj.prefilling_on]  # type: ignore[index]
        self._materialise(target)  # it may still decode steps it ran before its switch
        if pulled:
            target.core.put_prefix(tid, pulled)
        decision = traj.decision
        assert decision is not None
        request_id = f"{tid}#{traj.view.step_index}"
        target.prefills.add(request_id)
        target.core.add_request(
            EngineRequest(
                request_id=request_id,
                prefix_key=tid,
                context_tokens=traj.view.context_tokens,
                max_new_tokens=1,
                priority=decision.priority,
            )
        )
        if not target.running:
            self._start(target)

    def _prefilled(self, inst: _Instance, request_id: str) -> None:
        """A prefill is done (its first token made): its KV goes to the decode instance."""
        tid = request_id.rpartition("#")[0]
        traj = self.trajectories[tid]
        inst.prefills.discard(request_id)
        inst.in_flight -= 1
        traj.prefilling_on = None
        decision = traj.decision
        assert decision is not None
        home = self.instances[decision.instance_id]
        missing = traj.view.context_tokens - _held(home, tid)
        seconds = self._kv_seconds(inst, home, missing) if missing > 0 else 0.0
        self.kv_handoffs += 1
        self.handoff_s += seconds
        self._push(self.now + seconds, HANDOFF, (tid,))

    def _handoff(self, tid: str) -> None:
        traj = self.trajectories[tid]
        decision = traj.decision
        assert decision is not None
        traj.decision = None
        decision = self._off_lent(decision)
        home = self.instances[decision.instance_id]
        if traj.dropped:
            home.in_flight -= 1
            self._refresh(home)
            self._end_dropped(traj)
            return
        self._materialise(home)
        home.core.put_prefix(tid, traj.view.context_tokens)  # else it prefills again there
        traj.step_offset = 1  # the token the prefill made
        self._enqueue(traj, home, decision)

    def _to_decode_instance(self, decision: Decision) -> Decision:
        """A policy that plans on the whole split may name an instance serving prefill
        now: the step goes to the least busy decode instance as wide (or any)."""
        inst = self.instances[decision.instance_id]
        if inst.serving == DECODE:
            return decision
        pool = [i for i in self.instances.values() if i.serving == DECODE]
        same = [i for i in pool if i.spec.tp == inst.spec.tp] or pool
        best = min(same, key=lambda i: (i.in_flight, i.sessions, i.spec.instance_id))
        return dataclasses.replace(decision, instance_id=best.spec.instance_id)

    def _off_lent(self, decision: Decision) -> Decision:
        """A step on its way to an instance lent to the trainer meanwhile goes to a decode
        instance instead (its in-flight count with it)."""
        if self.instances[decision.instance_id].serving != TRAIN:
            return decision
        lent = self.instances[decision.instance_id]
        decision = self._to_decode_instance(decision)
        target = self.instances[decision.instance_id]
        lent.in_flight -= 1
        target.in_flight += 1
        self._refresh(target)
        return decision

    def _schedule_roles(self) -> None:
        """Plan roles every half horizon while trajectories run (forecast roles only)."""
        config = self.disaggregation
        if config is not None and config.roles == "forecast" and not self._roles_pending:
            self._roles_pending = True
            self._push(self.now + config.horizon_s / 2, ROLES, None)

    def _plan_roles(self) -> None:
        """Switch roles to the forecast's (`scheduler.roles.prefill_instances`)."""
        config = self.disaggregation
        assert config is not None
        views = [
            RoleInstance(
                iid, i.spec.tp, i.serving, load=i.sessions + i.in_flight,
                prefill_tokens_per_s=self._prefill_rate(i),
                kv_capacity_tokens=i.core.limits.kv_capacity_tokens,
            )
            for iid, i in self.instances.items()
            if i.serving != TRAIN
        ]  # fmt: skip
        trajs = self.trajectories.values()
        unstarted = [t.view.context_tokens for t in trajs
                     if t.view.previous_instance is None and t.finished_at < 0]  # fmt: skip
        tool_users = sum(
            1 for t in trajs if t.finished_at < 0 and (t.in_tool or t.view.num_tool_calls)
        )
        decoding = sum(i.core.num_running_kv_tokens for i in self.instances.values()
                       if i.serving == DECODE)  # fmt: skip
        wanted = prefill_instances(
            views,
            demand_tokens=self.prefill_forecast.demand_tokens(unstarted, tool_users),
            decoding_kv_tokens=decoding,
            config=config,
        )
        # A switch takes effect at once: a new prefill instance finishes the decodes it
        # runs, a new decode instance the prefills it has (`prefills` tells them apart).
        for iid, inst in self.instances.items():
            if inst.serving == TRAIN:
                continue
            role = PREFILL if iid in wanted else DECODE
            if inst.serving != role:
                inst.serving = role
                self.role_switches += 1
                self._state_list = None

    def _materialise(self, inst: _Instance) -> None:
        """Cut a running decode block at the iteration boundary after `now`."""
        if inst.block is None:
            return
        block, start = inst.block, inst.block_start
        done = block.iterations_done_by(self.now - start)
        inst.block = None
        inst.version += 1
        if done == 0:  # the block starts now: start over with the newcomer
            inst.running = False
            return
        inst.pending = inst.core.advance_decode(block, done)
        inst.busy_until = start + block.elapsed_s(done)
        inst.add_busy(start, inst.busy_until)
        self._push(inst.busy_until, WAKE, (inst.spec.instance_id, inst.version))

    def _start(self, inst: _Instance) -> None:
        now = self.now
        inst.version += 1
        if not inst.core.has_work():
            inst.running = False
            return
        if now < inst.paused_until:  # loading new weights: start when they are in
            inst.running = True
            self._push(inst.paused_until, WAKE, (inst.spec.instance_id, inst.version))
            return
        inst.running = True
        core = inst.core
        inst.peak_kv_tokens = max(
            inst.peak_kv_tokens, core.num_running_kv_tokens + core.num_cached_kv_tokens
        )
        block = core.decode_block()
        if block is not None:
            inst.block, inst.block_start = block, now
            end = now + block.elapsed_s(block.num_iterations)
        else:
            out = inst.core.step()
            if not out.advanced and not out.preempted:
                raise RuntimeError(f"instance {inst.spec.instance_id} cannot make progress")
            for rid in out.advanced:
                if rid not in self._first_scheduled:
                    self._first_scheduled[rid] = now
                    request = core.request(rid)  # None: it ended in this iteration
                    if request is not None:
                        self._first_cached[rid] = request.num_cached_tokens
            inst.pending = out
            self.prefill_tokens += out.num_prefill_tokens
            if inst.serving == PREFILL:
                self.offloaded_prefill_tokens += out.num_prefill_tokens
            end = now + out.duration_s
            inst.add_busy(now, end)
        inst.busy_until = end
        self._push(end, WAKE, (inst.spec.instance_id, inst.version))

    def _wake(self, inst: _Instance) -> None:
        if inst.block is not None:
            block = inst.block
            inst.block = None
            out = inst.core.advance_decode(block, block.num_iterations)
            inst.add_busy(inst.block_start, self.now)
        else:
            out = inst.pending or StepOutput()
        inst.pending = None
        if out.speculated:
            self.speculated_tokens += sum(out.advanced.values())
        for rid in out.finished:
            (self._prefilled if rid in inst.prefills else self._step_done)(inst, rid)
        self._start(inst)

    def _step_done(self, inst: _Instance, request_id: str) -> None:
        tid, _, index = request_id.rpartition("#")
        traj = self.trajectories[tid]
        step = traj.spec.steps[int(index)]
        inst.in_flight -= 1
        self._refresh(inst)
        if traj.dropped:  # its last iteration was under way when it was dropped
            self._end_dropped(traj)
            return
        first = self._first_scheduled.pop(request_id, traj.submitted_at)
        traj.queued_s += first - traj.submitted_at
        if self.step_log is not None:
            self.step_log.append(
                (tid, int(index), traj.ready_at, traj.submitted_at, first, self.now,
                 inst.spec.instance_id)
            )  # fmt: skip
        cached = self._first_cached.pop(request_id, None)
        evicted = (traj.stayed and not traj.step_offset and cached is not None
                   and traj.view.found_evicted(cached))  # fmt: skip
        traj.step_offset = 0
        text = step.text or StepText()
        traj.view = traj.view.after_output(step.output_tokens, text.output_ngrams, evicted=evicted)
        self.token_events.append((self.now, step.output_tokens))
        self.policy.on_step_done(traj.view, inst.spec.instance_id, step.output_tokens)
        if step.tool is None:
            traj.finished_at = self.now
            self._unfinished -= 1
            inst.sessions -= 1
            self._refresh(inst)
            self._mark_empty(inst)
            self.policy.on_trajectory_done(
                tid, traj.spec.group_id, traj.view.generated_tokens, len(traj.spec.steps)
            )
            self._reshape()
            if self.on_finished is not None:
                self.on_finished(tid)
            return
        traj.view = traj.view.after_tool(
            step.tool, step.tool_status, step.tool_output_tokens,
            input_chars=text.tool_input_chars, ngrams=text.observation_ngrams,
        )  # fmt: skip
        traj.last_tool_latency_s = step.tool_latency_s
        traj.ready_at = self.now + step.tool_latency_s
        traj.in_tool = True
        self._push(traj.ready_at, ARRIVE, tid)

    def _mark_empty(self, inst: _Instance) -> None:
        """Note when an instance first holds nothing in the rollout's tail."""
        if not self._unstarted and not inst.sessions and inst.emptied_at < 0:
            inst.emptied_at = self.now

    # ---- a campaign's hand on the rollout (`heddle.sim.campaign`) -----------------------
    def admit(self, trace: Sequence[TrajectorySpec]) -> None:
        """Start more trajectories now (an asynchronous campaign admits them as its
        staleness bound allows); the policy sees each at its first step."""
        for spec in trace:
            tid = spec.trajectory_id
            if tid in self.trajectories:
                raise ValueError(f"trajectory {tid} is already in the rollout")
            self.trajectories[tid] = _Trajectory(spec, TrajectoryView.first(spec))
            self._unfinished += 1
            self._unstarted += 1
            self._push(self.now, ARRIVE, tid)
        if trace:
            self._schedule_review(self.now + REVIEW_EVERY_S)
            self._schedule_roles()

    def call_at(self, t: float, callback: Callable[[], None]) -> None:
        """Run `callback` at virtual time `t` (a train step ending, a sync)."""
        self._push(t, CALL, callback)

    def stop(self) -> None:
        """End the run now, whatever is still in flight (a campaign's last step is in)."""
        self._stopped = True

    def tokens_made(self, tid: str) -> int:
        """Tokens a trajectory has generated so far, its step in progress included up to
        the instances' last iteration boundary (`pause` cuts blocks there)."""
        traj = self.trajectories[tid]
        made = traj.view.generated_tokens + traj.step_offset
        home = traj.view.previous_instance
        if traj.finished_at < 0 and not traj.in_tool and home is not None:
            request = self.instances[home].core.request(f"{tid}#{traj.view.step_index}")
            if request is not None:
                made += request.num_output_tokens
        return made

    def pause(self, duration_s: float, void_kv: bool = True) -> None:
        """New weights into every instance: no iteration runs for `duration_s`, and the
        KV the old weights computed is void (`EngineCore.reset_kv`), so the steps under
        way prefill their contexts again and continue under the new weights. With
        `void_kv` off the KV is kept (vLLM's `pause_generation(mode="keep")` without a
        cache reset): the new weights continue from the old weights' KV."""
        for inst in self.instances.values():
            self._materialise(inst)
            inst.paused_until = self.now + duration_s
            if void_kv:
                inst.core.reset_kv()
            self._refresh(inst)
            if not inst.running:  # a block cut where it began: start (after the load)
                self._start(inst)

    def drop(self, tid: str) -> None:
        """End a trajectory where it is (its group is dropped): its request leaves its
        engine, its KV and reservation are freed, and the policy forgets it."""
        traj = self.trajectories[tid]
        if traj.finished_at >= 0 or traj.dropped:
            return
        traj.dropped = True
        home = traj.view.previous_instance
        if traj.in_tool:
            self._end_dropped(traj)
            return
        if home is not None:
            inst = self.instances[home]
            self._materialise(inst)
            if inst.core.abort(f"{tid}#{traj.view.step_index}"):
                inst.in_flight -= 1
                self._refresh(inst)
                self._end_dropped(traj)
                if not inst.running:
                    self._start(inst)
        # Else it is on its way to an instance, its last iteration is under way, or its
        # first step is yet to arrive: `_submit`, `_step_done` or `_arrive` ends it.

    def blocks(self) -> list[Block]:
        """The instances lent to a campaign's trainer and those it may take (`lend`), as
        `scheduler.reallocation` sees them: not those serving prefill, nor those the
        policy is emptying to merge (their GPUs are promised to a wider instance)."""
        emptying = self.policy.emptying
        return [
            Block(iid, i.spec.tp, load=i.sessions + i.in_flight,
                  training=i.serving == TRAIN, restart_s=i.cost.reconfiguration_s())
            for iid, i in self.instances.items()
            if i.serving == TRAIN or (i.serving == DECODE and iid not in emptying)
        ]  # fmt: skip

    def lend(self, iid: str) -> None:
        """Take an instance out of the rollout: its GPUs train (Libra's lever in an
        asynchronous campaign). The policies no longer see it, and a step they name for it
        goes to a decode instance as wide; its running and queued steps move to one now,
        with their KV; the contexts it keeps are gone (the trainer needs the memory), so a
        trajectory it held prefills again where it next runs."""
        inst = self.instances[iid]
        if inst.serving != DECODE:
            raise ValueError(f"instance {iid} serves {inst.serving}: only a decode one is lent")
        if sum(1 for i in self.instances.values() if i.serving == DECODE) == 1:
            raise ValueError(f"instance {iid} is the rollout's last decode instance")
        inst.serving = TRAIN
        self._state_list = None
        self._materialise(inst)
        for request in [*inst.core.running, *inst.core.queued()]:
            decision = Decision(iid, priority=request.priority)
            self._move_running(request.prefix_key, inst, request,
                               self._to_decode_instance(decision))  # fmt: skip
        for key in dict.fromkeys([*inst.core.prefix_cache, *inst.core.sessions]):
            inst.core.drop_prefix(key)

    def give_back(self, iid: str, ready_at: float) -> None:
        """A lent instance serves the rollout again from `ready_at` (its engine back up
        with the new weights)."""
        inst = self.instances[iid]
        if inst.serving != TRAIN:
            raise ValueError(f"instance {iid} is not lent")
        inst.serving = DECODE
        inst.paused_until = max(inst.paused_until, ready_at)
        self._state_list = None

    def _end_dropped(self, traj: _Trajectory) -> None:
        tid = traj.spec.trajectory_id
        traj.finished_at = self.now
        self._unfinished -= 1
        home = traj.view.previous_instance
        if home is not None:
            inst = self.instances[home]
            inst.sessions -= 1
            inst.core.drop_prefix(tid)
            self._refresh(inst)
            self._mark_empty(inst)
        self.policy.on_trajectory_done(
            tid, traj.spec.group_id, traj.view.generated_tokens, traj.view.step_index
        )
        self._reshape()

    # ---- moves of running steps ----------------------------------------------------------
    def _review(self) -> None:
        shown: dict[str, tuple[_Instance, EngineRequest]] = {}
        events = []
        emptying = self.policy.emptying
        for inst in self.instances.values():
            if inst.serving != DECODE:
                continue
            # Tokens made inside a decode block so far (the block is not cut to look).
            in_block = 0
            if inst.block is not None:
                in_block = max(0, inst.block.iterations_done_by(self.now - inst.block_start) - 1)
            # An instance being emptied shows every step, queued ones included.
            everything = inst.spec.instance_id in emptying
            requests = [(r, not r.is_prefilling) for r in inst.core.running]
            # A preempted decode is a step in progress too (vLLM's stream shows its tokens).
            requests += [
                (r, False) for r in inst.core.queued() if everything or r.num_output_tokens
            ]
            for request, decoding in requests:
                if not (decoding or everything or request.num_output_tokens):
                    continue
                tid = request.prefix_key
                traj = self.trajectories[tid]
                made = traj.step_offset + request.num_output_tokens + (in_block if decoding else 0)
                if made >= REVIEW_MIN_TOKENS or everything:
                    shown[tid] = (inst, request)
                    events.append(self._event(traj, made))
        if events:
            moves = self.policy.review(events, self._states(), self.now)
            for tid, decision in moves.items():
                if tid not in shown or decision.instance_id not in self.instances:
                    raise ValueError(f"policy {self.policy.name} moves {tid} to an unknown place")
                self._move_running(tid, *shown[tid], self._to_decode_instance(decision))
        self._review_pending = False
        if self._unfinished:
            self._schedule_review(self.now + REVIEW_EVERY_S)

    def _schedule_review(self, at: float) -> None:
        if self.policy.reviews and not self._review_pending:
            self._review_pending = True
            self._push(at, REVIEW, None)

    def _move_running(
        self, tid: str, inst: _Instance, request: EngineRequest, decision: Decision
    ) -> None:
        """Stop a step mid-decode (or take it out of the queue) and resume it on another
        instance after its KV moves."""
        if decision.instance_id == inst.spec.instance_id:
            return
        self._materialise(inst)
        if request.is_finished or request.request_id not in inst.core:
            if not inst.running:
                self._start(inst)
            return  # it finished at the boundary: nothing to move (a preempted one moves)
        traj = self.trajectories[tid]
        traj.step_offset += request.num_output_tokens
        inst.core.abort(request.request_id)
        tokens = inst.core.drop_prefix(tid)
        inst.in_flight -= 1
        self._refresh(inst)
        if not inst.running:
            self._start(inst)
        target = self.instances[decision.instance_id]
        target.in_flight += 1
        self._refresh(target)
        move = self._move(inst.spec.instance_id, decision.instance_id, tokens)
        if move.recompute:
            self._submit(tid, decision, 0)
        else:
            self._push(self.now + move.seconds, SUBMIT, (tid, decision, tokens))

    # ---- reshaping -----------------------------------------------------------------------
    def _reshape(self) -> None:
        changes = self.policy.reshape(self._states(), self.now)
        for change in changes:
            retired = []
            for iid in change.retire:
                inst = self.instances.get(iid)
                if inst is None or inst.in_flight or inst.sessions or inst.serving == TRAIN:
                    raise ValueError(
                        f"policy {self.policy.name} retires {iid}, which is not an idle instance"
                    )
                retired.append(self.instances.pop(iid))
            if sum(i.spec.tp for i in retired) != change.create.tp:
                raise ValueError(
                    f"policy {self.policy.name} makes TP-{change.create.tp} from "
                    f"{[i.spec.tp for i in retired]} GPUs"
                )
            self.retired += retired
            self.layout.merge(change.retire, change.create.instance_id)
            self.reconfigurations += 1
            self.reconfiguration_s += change.cost_s
            self._push(self.now + change.cost_s, READY, change.create)
        if changes:
            self._state_list = None

    def _ready(self, spec: InstanceSpec) -> None:
        if spec.instance_id in self.instances or any(
            i.spec.instance_id == spec.instance_id for i in self.retired
        ):
            raise ValueError(f"policy {self.policy.name} reuses instance id {spec.instance_id}")
        self.instances[spec.instance_id] = self._new_instance(spec)
        self._state_list = None
        self.policy.on_instance_ready(spec)

    # ---- results -----------------------------------------------------------------------
    def _result(self, wall_s: float) -> SimResult:
        trajs = list(self.trajectories.values())
        finish = sorted(t.finished_at for t in trajs)
        makespan = finish[-1] if finish else 0.0
        longest = sorted(trajs, key=lambda t: t.spec.generated_tokens, reverse=True)
        tail = longest[: max(1, len(longest) // 10)]
        everyone = {i.spec.instance_id: i for i in self.retired} | self.instances
        busy_gpu_s = sum(i.busy_s * i.spec.tp for i in everyone.values())
        return SimResult(
            policy=self.policy.name,
            makespan_s=makespan,
            generated_tokens=sum(t.view.generated_tokens for t in trajs),
            trajectories=len(trajs),
            completion_s={
                name: percentile(finish, q)
                for name, q in (("p50", 50), ("p90", 90), ("p99", 99), ("max", 100))
            },
            migrations=self.migrations,
            migration_s=self.migration_s,
            recomputed_moves=self.recomputed_moves,
            prefill_tokens=self.prefill_tokens,
            speculated_tokens=self.speculated_tokens,
            kv_handoffs=self.kv_handoffs,
            handoff_s=self.handoff_s,
            offloaded_prefill_tokens=self.offloaded_prefill_tokens,
            role_switches=self.role_switches,
            reconfigurations=self.reconfigurations,
            reconfiguration_s=self.reconfiguration_s,
            gpu_busy_frac=busy_gpu_s / (self.num_gpus * makespan) if makespan > 0 else 0.0,
            tail_queueing_s=sum(t.queued_s for t in tail) / len(tail),
            instances=[
                {
                    "instance_id": iid,
                    "tp": i.spec.tp,
                    "role": i.spec.role,
                    "busy_s": i.busy_s,
                    "kv_capacity_tokens": i.core.limits.kv_capacity_tokens,
                    "peak_kv_tokens": i.peak_kv_tokens,
                    "retired": iid not in self.instances,  # its GPUs went to a wider one
                    "emptied_at": i.emptied_at,
                    "refilled": i.refilled,
                }
                for iid, i in everyone.items()
            ],
            completion_times=[t.finished_at for t in trajs],
            busy_intervals=[(iid, a, b) for iid, i in everyone.items() for a, b in i.intervals],
            token_events=self.token_events,
            wall_s=wall_s,
        )


def _held(inst: _Instance, tid: str) -> int:
    """Tokens of a trajectory's context an instance keeps cached."""
    return inst.core.cached_tokens(tid)


def simulate(
    trace: Sequence[TrajectorySpec], policy: Policy, cluster: ClusterShape, **options: Any
) -> SimResult:
    """Run one policy on one trace on the cluster; `options` are `Simulator`'s."""
    return Simulator(trace=trace, policy=policy, cluster=cluster, **options).run()
