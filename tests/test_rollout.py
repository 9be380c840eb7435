"""A rollout batch end to end on the real Temporal dev server, simulated engines, SQLite."""

from __future__ import annotations

import asyncio
import time

import pytest

from heddle import search_attributes as sa
from heddle.trace import TraceRecord
from heddle.types import RolloutOptions, StepSpec, TrajectorySpec
from heddle.workloads import generate
from scheduler.placement import LeastLoaded
from scheduler.registry import PLANS_SPLIT, policy_names
from tests.live import count_workflows, live_client, scheduled_activities


def test_batch_of_64_completes_with_every_trajectory_recorded(
    temporal_address: str, store_url: str, queue_prefix: str
) -> None:
    records = generate("coding", prompts=4, samples=16, seed=7)
    expected_tokens = sum(r.spec.generated_tokens for r in records)
    expected_steps = {r.spec.trajectory_id: len(r.spec.steps) for r in records}

    async def run() -> None:
        async with live_client(
            temporal_address, store_url, queue_prefix, time_scale=0.03
        ) as client:
            handle = await client.start_rollout(records=records, options=RolloutOptions())
            report = await asyncio.wait_for(handle.report(), 240)

            assert report.trajectories == 64
            assert report.completed == 64
            assert report.failed == 0
            assert report.generated_tokens == expected_tokens
            assert report.makespan_s > 0
            assert report.throughput_tok_s > 0
            assert report.completion_s["max"] <= report.makespan_s + 1e-6

            rows = await client.list_trajectories(handle.batch_id)
            assert len(rows) == 64
            assert {r["status"] for r in rows} == {"completed"}
            by_id = {r.spec.trajectory_id: r.spec for r in records}
            for row in rows:
                spec = by_id[row["trajectory_id"]]
                assert row["generated_tokens"] == spec.generated_tokens
                assert row["turns"] == len(spec.steps)
                assert row["tool_calls"] == len(spec.steps) - 1
            assert client.store.count_steps(handle.batch_id) == sum(expected_steps.values())

            one = await client.inspect_trajectory(handle.batch_id, records[0].spec.trajectory_id)
            assert one is not None
            assert one["workflow"]["status"] == "COMPLETED"
            spec0 = records[0].spec
            assert [s["output_tokens"] for s in one["steps"]] == [
                s.output_tokens for s in spec0.steps
            ]
            # Its search attributes end as the trajectory did, though its steps' upserts
            # are throttled.
            desc = await client.temporal.get_workflow_handle(
                f"{handle.batch_id}/{spec0.trajectory_id}"
            ).describe()
            attrs = desc.typed_search_attributes
            assert attrs.get(sa.TURN) == len(spec0.steps)
            assert attrs.get(sa.GENERATED) == spec0.generated_tokens
            assert attrs.get(sa.INSTANCE) == one["steps"][-1]["instance_id"]
            assert attrs.get(sa.STATUS) == "completed"
            assert attrs.get(sa.PREDICTED_REMAINING) is None  # least_loaded forecasts nothing
            # A later turn of the same trajectory on the same instance finds its prefix cached.
            for prev, step in zip(one["steps"], one["steps"][1:], strict=False):
                if step["instance_id"] == prev["instance_id"]:
                    assert step["cached_tokens"] > 0

            batch = client.store.get_batch(handle.batch_id)
            assert batch is not None
            assert batch["status"] == "completed"
            assert batch["report"]["generated_tokens"] == expected_tokens

            n = await count_workflows(
                client.temporal,
                f'HeddleBatch="{handle.batch_id}" AND WorkflowType="TrajectoryWorkflow"',
                64,
            )
            assert n == 64
            done = await count_workflows(
                client.temporal, f'HeddleBatch="{handle.batch_id}" AND HeddleStatus="completed"', 64
            )
            assert done == 64

    asyncio.run(run())


