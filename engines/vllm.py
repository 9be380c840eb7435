"""A vLLM instance behind the engine interface the simulated engine has.

vLLM's async engine (`AsyncLLM`) runs its engine core in a child process; this object
lives in the engine host and turns each LLM step (counts of tokens) into a vLLM request on
token ids:

- the context of a trajectory is kept as token ids in `TokenSessions`, shared by the
  host's instances: the prompt and tool outputs are stand-in ids (deterministic per
  trajectory and position), generated tokens are the model's own, so a trajectory's next
  turn extends its last one and vLLM's prefix cache finds it;
- a trace step is replayed exactly: `min_tokens = max_tokens = output_tokens`, `ignore_eos`;
- per-request priority uses vLLM's priority scheduling (lower first, as Heddle's);
- a step stopped to move, a migration's warm-up (prefill only) and an abort map onto
  vLLM's abort and a one-token request.

vLLM is imported when an instance starts: Heddle runs without the real-engine extra.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import threading
import time
from array import array
from collections import OrderedDict
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar

from engines.request import EngineRequest, Sampling
from engines.simulated import EngineResult
from heddle.hardware import Speculation

log = logging.getLogger(__name__)

T = TypeVar("T")

# Token ids below this are the tiny model's special tokens; stand-in ids avoid them.
FIRST_PLAIN_ID = 3


class EngineDead(RuntimeError):
    """The instance's engine process died; the step goes on elsewhere."""

    def __init__(self, instance_id: str, made: int) -> None:
        super().__init__(f"engine instance {instance_id} died")
        self.instance_id = instance_id
        self.made = made


@dataclass(frozen=True)
class VllmSettings:
    """How each vLLM instance of a host is started."""

    model_path: str
    max_model_len: int = 8192
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 4096
    kv_cache_gib: float = 2.0
    scheduling_policy: Literal["priority", "fcfs"] = "priority"
    enforce_eager: bool = True  # on CPU: start in ~25 s rather than 30-70 s with compile
    prefix_caching: bool = True
    use_gpus: bool = False  # Ray placement groups reserve GPUs (TP of them) or a CPU
    nice: int | None = None  # the engine processes' niceness; None: 10 on CPU, else 0
    weight_version: int = 0  # of the weights at model_path (a campaign's train step)
    speculation: Speculation | None = None
    # (tp, the largest decode batch that speculates) per instance shape: where the cost
    # model says it pays on the cluster's GPUs (`CostModel.speculation_max_batch`).
    speculation_max_batch: tuple[tuple[int, int], ...] = ()

    def speculative_config(self, tp: int) -> dict[str, Any] | None:
        """vLLM's `speculative_config` for a TP-`tp` instance: drafts only while it
        decodes at most the batch where they pay (vLLM's dynamic schedule drafts 0
        tokens above it), or None where they never pay."""
        spec = self.speculation
        if spec is None:
            return None
        limit = min(dict(self.speculation_max_batch).get(tp, self.max_num_seqs), self.max_num_seqs)
        if limit <= 0:
            return None
        k = spec.draft_tokens
        config: dict[str, Any] = {"method": spec.method, "num_speculative_tokens": k}
        if limit < self.max_num_seqs:
            config["num_speculative_tokens_per_batch_size"] = [
                (1, limit, k),
                (limit + 1, self.max_num_seqs, 0),
            ]
        return config

    def engine_args(self, tp: int) -> Any:
        from vllm.engine.arg_utils import AsyncEngineArgs

        return AsyncEngineArgs(
            model=self.model_path,
            tokenizer=self.model_path,
            dtype="bfloat16",
            tensor_parallel_size=tp,
            max_model_len=self.max_model_len,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            enable_prefix_caching=self.prefix_caching,
            scheduling_policy=self.scheduling_policy,
            enforce_eager=self.enforce_eager,
            disable_log_stats=False,
            speculative_config=self.speculative_config(tp),
        )


# Token ids the sessions keep before the least recently used trajectories are dropped
# (4 bytes each: 256 MB).
MAX_SESSION_TOKENS = 64 * 2**20


