"""The live scheduler service: soft state around the pure policies.

It keeps how many decided steps each instance has in flight and where each trajectory
last ran, asks the policy, and forgets everything on restart without harm: a lost count
only skews a few decisions.

Besides the engine's own request priority, a decision carries a Temporal task-queue
priority (`priority_key`, 1 first to 5 last): the step's place among the last
`PRIORITY_WINDOW` decisions' priorities, in `PRIORITY_BUCKETS` equal-count buckets, so a
backlogged engine queue hands out the most urgent steps first whatever the policy's scale.
"""

from __future__ import annotations

import bisect
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from dataclasses import replace

from heddle.types import (
    DecideRequest,
    Decision,
    InstancePlan,
    StepReport,
    TrajectoryDone,
    TrajectorySpec,
    TrajectoryView,
)
from scheduler.interface import (
    REVIEW_MIN_TOKENS,
    InstanceSpec,
    InstanceState,
    Policy,
    PolicyContext,
)
from scheduler.plan import initial_plan
from scheduler.registry import create_policy


class BatchNotPlanned(LookupError):
    """A planned batch's decide reached a service without its plan (it restarted)."""

    def __init__(self, policy: str, batch_id: str) -> None:
        super().__init__(f"batch {batch_id} ({policy}) is not planned in this service")
        self.policy = policy
        self.batch_id = batch_id


PRIORITY_BUCKETS = 5
PRIORITY_WINDOW = 1024


