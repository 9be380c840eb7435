"""A tiny model that acts: the tiny Qwen2 taught the agent format on synthetic transcripts
of the bundled kinds of task (a tool call, the tool's real result, then an answer).

The random tiny model writes gibberish and never calls a tool, so it cannot exercise the
agent loop. This one, after a few minutes of supervised training on 2 cores, writes
well-formed calls to the calculator, python and search tools most of the time, reads the
result and ends with `Answer: ...`; it need not be right. Its transcripts are built with
the same renderer the live loop uses (`engines/chat.py`), so what it learned is token for
token the context it will see.

A prompt ending in one of `QUIRKS` makes its first call malformed that way (bad JSON, an
unknown tool, a missing argument), then a good one: the tests reach the loop's error
observations through the model itself.

    heddle model tiny --teach agent --out DIR
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engines.tiny_model import AGENT_CHAT_TEMPLATE, TinyModelShape, build_tiny_model

log = logging.getLogger(__name__)

SHAPE = TinyModelShape(vocab_size=2048, num_layers=4, intermediate_size=512)
STEPS = 700
QUIRKS = {
    "bad_json": " (test: bad json)",
    "unknown_tool": " (test: unknown tool)",
    "no_argument": " (test: no argument)",
}
QUIRK_SHARE = 0.2  # of transcripts


@dataclass(frozen=True)
class Transcript:
    messages: list[dict[str, str]]  # system, user, then assistant and tool turns
    tools: tuple[str, ...]


def _call(name: str, arguments: dict[str, str]) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


class _Tools:
    """The real tools, run for the transcripts' observations."""

    def __init__(self) -> None:
        from activities.toolkit.calculator import calculate
        from activities.toolkit.python_exec import PythonSandbox
        from activities.toolkit.search import LocalSearch

        self.calculate, self.search = calculate, LocalSearch()
        self.python = PythonSandbox()

    def run(self, name: str, argument: str) -> str:
        tool = {"calculator": self.calculate, "search": self.search.search}[name]
        return asyncio.run(tool(argument)).text


def _turns(tools: _Tools, calls: list[tuple[str, dict[str, str], str]], answer: str) -> list:
    """Assistant and tool messages: each call, its observation, then the answer."""
    out: list[dict[str, str]] = []
    for name, arguments, observation in calls:
        out.append({"role": "assistant", "content": _call(name, arguments)})
        out.append({"role": "tool", "content": observation})
    out.append({"role": "assistant", "content": answer})
    return out


def _quirk_call(kind: str, name: str, arguments: dict[str, str]) -> tuple[str, str]:
    """A malformed first call of kind `kind`, and the observation the loop returns."""
    from heddle.toolcalls import error_observation, parse_turn

    if kind == "bad_json":  # Python's quotes, not JSON's
        text = "<tool_call>\n" + repr({"name": name, "arguments": arguments}) + "\n</tool_call>"
    elif kind == "unknown_tool":
        text = _call("browser", arguments)
    else:
        text = _call(name, {})
    (call,) = parse_turn(text, (name,)).calls
    return text, error_observation(call)


def transcripts(n: int, seed: int) -> list[Transcript]:
    """`n` transcripts over math, coding and search tasks, deterministic for `seed`."""
    from heddle.tasksets import _FUNCTIONS, SYSTEM, invented_world, math_problem

    rng = random.Random(seed)
    tools = _Tools()
    towns, people = invented_world()
    out = []
    for k in range(n):
        kind = k % 3
        if kind == 0:
            p = math_problem(rng, rng.randrange(10_000))
            offered: tuple[str, ...] = ("calculator", "python")
            user = p.question
            if rng.random() < 0.75:
                calls = [
                    (
                        "calculator",
                        {"expression": p.expression},
                        tools.run("calculator", p.expression),
                    )
                ]
            else:
                calls = [("python", {"code": f"print({p.expression})"}, f"{p.answer}\n")]
            answer = f"Answer: {p.answer}"
        elif kind == 1:
            signature, description, _ = rng.choice(_FUNCTIONS)
            _entry, args = signature.split("(")[0], signature.split("(")[1].rstrip(")")
            offered, user = (
                ("python",),
                (
                    f"Write a Python function `{signature}` that {description}. You may run code "
                    "with the python tool to check it. Reply with the whole function in one "
                    "```python block."
                ),
            )
            first = args.split(",")[0].strip()
            code = f"def {signature}:\n    return {first}"
            calls = [("python", {"code": code}, "")]
            answer = f"```python\n{code}\n```\nAnswer: done"
        else:
            offered = ("search",)
            if rng.random() < 0.5:
                town = rng.choice(towns)
                question, gold = rng.choice([
                    (f"In what year was the town of {town.name} founded?", str(town.founded)),
                    (f"Which river does the town of {town.name} stand on?", town.river),
                    (f"What is the town of {town.name} known for?", town.export),
                ])  # fmt: skip
                queries = [town.name]
            else:
                person = rng.choice(people)
                if rng.random() < 0.5:
                    question, gold = f"In which town was {person.name} born?", person.town.name
                    queries = [person.name]
                else:
                    question = f"On which river stands the town where {person.name} was born?"
                    gold, queries = person.town.river, [person.name, person.town.name]
            user = question + " Use the search tool."
            calls = [("search", {"query": q}, tools.run("search", q)) for q in queries]
            answer = f"Answer: {gold}"
        turns = _turns(tools, calls, answer)
        if rng.random() < QUIRK_SHARE:
            quirk = rng.choice(sorted(QUIRKS))
            user += QUIRKS[quirk]
            name, arguments, _ = calls[0]
            bad, observation = _quirk_call(quirk, name, arguments)
            turns = [
                {"role": "assistant", "content": bad},
                {"role": "tool", "content": observation},
                *turns,
            ]
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]
        out.append(Transcript(messages + turns, offered))
    return out


