"""Types shared by the client, the workflows, the activities and the policy core.

Every workflow, activity and signal takes one dataclass and returns one; new fields get
defaults so that recorded histories keep replaying. Payloads hold counts and store keys,
never token arrays or long texts (those live in the trajectory store).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

TOOL_STATUSES = ("ok", "error", "timeout")


@dataclass(frozen=True)
class StepText:
    """What a step's texts show the predictor (`heddle.textfeatures`): hashed n-grams of
    the model's output and of the tool's observation, and the tool call's argument size.
    Only traces with text (`heddle trace from-batch`) and agent turns have one."""

    output_ngrams: tuple[float, ...] = ()
    observation_ngrams: tuple[float, ...] = ()
    tool_input_chars: int = 0


@dataclass(frozen=True)
class StepSpec:
    """One LLM step of a trace: what the engine generates, then the tool it calls, if any."""

    output_tokens: int
    tool: str | None = None
    tool_latency_s: float = 0.0
    tool_status: str = "ok"
    tool_output_tokens: int = 0
    # Argument of a real tool call (code, expression, query); replay ignores it. In the
    # store and in workflow history it is replaced by `tool_input_ref`, a store key.
    tool_input: str | None = None
    tool_input_ref: str = ""
    text: StepText | None = None


@dataclass(frozen=True)
class TrajectorySpec:
    """One trace line without its long texts: what a trajectory workflow carries."""

    trajectory_id: str
    group_id: str
    prompt_tokens: int
    steps: tuple[StepSpec, ...]
    workload: str = "unknown"
    # An agent trajectory: the task the model works on (the store keeps it, under the
    # batch); its steps are what the model does, not a trace's.
    task_id: str = ""

    @property
    def generated_tokens(self) -> int:
        return sum(s.output_tokens for s in self.steps)

    @property
    def sequence_tokens(self) -> int:
        """Its whole sequence as a trainer's forward pass reads it: the prompt, every
        turn's output and every tool result."""
        return self.prompt_tokens + sum(s.output_tokens + s.tool_output_tokens for s in self.steps)


@dataclass
class RolloutOptions:
    """How a batch runs; one copy travels with the batch and each of its trajectories."""

    policy: str = "least_loaded"
    tools: str = "replay"  # "replay" the trace's tool timings, or "real" tool execution
    max_turns: int = 64
    max_tokens: int = 65536
    max_in_flight: int = 4096
    queue_prefix: str = ""
    # Retries of a single LLM step or tool call before the trajectory is marked failed.
    max_attempts: int = 5
    # The policy plans the batch and the cluster's split before the first step (Heddle);
    # set by the client from the registry.
    plans_split: bool = False
    # Every scheduler call goes to the engine host's service (an activity on its control
    # queue) rather than to the service of the process running the workflow: one view of
    # the cluster when workflow workers run on several machines. Planned batches always do.
    central_scheduler: bool = False
    # Wall seconds per modelled second of the stack that runs the batch (its batch
    # workflow sets it from the stack): a replayed tool waits its latency times this.
    time_scale: float = 0.0
    # Agent trajectories: how each turn samples, its token cap, and the context limit
    # (0: the engines' own).
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0
    max_tokens_per_turn: int = 512
    max_context_tokens: int = 0


@dataclass
class BatchInput:
    batch_id: str
    num_trajectories: int
    options: RolloutOptions = field(default_factory=RolloutOptions)
    page_size: int = 256


@dataclass
class SliceInput:
    """A slice of a large batch: its `count` trajectories at positions `offset`,
    `offset + stride`, ... (slices started before strides: `offset .. offset + count - 1`)."""

    batch_id: str
    offset: int
    count: int
    options: RolloutOptions
    page_size: int = 256
    started_at: float = 0.0  # the batch's start: completion times count from it
    window: int = 4096  # trajectories of the slice running at once
    stride: int = 1


@dataclass
class SliceOutcome:
    completed: int
    failed: int
    generated_tokens: int
    completion_s: list[float] = field(default_factory=list)
    failed_ids: list[str] = field(default_factory=list)


@dataclass
class TrajectoryInput:
    batch_id: str
    spec: TrajectorySpec
    options: RolloutOptions = field(default_factory=RolloutOptions)


