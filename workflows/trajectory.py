"""One trajectory: LLM step, tool call, observation, repeated until an answer or a limit."""

from __future__ import annotations

import dataclasses
import zlib
from typing import Any

from temporalio import workflow
from temporalio.common import Priority, SearchAttributeUpdate
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from heddle import activity_names as names
    from heddle import search_attributes as sa
    from heddle.queues import control_queue, engine_queue, tools_queue
    from heddle.types import (
        AgentTurn,
        DecideRequest,
        Decision,
        GenerateRequest,
        GenerateResult,
        MigrateRequest,
        RewardRequest,
        RolloutOptions,
        StepRecord,
        StepReport,
        StepSpec,
        StepText,
        ToolCallRecord,
        ToolRequest,
        ToolResult,
        TrajectoryDone,
        TrajectoryEnd,
        TrajectoryInput,
        TrajectoryStarted,
        TrajectorySummary,
        TrajectoryView,
        Verdict,
        VerifyRequest,
    )
    from workflows import policy


# Workflows started before the tool call hid the move replay without it.
ANTICIPATE_PATCH = "anticipate-during-tool"
# The lean step path: every scheduler call a local activity, the engine host keeping the
# step's books (report, KV moves, the re-prediction during the tool call), the reward a
# local activity. Workflows started before it replay their activities as recorded.
LEAN_PATCH = "lean-step"
# On the lean path, a replayed tool is waited out by the engine host's step activity
# (`GenerateRequest.then_wait_s`): one workflow task a step instead of two and a timer.
# Workflows started before it wait replayed tools on timers.
TOOL_IN_STEP_PATCH = "replayed-tool-in-step"
# A step's search attributes (turn, instance, tokens) are upserted when the trajectory
# moves to another instance, or once this many seconds of workflow time have passed since
# the last upsert; its end always is. Each upsert is a visibility write that cost the
# server about 4 ms at 1,000 trajectories and more as the table grows, which tiny steps
# paid every step; a dashboard refreshes no faster. Workflows started before it upsert
# every step.
UPSERT_PATCH = "throttled-upserts"
UPSERT_EVERY_S = 1.0
# A trajectory's end is one local activity (`names.END_TRAJECTORY`: the last step's
# record, the reward, the summary, the scheduler told) where there were four: the worker's
# CPU a step on 6,400 tiny trajectories fell from 22.8 to 19.7 ms (the server's stayed at
# about 38 ms). Workflows started before it replay the four.
END_PATCH = "one-end-activity"
# The step upserts come at most once each `UPSERT_EVERY_S` of workflow time from the
# trajectory's start, a move to another instance included (the instance shown lags by
# under a second): a trajectory shorter than that makes one visibility write, its end,
# where it made up to three (first placement, a move, the end). Workflows started before
# it upsert on every move and at the first step.
UPSERT_EACH_S_PATCH = "upserts-each-second"
# The shortest timer a replayed tool waits (Temporal's timers are milliseconds).
MIN_TIMER_S = 0.001


def _decide_request(inp: TrajectoryInput, view: TrajectoryView, instance: str) -> DecideRequest:
    """A decide for the trajectory as `view` sees it, its last step on `instance`."""
    opts = inp.options
    return DecideRequest(view.on(instance), opts.policy, inp.batch_id, opts.plans_split)


def _replays_tools(opts: RolloutOptions) -> bool:
    """Tools are the trace's latencies, waited on the stack's clock (real ones run)."""
    return opts.tools == "replay" and opts.time_scale > 0


def _replayed(request: ToolRequest) -> ToolResult:
    """A replayed tool's result: the trace's."""
    return ToolResult(
        status=request.status, output_tokens=request.output_tokens, latency_s=request.latency_s
    )


def _step_record(
    inp: TrajectoryInput, index: int, generated: GenerateResult, context_tokens: int
) -> StepRecord:
    """What the store keeps of a step's LLM part (its tool, if any, is added after)."""
    return StepRecord(
        batch_id=inp.batch_id,
        trajectory_id=inp.spec.trajectory_id,
        step_index=index,
        instance_id=generated.instance_id,
        context_tokens=context_tokens,
        output_tokens=generated.output_tokens,
        cached_tokens=generated.cached_tokens,
        queued_s=generated.queued_s,
        gen_started_at=generated.started_at,
        gen_finished_at=generated.finished_at,
        attempt=generated.attempt,
        resumed_tokens=generated.resumed_tokens,
    )


