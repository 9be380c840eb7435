"""Task sets: the format is checked line by line before anything starts, the shipped sets
are what `heddle.tasksets` makes, their verifiers can be satisfied, and no prompt holds
its own answer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from heddle import tasksets
from heddle.tasks import TASK_TOOLS, TaskError, dump_task, load_tasks, parse_task
from tests.test_cli import heddle

DATA = tasksets.DATA
GOOD: dict[str, Any] = {
    "task_id": "t1",
    "workload": "math",
    "prompt": "What is 2 + 3?",
    "tools": ["calculator"],
    "verifier": {"kind": "numeric", "answer": 5},
}


def _write(path: Path, lines: list[Any]) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def test_shipped_task_sets_are_what_the_generator_makes_and_load() -> None:
    for name, lines in tasksets.shipped().items():
        assert (DATA / name).read_text(encoding="utf-8") == tasksets.render(lines), (
            f"{name} is stale: run python -m heddle.tasksets"
        )
    sizes = {
        w: len(load_tasks(DATA / "tasks" / f"{w}.jsonl")) for w in ("math", "coding", "search")
    }
    assert sizes == {"math": 120, "coding": 30, "search": 120}
    assert len((DATA / "corpus.jsonl").read_text().splitlines()) >= 300


def test_the_learning_toy_is_what_its_generator_makes_and_scores_its_first_digit() -> None:
    import asyncio

    from activities.verify import verify
    from heddle import toytasks
    from heddle.tasks import dump_task

    made = tasksets.render([dump_task(t) for t in toytasks.leading_one_tasks()])
    assert toytasks.FILE.read_text(encoding="utf-8") == made, "run python -m heddle.toytasks"
    task = load_tasks(toytasks.FILE)[0]
    assert task.messages[-1].content.endswith(toytasks.INSTRUCTION)
    scores = {
        text: asyncio.run(verify(task.verifier, text)).reward
        for text in (
            "Answer: 1603",
            "Answer: 603",
            "<tool_call>1</tool_call>\nAnswer: -1",
            "Answer: 19",
        )
    }
    assert scores == {
        "Answer: 1603": 1.0, "Answer: 603": 0.0,
        "<tool_call>1</tool_call>\nAnswer: -1": 0.0, "Answer: 19": 1.0,
    }  # fmt: skip


def test_a_task_round_trips_through_its_line(tmp_path: Path) -> None:
    tasks = (
        load_tasks(DATA / "tasks" / "coding.jsonl")[:3]
        + load_tasks(DATA / "tasks" / "search.jsonl")[:3]
    )
    path = _write(tmp_path / "t.jsonl", [dump_task(t) for t in tasks])
    assert load_tasks(path) == tasks


BAD_LINES = [
    ({**GOOD, "colour": 1}, "colour", "is not a task field"),
    ({k: v for k, v in GOOD.items() if k != "verifier"}, "verifier", "is required"),
    ({**GOOD, "workload": "poetry"}, "workload", "must be one of"),
    ({**GOOD, "prompt": ""}, "prompt", "must not be empty"),
    ({**GOOD, "prompt": [{"role": "user"}]}, "prompt[0].content", "non-empty string"),
    ({**GOOD, "prompt": [{"role": "wizard", "content": "x"}]}, "prompt[0].role", "must be one of"),
    ({**GOOD, "prompt": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]},
     "prompt[1].role", "the last message must be the user's"),
    ({**GOOD, "tools": ["browser"]}, "tools[0]", "must be one of"),
    ({**GOOD, "tools": ["python", "python"]}, "tools", "names a tool twice"),
    ({**GOOD, "verifier": {"kind": "numeric"}}, "verifier.answer", "is required"),
    ({**GOOD, "verifier": {"kind": "numeric", "answer": "five"}}, "verifier.answer",
     "finite number"),
    ({**GOOD, "verifier": {"kind": "vibes"}}, "verifier.kind", "must be one of"),
    ({**GOOD, "verifier": {"kind": "exact", "answer": "a", "tests": "x"}}, "verifier.tests",
     "is not a field of a exact verifier"),
    ({**GOOD, "verifier": {"kind": "unit_tests", "entry_point": "f", "tests": "assert f(("}},
     "verifier.tests", "is not valid Python"),
    ({**GOOD, "verifier": {"kind": "unit_tests", "entry_point": "2f", "tests": "pass"}},
     "verifier.entry_point", "must be a Python name"),
    ({**GOOD, "verifier": {"kind": "qa", "answers": []}}, "verifier.answers", "non-empty list"),
    ({**GOOD, "verifier": {"kind": "qa", "answers": ["a"], "metric": "bleu"}}, "verifier.metric",
     "must be one of"),
    ({**GOOD, "verifier": {"kind": "custom", "import_path": "mod.fn"}}, "verifier.import_path",
     "must be 'module:function'"),
    ({**GOOD, "metadata": []}, "metadata", "must be a JSON object"),
]  # fmt: skip


@pytest.mark.parametrize(("line", "field", "message"), BAD_LINES, ids=[b[1] for b in BAD_LINES])
def test_a_bad_line_names_its_file_line_and_field(
    tmp_path: Path, line: dict[str, Any], field: str, message: str
) -> None:
    path = _write(tmp_path / "tasks.jsonl", [GOOD | {"task_id": "t0"}, "", line])
    with pytest.raises(TaskError) as caught:
        load_tasks(path)
    err = caught.value
    assert (err.path, err.line, err.field) == (str(path), 3, field)
    assert message in err.message


def test_a_file_level_mistake_is_named_too(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match="repeats line 1"):
        load_tasks(_write(tmp_path / "dup.jsonl", [GOOD, GOOD]))
    with pytest.raises(TaskError, match="is not valid JSON"):
        load_tasks(_write(tmp_path / "json.jsonl", ["{nope"]))
    with pytest.raises(TaskError, match="holds no task"):
        load_tasks(_write(tmp_path / "empty.jsonl", [""]))
    with pytest.raises(TaskError, match="cannot be read"):
        load_tasks(tmp_path / "missing.jsonl")


def test_the_cli_refuses_a_bad_file_in_one_error_line(tmp_path: Path) -> None:
    bad = _write(tmp_path / "bad.jsonl", [GOOD, {**GOOD, "task_id": "t2", "tools": ["web"]}])
    result = heddle("tasks", "validate", str(bad))
    assert result.returncode == 2
    assert result.stderr.count("error:") == 1
    assert f"{bad}:2: field 'tools[0]'" in result.stderr.replace("\n", "")
    assert "Traceback" not in result.stderr
    stats = heddle("tasks", "stats", str(DATA / "tasks" / "math.jsonl"))
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout)["verifiers"] == {"numeric": 120}


def test_task_tools_are_the_tool_registry() -> None:
    from activities.toolkit import default_registry

    assert sorted(TASK_TOOLS) == sorted(default_registry().names)


# Reference solutions: every shipped coding task's hidden tests can be passed.
REFERENCE = """
def clamp(x, lo, hi): return max(lo, min(hi, x))
def digit_sum(n): return sum(map(int, str(n)))
def is_palindrome(s):
    t = [c.lower() for c in s if c.isalpha()]
    return t == t[::-1]