@dataclass(frozen=True)
class Decision:
    """Where and how urgently the next LLM step runs, and why."""

    instance_id: str
    priority: int = 0
    reason: str = ""
    # Move the trajectory's KV from its previous instance (during its tool call) rather
    # than recompute its context on the new one.
    migrate: bool = False
    # Temporal task-queue priority of the step's activity, 1 (first) to 5; 0 leaves the
    # server's default. The engine orders its own queue by `priority`.
    priority_key: int = 0
    # The policy may move the trajectory when it re-predicts at the end of the step: the
    # workflow asks it (`anticipate`) while the step's tool call runs.
    anticipate: bool = False
    # The policy's forecast of the trajectory's remaining tokens, for the UI's
    # `HeddlePredictedRemaining`; -1 where the policy does not forecast.
    predicted_remaining: int = -1
    # The KV the policy reserves for the trajectory on its engine (Heddle: its forecast
    # mean KV over what is left of it): the engine admits a trajectory it does not hold
    # yet only while the reservations leave room for it (`engines.core`, "Sessions").
    # 0: no reservation; the engine admits as vLLM does.
    reserve_kv_tokens: int = 0


def size_bin(tokens: int) -> str:
    return "s" if tokens <= 500 else ("m" if tokens <= 5000 else "l")


def tool_state(tool: str, output_tokens: int, status: str) -> str:
    """A tool call as a node of the tool-return path: "tool:size-bin:status" (Libra's
    tree key, and a predictor feature)."""
    return f"{tool}:{size_bin(output_tokens)}:{status}"


@dataclass(frozen=True)
class TrajectoryView:
    """What the scheduler has seen of a trajectory as it is about to run its next LLM
    step (or, shown to a review, part-way through one). The one record of it: the
    workflow grows it after each step and tool result and sends it with each decide,
    the simulator keeps one per trajectory, and every policy reads it."""

    trajectory_id: str
    group_id: str
    step_index: int
    context_tokens: int
    generated_tokens: int
    previous_instance: str | None = None
    prompt_tokens: int = 0
    num_tool_calls: int = 0
    last_tool: str | None = None
    last_tool_status: str | None = None
    last_tool_output_tokens: int = 0
    # The tool-return path so far (`tool_state` per call), and the last few turns' lengths.
    tool_path: tuple[str, ...] = ()
    recent_output_tokens: tuple[int, ...] = ()
    # Tokens of the current turn made so far: a step in progress shown to a review (its
    # `generated_tokens` and `context_tokens` include them); 0 at a step boundary.
    step_tokens: int = 0
    # The latest step's texts as the predictor reads them (`StepText`), where they exist.
    last_output_ngrams: tuple[float, ...] = ()
    last_observation_ngrams: tuple[float, ...] = ()
    last_tool_input_chars: int = 0
    # Its last step ran where the one before it had, and found its context evicted
    # meanwhile (`found_evicted`): the engines' KV cache is short of what they hold.
    context_evicted: bool = False

    @classmethod
    def first(cls, spec: TrajectorySpec) -> TrajectoryView:
        """Before its first step: the prompt only."""
        return cls(spec.trajectory_id, spec.group_id, 0, spec.prompt_tokens, 0,
                   prompt_tokens=spec.prompt_tokens)  # fmt: skip

    def after_output(
        self, tokens: int, ngrams: tuple[float, ...] = (), *, evicted: bool = False
    ) -> TrajectoryView:
        """As a step that made `tokens` (its text hashed to `ngrams`) ends, before any
        tool result; `evicted`: the step found its context evicted (`found_evicted`)."""
        return dataclasses.replace(
            self,
            context_evicted=evicted,
            step_index=self.step_index + 1,
            context_tokens=self.context_tokens + tokens,
            generated_tokens=self.generated_tokens + tokens,
            recent_output_tokens=(*self.recent_output_tokens[-3:], tokens),
            step_tokens=0,
            last_output_ngrams=ngrams,
            last_observation_ngrams=(),
            last_tool_input_chars=0,
        )

    def after_tool(
        self,
        tool: str,
        status: str,
        output_tokens: int,
        *,
        input_chars: int = 0,
        ngrams: tuple[float, ...] = (),
    ) -> TrajectoryView:
        """As the tool's result (its observation hashed to `ngrams`) joins the context."""
        return dataclasses.replace(
            self,
            num_tool_calls=self.num_tool_calls + 1,
            last_tool=tool,
            last_tool_status=status,
            last_tool_output_tokens=output_tokens,
            tool_path=(*self.tool_path, tool_state(tool, output_tokens, status)),
            context_tokens=self.context_tokens + output_tokens,
            last_observation_ngrams=ngrams,
            last_tool_input_chars=input_chars,
        )

    def found_evicted(self, cached_tokens: int) -> bool:
        """Whether its next step, run on the instance its last step ran on, found its
        context evicted: less than half of what the last step left there (the context
        but the tool result since) came back from the prefix cache. Half, since an
        engine caches whole blocks and may have lost a few of them; a context lost
        during the tool call is lost whole."""
        left = self.context_tokens - self.last_tool_output_tokens if self.step_index else 0
        return left > 0 and cached_tokens < left / 2

    def on(self, instance: str | None) -> TrajectoryView:
        """Where its last step ran (None: nowhere yet, or an instance that is gone)."""
        return dataclasses.replace(self, previous_instance=instance or None)

    def in_progress(self, made: int) -> TrajectoryView:
        """Part-way through its next step, `made` tokens into the turn (a review)."""
        return dataclasses.replace(
            self,
            context_tokens=self.context_tokens + made,
            generated_tokens=self.generated_tokens + made,
            step_tokens=made,
        )