class TokenSessions:
    """Each trajectory's context as token ids. Soft state: whatever is missing (a host
    restarted, tool output not seen yet, a session dropped for room) is filled with
    stand-in ids, so a context always has the length the workflow gives; only the prefix
    cache notices the loss."""

    def __init__(self, vocab_size: int, max_tokens: int = MAX_SESSION_TOKENS) -> None:
        self.vocab_size = vocab_size
        self.max_tokens = max_tokens
        self.ids: OrderedDict[str, array[int]] = OrderedDict()
        self._tokens = 0

    def _session(self, trajectory_id: str) -> array[int]:
        ids = self.ids.get(trajectory_id)
        if ids is None:
            ids = self.ids[trajectory_id] = array("i")
        self.ids.move_to_end(trajectory_id)
        return ids

    def _resize(self, ids: array[int], trajectory_id: str, length: int) -> None:
        before = len(ids)
        if before > length:
            del ids[length:]
        elif before < length:
            rng = random.Random(f"{trajectory_id}@{before}")
            ids.extend(
                rng.randrange(FIRST_PLAIN_ID, self.vocab_size) for _ in range(length - before)
            )
        self._tokens += len(ids) - before

    def context(self, trajectory_id: str, length: int) -> list[int]:
        ids = self._session(trajectory_id)
        self._resize(ids, trajectory_id, length)
        self._evict()
        return ids.tolist()

    def extend(self, trajectory_id: str, new_ids: list[int]) -> None:
        self._session(trajectory_id).extend(new_ids)
        self._tokens += len(new_ids)
        self._evict()

    def forget(self, trajectory_id: str) -> None:
        ids = self.ids.pop(trajectory_id, None)
        if ids is not None:
            self._tokens -= len(ids)

    def _evict(self) -> None:
        while self._tokens > self.max_tokens and len(self.ids) > 1:
            _, ids = self.ids.popitem(last=False)
            self._tokens -= len(ids)


def read_vocab_size(model_path: str) -> int:
    import json

    with open(os.path.join(model_path, "config.json")) as f:
        return int(json.load(f)["vocab_size"])


def replay_params(tokens: int, *, detokenize: bool = False) -> Any:
    """vLLM sampling parameters that make exactly `tokens` tokens (a trace step, replayed),
    streamed as deltas. Token ids are all a step needs: text would cost the host's event
    loop an incremental detokenization per token (`benchmarks/vllm_frontend.py`)."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(
        max_tokens=tokens,
        min_tokens=tokens,
        ignore_eos=True,
        temperature=0.0,
        output_kind=RequestOutputKind.DELTA,
        detokenize=detokenize,
    )


def sampled_params(tokens: int, sampling: Sampling, *, seeded: bool = True) -> Any:
    """vLLM sampling parameters of an agent turn: sampled until the model's end-of-turn
    token (its EOS) or `tokens`, each token's log-prob returned (the sampled token's
    only: `logprobs=0`), streamed as deltas. Not `seeded`: the turn's seed is left out
    (vLLM's CPU build, where a seeded request whose prefill is split over iterations
    kills the engine: `python benchmarks/cpu_seeded_chunks.py`)."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(
        max_tokens=tokens,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        seed=sampling.seed if seeded else None,
        logprobs=0,
        output_kind=RequestOutputKind.DELTA,
        detokenize=False,
    )


@dataclass
class StreamPart:
    """What a vLLM stream yields: the new token ids, the prompt tokens found in the
    prefix cache, and for a sampled turn each new token's log-prob and, at the end, why
    it stopped."""

    ids: list[int]
    cached: int
    logprobs: list[float]
    finish_reason: str = ""
    weight_version: int = -1  # at the end: the version that made the last token


def _sampled_logprobs(ids: list[int], logprobs: Any) -> list[float]:
    """The log-prob of each sampled id, from vLLM's per-position dicts."""
    if logprobs is None:
        return []
    return [float(pos[tok].logprob) for tok, pos in zip(ids, logprobs, strict=True)]


