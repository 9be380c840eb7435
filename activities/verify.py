"""Verifiers: score a finished trajectory's final answer against its task's verifier.

Numeric, exact and QA answers are scored here; unit tests run the model's code with the
task's hidden tests in the Python sandbox, in a run of their own after the trajectory
(the model's tool calls never see them); a custom verifier is imported by path. A
verifier that crashes or times out yields a `Verdict` with an `error` (reward 0), never an
exception: the batch goes on and the store records why.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
import secrets
import string
from collections import Counter

from activities.toolkit.python_exec import PythonSandbox
from heddle.tasks import Verifier
from heddle.toolcalls import final_answer
from heddle.types import Verdict

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:\s*/\s*\d+)?|-?\.\d+")
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_CODE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)


def parse_number(text: str) -> float | None:
    """The number an answer gives: a \\boxed{} one, else the last one in the text
    (thousands separators and simple fractions read)."""
    boxed = _BOXED.findall(text)
    found = _NUMBER.findall(boxed[-1] if boxed else text)
    if not found:
        return None
    token = found[-1].replace(",", "").replace(" ", "")
    try:
        if "/" in token:
            num, den = token.split("/")
            return float(num) / float(den) if float(den) else None
        return float(token)
    except ValueError:
        return None


def normalize(text: str) -> str:
    """SQuAD's answer normalisation: lower case, no punctuation, articles or extra space."""
    text = "".join(c for c in text.lower() if c not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def token_f1(prediction: str, gold: str) -> float:
    pred, ref = normalize(prediction).split(), normalize(gold).split()
    common = sum((Counter(pred) & Counter(ref)).values())
    if not pred or not ref or not common:
        return float(pred == ref)
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def score_numeric(v: Verifier, text: str) -> Verdict:
    got = parse_number(final_answer(text))
    if got is None:
        return Verdict(0.0, "no number in the answer")
    assert isinstance(v.answer, float)
    ok = abs(got - v.answer) <= v.tolerance * max(1.0, abs(v.answer))
    return Verdict(float(ok), f"answered {got:g}, expected {v.answer:g}")


def score_exact(v: Verifier, text: str) -> Verdict:
    got, want = final_answer(text).strip().rstrip("."), str(v.answer).strip()
    ok = got == want if v.case_sensitive else got.casefold() == want.casefold()
    return Verdict(float(ok), "exact match" if ok else f"answered {got[:80]!r}")


def score_qa(v: Verifier, text: str) -> Verdict:
    got = final_answer(text)
    if v.metric == "f1":
        reward = max(token_f1(got, gold) for gold in v.answers)
        return Verdict(reward, f"token F1 {reward:.2f}")
    ok = any(normalize(got) == normalize(gold) for gold in v.answers)
    return Verdict(float(ok), "exact match" if ok else f"answered {got[:80]!r}")


def extract_code(text: str) -> str:
    """The last fenced Python block of the answer, else the whole answer."""
    blocks = _CODE.findall(text)
    return blocks[-1] if blocks else text


async def score_unit_tests(v: Verifier, text: str, sandbox: PythonSandbox) -> Verdict:
    """The model's code, then the hidden tests, in one sandboxed run. It passes only if
    the run reaches a line after the tests that prints a secret made now: code that
    exits early, or silences its output, does not pass."""
    nonce = secrets.token_hex(8)
    keep = f"_heddle_stdout_{nonce}"
    program = "\n".join([
        f"import io as _io_{nonce}, sys as _sys_{nonce}",
        f"{keep} = _sys_{nonce}.stdout",
        f"_sys_{nonce}.stdout = _io_{nonce}.StringIO()",
        extract_code(text),
        v.tests,
        f"_sys_{nonce}.stdout = {keep}",
        f"print({nonce!r})",
    ])  # fmt: skip
    # The CPU cap a second past the clock's: a busy loop is stopped by the clock and
    # reported as timed out, not by whichever of the two limits its start-up lets win.
    limited = dataclasses.replace(sandbox, timeout_s=v.timeout_s, cpu_s=int(v.timeout_s) + 1)
    run = await limited.run(program)
    if run.status == "timeout":
        return Verdict(0.0, f"the tests timed out after {v.timeout_s:g} s")
    if run.status == "ok" and nonce in run.text:
        return Verdict(1.0, "all tests passed")
    last = run.text.strip().splitlines()[-1:] or ["no output"]
    return Verdict(0.0, f"tests failed: {last[0][:200]}")


async def score_custom(v: Verifier, text: str) -> Verdict:
    """`module:function`, called with the final turn's text and the verifier's params;
    it returns a reward, or (reward, reason)."""
    module, _, name = v.import_path.partition(":")
    fn = getattr(importlib.import_module(module), name)
    result = fn(text, dict(v.params))
    if inspect.isawaitable(result):
        result = await result
    reward, reason = result if isinstance(result, tuple) else (result, v.import_path)
    return Verdict(float(reward), str(reason))


async def verify(v: Verifier, text: str, sandbox: PythonSandbox | None = None) -> Verdict:
    """Score `text` (the trajectory's final turn); a failing verifier is a verdict with
    an error, never an exception."""
    try:
        if v.kind == "numeric":
            return score_numeric(v, text)
        if v.kind == "exact":
            return score_exact(v, text)
        if v.kind == "qa":
            return score_qa(v, text)
        if v.kind == "unit_tests":
            return await score_unit_tests(v, text, sandbox or PythonSandbox())
        return await score_custom(v, text)
    except Exception as exc:  # a verifier's own failure: recorded, the batch goes on
        return Verdict(0.0, "the verifier failed", error=f"{type(exc).__name__}: {exc}"[:500])
