"""Iteration times of an LLM engine from first principles (DESIGN.md, "The engine core").

A decode iteration reads the weights once and every running request's KV cache, so it is
memory bound until the batch is large enough to be compute bound; prefill is compute
bound. Tensor parallelism divides both across GPUs and adds two all-reduces per layer.
Interference between co-located requests is not a fudge factor: it is what a larger
batch and longer contexts cost here.

Every constant names its source. tests/test_costmodel.py checks the model against
published vLLM measurements (per-token latency at batch 1, closed-loop throughput at
batch 8) within the tolerances it states; Llama-3.1-8B and the A100 40GB are in the
tables for that reason: they are what those measurements used.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

from heddle.hardware import (
    BYTES_PER_PARAM,
    GPUS,
    MODELS,
    ClusterShape,
    GPUSpec,
    ModelShape,
    Speculation,
)

# Achievable fractions of peak. Batch-1 decode of Llama-3.1-8B in vLLM runs at about 77%
# of the HBM roofline (J. Musgrave's A100 sweep, see ITERATION_OVERHEAD_S); large
# prefill GEMMs at 70-80% of dense bf16 peak (cuBLAS); 0.7 fits the closed-loop
# throughput test in tests/test_costmodel.py.
HBM_EFFICIENCY = 0.8
COMPUTE_EFFICIENCY = 0.7
NVLINK_EFFICIENCY = 0.7
# Per-iteration time beyond the weight and KV reads (kernel launch gaps, sampling, the
# scheduler's share not hidden by async scheduling). Fitted to batch-1 TPOT of
# Llama-3.1-8B with vLLM: 6.48 ms on H100 80GB (vLLM 0.21, InferenceBench concurrency
# sweep) and 13.3 ms (75 tok/s) on A100 40GB (vLLM 0.23, J. Musgrave's sweep), whose
# pure weight reads at HBM_EFFICIENCY take 6.0 and 12.9 ms.
ITERATION_OVERHEAD_S = 0.5e-3
# NCCL all-reduce launch latency on NVLink, small messages: ~10 us (nccl-tests).
ALLREDUCE_LATENCY_S = 10e-6
# Activation and CUDA-graph memory vLLM reserves beside weights and KV, per GPU.
ACTIVATION_RESERVE_BYTES = 4e9
# Migration across nodes: 400 Gb/s InfiniBand per GPU (the paper's testbed; an HGX node
# has a NIC per GPU), at 80% efficiency.
INTERNODE_BYTES_PER_S = 50e9 * 0.8
# GPUs per node (HGX H100/H200/A100): NVLink joins the GPUs of one node only.
GPUS_PER_NODE = 8
MIGRATION_SETUP_S = 5e-3
# Reconfiguration: weights reloaded from host memory over PCIe Gen5 (~25 GB/s achievable
# per GPU), plus engine restart (process start, CUDA graph capture): ~20 s for vLLM.
WEIGHT_RELOAD_BYTES_PER_S = 25e9
ENGINE_RESTART_S = 20.0
# Drafting from a suffix tree, per decoding request per step, on the host: arctic-inference
# 0.3.0's `speculate` plus appending the step's token, 8.7 + 3.1 us over a tree of 2,000
# earlier responses of 2,000 tokens (`python benchmarks/suffix_draft_cost.py` on this
# machine's idle CPU; 21 us with two simulations running beside it).
DRAFT_S_PER_SEQ = 12e-6
# The context a request is assumed to decode at when an instance's speculation threshold
# is set (`CostModel.speculation_max_batch`): a few turns into an agentic trajectory.
SPECULATION_REFERENCE_CONTEXT = 8192


@dataclass(frozen=True)
class IterationTerms:
    """Iteration time = max(memory, compute) + all-reduce + overhead, each linear in the
    batch's tokens and KV: the coefficients, so vectorised planners share the model."""

    mem_base_s: float  # the weights, read once
    mem_per_kv_token_s: float
    compute_per_token_s: float
    compute_per_attended_s: float
    allreduce_base_s: float
    allreduce_per_token_s: float
    overhead_s: float