def engine_nice(nice: int | None) -> int:
    """The niceness engines run at: `nice`, or by default 10 on vLLM's CPU build."""
    from vllm.platforms import current_platform

    if nice is None:
        return 10 if current_platform.is_cpu() else 0
    return nice


def lower_session(nice: int) -> bool:
    """Lower this process's session as a whole: Linux schedules each session as one
    group (autogroup) and shares the CPU between groups before niceness counts, so
    niced engines in a session of their own still starve the Temporal server in another
    (`benchmarks/cpu_engine_starvation.py`: a probe in another session was stalled 30.3 s
    of 43.4 s while two niced CPU engines decoded, 0.0 s with this). Only a session
    leader does this (the stack and `heddle dev` start each worker in its own session):
    a worker run from a terminal would lower the terminal's session. True if lowered."""
    if nice <= 0 or os.getsid(0) != os.getpid():
        return False
    try:
        with open("/proc/self/autogroup", "w") as f:
            f.write(str(nice))
    except OSError:  # no autogroup (not Linux, or a kernel without it)
        return False
    return True


async def _in_lowered_thread(build: Callable[[], T], nice: int) -> T:
    """Run `build` in a thread of its own at niceness `nice`: the processes it starts
    (vLLM's engine core and its workers) inherit it, every thread of them. On vLLM's CPU
    build these decode on every core they get; the Temporal server and this worker, on
    the same cores, would miss their deadlines. (Renicing the processes afterwards is not
    enough: Linux keeps a niceness per thread.)"""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, exc: BaseException | None) -> None:
        if done.cancelled():
            return
        if exc is not None:
            done.set_exception(exc)
        else:
            done.set_result(result)  # type: ignore[arg-type]

    def run() -> None:
        try:
            tid = threading.get_native_id()
            if nice > os.getpriority(os.PRIO_PROCESS, tid):  # lowered only, never raised
                os.setpriority(os.PRIO_PROCESS, tid, nice)
            result = build()
        except BaseException as exc:
            loop.call_soon_threadsafe(settle, None, exc)
        else:
            loop.call_soon_threadsafe(settle, result, None)

    threading.Thread(target=run, name="vllm-start", daemon=True).start()
    return await done


def _version(spans: Any, loaded: int) -> int:
    """The version vLLM labelled a finished output's last tokens with ("default" until a
    sync labels one), else the version this instance loaded."""
    label = str(spans[-1].version) if spans else ""
    return int(label) if label.isdigit() else loaded