def _engine_dead_tokens(exc: ActivityError) -> int | None:
    """The tokens a step made before its engine died, or None for any other failure."""
    cause = exc.cause
    if isinstance(cause, ApplicationError) and cause.type == names.ENGINE_DEAD:
        return int(cause.details[0]) if cause.details else 0
    return None


@workflow.defn(name="TrajectoryWorkflow")
class TrajectoryWorkflow:
    def __init__(self) -> None:
        self._turn = 0
        self._generated = 0
        self._instance = ""
        self._lean = False
        self._tool_in_step = False
        self._throttles_upserts = False
        self._upserted_at: float | None = None  # workflow time of the last step upsert
        self._predicted = -1  # the last decision's forecast of remaining tokens
        self._ends_at_once = False
        self._upserts_each_second = False
        self._last_call = ""  # an agent trajectory's last tool call, for the UI

    @workflow.query
    def progress(self) -> dict[str, int | str]:
        return {"turn": self._turn, "generated_tokens": self._generated, "instance": self._instance}

    @workflow.run
    async def run(self, inp: TrajectoryInput) -> TrajectorySummary:
        spec, opts = inp.spec, inp.options
        self._lean = workflow.patched(LEAN_PATCH)
        self._tool_in_step = self._lean and workflow.patched(TOOL_IN_STEP_PATCH)
        self._throttles_upserts = self._tool_in_step and workflow.patched(UPSERT_PATCH)
        self._ends_at_once = self._throttles_upserts and workflow.patched(END_PATCH)
        self._upserts_each_second = self._ends_at_once and workflow.patched(UPSERT_EACH_S_PATCH)
        if self._upserts_each_second:
            self._upserted_at = workflow.now().timestamp()
        last_step: StepRecord | None = None  # the last step's record, written at the end
        started_at = workflow.now().timestamp()
        await workflow.execute_local_activity(
            names.MARK_STARTED,
            TrajectoryStarted(inp.batch_id, spec.trajectory_id, started_at),
            start_to_close_timeout=policy.STORE_TIMEOUT,
            retry_policy=policy.STORE_RETRY,
        )
        view = TrajectoryView.first(spec)
        finish_reason = "answer"
        error = ""
        try:
            if spec.task_id:
                finish_reason, view = await self._agent_steps(inp, view)
            else:
                for index, step in enumerate(spec.steps):
                    if index >= opts.max_turns:
                        finish_reason = "turn_limit"
                        break
                    budget = opts.max_tokens - self._generated
                    new_tokens = min(step.output_tokens, budget)
                    request = _decide_request(inp, view, self._instance)
                    decision = await self._scheduler(opts, names.DECIDE, request, Decision)
                    moves = decision.migrate and self._instance not in ("", decision.instance_id)
                    move_from = self._instance if moves and self._lean else ""
                    if moves and not self._lean:
                        # Its KV moves to the new instance instead of being recomputed there.
                        await workflow.execute_activity(
                            names.MIGRATE_KV,
                            MigrateRequest(
                                spec.trajectory_id, self._instance, decision.instance_id
                            ),
                            task_queue=control_queue(opts.queue_prefix),
                            start_to_close_timeout=policy.MIGRATE_TIMEOUT,
                            retry_policy=policy.retry(opts.max_attempts),
                        )
                    moved_on = decision.instance_id != self._instance
                    self._turn, self._instance = index + 1, decision.instance_id
                    self._predicted = decision.predicted_remaining
                    self._upsert_step(moved_on)
                    # A replayed tool the step activity waits out (none if the budget cuts the
                    # step short: no tool follows).
                    held = (
                        self._tool_in_step
                        and step.tool is not None
                        and new_tokens == step.output_tokens
                        and _replays_tools(opts)
                    )
                    then_wait_s = step.tool_latency_s * opts.time_scale if held else 0.0
                    generated = await self._generate(
                        inp, index, new_tokens, decision, request, move_from,
                        step.tool is not None, then_wait_s, step if held else None,
                    )  # fmt: skip
                    self._generated += generated.output_tokens
                    record = _step_record(inp, index, generated, view.context_tokens)
                    text = step.text or StepText()
                    evicted = not moved_on and view.found_evicted(generated.cached_tokens)
                    view = view.after_output(
                        generated.output_tokens, text.output_ngrams, evicted=evicted
                    )
                    if new_tokens < step.output_tokens:
                        finish_reason = "token_limit"
                        await self._record(record)
                        break
                    if step.tool is not None:
                        request_tool = ToolRequest(
                            trajectory_id=spec.trajectory_id,
                            step_index=index,
                            tool=step.tool,
                            mode=opts.tools,
                            latency_s=step.tool_latency_s,
                            status=step.tool_status,
                            output_tokens=step.tool_output_tokens,
                            tool_input_ref=step.tool_input_ref,
                            batch_id=inp.batch_id,
                        )
                        if held:
                            # The step activity waited it out (the rest, if it was cut short).
                            if generated.wait_left_s > 0:
                                await workflow.sleep(max(MIN_TIMER_S, generated.wait_left_s))
                            tool = _replayed(request_tool)
                        elif self._lean:
                            # The engine host re-predicted as the step ended.
                            tool = await self._tool(opts, request_tool)
                        else:
                            tool_call = self._tool_activity(opts, request_tool)
                            if decision.anticipate and workflow.patched(ANTICIPATE_PATCH):
                                # Its re-prediction from this step's output, hidden by the tool.
                                ahead = _decide_request(inp, view, self._instance)
                                await self._move_during_tool(opts, ahead)
                            tool = await tool_call
                        view = view.after_tool(
                            step.tool, tool.status, tool.output_tokens,
                            input_chars=text.tool_input_chars, ngrams=text.observation_ngrams,
                        )  # fmt: skip
                        record.tool = step.tool
                        record.tool_status = tool.status
                        record.tool_output_tokens = tool.output_tokens
                        record.tool_latency_s = tool.latency_s
                        record.observation_ref = tool.observation_ref
                    if self._ends_at_once and step.tool is None:
                        last_step = record  # nothing follows: written with the summary
                    else:
                        await self._record(record)
        except ActivityError as exc:
            finish_reason = "error"
            cause = exc.cause if exc.cause is not None else exc
            error = f"{type(cause).__name__}: {cause}"[:500]
            workflow.logger.warning(
                "trajectory failed", extra={"trajectory_id": spec.trajectory_id, "error": error}
            )

        status = "failed" if finish_reason == "error" else "completed"
        reward = 0.0
        verdict: Verdict | None = None
        if status == "completed" and spec.task_id:
            verdict = await self._verify(opts, VerifyRequest(
                inp.batch_id, spec.trajectory_id, spec.task_id, finish_reason
            ))  # fmt: skip
            reward = verdict.reward
        elif status == "completed" and not self._ends_at_once:
            reward = await self._reward(
                opts,
                RewardRequest(
                    inp.batch_id, spec.trajectory_id, finish_reason, view.last_tool_status
                ),
            )
        summary = TrajectorySummary(
            batch_id=inp.batch_id,
            trajectory_id=spec.trajectory_id,
            group_id=spec.group_id,
            status=status,
            finish_reason=finish_reason,
            turns=self._turn,
            generated_tokens=self._generated,
            tool_calls=view.num_tool_calls,
            reward=reward,
            started_at=started_at,
            finished_at=workflow.now().timestamp(),
            error=error,
            reward_reason=verdict.reason if verdict else "",
            reward_error=verdict.error if verdict else "",
        )
        done = TrajectoryDone(
            spec.trajectory_id, spec.group_id, self._generated, self._turn, opts.policy,
            inp.batch_id,
        )  # fmt: skip
        if self._ends_at_once:
            replayed = status == "completed" and not spec.task_id
            asks = RewardRequest(
                inp.batch_id, spec.trajectory_id, finish_reason, view.last_tool_status
            )
            reward = await workflow.execute_local_activity(
                names.END_TRAJECTORY,
                TrajectoryEnd(summary, done, last_step, asks if replayed else None),
                start_to_close_timeout=policy.STORE_TIMEOUT,
                retry_policy=policy.STORE_RETRY,
                result_type=float,
            )
            summary = dataclasses.replace(summary, reward=reward)
        else:
            await workflow.execute_local_activity(
                names.FINISH_TRAJECTORY,
                summary,
                start_to_close_timeout=policy.STORE_TIMEOUT,
                retry_policy=policy.STORE_RETRY,
            )
            await self._scheduler(opts, names.REPORT_DONE, done)
        final: list[SearchAttributeUpdate[Any]] = [
            sa.STATUS.value_set(status),
            sa.GENERATED.value_set(self._generated),
        ]
        if self._predicted >= 0:  # nothing remains of an ended trajectory
            final.append(sa.PREDICTED_REMAINING.value_set(0))
        if self._throttles_upserts:  # a throttled step's turn and instance, shown at last
            final += [sa.TURN.value_set(self._turn), sa.INSTANCE.value_set(self._instance)]
        workflow.upsert_search_attributes(final)
        details = (
            f"{status} ({finish_reason}) after {self._turn} turns, {self._generated} tokens"
            f" on {self._instance or 'no instance'}"
        )
        if spec.task_id:
            details = f"task {spec.task_id}: {details}, {self._last_tool()}"
        details += f", reward {summary.reward:g}"
        workflow.set_current_details(details)
        return summary

    def _last_tool(self) -> str:
        return f"last tool {self._last_call}" if self._last_call else "no tool called"

    async def _agent_steps(
        self, inp: TrajectoryInput, view: TrajectoryView
    ) -> tuple[str, TrajectoryView]:
        """The model's turns: each decided and placed like a replayed step, sampled on
        its engine, its tool calls run (a call that cannot run is an error observation
        the model reads next turn), until an answer or a limit. Returns the finish
        reason and the trajectory as the scheduler last saw it."""
        spec, opts = inp.spec, inp.options
        observations: list[str] = []
        for index in range(opts.max_turns):
            budget = opts.max_tokens - self._generated
            if budget <= 0:
                return "token_limit", view
            request = _decide_request(inp, view, self._instance)
            decision = await self._scheduler(opts, names.DECIDE, request, Decision)
            moves = decision.migrate and self._instance not in ("", decision.instance_id)
            moved_on = decision.instance_id != self._instance
            move_from = self._instance if moves else ""
            self._turn, self._instance = index + 1, decision.instance_id
            self._predicted = decision.predicted_remaining
            self._upsert_step(moved_on)
            agent = AgentTurn(
                batch_id=inp.batch_id,
                task_id=spec.task_id,
                observation_refs=observations,
                temperature=opts.temperature,
                top_p=opts.top_p,
                seed=zlib.crc32(f"{opts.seed}/{spec.trajectory_id}/{index}".encode()),
                max_context_tokens=opts.max_context_tokens,
            )
            max_new = min(budget, opts.max_tokens_per_turn)
            generated = await self._agent_turn(
                inp, index, max_new, decision, request, move_from, agent
            )
            outcome = generated.turn
            assert outcome is not None
            self._generated += generated.output_tokens
            made = generated.output_tokens
            evicted = not moved_on and view.found_evicted(generated.cached_tokens)
            view = dataclasses.replace(
                view.after_output(made, outcome.output_ngrams, evicted=evicted),
                context_tokens=outcome.context_tokens + made,
            )
            record = _step_record(inp, index, generated, outcome.context_tokens)
            if outcome.finish_reason == "context" or not outcome.calls:
                await self._record(record)
                if outcome.finish_reason == "context":
                    return "context_limit", view
                return ("answer" if outcome.finish_reason == "stop" else "token_limit"), view
            calls = await self._run_calls(opts, inp, index, outcome.calls)
            for call in calls:
                view = view.after_tool(
                    call.name or "invalid", call.status, call.output_tokens,
                    input_chars=call.input_chars, ngrams=call.observation_ngrams,
                )  # fmt: skip
            last = calls[-1]
            record.calls = calls
            record.tool, record.tool_status = last.name or "invalid", last.status
            record.tool_output_tokens = sum(c.output_tokens for c in calls)
            record.tool_latency_s = max(c.latency_s for c in calls)
            record.observation_ref = last.observation_ref
            await self._record(record)
            observations = [c.observation_ref for c in calls]
            self._last_call = f"{last.name or 'invalid'} ({last.status})"
            workflow.set_current_details(
                f"task {spec.task_id}: turn {self._turn} on {self._instance}, "
                f"{self._generated} tokens, {self._last_tool()}{self._forecast_note()}"
            )
        return "turn_limit", view

    async def _agent_turn(
        self,
        inp: TrajectoryInput,
        index: int,
        max_new_tokens: int,
        decision: Decision,
        request: DecideRequest,
        move_from: str,
        agent: AgentTurn,
    ) -> GenerateResult:
        """One model turn on the decided instance. If its engine dies, the turn is
        decided again and starts over elsewhere (the engine host stores a turn only
        once it is whole)."""
        opts, tid = inp.options, inp.spec.trajectory_id
        deaths = 0
        while True:
            try:
                result: GenerateResult = await workflow.execute_activity(
                    names.GENERATE,
                    GenerateRequest(
                        request_id=f"{inp.batch_id}/{tid}/{index}",
                        trajectory_id=tid,
                        step_index=index,
                        context_tokens=request.view.context_tokens,
                        max_new_tokens=max_new_tokens,
                        priority=decision.priority,
                        agent=agent,
                        **self._books(request, 0, decision, move_from, True),
                    ),
                    task_queue=engine_queue(decision.instance_id, opts.queue_prefix),
                    priority=Priority(priority_key=decision.priority_key or None),
                    start_to_close_timeout=policy.GENERATE_TIMEOUT,
                    heartbeat_timeout=policy.GENERATE_HEARTBEAT,
                    retry_policy=policy.retry(opts.max_attempts),
                    result_type=GenerateResult,
                )
            except ActivityError as exc:
                deaths += 1
                if _engine_dead_tokens(exc) is None or deaths >= opts.max_attempts:
                    raise
                again = dataclasses.replace(request, view=request.view.on(self._instance))
                decision = await self._scheduler(opts, names.DECIDE, again, Decision)
                self._instance, move_from = decision.instance_id, ""
                continue
            self._instance = result.next_instance or result.instance_id
            return result

    async def _run_calls(
        self, opts: RolloutOptions, inp: TrajectoryInput, index: int, calls: list[ToolCallRecord]
    ) -> list[ToolCallRecord]:
        """A turn's tool calls, side by side on the tools queue; each result's text is
        in the store under its `observation_ref`."""
        running = {
            i: self._tool_activity(
                opts,
                ToolRequest(
                    trajectory_id=inp.spec.trajectory_id,
                    step_index=index,
                    tool=call.name,
                    mode="real",
                    tool_input_ref=call.input_ref,
                    batch_id=inp.batch_id,
                    call_index=i,
                ),
            )
            for i, call in enumerate(calls)
            if not call.error
        }
        done = list(calls)
        for i, handle in running.items():
            result = await handle
            done[i] = dataclasses.replace(
                calls[i],
                status=result.status,
                output_tokens=result.output_tokens,
                latency_s=result.latency_s,
                observation_ref=result.observation_ref,
                observation_ngrams=result.observation_ngrams,
            )
        return done

    async def _verify(self, opts: RolloutOptions, request: VerifyRequest) -> Verdict:
        verdict: Verdict = await workflow.execute_activity(
            names.VERIFY,
            request,
            task_queue=tools_queue(opts.queue_prefix),
            start_to_close_timeout=policy.VERIFY_TIMEOUT,
            heartbeat_timeout=policy.TOOL_HEARTBEAT,
            retry_policy=policy.retry(opts.max_attempts),
            result_type=Verdict,
        )
        return verdict

    def _forecast_note(self) -> str:
        return f", predicted remaining {self._predicted}" if self._predicted >= 0 else ""

    def _upsert_step(self, moved_on: bool) -> None:
        """The step's search attributes, for the UI's turn and instance filters (at most
        every `UPSERT_EVERY_S`: `UPSERT_EACH_S_PATCH`, `UPSERT_PATCH`)."""
        workflow.set_current_details(
            f"turn {self._turn} on {self._instance}, {self._generated} tokens"
            + self._forecast_note()
        )  # not a command: shown on the workflow's page at every step, unthrottled
        now = workflow.now().timestamp()
        if self._upserts_each_second:
            assert self._upserted_at is not None
            if now - self._upserted_at < UPSERT_EVERY_S:
                return
        elif (
            self._throttles_upserts
            and not moved_on
            and self._upserted_at is not None
            and now - self._upserted_at < UPSERT_EVERY_S
        ):
            return
        self._upserted_at = now
        step: list[SearchAttributeUpdate[Any]] = [
            sa.TURN.value_set(self._turn),
            sa.INSTANCE.value_set(self._instance),
            sa.GENERATED.value_set(self._generated),
        ]
        if self._predicted >= 0:
            step.append(sa.PREDICTED_REMAINING.value_set(self._predicted))
        workflow.upsert_search_attributes(step)

    async def _move_during_tool(self, opts: RolloutOptions, request: DecideRequest) -> None:
        """Re-predict while the tool runs; when the new rank calls for another instance,
        the KV moves there now, hidden behind the tool call. A failed re-prediction costs
        the move; a failed move, a recompute of the context on the new instance."""
        try:
            move = await self._scheduler(opts, names.ANTICIPATE, request, Decision | None)
        except ActivityError as exc:  # no move: the next decide places the step anyway
            workflow.logger.warning("re-prediction during the tool call failed: %s", exc)
            return
        if move is None or move.instance_id == self._instance:
            return
        try:
            await workflow.execute_activity(
                names.MIGRATE_KV,
                MigrateRequest(request.trajectory_id, self._instance, move.instance_id),
                task_queue=control_queue(opts.queue_prefix),
                start_to_close_timeout=policy.MIGRATE_TIMEOUT,
                retry_policy=policy.retry(opts.max_attempts),
            )
        except ActivityError as exc:
            workflow.logger.warning("KV move failed, the context is recomputed: %s", exc)
        self._instance = move.instance_id

    async def _generate(
        self,
        inp: TrajectoryInput,
        index: int,
        new_tokens: int,
        decision: Decision,
        request: DecideRequest,
        move_from: str = "",
        before_tool: bool = False,
        then_wait_s: float = 0.0,
        then_tool: StepSpec | None = None,
    ) -> GenerateResult:
        """One LLM step on the decided instance (`request`: what it was decided on). If
        the scheduler stops it mid-decode to move it (a long decode outgrew its instance),
        it goes on on the new instance from the tokens made (the engine host moves it on
        the lean path; the workflow did before); if the instance's engine dies, the step
        is decided again and goes on elsewhere. The result covers the whole step."""
        opts, tid, context = inp.options, inp.spec.trajectory_id, request.view.context_tokens
        instance, made, deaths = decision.instance_id, 0, 0
        first: GenerateResult | None = None
        while True:
            part: GenerateResult | None = None
            try:
                part = await workflow.execute_activity(
                    names.GENERATE,
                    GenerateRequest(
                        request_id=f"{inp.batch_id}/{tid}/{index}" + (f"+{made}" if made else ""),
                        trajectory_id=tid,
                        step_index=index,
                        context_tokens=context + made,
                        max_new_tokens=new_tokens - made,
                        priority=decision.priority,
                        then_wait_s=then_wait_s,
                        then_tool=(then_tool.tool or "") if then_tool else "",
                        then_tool_status=then_tool.tool_status if then_tool else "ok",
                        reserve_kv_tokens=decision.reserve_kv_tokens,
                        ends_session=not before_tool,
                        **self._books(request, made, decision, move_from, before_tool),
                    ),
                    task_queue=engine_queue(instance, opts.queue_prefix),
                    priority=Priority(priority_key=decision.priority_key or None),
                    start_to_close_timeout=policy.GENERATE_TIMEOUT,
                    heartbeat_timeout=policy.GENERATE_HEARTBEAT,
                    retry_policy=policy.retry(opts.max_attempts),
                    result_type=GenerateResult,
                )
            except ActivityError as exc:
                lost_engine_made = _engine_dead_tokens(exc)
                deaths += 1
                if lost_engine_made is None or deaths >= opts.max_attempts:
                    raise
                made += lost_engine_made
            finally:
                if not self._lean:
                    await self._scheduler(
                        opts, names.REPORT_STEP, StepReport(tid, instance, index, new_tokens - made)
                    )
            move_from = ""
            if part is not None:
                first = first or part
                made += part.output_tokens
                instance = self._instance = part.next_instance or part.instance_id
                if not part.moved_to or made >= new_tokens:
                    break
            if part is None or self._lean:
                # Its engine died (or the instance it was moving to went away): decided
                # again, it goes on where the scheduler says.
                again = dataclasses.replace(
                    request, view=request.view.in_progress(made).on(self._instance)
                )
                decision = await self._scheduler(opts, names.DECIDE, again, Decision)
                instance = self._instance = decision.instance_id
                continue
            await workflow.execute_activity(
                names.MIGRATE_KV,
                MigrateRequest(tid, instance, part.moved_to),
                task_queue=control_queue(opts.queue_prefix),
                start_to_close_timeout=policy.MIGRATE_TIMEOUT,
                retry_policy=policy.retry(opts.max_attempts),
            )
            instance = self._instance = part.moved_to
        assert part is not None
        assert first is not None
        return dataclasses.replace(
            part,
            instance_id=part.instance_id,
            output_tokens=made,
            cached_tokens=first.cached_tokens,
            queued_s=first.queued_s,
            started_at=first.started_at,
            resumed_tokens=first.resumed_tokens,
        )

    def _books(
        self,
        request: DecideRequest,
        made: int,
        decision: Decision,
        move_from: str,
        before_tool: bool,
    ) -> dict[str, Any]:
        """The lean path's part of a generate request: what the engine host needs to
        keep the step's books (none before it: the workflow kept them)."""
        if not self._lean:
            return {}
        return {
            "decided": dataclasses.replace(request, view=request.view.in_progress(made)),
            "anticipate": decision.anticipate and before_tool,
            "move_from": move_from,
        }

    def _tool_activity(
        self, opts: RolloutOptions, request: ToolRequest
    ) -> workflow.ActivityHandle[ToolResult]:
        return workflow.start_activity(
            names.RUN_TOOL,
            request,
            task_queue=tools_queue(opts.queue_prefix),
            start_to_close_timeout=policy.TOOL_TIMEOUT,
            heartbeat_timeout=policy.TOOL_HEARTBEAT,
            retry_policy=policy.retry(opts.max_attempts),
            result_type=ToolResult,
        )

    async def _tool(self, opts: RolloutOptions, request: ToolRequest) -> ToolResult:
        """A tool call. Replaying a trace, the tool is its recorded latency: a durable
        timer (none for an instant tool) costs the server less than an activity that
        only sleeps. Real tools run as activities on the tools queue."""
        if not _replays_tools(opts):
            return await self._tool_activity(opts, request)
        wait_s = request.latency_s * opts.time_scale
        if wait_s > 0:
            await workflow.sleep(max(MIN_TIMER_S, wait_s))
        return _replayed(request)

    async def _reward(self, opts: RolloutOptions, request: RewardRequest) -> float:
        if self._lean:
            reward: float = await workflow.execute_local_activity(
                names.REWARD,
                request,
                start_to_close_timeout=policy.STORE_TIMEOUT,
                retry_policy=policy.STORE_RETRY,
                result_type=float,
            )
            return reward
        reward = await workflow.execute_activity(
            names.REWARD,
            request,
            task_queue=tools_queue(opts.queue_prefix),
            start_to_close_timeout=policy.STORE_TIMEOUT,
            retry_policy=policy.STORE_RETRY,
            result_type=float,
        )
        return reward

    async def _scheduler(
        self, opts: RolloutOptions, name: str, arg: Any, result_type: Any = None
    ) -> Any:
        """A call to the scheduler service: a local activity, which reaches the engine
        host's service from whichever process runs this workflow. Before the lean path,
        a planned or central batch's calls were activities on the engine host's queue."""
        if not self._lean and (opts.plans_split or opts.central_scheduler):
            return await workflow.execute_activity(
                name,
                arg,
                result_type=result_type,
                task_queue=control_queue(opts.queue_prefix),
                start_to_close_timeout=policy.DECIDE_TIMEOUT,
                schedule_to_close_timeout=policy.DECIDE_GIVE_UP,
                retry_policy=policy.SCHEDULER_RETRY,
            )
        return await workflow.execute_local_activity(
            name,
            arg,
            result_type=result_type,
            start_to_close_timeout=policy.DECIDE_TIMEOUT,
            schedule_to_close_timeout=policy.DECIDE_GIVE_UP,
            retry_policy=policy.SCHEDULER_RETRY,
        )

    async def _record(self, record: StepRecord) -> None:
        await workflow.execute_local_activity(
            names.RECORD_STEP,
            record,
            start_to_close_timeout=policy.STORE_TIMEOUT,
            retry_policy=policy.STORE_RETRY,
        )
