"""The engine host's half of an agent turn: the context before the turn as token ids, and
what the turn made, parsed and stored.

The host keeps each trajectory's ids for its next turn; the store keeps every turn, so a
host that restarted, or a turn that lands on another host, rebuilds the context from it
exactly. A retried turn starts over from the stored turns before it (its own earlier
attempt, if one was written, is replaced): the stored trajectory is always what the
model saw and sampled. Each turn's record, its text and its tool calls' arguments are
written in one transaction before the workflow hears of the turn.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from dataclasses import dataclass

from activities.store import in_store
from engines.chat import ChatRenderer
from heddle.store import TrajectoryStore
from heddle.store.db import trajectory_key
from heddle.tasks import Task
from heddle.textfeatures import hashed_ngrams
from heddle.toolcalls import call_input, error_observation, parse_turn, tool_schemas
from heddle.types import AgentTurn, GenerateRequest, ToolCallRecord, TurnOutcome, TurnRecord

# Trajectories whose ids the host keeps for their next turn (the least recent dropped:
# the store has them).
MAX_CONTEXTS = 8192
# What the model reads for a tool result the store does not have (it should not happen).
LOST_OBSERVATION = "error: the tool result was lost"


def observation_ref(batch_id: str, trajectory_id: str, step_index: int, call_index: int) -> str:
    """Where a tool call's result is kept (a turn's first call: the step's own key)."""
    suffix = f".{call_index}" if call_index else ""
    return f"{trajectory_key(batch_id, trajectory_id)}/obs/{step_index}{suffix}"


@dataclass
class _Context:
    turns: int  # turns the ids hold
    ids: array[int]
    ended: bool  # the last turn ended with the model's end-of-turn token


@dataclass
class PreparedTurn:
    """A turn's context: the ids before it, what it appends first, its token cap."""

    task: Task
    prior: list[int]
    appended: list[int]
    max_new_tokens: int

    @property
    def prompt(self) -> list[int]:
        return self.prior + self.appended


class AgentTurns:
    """Contexts and records of the agent turns one engine host runs."""

    def __init__(self, store: TrajectoryStore, model_path: str, max_model_len: int) -> None:
        self.store = store
        self.model_path = model_path
        self.max_model_len = max_model_len
        self._renderer: ChatRenderer | None = None
        self._contexts: OrderedDict[str, _Context] = OrderedDict()
        self._tasks: OrderedDict[tuple[str, str], Task] = OrderedDict()

    @property
    def renderer(self) -> ChatRenderer:
        if self._renderer is None:
            self._renderer = ChatRenderer.from_model(self.model_path)
        return self._renderer

    async def prepare(self, request: GenerateRequest) -> PreparedTurn:
        agent = request.agent
        assert agent is not None
        task = await self._task(agent.batch_id, agent.task_id)
        ctx = self._contexts.get(_key(agent, request))
        if ctx is None or ctx.turns != request.step_index:
            ctx = await in_store(self._rebuild, agent, request)
        schemas = tool_schemas(task.tools)
        if request.step_index == 0:
            messages = [{"role": m.role, "content": m.content} for m in task.messages]
            appended = self.renderer.prompt_ids(messages, schemas)
        else:
            texts = await in_store(self.store.get_texts, agent.observation_refs)
            results = [
                {"role": "tool", "content": texts.get(ref, LOST_OBSERVATION)}
                for ref in agent.observation_refs
            ]
            appended = self.renderer.after_reply_ids(results, schemas, ended=ctx.ended)
        prior = ctx.ids.tolist()
        limit = min(agent.max_context_tokens or self.max_model_len, self.max_model_len)
        room = limit - len(prior) - len(appended)
        return PreparedTurn(task, prior, appended, max(0, min(request.max_new_tokens, room)))

    def _rebuild(self, agent: AgentTurn, request: GenerateRequest) -> _Context:
        """The ids of the turns before this one, from the store."""
        turns = self.store.load_turns(agent.batch_id, request.trajectory_id)
        stored = [
            t for t in turns.get(request.trajectory_id, []) if t.step_index < request.step_index
        ]
        if [t.step_index for t in stored] != list(range(request.step_index)):
            raise RuntimeError(
                f"{request.trajectory_id}: the store lacks turns before {request.step_index}"
            )
        ids = array("i")
        for t in stored:
            ids.extend(t.input_ids)
            ids.extend(t.output_ids)
        ended = bool(stored) and stored[-1].finish_reason == "stop"
        return _Context(request.step_index, ids, ended)

    async def finish(
        self,
        request: GenerateRequest,
        turn: PreparedTurn,
        output_ids: list[int],
        logprobs: list[float],
        finish_reason: str,
        weight_version: int = 0,
    ) -> TurnOutcome:
        """Parse the turn's tool calls and store the turn, its text and the calls'
        arguments (a call that cannot run gets its error observation now)."""
        agent = request.agent
        assert agent is not None
        tid, step = request.trajectory_id, request.step_index
        text = self.renderer.reply_text(output_ids)
        parsed = parse_turn(text, turn.task.tools)
        calls: list[ToolCallRecord] = []
        texts: dict[str, str] = {}
        key = trajectory_key(agent.batch_id, tid)
        for i, call in enumerate(parsed.calls):
            if call.error:
                ref = observation_ref(agent.batch_id, tid, step, i)
                texts[ref] = error_observation(call)
                calls.append(
                    ToolCallRecord(
                        call.name, error=call.error, observation_ref=ref, status="error",
                        observation_ngrams=hashed_ngrams(texts[ref]),
                    )
                )  # fmt: skip
            else:
                argument = call_input(call)
                ref = f"{key}/tool_input/{step}" + (f".{i}" if i else "")
                texts[ref] = argument
                calls.append(ToolCallRecord(call.name, input_ref=ref, input_chars=len(argument)))
        record = TurnRecord(
            batch_id=agent.batch_id,
            trajectory_id=tid,
            step_index=step,
            input_ids=turn.appended,
            output_ids=output_ids,
            output_logprobs=logprobs,
            weight_version=weight_version,
            finish_reason=finish_reason,
            text=text,
        )
        await in_store(self.store.write, [record], texts)
        ids = array("i", turn.prompt)
        ids.extend(output_ids)
        self._remember(_key(agent, request), _Context(step + 1, ids, finish_reason == "stop"))
        return TurnOutcome(
            finish_reason, calls, context_tokens=len(turn.prompt), output_ngrams=hashed_ngrams(text)
        )

    def _remember(self, key: str, ctx: _Context) -> None:
        self._contexts[key] = ctx
        self._contexts.move_to_end(key)
        while len(self._contexts) > MAX_CONTEXTS:
            self._contexts.popitem(last=False)

    async def _task(self, batch_id: str, task_id: str) -> Task:
        task = self._tasks.get((batch_id, task_id))
        if task is None:
            task = await in_store(self.store.get_task, batch_id, task_id)
            self._tasks[(batch_id, task_id)] = task
            while len(self._tasks) > MAX_CONTEXTS:
                self._tasks.popitem(last=False)
        return task


def _key(agent: AgentTurn, request: GenerateRequest) -> str:
    return trajectory_key(agent.batch_id, request.trajectory_id)