def count_vowels(s): return sum(c in "aeiouAEIOU" for c in s)
def reverse_words(s): return " ".join(reversed(s.split()))
def fib(n):
    a, b = 0, 1
    for _ in range(n): a, b = b, a + b
    return a
def gcd(a, b):
    while b: a, b = b, a % b
    return a
def running_max(xs):
    out = []
    for x in xs: out.append(x if not out else max(out[-1], x))
    return out
def dedupe(xs): return list(dict.fromkeys(xs))
def fizzbuzz(n):
    return "FizzBuzz" if n % 15 == 0 else "Fizz" if n % 3 == 0 else "Buzz" if n % 5 == 0 else str(n)
def is_prime(n): return n > 1 and all(n % d for d in range(2, int(n ** 0.5) + 1))
def flatten(xss): return [x for xs in xss for x in xs]
def word_count(s):
    out = {}
    for w in s.lower().split(): out[w] = out.get(w, 0) + 1
    return out
def rotate(xs, k):
    if not xs: return []
    k %= len(xs)
    return xs[-k:] + xs[:-k] if k else list(xs)
def chunks(xs, n): return [xs[i:i + n] for i in range(0, len(xs), n)]
def to_binary(n): return bin(n)[2:]
def median(xs):
    s = sorted(xs); m = len(s) // 2
    return s[m] if len(s) % 2 else (s[m - 1] + s[m]) / 2
