"""The models and GPUs Heddle knows: their shapes and datasheet figures. Shared facts,
below everything: the cluster file is checked against them and the cost model derives
iteration times from them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

BYTES_PER_PARAM = 2  # bf16 weights
BYTES_PER_KV_ELEMENT = 2  # bf16 KV cache


@dataclass(frozen=True)
class ModelShape:
    name: str
    num_params: float
    num_layers: int
    hidden_size: int
    num_kv_heads: int
    head_dim: int

    @property
    def weight_bytes(self) -> float:
        return self.num_params * BYTES_PER_PARAM

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V, every layer, every KV head (summed over the TP group)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * BYTES_PER_KV_ELEMENT


@dataclass(frozen=True)
class GPUSpec:
    name: str
    memory_bytes: float
    hbm_bytes_per_s: float
    bf16_flops: float  # dense
    nvlink_bytes_per_s: float  # per direction, per GPU


# Model shapes: the models' config.json on their Hugging Face cards (Qwen3 technical report).
MODELS: dict[str, ModelShape] = {
    "qwen3-8b": ModelShape("qwen3-8b", 8.19e9, 36, 4096, 8, 128),
    "qwen3-14b": ModelShape("qwen3-14b", 14.8e9, 40, 5120, 8, 128),
    "qwen3-32b": ModelShape("qwen3-32b", 32.8e9, 64, 5120, 8, 128),
    # Calibration only (the published vLLM measurements are of Llama-3.1-8B).
    "llama-3.1-8b": ModelShape("llama-3.1-8b", 8.03e9, 32, 4096, 8, 128),
}

# GPUs: NVIDIA datasheets (H100 SXM5, H200 SXM, A100 80GB SXM4); NVLink per GPU per direction.
GPUS: dict[str, GPUSpec] = {
    "h100": GPUSpec("h100", 80e9, 3.35e12, 989e12, 450e9),
    "h200": GPUSpec("h200", 141e9, 4.8e12, 989e12, 450e9),
    "a100": GPUSpec("a100", 80e9, 2.039e12, 312e12, 300e9),
    "a100-40gb": GPUSpec("a100-40gb", 40e9, 1.555e12, 312e12, 300e9),
}


@dataclass(frozen=True)
class Speculation:
    """Speculative decoding on every instance (WAR's low-load lever): each decoding
    request drafts `draft_tokens` tokens per step (from a suffix tree of earlier
    trajectories, or n-grams of its own context) and the engine verifies them in one
    pass. `acceptance` is the chance each drafted token is accepted, given the ones
    before it were: the cost model's only guess about the workload (vLLM measures it).
    `max_batch`: speculate only while an instance decodes at most this many requests
    (None: where the cost model says it pays, per instance shape)."""

    method: str = "suffix"  # vLLM's speculative method: "suffix" or "ngram"
    draft_tokens: int = 4
    acceptance: float = 0.5
    max_batch: int | None = None

    @property
    def tokens_per_verify(self) -> float:
        """Tokens a verify pass makes on average: the accepted run of drafts plus the
        token the pass samples itself, (1 - a^(k+1)) / (1 - a)."""
        a, k = self.acceptance, self.draft_tokens
        return float(k + 1) if a >= 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)


@dataclass(frozen=True)
class Disaggregation:
    """Prefill and decode on separate instances (Prorsa's lever). A step whose uncached
    context is at least `min_prefill_tokens` prefills on an instance serving prefill,
    which pulls the trajectory's cached KV from its decode instance and sends the new KV
    back over the interconnect; smaller prefills stay on the decode instance (as vLLM's
    and Dynamo's conditional disaggregation keep them). `roles`: "forecast" switches
    instances between the roles from the forecast prefill and decode demand of the next
    `horizon_s` seconds, up to `prefill_share` of the GPUs; "static" keeps the narrowest
    instances on that share of the GPUs (at least one instance) on prefill all along."""

    min_prefill_tokens: int = 512
    roles: str = "forecast"  # "forecast" or "static"
    prefill_share: float = 0.25
    horizon_s: float = 10.0


@dataclass(frozen=True)
class ClusterShape:
    """The cluster as the policies, the simulator and the engines see it, built once from
    the cluster file (`ClusterConfig.shape`): every reader takes this one value, so no
    two of them can unpack the file differently."""

    model: str = "qwen3-8b"
    gpu: str = "h100"
    num_gpus: int = 8
    default_tp: int = 1
    tp_choices: tuple[int, ...] = (1, 2, 4, 8)
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    gpu_memory_utilization: float = 0.9
    kv_overcommit_per_s: float = 0.0  # EngineLimits.overcommit_per_s
    kv_release_evicted: bool = True  # EngineLimits.release_evicted
    speculation: Speculation | None = None  # off unless the cluster file asks
    disaggregation: Disaggregation | None = None  # off (prefill and decode co-located)

    @property
    def prefill_pool_gpus(self) -> int:
        """GPUs a static prefill pool holds: `prefill_share` of them, in instances of
        `default_tp`, at least one, never all."""
        config = self.disaggregation
        if config is None or config.roles != "static":
            return 0
        tp = self.default_tp
        gpus = int(config.prefill_share * self.num_gpus) // tp * tp
        return min(max(gpus, tp), self.num_gpus - tp)

    def for_placement(self) -> ClusterShape:
        """The cluster the policies split and place on: without a static prefill pool's
        GPUs (a simulation adds the pool beside their split)."""
        pool = self.prefill_pool_gpus
        return dataclasses.replace(self, num_gpus=self.num_gpus - pool) if pool else self
