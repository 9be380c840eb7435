"""Configuration models, validated once at the edge (STYLE.md 9).

A cluster file is YAML: `model`, `gpu`, `num_gpus`, `tp_choices`, `default_tp`, the
engine limits and, optionally, `engine:` (simulated, or vLLM with a model folder). Errors
name the file, the line and the field.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from heddle.errors import ConfigError
from heddle.hardware import GPUS, MODELS, ClusterShape, Disaggregation, Speculation

M = TypeVar("M", bound=BaseModel)


class EngineConfig(BaseModel):
    """What serves the LLM steps: simulated engines (the cost model's time, scaled) or
    vLLM instances loading `model_path` (a Hugging Face folder: `heddle model tiny`
    builds one for CPU)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["simulated", "vllm"] = "simulated"
    model_path: str | None = None
    max_model_len: Annotated[int, Field(ge=64)] = 8192
    kv_cache_gib: Annotated[float, Field(gt=0.0)] = (
        2.0  # vLLM's CPU KV cache (VLLM_CPU_KVCACHE_SPACE)
    )
    enforce_eager: bool = True  # no torch.compile: faster start, slower steps
    # Host each vLLM instance in this process's children ("process") or as a Ray actor in
    # a placement group ("ray": `ray_address`, or a local Ray started by the worker).
    hosting: Literal["process", "ray"] = "process"
    ray_address: str | None = None
    use_gpus: bool = False  # Ray: reserve TP GPUs per instance (False: one CPU)
    # The engine processes' CPU niceness (0-19). None: 10 on vLLM's CPU build, where the
    # engines share cores with the Temporal server and worker and would starve them
    # (deadlines missed, heartbeats late); 0 on GPUs.
    nice: Annotated[int, Field(ge=0, le=19)] | None = None

    @model_validator(mode="after")
    def _check(self) -> EngineConfig:
        if self.kind == "vllm":
            if not self.model_path:
                raise ValueError("model_path: a vLLM engine needs a model folder")
            if not (Path(self.model_path) / "config.json").is_file():
                raise ValueError(
                    f"model_path: {self.model_path} has no config.json "
                    "(build one with `heddle model tiny --out DIR`)"
                )
        return self


class SpeculationConfig(BaseModel):
    """Speculative decoding on every instance (`heddle.hardware.Speculation`): vLLM's
    `suffix` method (a suffix tree of earlier trajectories; needs the arctic-inference
    package) or `ngram` (the request's own context). Simulated engines take `acceptance`
    as the workload's; `max_batch` left out is where the cost model says it pays."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    method: Literal["suffix", "ngram"] = "suffix"
    draft_tokens: int = Field(4, ge=1, le=32)
    acceptance: float = Field(0.5, ge=0.0, le=1.0)
    max_batch: int | None = Field(None, ge=0)

    def shape(self) -> Speculation:
        return Speculation(
            method=self.method,
            draft_tokens=self.draft_tokens,
            acceptance=self.acceptance,
            max_batch=self.max_batch,
        )


class DisaggregationConfig(BaseModel):
    """Prefill and decode on separate instances, roles switched from forecast demand
    (`heddle.hardware.Disaggregation`). Simulated engines only: vLLM's CPU build has no
    KV connector to move a prefill's KV between instances."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_prefill_tokens: int = Field(512, ge=1)
    roles: Literal["forecast", "static"] = "forecast"
    prefill_share: float = Field(0.25, gt=0.0, lt=1.0)
    horizon_s: float = Field(10.0, gt=0.0)

    def shape(self) -> Disaggregation:
        return Disaggregation(
            min_prefill_tokens=self.min_prefill_tokens,
            roles=self.roles,
            prefill_share=self.prefill_share,
            horizon_s=self.horizon_s,
        )


class ClusterConfig(BaseModel):
    """The GPUs a rollout runs on and how the engines on them are shaped."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = "qwen3-8b"
    gpu: str = "h100"
    num_gpus: int = Field(4, ge=1)
    tp_choices: tuple[int, ...] = (1, 2, 4, 8)
    default_tp: int = Field(1, ge=1)
    max_num_seqs: int = Field(256, ge=1)
    max_num_batched_tokens: int = Field(8192, ge=16)
    gpu_memory_utilization: float = Field(0.9, gt=0.0, le=1.0)
    # Simulated engines: how fast (per modelled second) an instance's admission may grow
    # past the KV its trajectories reserved (`engines.core.EngineLimits`); 0 keeps it at
    # the reservations.
    kv_overcommit_per_s: float = Field(0.0, ge=0.0, le=1.0)
    # Simulated engines: an evicted context of a trajectory in its tool call ends its
    # hold on the instance (`engines.core.EngineLimits.release_evicted`).
    kv_release_evicted: bool = True
    speculation: SpeculationConfig | None = None
    disaggregation: DisaggregationConfig | None = None
    engine: EngineConfig = EngineConfig()

    @model_validator(mode="after")
    def _check(self) -> ClusterConfig:
        if self.model.lower() not in MODELS:
            raise ValueError(f"model: unknown model {self.model!r}; known: {sorted(MODELS)}")
        if self.gpu.lower() not in GPUS:
            raise ValueError(f"gpu: unknown GPU {self.gpu!r}; known: {sorted(GPUS)}")
        for tp in self.tp_choices:
            if tp < 1 or tp & (tp - 1):
                raise ValueError(f"tp_choices: {tp} is not a power of two")
        if self.default_tp not in self.tp_choices:
            raise ValueError(f"default_tp: {self.default_tp} is not in tp_choices")
        if self.num_gpus % self.default_tp:
            raise ValueError(
                f"num_gpus: {self.num_gpus} GPUs do not divide into TP-{self.default_tp} instances"
            )
        spec = self.speculation
        if (
            spec is not None
            and spec.method == "suffix"
            and self.engine.kind == "vllm"
            and importlib.util.find_spec("arctic_inference") is None
        ):
            raise ValueError(
                "speculation.method: vLLM's suffix method needs the arctic-inference "
                "package (built from source as the Makefile's real-engine set-up does); "
                "`ngram` needs nothing"
            )
        if self.disaggregation is not None and self.engine.kind == "vllm":
            raise ValueError(
                "disaggregation: simulated engines only; vLLM's CPU build has no KV "
                "connector to move a prefill's KV to its decode instance"
            )
        return self

    def shape(self) -> ClusterShape:
        """What the policies, the simulator and the engines read of this file."""
        return ClusterShape(
            model=self.model,
            gpu=self.gpu,
            num_gpus=self.num_gpus,
            default_tp=self.default_tp,
            tp_choices=self.tp_choices,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            gpu_memory_utilization=self.gpu_memory_utilization,
            kv_overcommit_per_s=self.kv_overcommit_per_s,
            kv_release_evicted=self.kv_release_evicted,
            speculation=self.speculation.shape() if self.speculation else None,
            disaggregation=self.disaggregation.shape() if self.disaggregation else None,
        )

    def instance_ids(self) -> list[str]:
        """The homogeneous default split: one instance per `default_tp` GPUs."""
        return [f"i{k}" for k in range(self.num_gpus // self.default_tp)]


def _yaml_line(text: str, loc: tuple[Any, ...]) -> int | None:
    """The 1-based line of the YAML node at `loc`, or of its nearest existing parent."""
    try:
        node = yaml.compose(text)
    except yaml.YAMLError:
        return None
    line = node.start_mark.line + 1 if node is not None else None
    for key in loc:
        if isinstance(node, yaml.MappingNode):
            match = next((v for k, v in node.value if k.value == key), None)
            if match is None:
                return line
            node = match
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            node = node.value[key]
        else:
            break
        line = node.start_mark.line + 1
    return line


class BatchSpec(BaseModel):
    """A rollout batch described by its workload instead of a trace file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    workload: str
    prompts: int = Field(4, ge=1)
    samples: int = Field(16, ge=1)
    seed: int = 0
    iteration: int = Field(0, ge=0)

    @model_validator(mode="after")
    def _check(self) -> BatchSpec:
        from heddle.workloads import WORKLOADS

        if self.workload not in WORKLOADS:
            raise ValueError(
                f"workload: unknown workload {self.workload!r}; valid: {sorted(WORKLOADS)}"
            )
        return self


def load_cluster(path: str | Path) -> ClusterConfig:
    """Read a cluster YAML file; raise `ConfigError` naming file, line and field."""
    return _load_yaml_model(path, ClusterConfig, "cluster")


def load_batch_spec(path: str | Path) -> BatchSpec:
    """Read a batch spec YAML file (workload, prompts, samples, seed, iteration)."""
    return _load_yaml_model(path, BatchSpec, "batch spec")


def _load_yaml_model(path: str | Path, model: type[M], what: str) -> M:
    path_str = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(path_str, None, None, f"cannot be read: {exc.strerror}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        raise ConfigError(path_str, line, None, f"is not valid YAML: {exc}") from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(path_str, 1, None, "must be a YAML mapping")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = tuple(err.get("loc", ()))
        msg = str(err.get("msg", "is invalid"))
        field = ".".join(str(p) for p in loc) if loc else None
        if msg.startswith("Value error, ") and ": " in msg:
            # Raised by a model validator as "field: message" (of a nested model at loc).
            sub, msg = msg.removeprefix("Value error, ").split(": ", 1)
            loc = (*loc, sub)
            field = ".".join(str(p) for p in loc)
        if err.get("type") == "extra_forbidden":
            msg = f"is not a {what} field"
        raise ConfigError(path_str, _yaml_line(text, loc), field, msg) from exc