@dataclass
class DecideRequest:
    """A decide: the trajectory's view, where its last step ran by the workflow's own
    record (a restarted service forgot), and the batch whose policy decides."""

    view: TrajectoryView
    policy: str = "least_loaded"
    batch_id: str = ""
    # Its batch was planned (Heddle): a service that lost the plan plans it again.
    planned: bool = False

    @property
    def trajectory_id(self) -> str:
        return self.view.trajectory_id

    def after_output(self, tokens: int, ngrams: tuple[float, ...] = ()) -> DecideRequest:
        """The request as the step's `tokens` end, before any tool result: what the
        engine host re-predicts from during the tool call."""
        return dataclasses.replace(self, view=self.view.after_output(tokens, ngrams))


@dataclass
class StepReport:
    """Sent to the scheduler service after an LLM step ends (load bookkeeping)."""

    trajectory_id: str
    instance_id: str
    step_index: int
    output_tokens: int


@dataclass
class TrajectoryDone:
    """Sent to the scheduler service when a trajectory ends (policies learn from it)."""

    trajectory_id: str
    group_id: str
    generated_tokens: int
    turns: int
    policy: str = "least_loaded"
    batch_id: str = ""


@dataclass
class GenerateRequest:
    """One LLM step on one engine instance (trace replay: exactly `max_new_tokens`)."""

    request_id: str
    trajectory_id: str
    step_index: int
    context_tokens: int
    max_new_tokens: int
    priority: int = 0
    # The lean step path: the request the step was decided on. The engine host then
    # keeps the step's books itself: it reports the step's end to its scheduler service,
    # carries out a mid-decode move within this activity, and (`anticipate`, a tool call
    # follows) re-predicts as the step ends and moves the KV during the tool call.
    decided: DecideRequest | None = None
    anticipate: bool = False
    # The decision moved the trajectory here: its KV comes from this instance first.
    move_from: str = ""
    # A replayed tool follows (trace replay): the engine host waits its latency, on the
    # stack's clock, once the step is done and its books kept, so the workflow wakes
    # once a step rather than again to start a timer.
    then_wait_s: float = 0.0
    then_tool: str = ""  # that tool's name and replayed status (for the tool metrics)
    then_tool_status: str = "ok"
    # The decision's KV reservation for the trajectory (`Decision.reserve_kv_tokens`), and
    # whether this is its last step (no tool follows), which ends the reservation.
    reserve_kv_tokens: int = 0
    ends_session: bool = False
    # An agent turn: the model samples; the engine host renders its context.
    agent: AgentTurn | None = None