def caesar(s, k):
    def shift(c):
        if c.isascii() and c.isalpha():
            base = ord("a") if c.islower() else ord("A")
            return chr(base + (ord(c) - base + k) % 26)
        return c
    return "".join(map(shift, s))
def balanced(s):
    pairs, stack = {")": "(", "]": "[", "}": "{"}, []
    for c in s:
        if c in "([{": stack.append(c)
        elif c in pairs and (not stack or stack.pop() != pairs[c]): return False
    return not stack
def second_largest(xs):
    d = sorted(set(xs))
    return d[-2] if len(d) > 1 else None
def roman(n):
    out = ""
    for v, r in [(1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
                 (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")]:
        while n >= v: out, n = out + r, n - v
    return out
def merge_sorted(a, b): return sorted(a + b)
def anagrams(a, b): return sorted(a.lower().replace(" ", "")) == sorted(b.lower().replace(" ", ""))
def pascal_row(n):
    row = [1]
    for _ in range(n): row = [1] + [x + y for x, y in zip(row, row[1:])] + [1]
    return row
def collatz_steps(n):
    k = 0
    while n != 1: n, k = (n // 2 if n % 2 == 0 else 3 * n + 1), k + 1
    return k
def title_case(s): return " ".join(w[:1].upper() + w[1:].lower() for w in s.split(" "))
def interleave(a, b):
    out = []
    for i in range(max(len(a), len(b))):
        out += a[i:i + 1] + b[i:i + 1]
    return out
def max_subarray(xs):
    best = cur = xs[0]
    for x in xs[1:]:
        cur = max(x, cur + x); best = max(best, cur)
    return best
def hamming(a, b): return sum(x != y for x, y in zip(a, b))
def compress(s):
    out, i = "", 0
    while i < len(s):
        j = i
        while j < len(s) and s[j] == s[i]: j += 1
        out, i = out + f"{s[i]}{j - i}", j
    return out
"""


def test_every_coding_task_can_be_passed_and_failed() -> None:
    for task in load_tasks(DATA / "tasks" / "coding.jsonl"):
        v = task.verifier
        env: dict[str, Any] = {}
        exec(REFERENCE, env)  # the project's own reference code
        exec(v.tests, env)  # passes on the reference
        wrong = {v.entry_point: lambda *args: None}
        with pytest.raises((AssertionError, TypeError)):
            exec(v.tests, wrong)  # a stub fails


def test_search_answers_are_in_the_corpus_and_no_prompt_holds_its_answer() -> None:
    docs = [json.loads(line) for line in (DATA / "corpus.jsonl").read_text().splitlines()]
    by_title = {d["title"]: d["text"] for d in docs}
    for task in load_tasks(DATA / "tasks" / "search.jsonl"):
        question = task.messages[-1].content
        named = [t for t in by_title if t in question]
        assert named, f"{task.task_id} names no document"
        text = by_title[named[0]]
        if task.metadata["hops"] == "two-hop":  # through the birthplace's own document
            birthplace = text.split(" in ", 1)[1].split(")")[0]
            text = by_title[birthplace]
        assert all(a in text for a in task.verifier.answers), task.task_id
        assert not any(a in question for a in task.verifier.answers), task.task_id
    for task in load_tasks(DATA / "tasks" / "coding.jsonl"):
        assert task.verifier.tests not in " ".join(m.content for m in task.messages)


def test_parse_task_keeps_chat_messages() -> None:
    task = parse_task(
        GOOD | {"prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]},
        path="mem",
        line=1,
    )
    assert [(m.role, m.content) for m in task.messages] == [("system", "s"), ("user", "u")]