class PriorityBuckets:
    """Equal-count buckets over a sliding window of recent priorities (lower first)."""

    def __init__(self, buckets: int = PRIORITY_BUCKETS, window: int = PRIORITY_WINDOW) -> None:
        self.buckets = buckets
        self._recent: deque[int] = deque(maxlen=window)
        self._sorted: list[int] = []

    def key(self, priority: int) -> int:
        if len(self._recent) == self._recent.maxlen:
            old = self._recent[0]
            del self._sorted[bisect.bisect_left(self._sorted, old)]
        self._recent.append(priority)
        bisect.insort(self._sorted, priority)
        if len(self._sorted) == 1 or self._sorted[0] == self._sorted[-1]:
            return (self.buckets + 1) // 2  # nothing to rank against: the middle
        below = bisect.bisect_left(self._sorted, priority)
        return 1 + min(self.buckets - 1, below * self.buckets // len(self._sorted))


class SchedulerService:
    def __init__(
        self,
        *,
        instance_ids: Sequence[str] = (),
        context: PolicyContext | None = None,
        tps: Mapping[str, int] | None = None,
    ) -> None:
        self.context = context or PolicyContext()
        self.instance_ids: list[str] = []
        self.tps: dict[str, int] = {}
        self._offered_before: dict[str, int] = {}  # every instance ever offered: its TP
        self.in_flight: dict[str, int] = {}
        # Where each trajectory's one step in flight runs: a decide made again for the same
        # step (its workflow task retried, the first result lost) replaces it rather than
        # counting a second step, which no report would ever take back (a retired
        # instance then never drains).
        self._running: dict[str, str] = {}
        self.kv_usage: dict[str, float] = {}
        self._last_instance: dict[str, str] = {}
        # Trajectories whose first step was decided here, by batch: a lend to the trainer
        # waits until they stop growing, or until a batch has all started
        # (`activities.control`).
        self.started_by_batch: Counter[str] = Counter()
        # Policies by (name, batch): "" for the shared one of a policy that plans nothing.
        self._policies: dict[tuple[str, str], Policy] = {}
        self._buckets: dict[tuple[str, str], PriorityBuckets] = {}
        # A planned batch's instance ids: the policy's -> the cluster's.
        self._live_ids: dict[tuple[str, str], dict[str, str]] = {}
        # Each trajectory's latest decide request: what a mid-step review starts from.
        self._last_request: dict[str, DecideRequest] = {}
        tps = tps or {}
        self.set_instances({i: tps.get(i, self.context.cluster.default_tp) for i in instance_ids})

    def set_instances(self, tps: Mapping[str, int]) -> None:
        """The instances that take steps now (the cluster plan's active ones). Counts of
        steps still running on an instance that left are kept until they report. A
        planning policy hears when an instance it asked for comes up."""
        new = [i for i in tps if i not in self.tps]
        self.instance_ids = list(tps)
        self.tps = dict(tps)
        self._offered_before.update(tps)
        for iid in self.instance_ids:
            self.in_flight.setdefault(iid, 0)
        for key, live in self._live_ids.items():
            ours = {v: k for k, v in live.items()}
            for iid in new:
                if iid in ours:
                    self._policies[key].on_instance_ready(InstanceSpec(ours[iid], tps[iid]))

    def observe_loads(
        self, loads: Mapping[str, int], kv_usage: Mapping[str, float] | None = None
    ) -> None:
        """What each hosted engine reports: the steps it holds and its KV cache use. A
        restarted service counts from zero while the steps that were in flight run on
        (retried by their workflows); a count is never left below what its engine holds,
        so those steps are seen again."""
        for iid, load in loads.items():
            if iid in self.in_flight:
                self.in_flight[iid] = max(self.in_flight[iid], load)
        self.kv_usage.update(kv_usage or {})

    @property
    def trajectories_started(self) -> int:
        return self.started_by_batch.total()

    def load_by_instance(self) -> dict[str, int]:
        """Per instance, the trajectories whose last step it ran and the steps on it."""
        load = Counter(self._last_instance.values())
        for iid, n in self.in_flight.items():
            load[iid] += n
        return dict(load)

    def tool_users(self) -> int:
        """Trajectories started and not finished that are between steps (in a tool call)
        or ran a tool before the step they run."""
        return sum(
            1
            for tid in self._last_instance
            if tid not in self._running
            or ((r := self._last_request.get(tid)) is not None and r.view.num_tool_calls)
        )

    def reviews(self) -> bool:
        """Whether any policy here reviews steps in progress (else a review is a no-op)."""
        return any(policy.reviews for policy in self._policies.values())

    def emptying(self) -> set[str]:
        """The instances (the cluster's ids) a policy is emptying: their queued steps are
        worth showing to `review`; elsewhere only long decodes are."""
        return {
            (self._live_ids.get(key) or {}).get(iid, iid)
            for key, policy in self._policies.items()
            for iid in policy.emptying
        }

    def reshapes(self, now: float) -> list[tuple[list[str], str, int]]:
        """Changes the planning policies want to the split during rollout (the
        simulator's `Reshaper`), as (instances to retire, new instance, its TP) in the
        cluster's ids."""
        wanted = []
        for key, live in self._live_ids.items():
            _, _, states = self._view(key)
            for change in self._policies[key].reshape(states, now):
                tag = key[1].rsplit("-", 1)[-1][:8]
                live[change.create.instance_id] = f"{tag}-{change.create.instance_id}"
                wanted.append(
                    ([live[i] for i in change.retire], live[change.create.instance_id],
                     change.create.tp)
                )  # fmt: skip
        return wanted

    def _key(self, name: str, batch_id: str, planned: bool = False) -> tuple[str, str]:
        key = (name, batch_id)
        if planned and key not in self._policies:
            raise BatchNotPlanned(name, batch_id)
        if key not in self._policies:
            key = (name, "")
            if key not in self._policies:
                self._policies[key] = create_policy(name, self.context)
                self._buckets[key] = PriorityBuckets()
        return key

    def is_planned(self, name: str, batch_id: str) -> bool:
        return (name, batch_id) in self._policies

    def plan_batch(
        self,
        name: str,
        batch_id: str,
        specs: Sequence[TrajectorySpec],
        history: Sequence[TrajectorySpec],
    ) -> list[InstancePlan]:
        """Plan a batch before its first step (Heddle: forecast, TP split, groups); the
        split comes back as the cluster's instances, under ids of this batch. Planning is
        deterministic, so a restarted service that plans the batch again from the store
        gets the split the cluster runs."""
        ctx = replace(self.context, history=tuple(history), truth=tuple(specs))
        policy = create_policy(name, ctx)
        policy.on_batch_start([TrajectoryView.first(s) for s in specs])
        split = policy.split.instances(ctx.cluster.num_gpus)
        tag = batch_id.rsplit("-", 1)[-1][:8]
        live = {s.instance_id: f"{tag}-{s.instance_id}" for s in split}
        key = (name, batch_id)
        self._policies[key], self._buckets[key], self._live_ids[key] = (
            policy, PriorityBuckets(), live)  # fmt: skip
        plan = initial_plan(
            [live[s.instance_id] for s in split], [s.tp for s in split], ctx.cluster.num_gpus,
            ctx.cluster.tp_choices,
        )  # fmt: skip
        return plan.instances

    def _view(
        self, key: tuple[str, str]
    ) -> tuple[dict[str, str], dict[str, str], list[InstanceState]]:
        """The policy's ids -> the cluster's (identity unless the batch planned), the
        reverse, and the policy's view of the instances that take steps."""
        live = self._live_ids.get(key) or {i: i for i in self.instance_ids}
        ours = {v: k for k, v in live.items()}
        sessions = Counter(self._last_instance.values())
        states = [
            InstanceState(
                ours[i],
                num_in_flight=self.in_flight[i],
                num_sessions=sessions[i],
                tp=self.tps[i],
                kv_usage=self.kv_usage.get(i, 0.0),
            )
            for i in live.values()
            if i in self.tps
        ]
        return live, ours, states

    def _offered(self, target: str) -> str:
        """A planning policy may name an instance of its plan that takes no steps now but
        did (it serves prefill, or its engine died): the step goes to the least busy
        offered instance as wide, or any. One not up yet (a reshape's) is waited for."""
        tp = self._offered_before.get(target)
        if target in self.tps or not self.tps or tp is None:
            return target
        same = [i for i in self.instance_ids if self.tps[i] == tp] or self.instance_ids
        return min(same, key=lambda i: (self.in_flight.get(i, 0), i))

    def _previous(self, request: DecideRequest) -> str | None:
        """Where the trajectory last ran: this service's record, else the workflow's."""
        own = self._last_instance.get(request.trajectory_id)
        return own or request.view.previous_instance or None

    def decide(self, request: DecideRequest, now: float) -> Decision:
        key = self._key(request.policy, request.batch_id, request.planned)
        live, ours, states = self._view(key)
        if not states:
            # The decide activity is retried: steps wait for the plan, not fail.
            raise RuntimeError("no engine instance of this batch's plan takes steps yet")
        previous = self._previous(request)
        # Its instance was retired (its KV went with it), or is not this batch's.
        previous_ours = ours.get(previous) if previous in self.tps else None
        decision = self._policies[key].decide(request.view.on(previous_ours), states, now)
        target = self._offered(live.get(decision.instance_id, decision.instance_id))
        decision = replace(
            decision,
            instance_id=target,
            migrate=decision.migrate and previous is not None and target != previous,
            priority_key=self._buckets[key].key(decision.priority),
            anticipate=self._policies[key].migrates,
        )
        self._start(request.trajectory_id, decision.instance_id)
        if request.trajectory_id not in self._last_instance:
            self.started_by_batch[request.batch_id] += 1
        self._last_instance[request.trajectory_id] = decision.instance_id
        self._last_request[request.trajectory_id] = request
        return decision

    def anticipate(self, request: DecideRequest, now: float) -> Decision | None:
        """Re-predict a trajectory as its LLM step ends (`request` is that moment's view,
        before the tool's result) and return the move its new rank calls for, if any: the
        workflow migrates it while the tool runs, and the next decide finds it there. No
        step starts, so nothing is counted in flight."""
        key = self._key(request.policy, request.batch_id, request.planned)
        policy = self._policies[key]
        previous = self._previous(request)
        live, ours, states = self._view(key)
        if not policy.migrates or previous not in ours or not states:
            return None
        decision = policy.decide(request.view.on(ours[previous]), states, now)
        target = live[decision.instance_id]
        if not decision.migrate or target == previous:
            return None
        self._last_instance[request.trajectory_id] = target
        return replace(decision, instance_id=target)

    def review(
        self, running: Sequence[tuple[str, str, int]], now: float
    ) -> list[tuple[str, str, str]]:
        """Mid-step moves, as in the simulator: `running` holds (instance, trajectory,
        context now) for each step in progress or queued; a reviewing policy may move one
        that has made `REVIEW_MIN_TOKENS` in its turn, or any on an instance it is
        emptying. Returns (trajectory, from, to)."""
        shown: dict[tuple[str, str], list[tuple[TrajectoryView, str]]] = {}
        # Per batch, once a review: the cluster's ids -> the policy's, and what it empties
        # (None: the policy does not review).
        views: dict[tuple[str, str], tuple[dict[str, str], frozenset[str]] | None] = {}
        for instance_id, tid, context in running:
            request = self._last_request.get(tid)
            if request is None:
                continue
            key = self._key(request.policy, request.batch_id)
            if key not in views:
                policy = self._policies[key]
                ours = {v: k for k, v in (self._live_ids.get(key) or {}).items()}
                views[key] = (ours, policy.emptying) if policy.reviews else None
            view = views[key]
            if view is None:
                continue
            made = context - request.view.context_tokens
            here = view[0].get(instance_id, instance_id)
            if made < REVIEW_MIN_TOKENS and here not in view[1]:
                continue
            event = request.view.on(here).in_progress(made)
            shown.setdefault(key, []).append((event, instance_id))
        moves = []
        for key, items in shown.items():
            live, _, states = self._view(key)
            decisions = self._policies[key].review([e for e, _ in items], states, now)
            source = {e.trajectory_id: i for e, i in items}
            for tid, decision in decisions.items():
                target = live[decision.instance_id]
                if target == source[tid]:
                    continue
                self._start(tid, target)  # the continued step reports there
                self._last_instance[tid] = target
                moves.append((tid, source[tid], target))
        return moves

    def _start(self, trajectory_id: str, instance_id: str) -> None:
        """The trajectory's step is in flight on `instance_id` (and nowhere else)."""
        self._release(self._running.get(trajectory_id))
        self._running[trajectory_id] = instance_id
        self.in_flight[instance_id] = self.in_flight.get(instance_id, 0) + 1

    def _release(self, instance_id: str | None) -> None:
        if instance_id is not None and self.in_flight.get(instance_id, 0) > 0:
            self.in_flight[instance_id] -= 1

    def report(self, report: StepReport) -> None:
        """A step ended (or left `report.instance_id` to go on elsewhere). A report of a
        step the service does not know (decided before a restart) takes one off its
        instance's count; one of a step superseded by a later decide or move, nothing."""
        running = self._running.get(report.trajectory_id)
        if running == report.instance_id:
            del self._running[report.trajectory_id]
            self._release(running)
        elif running is None:
            self._release(report.instance_id)

    def finished(self, done: TrajectoryDone) -> None:
        self._release(self._running.pop(done.trajectory_id, None))
        self._last_instance.pop(done.trajectory_id, None)
        self._last_request.pop(done.trajectory_id, None)
        key = (done.policy, done.batch_id)
        if key not in self._policies:
            key = (done.policy, "")
        policy = self._policies.get(key)  # none: it decided nothing here (a restart)
        if policy is not None:
            policy.on_trajectory_done(
                done.trajectory_id, done.group_id, done.generated_tokens, done.turns
            )