@dataclass
class AgentTurn:
    """What the engine host needs to run one model turn of an agent trajectory. Texts
    travel as store keys: the workflow's history holds no long text or array."""

    batch_id: str
    task_id: str
    # The tool results the turn reads first (the previous turn's calls, in order).
    observation_refs: list[str] = field(default_factory=list)
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0
    max_context_tokens: int = 0


@dataclass
class ToolCallRecord:
    """One tool call of a model turn: parsed by the engine host, run by a tool worker."""

    name: str
    input_ref: str = ""  # store key of the call's argument; "" for a call that cannot run
    input_chars: int = 0
    error: str = ""  # why it cannot run (its observation says so)
    observation_ref: str = ""
    status: str = ""  # ok | error | timeout, once run
    output_tokens: int = 0
    latency_s: float = 0.0
    observation_ngrams: tuple[float, ...] = ()


@dataclass
class TurnOutcome:
    """What a model turn did, as the workflow needs it to go on."""

    finish_reason: str  # stop | length | context
    calls: list[ToolCallRecord] = field(default_factory=list)
    context_tokens: int = 0  # the turn's context, tool results and prompt included
    output_ngrams: tuple[float, ...] = ()  # of the turn's text (`heddle.textfeatures`)


@dataclass
class GenerateResult:
    instance_id: str
    output_tokens: int
    cached_tokens: int = 0
    queued_s: float = 0.0
    started_at: float = 0.0
    finished_at: float = 0.0
    attempt: int = 1
    resumed_tokens: int = 0
    # The step was stopped mid-decode to continue on this instance (its KV moves there);
    # `output_tokens` is what it made here.
    moved_to: str = ""
    # The lean path's re-prediction moved the trajectory on as the step ended: its KV
    # goes there during the tool call, and its next step is decided from there.
    next_instance: str = ""
    # What is left of `then_wait_s` when the wait was cut short (its worker stopping,
    # e.g. a retired instance): the workflow waits it out.
    wait_left_s: float = 0.0
    turn: TurnOutcome | None = None  # an agent turn's outcome


@dataclass
class ToolRequest:
    trajectory_id: str
    step_index: int
    tool: str
    mode: str = "replay"
    latency_s: float = 0.0
    status: str = "ok"
    output_tokens: int = 0
    tool_input_ref: str = ""  # store key of the call's argument
    batch_id: str = ""
    call_index: int = 0  # of the turn's calls (an agent turn may make several)


@dataclass
class ToolResult:
    status: str
    output_tokens: int
    latency_s: float
    # Store key of the observation text; empty for replayed calls, which have no text.
    observation_ref: str = ""
    error: str = ""
    observation_ngrams: tuple[float, ...] = ()  # of a real observation's text


@dataclass
class StepRecord:
    """What the store keeps of one step: timings, instance, tokens, tool status."""

    batch_id: str
    trajectory_id: str
    step_index: int
    instance_id: str
    context_tokens: int
    output_tokens: int
    cached_tokens: int = 0
    queued_s: float = 0.0
    gen_started_at: float = 0.0
    gen_finished_at: float = 0.0
    tool: str | None = None
    tool_status: str | None = None
    tool_output_tokens: int = 0
    tool_latency_s: float = 0.0
    observation_ref: str = ""
    # Attempt of the LLM step that succeeded, and tokens it took over from earlier attempts.
    attempt: int = 1
    resumed_tokens: int = 0
    calls: list[ToolCallRecord] = field(default_factory=list)  # an agent turn's


@dataclass
class TurnRecord:
    """The tokens of one model turn of an agent trajectory, for training: what was
    appended to the context before it (the prompt, or a tool's result with the chat
    template's markup; loss mask 0) and what the model sampled (mask 1), with the
    log-prob of each sampled token and the weight version that made it. The engine host
    writes it to the store; long arrays never enter a workflow's history."""

    batch_id: str
    trajectory_id: str
    step_index: int
    input_ids: list[int]
    output_ids: list[int]
    output_logprobs: list[float]
    weight_version: int = 0
    finish_reason: str = ""  # stop | length | context
    text: str = ""  # the turn as the conversation keeps it (without its end token)