def test_turn_and_token_limits_end_a_trajectory(
    temporal_address: str, store_url: str, queue_prefix: str
) -> None:
    records = generate("math", prompts=1, samples=8, seed=3)

    async def run() -> None:
        async with live_client(
            temporal_address, store_url, queue_prefix, time_scale=0.02
        ) as client:
            opts = RolloutOptions(max_turns=1, max_tokens=100)
            report = await (await client.start_rollout(records=records, options=opts)).report()
            rows = await client.list_trajectories(report.batch_id)
            for row, rec in zip(rows, records, strict=True):
                assert row["turns"] == 1
                assert row["generated_tokens"] == min(100, rec.spec.steps[0].output_tokens)
                if rec.spec.steps[0].output_tokens > 100:
                    assert row["finish_reason"] == "token_limit"
                elif len(rec.spec.steps) > 1:
                    assert row["finish_reason"] == "turn_limit"
                else:
                    assert row["finish_reason"] == "answer"
            assert report.generated_tokens == sum(r["generated_tokens"] for r in rows)

    asyncio.run(run())


def test_a_failing_trajectory_does_not_fail_the_batch(
    temporal_address: str, store_url: str, queue_prefix: str
) -> None:
    good = generate("math", prompts=1, samples=6, seed=1)
    # A context no KV cache holds (Qwen3-8B on H100 keeps ~350K tokens): the engine
    # refuses it, the step is not retried, the trajectory fails, the others complete.
    huge = TraceRecord(
        spec=TrajectorySpec("huge", "g-huge", 1_000_000, (StepSpec(output_tokens=10),))
    )

    async def run() -> None:
        async with live_client(
            temporal_address, store_url, queue_prefix, time_scale=0.02
        ) as client:
            handle = await client.start_rollout(records=[*good, huge])
            report = await asyncio.wait_for(handle.report(), 120)
            assert (report.completed, report.failed) == (6, 1)
            assert report.failed_ids == ["huge"]
            row = (await client.list_trajectories(handle.batch_id, status="failed"))[0]
            assert row["trajectory_id"] == "huge"
            assert row["finish_reason"] == "error"
            assert "RequestTooLarge" in row["error"] or "KV tokens" in row["error"]

    asyncio.run(run())


def test_real_tools_run_and_their_observations_are_stored(
    temporal_address: str, store_url: str, queue_prefix: str
) -> None:
    def step(tool: str, tool_input: str | None) -> StepSpec:
        return StepSpec(
            output_tokens=5,
            tool=tool,
            tool_latency_s=0.1,
            tool_output_tokens=1,
            tool_input=tool_input,
        )

    spec = TrajectorySpec(
        "tools", "g", 20,
        (
            step("python", "print(sum(range(10)))"),
            step("calculator", "6*7"),
            step("search", "highest mountain"),
            step("teleport", "mars"),
            step("python", "raise SystemExit(3)"),
            StepSpec(output_tokens=5),
        ),
    )  # fmt: skip

    async def run() -> None:
        async with live_client(
            temporal_address, store_url, queue_prefix, time_scale=0.02
        ) as client:
            handle = await client.start_rollout(
                records=[TraceRecord(spec=spec)], options=RolloutOptions(tools="real")
            )
            report = await asyncio.wait_for(handle.report(), 60)
            assert report.completed == 1
            got = await client.inspect_trajectory(handle.batch_id, "tools")
            assert got is not None
            steps = got["steps"]
            texts = [client.store.get_text(s["observation_ref"]) for s in steps[:5]]
            assert [s["tool_status"] for s in steps[:5]] == ["ok", "ok", "ok", "error", "error"]
            assert texts[0] == "45\n"
            assert texts[1] == "42"
            assert "Mount Everest" in texts[2]
            assert "unknown tool 'teleport'" in texts[3]
            assert steps[0]["tool_output_tokens"] == 1
            assert got["reward"] == 0.0  # the last tool call failed
            assert got["status"] == "completed"

    asyncio.run(run())


def test_in_flight_window_bounds_concurrent_trajectories(
    temporal_address: str, store_url: str, queue_prefix: str
) -> None:
    records = generate("math", prompts=1, samples=16, seed=8)

    async def run() -> None:
        async with live_client(
            temporal_address, store_url, queue_prefix, time_scale=0.02
        ) as client:
            handle = await client.start_rollout(
                records=records, options=RolloutOptions(max_in_flight=4)
            )
            report = await asyncio.wait_for(handle.report(), 120)
            assert report.completed == 16
            rows = await client.list_trajectories(handle.batch_id)
            events = sorted(
                [(r["started_at"], 1) for r in rows] + [(r["finished_at"], -1) for r in rows]
            )
            live = peak = 0
            for _, delta in events:
                live += delta
                peak = max(peak, live)
            assert peak == 4

    asyncio.run(run())


