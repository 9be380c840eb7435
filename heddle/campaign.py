"""A training campaign's vocabulary: what it is asked to do, the state it carries from
iteration to iteration (and through continue-as-new), and what each iteration did.

Plain dataclasses, as every payload that crosses Temporal is (`heddle.types`): the
campaign workflow holds them, activities take and return them, the client reads them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from heddle.checkpoints import CheckpointRef
from heddle.staleness import ON_STALE
from heddle.types import RolloutOptions

MODES = ("agent", "simulated")


@dataclass(frozen=True)
class CampaignSpec:
    """A campaign as its user starts it. `agent`: the model works the stored task set on
    vLLM engines and the trainer updates it; `simulated`: each iteration replays a
    generated batch of `workload` (drifting with the iteration) on simulated engines, and
    training and weight sync take the times the cost model gives them."""

    name: str
    mode: str
    iterations: int
    samples: int  # trajectories per task (a GRPO group) or per prompt
    tasks_per_iteration: int  # agent: tasks each iteration (0: the whole set); simulated: prompts
    seed: int = 0
    options: RolloutOptions = field(default_factory=RolloutOptions)
    checkpoint_root: str = ""  # where the trainer commits its checkpoints
    model_path: str = ""  # agent: the base model (step 0 is it, untied)
    sync_weights: bool = True  # off: the engines keep the base weights (the control run)
    lr: float = 2e-4
    micro_batch: int = 8
    workload: str = "coding"  # simulated
    # Continue as new after this many iterations, so a campaign of hundreds never nears
    # Temporal's history limits.
    iterations_per_run: int = 10
    # Asynchronous with bounded staleness: up to this many batches roll out ahead of the
    # one being trained, so a step learns from tokens at most this many versions old
    # (`heddle.staleness`). 0: synchronous, each rollout after the step before it.
    max_staleness: int = 0
    # A trajectory with tokens older than the bound: "partial" keeps them as context
    # out of the loss; "drop" leaves its whole group out of the step.
    on_stale: str = "partial"
    # Libra's lever (asynchronous campaigns): every GPU runs an engine between steps, and
    # a train step borrows the engine instances that hold no trajectory, and the least
    # loaded up to this many GPUs, giving them back before the sync. 0: off (the trainer
    # is modelled on the cluster's GPUs, as it is when a plan of one instance lends none).
    trainer_gpus: int = 0
    # Libra's lever in a synchronous simulated campaign: once every trajectory of the
    # batch has started, the engine instances the rollout's tail leaves idle train on the
    # trajectories already finished, and the step after the rollout trains what is left.
    libra_tail: bool = False


@dataclass
class CampaignState:
    """What the campaign has done, carried through continue-as-new. `consumed_task_ids`
    names every task trained on this epoch (not a cursor into the task list, which a
    changed list or a crash between reads can shift)."""

    iteration: int = 0  # iterations finished
    policy_version: int = 0  # the train step of the weights the engines run
    checkpoint: CheckpointRef | None = None  # the last committed checkpoint
    consumed_task_ids: list[str] = field(default_factory=list)
    epoch: int = 0
    predictor_version: str = ""  # the batch the predictor was last fitted on
    open_batch: str = ""  # the rollout batch in flight, if any
    phase: str = "starting"  # starting, rollout, train, sync, done, stopped


@dataclass
class CampaignInput:
    spec: CampaignSpec
    state: CampaignState = field(default_factory=CampaignState)


@dataclass(frozen=True)
class OpenIteration:
    """The campaign asks for iteration `iteration`'s batch: the next tasks not consumed."""

    spec: CampaignSpec
    iteration: int
    consumed_task_ids: list[str]
    epoch: int


@dataclass(frozen=True)
class IterationBatch:
    batch_id: str
    num_trajectories: int
    task_ids: list[str]  # what training on it consumes
    epoch: int  # a new epoch starts when every task of the set was consumed
    options: RolloutOptions  # as stored with the batch (its sampling seed is the iteration's)


@dataclass(frozen=True)
class TrainRequest:
    spec: CampaignSpec
    start: CheckpointRef
    batch_id: str
    # GPUs lent to the step (`CampaignSpec.trainer_gpus`): it trains on them once they
    # have joined (`train_join_s`). 0: none lent; it trains on the cluster's.
    gpus: int = 0
    # Tokens already trained on during the rollout's tail (`CampaignSpec.libra_tail`).
    tokens_done: float = 0.0
    # The rollout still runs: the step trains only the trajectories already finished.
    tail: bool = False

    @property
    def oldest_version(self) -> int | None:
        """The oldest policy version whose tokens this step learns from; None: every
        token (a synchronous campaign, or one whose engines keep the base weights)."""
        if not self.spec.max_staleness or not self.spec.sync_weights:
            return None
        return self.start.step - self.spec.max_staleness