@dataclass
class TrajectorySummary:
    """A trajectory's outcome: what its workflow returns and the store persists."""

    batch_id: str
    trajectory_id: str
    group_id: str
    status: str  # completed | failed
    finish_reason: str  # answer | turn_limit | token_limit | error
    turns: int
    generated_tokens: int
    tool_calls: int
    reward: float = 0.0
    started_at: float = 0.0
    finished_at: float = 0.0
    error: str = ""
    reward_reason: str = ""  # the verifier's, for an agent trajectory
    reward_error: str = ""  # the verifier crashed or timed out (the reward is then 0)


@dataclass
class VerifyRequest:
    batch_id: str
    trajectory_id: str
    task_id: str
    finish_reason: str


@dataclass
class Verdict:
    """A verifier's reward for a trajectory's answer, and why."""

    reward: float
    reason: str = ""
    error: str = ""  # the verifier crashed, timed out or could not be imported


@dataclass
class BatchReport:
    batch_id: str
    trajectories: int
    completed: int
    failed: int
    generated_tokens: int
    makespan_s: float
    throughput_tok_s: float
    completion_s: dict[str, float] = field(default_factory=dict)
    started_at: float = 0.0
    finished_at: float = 0.0
    policy: str = ""
    time_scale: float = 1.0
    wall_s: float = 0.0
    failed_ids: list[str] = field(default_factory=list)


@dataclass
class SpecPage:
    specs: list[TrajectorySpec]


@dataclass
class SpecPageRequest:
    batch_id: str
    offset: int
    limit: int
    stride: int = 1  # positions offset, offset + stride, ... (a strided slice)


@dataclass
class BatchStart:
    """What the batch workflow learns from the stack that runs it."""

    time_scale: float
    instance_ids: list[str]


@dataclass
class TrajectoryStarted:
    batch_id: str
    trajectory_id: str
    started_at: float


@dataclass
class RewardRequest:
    batch_id: str
    trajectory_id: str
    finish_reason: str
    last_tool_status: str | None = None


@dataclass
class TrajectoryEnd:
    """A trajectory's end in one local activity (`names.END_TRAJECTORY`): its last step's
    record, if not yet written, the reward (from `reward`: a replayed trajectory's; None
    where `summary` already has it), the summary written with both in one transaction,
    then the scheduler service told. Returns the reward."""

    summary: TrajectorySummary
    done: TrajectoryDone
    last_step: StepRecord | None = None
    reward: RewardRequest | None = None


@dataclass
class InstancePlan:
    """One engine instance of the cluster plan: its GPUs are `tp` from `first_gpu`.

    `state`: "active" takes steps; "draining" finishes the steps it has and takes no
    more; "starting" is loading (it takes steps once active); "training": its GPUs are
    lent to a campaign's trainer (Libra's lever) and run no engine."""

    instance_id: str
    tp: int
    first_gpu: int
    state: str = "active"


@dataclass
class ClusterPlan:
    """The engine instances the cluster runs now; `version` counts applied changes."""

    num_gpus: int
    tp_choices: list[int]
    instances: list[InstancePlan] = field(default_factory=list)
    version: int = 0
    # The planning batch whose split the cluster runs ("" when none holds it): a second
    # planning batch waits for it to finish before planning its own.
    owner: str = ""
    # HOST:PORT of the engine host's scheduler service, which every worker's decide
    # calls ("" until the engine host announces it).
    scheduler_address: str = ""


@dataclass
class PlanChange:
    """Retire instances and start others on exactly their GPUs (a reshape)."""

    retire: list[str]
    create: list[InstancePlan]
    reason: str = ""


@dataclass
class BlockMove:
    """Engine instances lent to the trainer, or given back to the rollout (Libra's
    lever in an asynchronous campaign); one direction or both."""

    to_trainer: list[str] = field(default_factory=list)
    to_rollout: list[str] = field(default_factory=list)
    reason: str = ""


@dataclass
class ControlInput:
    plan: ClusterPlan
    queue_prefix: str = ""
    # Applied changes before the workflow continues as new (keeps its history short).
    changes_per_run: int = 50


@dataclass
class BatchPlanRequest:
    batch_id: str
    policy: str


@dataclass
class MigrateRequest:
    """Move a trajectory's cached KV between instances (during its tool call)."""

    trajectory_id: str
    source: str
    target: str