@pytest.mark.parametrize("policy", policy_names())
def test_every_live_policy_completes_a_batch(
    temporal_address: str, store_url: str, queue_prefix: str, policy: str
) -> None:
    records = generate("math", prompts=1, samples=6, seed=4, iteration=1)

    async def run() -> None:
        async with live_client(
            temporal_address, store_url, queue_prefix, time_scale=0.02
        ) as client:
            if policy in PLANS_SPLIT:
                # Heddle plans from the batch before: roll out the earlier iteration first.
                earlier = generate("math", prompts=1, samples=6, seed=4, iteration=0)
                first = await client.start_rollout(records=earlier)
                await asyncio.wait_for(first.report(), 120)
            handle = await client.start_rollout(
                records=records, options=RolloutOptions(policy=policy)
            )
            report = await asyncio.wait_for(handle.report(), 120)
            assert report.completed == 6
            assert report.policy == policy
            assert report.generated_tokens == sum(r.spec.generated_tokens for r in records)
            if policy in PLANS_SPLIT:
                # The cluster now runs the batch's planned split, and the steps ran there.
                plan = await client.cluster_plan()
                ids = {i.instance_id for i in plan.instances}
                tag = handle.batch_id.rsplit("-", 1)[-1][:8]
                assert all(i.startswith(f"{tag}-h") for i in ids)
                assert sum(i.tp for i in plan.instances) == 4
                for r in records:
                    row = client.store.get_trajectory(handle.batch_id, r.spec.trajectory_id)
                    assert row is not None
                    assert {st["instance_id"] for st in row["steps"]} <= ids

    asyncio.run(run())


def _register(monkeypatch: pytest.MonkeyPatch, name: str, placement: type) -> None:
    """Register a test placement as a policy (FCFS, TP-1 instances) for one test."""
    from scheduler import registry
    from scheduler.interface import Policy
    from scheduler.order import FirstComeFirstServed
    from scheduler.split import Homogeneous

    monkeypatch.setitem(
        registry.POLICIES,
        name,
        lambda ctx: Policy(name, FirstComeFirstServed(), placement(), Homogeneous(1)),
    )


class _PingPong(LeastLoaded):
    """Test placement: each step on the other instance of i0/i1, its KV migrated."""

    migrate = True  # the trajectory moves as soon as its step ends, during its tool call

    def place(self, event, instances, now):  # type: ignore[no-untyped-def]
        from heddle.types import Decision

        target = f"i{event.step_index % 2}"
        return Decision(target, reason="ping_pong", migrate=event.previous_instance is not None)