@dataclass(frozen=True)
class CostModel:
    """Times for one engine instance: one model on `tp` GPUs of one kind."""

    model: ModelShape
    gpu: GPUSpec
    tp: int = 1
    gpu_memory_utilization: float = 0.9

    @classmethod
    def for_names(
        cls, model: str, gpu: str, tp: int = 1, gpu_memory_utilization: float = 0.9
    ) -> CostModel:
        try:
            shape = MODELS[model.lower()]
        except KeyError:
            raise ValueError(f"unknown model {model!r}; known: {sorted(MODELS)}") from None
        try:
            spec = GPUS[gpu.lower()]
        except KeyError:
            raise ValueError(f"unknown GPU {gpu!r}; known: {sorted(GPUS)}") from None
        return cls(shape, spec, tp, gpu_memory_utilization)

    @classmethod
    def of(cls, cluster: ClusterShape, tp: int) -> CostModel:
        """One TP-`tp` instance of the cluster."""
        return cls.for_names(cluster.model, cluster.gpu, tp, cluster.gpu_memory_utilization)

    @property
    def kv_capacity_tokens(self) -> int:
        """KV-cache tokens the instance holds: what memory leaves after the weights."""
        usable = self.gpu.memory_bytes * self.gpu_memory_utilization - ACTIVATION_RESERVE_BYTES
        free = usable * self.tp - self.model.weight_bytes
        if free <= 0:
            return 0
        return int(free // self.model.kv_bytes_per_token)

    @cached_property
    def terms(self) -> IterationTerms:
        """The iteration time's linear terms, computed once per instance shape."""
        m = self.model
        hbm = self.tp * self.gpu.hbm_bytes_per_s * HBM_EFFICIENCY
        flops = self.tp * self.gpu.bf16_flops * COMPUTE_EFFICIENCY
        nvlink = self.gpu.nvlink_bytes_per_s * NVLINK_EFFICIENCY
        ring_bytes = 2 * (self.tp - 1) / self.tp * m.hidden_size * BYTES_PER_PARAM
        two_per_layer = 2 * m.num_layers if self.tp > 1 else 0
        return IterationTerms(
            mem_base_s=m.weight_bytes / hbm,
            mem_per_kv_token_s=m.kv_bytes_per_token / hbm,
            compute_per_token_s=2 * m.num_params / flops,
            compute_per_attended_s=4 * m.num_layers * m.hidden_size / flops,
            allreduce_base_s=two_per_layer * ALLREDUCE_LATENCY_S,
            allreduce_per_token_s=two_per_layer * ring_bytes / nvlink,
            overhead_s=ITERATION_OVERHEAD_S,
        )

    def iteration_s(
        self,
        *,
        num_decode_seqs: int,
        decode_context_tokens: int,
        num_prefill_tokens: int = 0,
        prefill_attended_tokens: float = 0.0,
        prefill_cached_tokens: int = 0,
        draft_tokens: int = 0,
    ) -> float:
        """One engine iteration: `num_decode_seqs` decode tokens whose KV totals
        `decode_context_tokens`, plus `num_prefill_tokens` prefill tokens that each attend
        to `prefill_attended_tokens` on average (earlier context plus half their own
        chunk) and read `prefill_cached_tokens` of cached KV in all. With `draft_tokens`,
        each decoding request verifies that many drafted tokens besides its own in the
        same pass: its KV is read once, but every position is computed and attends to
        the context (and the drafts are made on the host first)."""
        positions = 1 + draft_tokens
        num_tokens = num_decode_seqs * positions + num_prefill_tokens
        if num_tokens == 0:
            return 0.0
        t = self.terms
        mem_s = (
            t.mem_base_s + (decode_context_tokens + prefill_cached_tokens) * t.mem_per_kv_token_s
        )
        attended = decode_context_tokens * positions + num_prefill_tokens * prefill_attended_tokens
        compute_s = num_tokens * t.compute_per_token_s + attended * t.compute_per_attended_s
        allreduce_s = t.allreduce_base_s + num_tokens * t.allreduce_per_token_s
        draft_s = num_decode_seqs * DRAFT_S_PER_SEQ if draft_tokens else 0.0
        return max(mem_s, compute_s) + allreduce_s + t.overhead_s + draft_s

    def speculative_decode_s(
        self, spec: Speculation, *, num_decode_seqs: int, decode_context_tokens: int
    ) -> float:
        """A decode iteration's time per token made under `spec`: one verify pass,
        charged over the tokens it makes on average (a fluid model: the engine core
        advances one token an iteration, so each iteration costs its share of a pass)."""
        return per_token_of_verify(self.iteration_s, spec, num_decode_seqs, decode_context_tokens)

    def speculation_max_batch(
        self, spec: Speculation, max_num_seqs: int, context_tokens: int = 0
    ) -> int:
        """The largest decode batch at which speculating pays on this instance: a verify
        pass's time per token made below a plain iteration's, with every request at
        `context_tokens` (default SPECULATION_REFERENCE_CONTEXT). A small batch is memory
        bound, so the drafts' positions ride on the weight and KV reads for free; a large
        one (its KV no more than the cache holds) is compute bound and pays for every
        rejected position. 0: it never pays."""
        if spec.max_batch is not None:
            return min(spec.max_batch, max_num_seqs)
        context = context_tokens or SPECULATION_REFERENCE_CONTEXT
        best = 0
        for batch in range(1, max_num_seqs + 1):
            kv = min(batch * context, self.kv_capacity_tokens)  # a full cache at most
            plain = self.iteration_s(num_decode_seqs=batch, decode_context_tokens=kv)
            spec_s = self.speculative_decode_s(
                spec, num_decode_seqs=batch, decode_context_tokens=kv
            )
            if spec_s < plain:
                best = batch
        return best

    def decode_token_s(self, batch_size: int = 1, context_tokens: int = 1024) -> float:
        """Per-token latency of a decode iteration at `batch_size`, each with `context_tokens`."""
        return self.iteration_s(
            num_decode_seqs=batch_size, decode_context_tokens=batch_size * context_tokens
        )

    def prefill_tokens_per_s(self, token_budget: int) -> float:
        """Prefill throughput with every iteration a full `token_budget` of prefill (an
        instance serving prefill, `Disaggregation`)."""
        return token_budget / self.prefill_s(token_budget)

    def prefill_s(self, num_tokens: int, cached_tokens: int = 0) -> float:
        """Recomputing a context: what a turn on a cold instance pays."""
        return self.iteration_s(
            num_decode_seqs=0,
            decode_context_tokens=0,
            num_prefill_tokens=num_tokens,
            prefill_attended_tokens=cached_tokens + num_tokens / 2,
            prefill_cached_tokens=cached_tokens,
        )

    def migration_s(
        self, context_tokens: int, *, same_node: bool = True, target_tp: int | None = None
    ) -> float:
        """Moving a trajectory's KV cache to another instance: each GPU sends its shard
        over its own link (NVLink within a node, its NIC across nodes), as many links at
        once as the narrower of the two instances has GPUs."""
        nbytes = context_tokens * self.model.kv_bytes_per_token
        bw = self.gpu.nvlink_bytes_per_s * NVLINK_EFFICIENCY if same_node else INTERNODE_BYTES_PER_S
        links = min(self.tp, target_tp or self.tp)
        return MIGRATION_SETUP_S + nbytes / (bw * links)

    def reconfiguration_s(self) -> float:
        """Restarting the instance at another TP degree: weight reload plus engine start."""
        return self.model.weight_bytes / self.tp / WEIGHT_RELOAD_BYTES_PER_S + ENGINE_RESTART_S


def per_token_of_verify(
    iteration_cost: Callable[..., float],
    spec: Speculation,
    num_decode_seqs: int,
    decode_context_tokens: int,
) -> float:
    """A verify pass's time (`iteration_cost` is `CostModel.iteration_s` or the engine
    core's copy of it) over the tokens it makes on average."""
    verify_s = iteration_cost(
        num_decode_seqs=num_decode_seqs,
        decode_context_tokens=decode_context_tokens,
        draft_tokens=spec.draft_tokens,
    )
    return verify_s / spec.tokens_per_verify


# Training a policy: about 6 FLOPs per parameter per token (2 forward, 4 backward;
# Kaplan et al. 2020) at this model FLOPs utilization, which FSDP trainers of 8-32B
# models report at 30-45% on H100s (verl's and Megatron's published MFU).
TRAIN_MFU = 0.35


def train_step_s(
    model: ModelShape, gpu: GPUSpec, num_gpus: int, tokens: int, mfu: float = TRAIN_MFU
) -> float:
    """A policy update over `tokens` tokens on `num_gpus` GPUs (the rollout's own, as a
    colocated trainer runs)."""
    return 6 * model.num_params * tokens / (num_gpus * gpu.bf16_flops * mfu)


def train_tokens_per_gpu_s(model: ModelShape, gpu: GPUSpec, mfu: float = TRAIN_MFU) -> float:
    """Tokens one trainer GPU works through a second: a trainer whose GPUs come and go
    (Libra's lever) works at this rate times the GPUs it has."""
    return gpu.bf16_flops * mfu / (6 * model.num_params)


# Bytes of training state per parameter a trainer GPU holds its shard of: bf16 weights
# and gradients, fp32 master weights and Adam's two moments (2 + 2 + 4 + 4 + 4).
TRAIN_STATE_BYTES_PER_PARAM = 16


def train_join_s(model: ModelShape, num_gpus: int) -> float:
    """An engine's GPUs joining the trainer (Libra's move): the engine sleeps and a
    trainer process starts in its place (an engine restart's time), then loads its shard
    of the training state, sharded over `num_gpus`, from host memory."""
    shard = TRAIN_STATE_BYTES_PER_PARAM * model.num_params / num_gpus
    return ENGINE_RESTART_S + shard / WEIGHT_RELOAD_BYTES_PER_S


def weight_sync_s(model: ModelShape, tp: int) -> float:
    """New weights into an instance: each of its GPUs receives its shard over its own
    link (a broadcast from the trainer across nodes), then a setup cost."""
    return MIGRATION_SETUP_S + model.weight_bytes / tp / INTERNODE_BYTES_PER_S


def same_node(first_gpu: int, other_first_gpu: int) -> bool:
    """Whether two instances, by their first GPUs, share a node (an instance never
    spans nodes: TP <= 8), so a move between them goes over NVLink."""
    return first_gpu // GPUS_PER_NODE == other_first_gpu // GPUS_PER_NODE


@dataclass(frozen=True)
class Move:
    """How a trajectory's context reaches another instance, and the time that takes."""

    recompute: bool  # the target prefills the context; else the KV is transferred
    seconds: float


def cheapest_move(
    source: CostModel,
    target: CostModel,
    context_tokens: int,
    *,
    same_node: bool,
    transfer_path: bool = True,
) -> Move:
    """Transfer the KV cache, or let the target recompute it (a prefill) where that is
    faster or no transfer path exists (the vLLM instances here, `engines/pool.py`). With
    GQA models on H100s a long context's transfer wins even across nodes (14B, 30,000
    tokens: 128 ms over one NIC, against 365 ms of prefill on a TP-8); recompute wins
    for short contexts (the transfer's setup) and where the KV is large for the model's
    compute (no GQA) or the links are slow."""
    if context_tokens <= 0:
        return Move(recompute=False, seconds=0.0)  # nothing cached: nothing to move
    recompute_s = target.prefill_s(context_tokens)
    if transfer_path:
        transfer_s = source.migration_s(context_tokens, same_node=same_node, target_tp=target.tp)
        if transfer_s <= recompute_s:
            return Move(recompute=False, seconds=transfer_s)
    return Move(recompute=True, seconds=recompute_s)