class LocalVllm:
    """vLLM's async engine in this process (its engine core in a child process): the
    token-level stream the engine interface is built on."""

    def __init__(self, instance_id: str, settings: VllmSettings, tp: int) -> None:
        self.instance_id = instance_id
        self.settings = settings
        self.tp = tp
        self._llm: Any = None
        self.kv_usage = 0.0  # fraction of the KV cache in use, as vLLM last reported it
        self.weight_version = settings.weight_version  # of the weights loaded
        # Speculation so far: tokens drafted, and of those the engine accepted.
        self.draft_tokens = 0
        self.accepted_tokens = 0
        # Whether agent turns carry their seeds to vLLM (`sampled_params`): not on CPU.
        self.seeded = True

    @property
    def is_healthy(self) -> bool:
        return self._llm is not None and not self._llm.errored

    def _kv_logger(self) -> Any:
        """A vLLM stat logger that keeps the KV cache use of each scheduler step."""
        from vllm.v1.metrics.loggers import StatLoggerBase

        owner = self

        class KvUse(StatLoggerBase):
            def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
                pass

            def record(
                self,
                scheduler_stats: Any,
                iteration_stats: Any,
                mm_cache_stats: Any = None,
                engine_idx: int = 0,
            ) -> None:
                if scheduler_stats is not None:
                    owner.kv_usage = float(scheduler_stats.kv_cache_usage)
                    drafts = scheduler_stats.spec_decoding_stats
                    if drafts is not None:
                        owner.draft_tokens += drafts.num_draft_tokens
                        owner.accepted_tokens += drafts.num_accepted_tokens

            def log_engine_initialized(self) -> None:
                pass

        return KvUse

    @property
    def block_size(self) -> int:
        """Tokens per KV block: the prefix cache hits whole blocks (128 on CPU)."""
        return int(self._llm.vllm_config.cache_config.block_size)

    async def start(self) -> None:
        if self._llm is not None:
            return
        # vLLM's CPU build sizes its KV cache from this (its default check fails on small
        # machines); GPU builds ignore it.
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", f"{self.settings.kv_cache_gib:g}")
        from vllm.platforms import current_platform
        from vllm.v1.engine.async_llm import AsyncLLM

        self.seeded = not current_platform.is_cpu()
        started = time.monotonic()
        args = self.settings.engine_args(self.tp)
        nice = engine_nice(self.settings.nice)
        lower_session(nice)
        # Building the engine blocks (it waits for the engine core process to load).
        self._llm = await _in_lowered_thread(
            lambda: AsyncLLM.from_engine_args(args, stat_loggers=[self._kv_logger()]), nice
        )
        log.info("vLLM instance %s up in %.1f s", self.instance_id, time.monotonic() - started)

    async def sync_weights(self, path: str, version: int) -> None:
        """Load the weights at `path` in place (REFERENCES.md, "The RL loop"): pause once
        the steps running have finished (a turn is never made by two versions), reload
        through the worker's `reload_weights`, label the version, resume. The prefix
        cache is cleared with the pause: the old weights' KV must not be reused."""
        if self._llm is None:
            raise EngineDead(self.instance_id, 0)
        await self._llm.pause_generation(mode="wait", clear_cache=True)
        try:
            await self._llm.collective_rpc("reload_weights", kwargs={"weights_path": path})
            await self._llm.update_weight_version(str(version))
            self.weight_version = version
        finally:
            await self._llm.resume_generation()

    async def stop(self) -> None:
        llm, self._llm = self._llm, None
        if llm is not None:
            # It joins the engine's processes (seconds for a dead one): not on the loop.
            with contextlib.suppress(Exception):
                await asyncio.to_thread(llm.shutdown)

    async def stream(
        self,
        request_id: str,
        prompt: list[int],
        max_new_tokens: int,
        priority: int,
        sampling: Sampling | None = None,
    ) -> AsyncGenerator[StreamPart, None]:
        """Generate after `prompt`: exactly `max_new_tokens` (a replayed step), or sampled
        as `sampling` says. Closing it early aborts the request."""
        from vllm.v1.engine.exceptions import EngineDeadError

        if self._llm is None:
            raise EngineDead(self.instance_id, 0)
        if sampling is None:
            params = replay_params(max_new_tokens)
        else:
            params = sampled_params(max_new_tokens, sampling, seeded=self.seeded)
        try:
            async for out in self._llm.generate(
                {"prompt_token_ids": prompt}, params, request_id, priority=priority
            ):
                made = out.outputs[0]
                ids = list(made.token_ids)
                spans = getattr(made, "weight_versions", None)
                yield StreamPart(
                    ids,
                    int(out.num_cached_tokens or 0),
                    _sampled_logprobs(ids, made.logprobs) if sampling else [],
                    str(made.finish_reason or ""),
                    _version(spans, self.weight_version),
                )
        except EngineDeadError as exc:
            raise EngineDead(self.instance_id, 0) from exc


class VllmBackend(Protocol):
    """Where an instance's vLLM runs: `LocalVllm`, or a Ray actor (`engines/ray_host.py`)."""

    kv_usage: float

    @property
    def is_healthy(self) -> bool: ...

    @property
    def block_size(self) -> int: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def sync_weights(self, path: str, version: int) -> None: ...

    def stream(
        self,
        request_id: str,
        prompt: list[int],
        max_new_tokens: int,
        priority: int,
        sampling: Sampling | None = None,
    ) -> AsyncGenerator[StreamPart, None]: ...