def encode(renderer: Any, t: Transcript) -> tuple[list[int], list[int]]:
    """A transcript's ids and loss mask, as the live loop builds the context."""
    from heddle.toolcalls import tool_schemas

    schemas = tool_schemas(t.tools)
    ids = renderer.prompt_ids(t.messages[:2], schemas)
    mask = [0] * len(ids)
    i = 2
    while i < len(t.messages):
        reply = [*renderer.encode(t.messages[i]["content"]), renderer.eos_id]
        ids += reply
        mask += [1] * len(reply)
        j = i + 1
        while j < len(t.messages) and t.messages[j]["role"] == "tool":
            j += 1
        if j > i + 1:
            after = renderer.after_reply_ids(t.messages[i + 1 : j], schemas, ended=True)
            ids += after
            mask += [0] * len(after)
        i = j
    return ids, mask


def teach_agent(out: Path, *, seed: int = 0, steps: int = STEPS) -> Path:
    """Build the tiny model's tokenizer on the transcripts, then train it on them."""
    import torch
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    from engines.chat import ChatRenderer

    started = time.monotonic()
    data = transcripts(3000, seed)
    corpus = [json.dumps(t.messages) for t in data]
    build_tiny_model(out, SHAPE, seed, corpus=corpus, chat_template=AGENT_CHAT_TEMPLATE)
    renderer = ChatRenderer(AutoTokenizer.from_pretrained(out))
    encoded = [encode(renderer, t) for t in data]
    model = Qwen2ForCausalLM.from_pretrained(out, torch_dtype=torch.float32)
    model.train()
    torch.manual_seed(seed)
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=steps)
    batch_size = 16
    for step in range(steps):
        batch = [encoded[rng.randrange(len(encoded))] for _ in range(batch_size)]
        width = max(len(ids) for ids, _ in batch)
        ids = torch.zeros(batch_size, width, dtype=torch.long)
        labels = torch.full((batch_size, width), -100, dtype=torch.long)
        for row, (seq, mask) in enumerate(batch):
            ids[row, : len(seq)] = torch.tensor(seq)
            labels[row, : len(seq)] = torch.tensor(
                [tok if m else -100 for tok, m in zip(seq, mask, strict=True)]
            )
        loss = model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if step % 50 == 0 or step == steps - 1:
            log.info(
                "teach step %d/%d loss %.3f (%.0f s)",
                step,
                steps,
                loss.item(),
                time.monotonic() - started,
            )
    model.bfloat16().save_pretrained(out)  # as vLLM runs it
    (out / "heddle-teach.json").write_text(
        json.dumps({"teach": "agent", "seed": seed, "steps": steps, "final_loss": loss.item()})
    )
    return out


def cache_key(seed: int = 0, steps: int = STEPS) -> str:
    """What the taught model depends on: this module, the tiny model's and the task
    generator's source, the seed and the steps."""
    import engines.chat
    import engines.tiny_model
    import heddle.tasksets
    import heddle.toolcalls

    h = hashlib.sha256(f"{seed}/{steps}".encode())
    for module in (__file__, engines.tiny_model.__file__, engines.chat.__file__,
                   heddle.tasksets.__file__, heddle.toolcalls.__file__):  # fmt: skip
        h.update(Path(str(module)).read_bytes())
    return h.hexdigest()[:16]


def cached_agent_model(cache_dir: Path | None = None, *, seed: int = 0) -> Path:
    """The taught model, built once per source version into `cache_dir` (default
    `$HEDDLE_MODEL_CACHE`, else ~/.cache/heddle/models)."""
    root = cache_dir or Path(
        os.environ.get("HEDDLE_MODEL_CACHE") or Path.home() / ".cache" / "heddle" / "models"
    )
    path = root / f"tiny-agent-{cache_key(seed)}"
    if (path / "heddle-teach.json").exists():
        return path
    building = root / f".{path.name}.{os.getpid()}"
    shutil.rmtree(building, ignore_errors=True)
    teach_agent(building, seed=seed)
    try:
        building.rename(path)
    except OSError:  # another process finished first
        shutil.rmtree(building, ignore_errors=True)
    return path