@dataclass(frozen=True)
class TrainResult:
    checkpoint: CheckpointRef
    samples: int
    tokens: int
    loss: float
    logprob_gap: float  # mean |trainer - rollout| log-prob before the update
    train_s: float  # modelled seconds (simulated) or the step's own wall seconds


@dataclass(frozen=True)
class TrainProgress:
    """How far a modelled step trained in slices has come. The step trains a slice at a
    time so that engine instances falling idle meanwhile can join it (Libra's lever
    inside a step: the campaign lends them between slices); the workflow carries this
    from slice to slice, and the trainer keeps nothing between them."""

    gpus: int = 0  # joined: training now
    joining_gpus: int = 0  # lent and joining (`train_join_s`)
    join_left_s: float = -1.0  # their join's modelled seconds left; -1: it starts now
    tokens_done: float = 0.0
    elapsed_s: float = 0.0  # the step's modelled seconds so far


@dataclass(frozen=True)
class TrainSlice:
    request: TrainRequest
    progress: TrainProgress
    # The most modelled seconds this slice trains (0: no limit). A slice also ends when
    # the GPUs joining have joined, and at the step's end.
    slice_s: float = 0.0


@dataclass(frozen=True)
class SliceResult:
    """A slice's end: the step's progress, what the lending rule reads, and the step's
    result once it is done (its checkpoint committed)."""

    progress: TrainProgress
    left_s: float  # the step's modelled seconds left, once the joining GPUs have joined
    join_s: float  # an instance lent now would join after this long
    trained: TrainResult | None = None


@dataclass(frozen=True)
class IdleLend:
    """Between a step's slices: lend it the engine instances that fell idle, where the
    step (`left_s` more) outlasts their join (`join_s`) and restart
    (`scheduler.reallocation.blocks_for_trainer`)."""

    train_left_s: float
    join_s: float


@dataclass(frozen=True)
class TailLend:
    """During a synchronous rollout: lend the trainer the instances that hold no
    trajectory, once all `num_trajectories` of `batch_id` have started."""

    batch_id: str
    num_trajectories: int


@dataclass(frozen=True)
class SyncRequest:
    checkpoint: CheckpointRef


@dataclass(frozen=True)
class IterationRecord:
    """One finished iteration, as `heddle campaign status` tabulates and plots it."""

    campaign: str
    iteration: int
    batch_id: str
    policy_version: int  # the weights the rollout ran
    trajectories: int
    completed: int
    reward_mean: float
    pass_rate: float
    makespan_s: float
    train_s: float
    sync_s: float
    logprob_gap: float
    checkpoint: str
    finished_at: float


def check_spec(spec: CampaignSpec) -> None:
    """Refuse a campaign its workflow could not run, before anything is stored."""
    if spec.mode not in MODES:
        raise ValueError(f"mode must be one of {list(MODES)}, got {spec.mode!r}")
    for name in ("iterations", "samples", "iterations_per_run"):
        if getattr(spec, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(spec, name)}")
    if not spec.name or "/" in spec.name:
        raise ValueError(f"a campaign name is non-empty without '/', got {spec.name!r}")
    if spec.max_staleness < 0:
        raise ValueError(f"max_staleness must be >= 0, got {spec.max_staleness}")
    if spec.on_stale not in ON_STALE:
        raise ValueError(f"on_stale must be one of {list(ON_STALE)}, got {spec.on_stale!r}")
    if spec.trainer_gpus < 0:
        raise ValueError(f"trainer_gpus must be >= 0, got {spec.trainer_gpus}")
    if spec.libra_tail and (spec.max_staleness or spec.mode != "simulated"):
        raise ValueError(
            "libra_tail (Libra's tail) needs a synchronous simulated campaign: "
            "max_staleness 0, mode 'simulated' (an asynchronous one lends with trainer_gpus)"
        )
    if spec.trainer_gpus and not spec.max_staleness:
        raise ValueError(
            "trainer_gpus (Libra's reallocation) needs an asynchronous campaign: "
            "max_staleness >= 1 (a synchronous step trains on every GPU already)"
        )


def campaign_spec(stored: dict[str, Any]) -> CampaignSpec:
    """A spec as the store keeps it (`dataclasses.asdict`), back."""
    options = RolloutOptions(**stored["options"])
    return CampaignSpec(**{**stored, "options": options})