class VllmEngine:
    """One vLLM instance behind the engine interface of `SimulatedEngine`."""

    kind = "vllm"

    def __init__(self, *, instance_id: str, backend: VllmBackend, sessions: TokenSessions) -> None:
        self.instance_id = instance_id
        self.backend = backend
        self.sessions = sessions
        self._running: dict[str, EngineRequest] = {}
        self._moves: dict[str, str] = {}

    @property
    def load(self) -> int:
        """Requests waiting or running on this instance."""
        return len(self._running)

    @property
    def is_healthy(self) -> bool:
        return self.backend.is_healthy

    @property
    def block_size(self) -> int:
        return self.backend.block_size

    @property
    def kv_usage(self) -> float:
        """Fraction of the instance's KV cache in use (vLLM's scheduler stats)."""
        return self.backend.kv_usage

    async def start(self) -> None:
        await self.backend.start()

    async def stop(self) -> None:
        await self.backend.stop()

    async def sync_weights(self, path: str, version: int) -> None:
        await self.backend.sync_weights(path, version)

    async def generate(
        self, request: EngineRequest, on_progress: Callable[[int], None] | None = None
    ) -> EngineResult:
        """Run one LLM step to completion; `on_progress(tokens)` as tokens are made."""
        tid = request.prefix_key
        sampled = request.sampling is not None
        if sampled:  # an agent turn: its context is the ids the host rendered
            prompt = request.prompt_ids
        else:
            prompt = self.sessions.context(tid, request.context_tokens)
        added_at = time.time()
        started_at = 0.0
        cached = 0
        ids: list[int] = []
        logprobs: list[float] = []
        finish_reason = ""
        weight_version = -1
        self._running[request.request_id] = request
        stream = self.backend.stream(
            request.request_id, prompt, request.max_new_tokens, request.priority,
            request.sampling,
        )  # fmt: skip
        try:
            async for part in stream:
                if not started_at:
                    started_at, cached = time.time(), part.cached
                if sampled:
                    ids += part.ids
                    logprobs += part.logprobs
                    finish_reason = part.finish_reason or finish_reason
                    weight_version = max(weight_version, part.weight_version)
                else:
                    self.sessions.extend(tid, part.ids)
                request.num_output_tokens += len(part.ids)
                if on_progress is not None and part.ids:
                    on_progress(request.num_output_tokens)
                if request.request_id in self._moves:
                    break
        except EngineDead as exc:
            self._moves.pop(request.request_id, None)
            raise EngineDead(self.instance_id, request.num_output_tokens) from exc
        finally:
            await stream.aclose()  # an early end aborts the request in vLLM
            self._running.pop(request.request_id, None)
        moved_to = self._moves.pop(request.request_id, "")
        return EngineResult(
            request_id=request.request_id,
            output_tokens=request.num_output_tokens,
            cached_tokens=cached,
            queued_s=max(0.0, started_at - added_at),
            started_at=started_at or added_at,
            finished_at=time.time(),
            moved_to=moved_to,
            output_ids=ids,
            output_logprobs=logprobs,
            finish_reason=finish_reason,
            weight_version=weight_version,
        )

    def running_decodes(self) -> list[EngineRequest]:
        """Requests generating now (past their prefill): what a mid-step review sees."""
        return [r for r in self._running.values() if r.num_output_tokens]

    def queued_steps(self) -> list[EngineRequest]:
        """Requests vLLM has not yet given a token. A stream yields nothing earlier, so
        one that is moved leaves after its first token."""
        return [r for r in self._running.values() if not r.num_output_tokens]

    def stop_to_move(self, request_id: str, target: str) -> bool:
        """End a running request after its next token, as made so far, to continue on
        `target`. False if it is no longer running."""
        request = self._running.get(request_id)
        if request is None or request.is_finished:
            return False
        self._moves[request_id] = target
        return True

    async def warm(self, trajectory_id: str, context_tokens: int) -> int:
        """Prefill a trajectory's context here (one token made, then dropped), so its next
        step finds it in the prefix cache: a migration where no KV transfer path exists."""
        if context_tokens <= 0 or not self.is_healthy:
            return 0
        prompt = self.sessions.context(trajectory_id, context_tokens)
        request_id = f"warm/{trajectory_id}/{time.monotonic_ns()}"
        async for _ in self.backend.stream(request_id, prompt, 1, 0):
            pass
        return context_tokens
