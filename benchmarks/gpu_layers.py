"""Decode and prefill iterations of Qwen3-8B-shaped layers, timed with torch on a GPU,
beside the cost model's figures for the same iterations (docs/simulator.md, "Checked on
a GPU").

    python benchmarks/gpu_layers.py [--layers 4] [--out DIR]
    python benchmarks/gpu_layers.py --tiny --device cpu     # the script's own check

Random bf16 weights, no vLLM: each layer is Qwen3's (RMSNorm, fused QKV with per-head
q/k norms, grouped-query attention through torch's SDPA, output projection, SwiGLU MLP),
without the rotary embedding, an elementwise op of well under 1% of a layer. A decode
iteration is `--layers` layers on a batch of B sequences of C tokens of context each,
replayed as a CUDA graph as vLLM replays its decode steps; the whole model's figure is
the layers' time scaled to 36 layers, plus the LM head timed alone. A prefill iteration
is one sequence of N tokens from an empty cache, run eagerly. Only batches whose KV fits
the instance's cache (the cost model's `kv_capacity_tokens` at TP 1) are timed: vLLM
runs no others. The cost model's figure leaves out `ITERATION_OVERHEAD_S`, the engine's
time beyond the GPU's kernels, which torch alone does not spend.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from engines.costmodel import CostModel


@dataclass(frozen=True)
class LayerShape:
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    layers: int  # the whole model's, which the timed layers are scaled to


# Qwen3-8B's config.json; `heddle.hardware.MODELS["qwen3-8b"]` has the same layers,
# hidden size, KV heads and head size.
QWEN3_8B = LayerShape(4096, 12288, 32, 8, 128, 151936, 36)
TINY = LayerShape(256, 512, 4, 2, 64, 1000, 4)
BATCHES = (1, 4, 16, 64, 128, 256)
CONTEXTS = (1024, 4096, 8192, 16384, 32768)
PREFILLS = (1024, 2048, 4096, 8192, 16384, 32768)


class Layer:
    """One decoder layer's weights and its forward pass over a flat batch of tokens."""

    def __init__(self, s: LayerShape, device: torch.device, dtype: torch.dtype) -> None:
        def weight(rows: int, cols: int) -> torch.Tensor:
            return torch.randn(rows, cols, device=device, dtype=dtype) * cols**-0.5

        self.s = s
        self.qkv = weight((s.heads + 2 * s.kv_heads) * s.head_dim, s.hidden)
        self.out = weight(s.hidden, s.heads * s.head_dim)
        self.gate_up = weight(2 * s.intermediate, s.hidden)
        self.down = weight(s.hidden, s.intermediate)
        self.norms = [torch.ones(n, device=device, dtype=dtype)
                      for n in (s.hidden, s.hidden, s.head_dim, s.head_dim)]  # fmt: skip

    def _qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        s, (attn_norm, _, q_norm, k_norm) = self.s, self.norms
        h = F.rms_norm(x, (s.hidden,), attn_norm)
        q, k, v = (h @ self.qkv.T).split(
            [s.heads * s.head_dim, s.kv_heads * s.head_dim, s.kv_heads * s.head_dim], dim=-1
        )
        q = F.rms_norm(q.unflatten(-1, (s.heads, s.head_dim)), (s.head_dim,), q_norm)
        k = F.rms_norm(k.unflatten(-1, (s.kv_heads, s.head_dim)), (s.head_dim,), k_norm)
        return q, k, v.unflatten(-1, (s.kv_heads, s.head_dim))

    def _rest(self, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        s, mlp_norm = self.s, self.norms[1]
        x = x + attended @ self.out.T
        gate, up = (F.rms_norm(x, (s.hidden,), mlp_norm) @ self.gate_up.T).chunk(2, dim=-1)
        return x + (F.silu(gate) * up) @ self.down.T

    def decode(self, x: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        """x: [B, hidden], one new token per sequence; the caches [B, kv_heads, C, head_dim]
        hold each sequence's context, the new token's K and V written at its last slot."""
        q, k, v = self._qkv(x)
        k_cache[:, :, -1] = k
        v_cache[:, :, -1] = v
        attended = F.scaled_dot_product_attention(q.unsqueeze(2), k_cache, v_cache, enable_gqa=True)
        return self._rest(x, attended.flatten(1))

    def prefill(self, x: torch.Tensor) -> torch.Tensor:
        """x: [N, hidden], one sequence's N tokens, causal, from an empty cache."""
        q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in self._qkv(x))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self._rest(x, attended[0].transpose(0, 1).flatten(1))


def timed_ms(fn: Callable[[], object], device: torch.device, repeat: int) -> float:
    """The median of `repeat` runs after two warm-ups, in milliseconds."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeat):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            began = time.perf_counter()
            fn()
            times.append((time.perf_counter() - began) * 1e3)
    return statistics.median(times)


def as_graph(fn: Callable[[], object], device: torch.device) -> Callable[[], object]:
    """`fn` captured as a CUDA graph (vLLM's decode steps run so, without a launch per
    kernel); on a CPU, or where the capture fails (said on stderr), `fn` itself."""
    if device.type != "cuda":
        return fn
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()  # the warm-up a capture needs
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
    except RuntimeError as e:
        print(f"CUDA graph capture failed, timed eagerly: {e}", file=sys.stderr)
        return fn
    return graph.replay


def gpu_name(device: torch.device) -> str:
    """The cost model's name for the GPU torch runs on (H100 unless it says H200)."""
    if device.type == "cuda" and "H200" in torch.cuda.get_device_name(device):
        return "h200"
    return "h100"


def run(shape: LayerShape, layers: int, device: torch.device, repeat: int, gpu: str,
        batches: tuple[int, ...], contexts: tuple[int, ...], prefills: tuple[int, ...],
        ) -> dict[str, object]:  # fmt: skip
    dtype = torch.bfloat16
    model = CostModel.for_names("qwen3-8b", gpu, 1) if shape == QWEN3_8B else None
    overhead_s = model.terms.overhead_s if model else 0.0
    capacity = model.kv_capacity_tokens if model else max(batches) * max(contexts)
    stack = [Layer(shape, device, dtype) for _ in range(layers)]
    lm_head = torch.randn(shape.vocab, shape.hidden, device=device, dtype=dtype) * 0.02
    scale = shape.layers / layers
    rows: list[dict[str, object]] = []
    with torch.inference_mode():
        for batch in batches:
            x = torch.randn(batch, shape.hidden, device=device, dtype=dtype)

            def head(x: torch.Tensor = x) -> torch.Tensor:
                return (x @ lm_head.T).argmax(-1)

            head_ms = timed_ms(as_graph(head, device), device, repeat)
            for context in contexts:
                if batch * context > capacity:
                    rows.append({"kind": "decode", "batch": batch, "context": context,
                                 "measured_ms": None, "model_ms": None})  # fmt: skip
                    continue
                caches = [tuple(torch.randn(batch, shape.kv_heads, context, shape.head_dim,
                                            device=device, dtype=dtype) for _ in "kv")
                          for _ in stack]  # fmt: skip

                def step(x: torch.Tensor = x, caches: list = caches) -> torch.Tensor:
                    h = x
                    for layer, (k, v) in zip(stack, caches, strict=True):
                        h = layer.decode(h, k, v)
                    return h

                layers_ms = timed_ms(as_graph(step, device), device, repeat)
                measured = layers_ms * scale + head_ms
                modelled = None
                if model:
                    it = model.iteration_s(num_decode_seqs=batch,
                                           decode_context_tokens=batch * context)  # fmt: skip
                    modelled = (it - overhead_s) * 1e3
                rows.append({"kind": "decode", "batch": batch, "context": context,
                             "measured_ms": measured, "model_ms": modelled})  # fmt: skip
                del caches, step  # `step` holds the caches too: free them before the next
                if device.type == "cuda":
                    torch.cuda.empty_cache()
        last = torch.randn(1, shape.hidden, device=device, dtype=dtype)
        head_ms = timed_ms(lambda: (last @ lm_head.T).argmax(-1), device, repeat)
        for tokens in prefills:
            x = torch.randn(tokens, shape.hidden, device=device, dtype=dtype)

            def prefill(x: torch.Tensor = x) -> torch.Tensor:
                h = x
                for layer in stack:
                    h = layer.prefill(h)
                return h

            # The LM head reads the last position only, once, whatever the layers.
            measured = timed_ms(prefill, device, repeat) * scale + head_ms
            modelled = (model.prefill_s(tokens) - overhead_s) * 1e3 if model else None
            rows.append({"kind": "prefill", "batch": 1, "context": tokens,
                         "measured_ms": measured, "model_ms": modelled})  # fmt: skip
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {"device": name, "gpu": gpu, "shape": asdict(shape), "layers_timed": layers,
            "torch": torch.__version__, "rows": rows}  # fmt: skip


def table(result: dict[str, object]) -> str:
    lines = [
        f"Device: {result['device']} (cost model: {result['gpu']}); torch {result['torch']}; "
        f"{result['layers_timed']} layers timed, scaled to {result['shape']['layers']}.",  # type: ignore[index]
        "",
        "| iteration | batch | context (tokens) | measured (ms) | cost model (ms) "
        "| measured / model |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:  # type: ignore[attr-defined]
        measured, modelled = r["measured_ms"], r["model_ms"]
        if measured is None:
            cells = "over the KV cache | | "
        elif modelled is None:
            cells = f"{measured:.2f} | | "
        else:
            cells = f"{measured:.2f} | {modelled:.2f} | {measured / modelled:.2f}"
        lines.append(f"| {r['kind']} | {r['batch']} | {r['context']} | {cells} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=4, help="layers timed (default 4)")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true",
                        help="a tiny shape and grid: checks the script only")  # fmt: skip
    parser.add_argument("--out", type=Path, help="write gpu_layers.md and .json here")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("no GPU here: run it on one, or with --tiny --device cpu")
    if args.tiny:
        result = run(TINY, 2, device, 2, "h100", (1, 4), (64, 256), (64, 256))
    else:
        result = run(QWEN3_8B, args.layers, device, args.repeat, gpu_name(device),
                     BATCHES, CONTEXTS, PREFILLS)  # fmt: skip
    text = table(result)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_layers.md").write_text(text + "\n")
        (args.out / "gpu_layers.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