def test_a_migrated_trajectory_finds_its_kv_on_the_new_instance(
    temporal_address: str, store_url: str, queue_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _register(monkeypatch, "test-ping-pong", _PingPong)
    steps = (*(StepSpec(40, "python", 5.0, "ok", 30) for _ in range(3)), StepSpec(40))
    records = [TraceRecord(TrajectorySpec(f"m{k}", "g", 200, steps, "coding")) for k in range(3)]

    async def run() -> None:
        async with live_client(
            temporal_address, store_url, queue_prefix, time_scale=0.02
        ) as client:
            handle = await client.start_rollout(
                records=records, options=RolloutOptions(policy="test-ping-pong")
            )
            report = await asyncio.wait_for(handle.report(), 120)
            assert report.completed == 3
            for r in records:
                row = client.store.get_trajectory(handle.batch_id, r.spec.trajectory_id)
                assert row is not None
                assert [st["instance_id"] for st in row["steps"]] == ["i0", "i1", "i0", "i1"]
                # After the first step every turn starts on an instance it has not run on
                # just before, yet finds its whole earlier context there: the KV moved.
                for st in row["steps"][1:]:
                    assert st["cached_tokens"] >= st["context_tokens"] - 30 - 1
                history = await client.temporal.get_workflow_handle(
                    f"{handle.batch_id}/{r.spec.trajectory_id}"
                ).fetch_history()
                # The engine host moved the KV as each step ended, while the tool ran
                # (a replayed tool is a timer): one activity per LLM step, nothing else.
                order = list(scheduled_activities(history).values())
                assert order == ["generate"] * 4

    asyncio.run(run())


class _MoveLongDecodes(_PingPong):
    """Test placement: every step on i0; a long decode in progress moves to i1."""

    def place(self, event, instances, now):  # type: ignore[no-untyped-def]
        from heddle.types import Decision

        return Decision("i0", reason="fixed")

    def review(self, events, instances, now):  # type: ignore[no-untyped-def]
        from heddle.types import Decision

        return {e.trajectory_id: Decision("i1", reason="test") for e in events
                if e.previous_instance == "i0"}  # fmt: skip


class _EmptyI0(_MoveLongDecodes):
    """Test placement: every step starts on i0, which it is emptying: the review moves
    each to i1, however few tokens it has made."""

    emptying = ("i0",)


@pytest.mark.parametrize(
    ("placement", "tokens"),
    [
        # 6,000 tokens at TP 1 take ~40 s of cluster time: reviewed every 5 s, shown
        # once past 2,048 tokens, moved at the next review.
        (_MoveLongDecodes, 6000),
        # 1,500 tokens, under those 2,048: shown only because i0 is being emptied.
        (_EmptyI0, 1500),
    ],
    ids=["long-decode", "emptied-instance"],
)
def test_a_decode_moves_mid_step_and_makes_each_token_once(
    temporal_address: str,
    store_url: str,
    queue_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    placement: type,
    tokens: int,
) -> None:
    _register(monkeypatch, "test-move", placement)
    spec = TrajectorySpec("t", "g", 200, (StepSpec(tokens),), "math")

    async def run() -> None:
        async with live_client(
            temporal_address, store_url, queue_prefix, time_scale=0.05
        ) as client:
            handle = await client.start_rollout(
                records=[TraceRecord(spec)], options=RolloutOptions(policy="test-move")
            )
            report = await asyncio.wait_for(handle.report(), 120)
            assert (report.completed, report.generated_tokens) == (1, tokens)
            row = client.store.get_trajectory(handle.batch_id, "t")
            assert row is not None
            assert [(st["instance_id"], st["output_tokens"]) for st in row["steps"]] == [
                ("i1", tokens)
            ]
            history = await client.temporal.get_workflow_handle(
                f"{handle.batch_id}/t"
            ).fetch_history()
            kinds = list(scheduled_activities(history).values())
            # The part on i0 and the rest on i1 are one activity: the engine host that
            # stopped the decode moved its KV and went on.
            assert kinds == ["generate"]

    asyncio.run(run())


def test_a_batch_of_many_slices_runs_every_trajectory_once_longest_expected_first(
    temporal_address: str, store_url: str, queue_prefix: str
) -> None:
    """Over `SLICE_SIZE` trajectories the batch fans out through slices, slice k taking
    positions k, k + S, ...; the client stores the batch longest expected first (by the
    earlier batch's prompts), so the slices start it in that order. Every trajectory
    runs exactly once."""
    from heddle.types import SliceInput
    from workflows.batch import SLICE_SIZE

    prompts = 9  # 144 trajectories: three slices, the last one short
    earlier = generate("coding", prompts=prompts, samples=16, seed=3, iteration=0)
    records = generate("coding", prompts=prompts, samples=16, seed=3, iteration=1)
    assert SLICE_SIZE * 2 < len(records) < SLICE_SIZE * 3
    made: dict[str, list[int]] = {}
    for r in earlier:
        made.setdefault(r.spec.group_id.split("-", 1)[1], []).append(r.spec.generated_tokens)
    expected = {p: sum(v) / len(v) for p, v in made.items()}

    async def run() -> None:
        async with live_client(
            temporal_address, store_url, queue_prefix, time_scale=0.002
        ) as client:
            # The earlier iteration, stored as a batch (the order reads its specs only).
            client.store.create_batch(batch_id=f"earlier-{queue_prefix}", records=earlier,
                                      options=RolloutOptions(), source="test",
                                      created_at=time.time() - 1)  # fmt: skip
            handle = await client.start_rollout(records=records, options=RolloutOptions())
            report = await asyncio.wait_for(handle.report(), 300)
            assert (report.trajectories, report.completed) == (len(records), len(records))
            assert report.generated_tokens == sum(r.spec.generated_tokens for r in records)
            rows = await client.list_trajectories(handle.batch_id)  # in position order
            assert sorted(r["trajectory_id"] for r in rows) == sorted(
                r.spec.trajectory_id for r in records
            )
            ranked = [expected[r["group_id"].split("-", 1)[1]] for r in rows]
            assert ranked == sorted(ranked, reverse=True)
            assert ranked[0] > ranked[-1]
            steps = sum(len(r.spec.steps) for r in records)
            assert client.store.count_steps(handle.batch_id) == steps
            history = await handle.workflow.fetch_history()
            slices = [
                client.temporal.data_converter.payload_converter.from_payloads(
                    e.start_child_workflow_execution_initiated_event_attributes.input.payloads,
                    [SliceInput],
                )[0]
                for e in history.events
                if e.HasField("start_child_workflow_execution_initiated_event_attributes")
            ]
            assert [(s.offset, s.stride, s.count) for s in slices] == [
                (k, 3, len(range(k, len(records), 3))) for k in range(3)
            ]

    asyncio.run(run())


class _ReservingOrder:
    """Test order: every trajectory reserves 4,000 tokens of KV on its engine; "long"
    goes first."""

    queue = "priority"

    def priority(self, event, now):  # type: ignore[no-untyped-def]
        return -1 if event.trajectory_id == "long" else 0

    def reserve_kv_tokens(self, event):  # type: ignore[no-untyped-def]
        return 4000


class _AllOnI0(LeastLoaded):
    def place(self, event, instances, now):  # type: ignore[no-untyped-def]
        from heddle.types import Decision

        return Decision("i0", reason="fixed")


class _EvictionsSeen:
    """Test order: "a" goes first; it records what each decide says of an eviction."""

    queue = "priority"

    def __init__(self) -> None:
        self.seen: dict[tuple[str, int], bool] = {}

    def priority(self, event, now):  # type: ignore[no-untyped-def]
        self.seen[(event.trajectory_id, event.step_index)] = event.context_evicted
        return -1 if event.trajectory_id == "a" else 0


def test_a_step_that_finds_its_context_evicted_says_so_at_its_next_decide(
    temporal_address: str, store_url: str, queue_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Live, on simulated engines (Qwen3-32B on one H100: 9,155 tokens of KV): "c" runs
    alone and its second step finds its context cached; "a" (3,000 tokens) is in its
    tool call when "b" (8,000) needs the cache, so a's second step finds its context
    evicted, and its decide after that step says so (`TrajectoryView.context_evicted`),
    which is what turns Heddle's queue key from the remaining to the total."""
    from heddle.config import ClusterConfig
    from scheduler import registry
    from scheduler.interface import Policy
    from scheduler.split import Homogeneous

    order = _EvictionsSeen()
    monkeypatch.setitem(
        registry.POLICIES, "test-evictions",
        lambda ctx: Policy("test-evictions", order, _AllOnI0(), Homogeneous(1)),
    )  # fmt: skip
    # a's first tool call lasts 60 s (3 s at this time scale): b runs within it.
    steps = (StepSpec(40, "python", 60.0, "ok", 30), StepSpec(40, "python", 0.1, "ok", 30),
             StepSpec(40))  # fmt: skip
    alone = [TraceRecord(TrajectorySpec("c", "g", 3000, steps, "coding"))]
    a = [TraceRecord(TrajectorySpec("a", "g", 3000, steps, "coding"))]
    b = [TraceRecord(TrajectorySpec("b", "g", 8000, (StepSpec(200),), "coding"))]
    cluster = ClusterConfig(model="qwen3-32b", gpu="h100", num_gpus=2, default_tp=1)
    options = RolloutOptions(policy="test-evictions")

    async def run() -> None:
        async with live_client(
            temporal_address, store_url, queue_prefix, cluster=cluster
        ) as client:
            first = await client.start_rollout(records=alone, options=options)
            assert (await asyncio.wait_for(first.report(), 120)).completed == 1
            handle = await client.start_rollout(records=a, options=options)
            while ("a", 0) not in order.seen:  # noqa: ASYNC110 (the policy's record)
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)  # its first step ends (about 1 s modelled): its tool
            second = await client.start_rollout(records=b, options=options)
            for h in (handle, second):
                assert (await asyncio.wait_for(h.report(), 120)).completed == 1
            row = client.store.get_trajectory(handle.batch_id, "a")
        assert row is not None
        assert row["steps"][1]["cached_tokens"] < 1500  # b's prefill evicted it
        assert order.seen[("c", 1)] is False
        assert order.seen[("c", 2)] is False
        assert order.seen[("a", 1)] is False  # nothing ran before it: nothing lost
        assert order.seen[("a", 2)] is True

    asyncio.run(run())


def test_an_engine_holds_the_trajectories_it_reserved_for_and_admits_the_rest_after(
    temporal_address: str, store_url: str, queue_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Live, on simulated engines: Qwen3-32B on one H100 holds 9,155 tokens of KV, room
    for two reservations of 4,000. On one instance a long decode runs beside one short
    trajectory, whose turns find their context cached; the two others start only once
    it has ended. (With nothing running nor waiting the engine would admit one anyway:
    it never idles with work.)"""
    from heddle.client import HeddleClient
    from heddle.config import ClusterConfig
    from scheduler import registry
    from scheduler.interface import Policy
    from scheduler.split import Homogeneous
    from tests.live import in_process_worker

    monkeypatch.setitem(
        registry.POLICIES, "test-reserving",
        lambda ctx: Policy("test-reserving", _ReservingOrder(), _AllOnI0(), Homogeneous(1)),
    )  # fmt: skip
    steps = (*(StepSpec(40, "python", 1.0, "ok", 30) for _ in range(2)), StepSpec(40))
    long = [TraceRecord(TrajectorySpec("long", "g", 2000, (StepSpec(3000),), "coding"))]
    short = [TraceRecord(TrajectorySpec(f"r{k}", "g", 2000, steps, "coding")) for k in range(3)]
    cluster = ClusterConfig(model="qwen3-32b", gpu="h100", num_gpus=2, default_tp=1)
    options = RolloutOptions(policy="test-reserving")

    async def run() -> None:
        async with in_process_worker(
            temporal_address, store_url, queue_prefix, time_scale=0.05, cluster=cluster
        ):
            client = await HeddleClient.connect(
                temporal_address, store_url=store_url, queue_prefix=queue_prefix
            )
            async with client:
                # The long one first, in a batch of its own: were the short ones there
                # first, the engine would admit each while the others are in tool calls.
                first = await client.start_rollout(records=long, options=options)
                while (await first.progress())["started"] < 1:  # noqa: ASYNC110 (the store)
                    await asyncio.sleep(0.05)
                await asyncio.sleep(0.5)  # its step reaches the engine (3.8 s of decode)
                second = await client.start_rollout(records=short, options=options)
                for handle, n in ((first, 1), (second, 3)):
                    report = await asyncio.wait_for(handle.report(), 120)
                    assert report.completed == n
                get = client.store.get_trajectory
                long_row = get(first.batch_id, "long")
                rows = [get(second.batch_id, r.spec.trajectory_id) for r in short]
        spans = []
        for row in rows:
            assert row is not None
            for st in row["steps"][1:]:
                assert st["cached_tokens"] >= st["context_tokens"] - 30 - 1
            spans.append((row["steps"][0]["gen_started_at"], row["steps"][-1]["gen_finished_at"]))
        spans.sort()
        assert long_row is not None
        assert long_row["steps"][0]["gen_finished_at"] > spans[1][0]  # it ran throughout
        assert spans[1][0] >= spans[0][1]
        assert spans[2][0] >= spans[0][1]

    asyncio.run(run())
