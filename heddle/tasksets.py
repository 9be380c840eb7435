# ruff: noqa: E501  (tables of task data: a test string per line reads better whole)
"""The task sets Heddle ships, one per workload, and the search corpus they draw on.

    python -m heddle.tasksets      # writes heddle/data/tasks/*.jsonl and corpus.jsonl

Everything is made here, deterministically from a seed (no data set can be downloaded on
these machines), so `tests/test_tasks.py` can check that the shipped files are exactly
what this module makes:

- math: arithmetic and word problems with numeric answers (tools: calculator, python);
- coding: small Python functions, each with hidden unit tests (tool: python);
- search: questions about an invented world of towns and people, each answered by a
  document of the corpus and by no general knowledge (tool: search). The corpus is the
  hand-written seed documents plus one document per town and person.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from heddle.tasks import Message, Task, Verifier, dump_task

DATA = Path(__file__).resolve().parent / "data"
SEED = 0
SYSTEM = (
    'You are a careful assistant. Call a tool with <tool_call>{"name": ..., '
    '"arguments": {...}}</tool_call> when it helps; end with the final answer as '
    "'Answer: ...'."
)

# ---- math ----------------------------------------------------------------------------

# (question, the expression that answers it): the taught model's calculator call too.
_WORD_PROBLEMS = [
    ("A baker makes {a} loaves a day for {b} days and sells {c} of them. "
     "How many loaves are left?", "{a} * {b} - {c}"),
    ("A train travels {a} km an hour for {b} hours, then {c} km more. "
     "How far does it travel in all, in km?", "{a} * {b} + {c}"),
    ("{a} students share {b} boxes of {c} pencils equally. How many pencils does each "
     "student get? (The pencils divide evenly.)", "{b} * {c} // {a}"),
    ("A tank holds {a} litres. It loses {b} litres an hour for {c} hours. "
     "How many litres are left?", "{a} - {b} * {c}"),
    ("A shop sells pens at {a} cents each. How many cents do {b} pens cost after a "
     "discount of {c} cents on the whole order?", "{a} * {b} - {c}"),
]  # fmt: skip


@dataclass(frozen=True)
class MathProblem:
    question: str
    expression: str  # what a calculator call that answers it evaluates
    answer: int
    kind: str  # arithmetic | word_problem


def math_problem(rng: random.Random, k: int) -> MathProblem:
    """The k-th problem of a stream: arithmetic on even k, a word problem on odd."""
    if k % 2 == 0:
        a, b, c = rng.randint(12, 999), rng.randint(2, 99), rng.randint(2, 999)
        op1, op2 = rng.choice("+-*"), rng.choice("+-")
        expression = f"{a} {op1} {b} {op2} {c}"
        question = f"Compute {expression}."
        kind = "arithmetic"
    else:
        template, formula = _WORD_PROBLEMS[(k // 2) % len(_WORD_PROBLEMS)]
        a, b, c = rng.randint(3, 60), rng.randint(2, 40), rng.randint(2, 30)
        if "share" in template:
            b = a * rng.randint(1, 5)  # boxes a multiple of students: an even split
            c = rng.randint(2, 12)
        if "tank" in template:
            a = b * c + rng.randint(5, 500)
        question = template.format(a=a, b=b, c=c)
        expression = formula.format(a=a, b=b, c=c)
        kind = "word_problem"
    answer = eval(expression)  # our own arithmetic, not input
    return MathProblem(question, expression, answer, kind)


def math_tasks(n: int = 120, seed: int = SEED) -> list[Task]:
    rng = random.Random(seed)
    tasks = []
    for k in range(n):
        p = math_problem(rng, k)
        tasks.append(Task(
            task_id=f"math-{k:04d}", workload="math",
            messages=(Message("system", SYSTEM), Message("user", p.question)),
            tools=("calculator", "python"),
            verifier=Verifier("numeric", answer=float(p.answer)),
            metadata={"kind": p.kind},
        ))  # fmt: skip
    return tasks


# ---- coding --------------------------------------------------------------------------

# (signature, description, hidden tests): the tests never reach the model or its sandbox.
_FUNCTIONS = [
    ("clamp(x, lo, hi)", "returns x limited to the range [lo, hi]",
     "assert clamp(5, 0, 3) == 3\nassert clamp(-2, 0, 3) == 0\nassert clamp(2, 0, 3) == 2"),
    ("digit_sum(n)", "returns the sum of the decimal digits of the non-negative integer n",
     "assert digit_sum(0) == 0\nassert digit_sum(9045) == 18\nassert digit_sum(7) == 7"),
    ("is_palindrome(s)", "tells whether s reads the same backwards, ignoring case and "
     "non-letters", "assert is_palindrome('A man, a plan, a canal: Panama')\n"
     "assert not is_palindrome('heddle')\nassert is_palindrome('')"),
    ("count_vowels(s)", "returns how many of the letters of s are vowels (a, e, i, o, u, "
     "either case)", "assert count_vowels('Temporal') == 3\nassert count_vowels('xyz') == 0\n"
     "assert count_vowels('AEIOU') == 5"),
    ("reverse_words(s)", "returns s with its space-separated words in reverse order, "
     "single-spaced", "assert reverse_words('a b  c') == 'c b a'\n"
     "assert reverse_words('one') == 'one'\nassert reverse_words('') == ''"),
    ("fib(n)", "returns the n-th Fibonacci number, fib(0) == 0 and fib(1) == 1",
     "assert fib(0) == 0\nassert fib(1) == 1\nassert fib(10) == 55\nassert fib(30) == 832040"),
    ("gcd(a, b)", "returns the greatest common divisor of two non-negative integers, not "
     "both zero", "assert gcd(12, 18) == 6\nassert gcd(7, 0) == 7\nassert gcd(17, 5) == 1"),
    ("running_max(xs)", "returns the list whose i-th item is the largest of xs[0..i]",
     "assert running_max([1, 3, 2, 5, 4]) == [1, 3, 3, 5, 5]\nassert running_max([]) == []"),
    ("dedupe(xs)", "returns xs without repeated items, keeping each first occurrence in "
     "order", "assert dedupe([3, 1, 3, 2, 1]) == [3, 1, 2]\nassert dedupe([]) == []"),
    ("fizzbuzz(n)", "returns 'Fizz' for multiples of 3, 'Buzz' for multiples of 5, "
     "'FizzBuzz' for both, else str(n)", "assert fizzbuzz(9) == 'Fizz'\n"
     "assert fizzbuzz(10) == 'Buzz'\nassert fizzbuzz(30) == 'FizzBuzz'\nassert fizzbuzz(7) == '7'"),
    ("is_prime(n)", "tells whether the integer n is prime",
     "assert is_prime(2)\nassert is_prime(97)\nassert not is_prime(1)\nassert not is_prime(91)"),
    ("flatten(xss)", "returns the items of a list of lists, in order, as one list",
     "assert flatten([[1, 2], [], [3]]) == [1, 2, 3]\nassert flatten([]) == []"),
    ("word_count(s)", "returns a dict from each lower-cased space-separated word of s to "
     "its count", "assert word_count('a B a') == {'a': 2, 'b': 1}\nassert word_count('') == {}"),
    ("rotate(xs, k)", "returns xs rotated right by k places (k may exceed len(xs))",
     "assert rotate([1, 2, 3, 4], 1) == [4, 1, 2, 3]\nassert rotate([1, 2, 3], 4) == [3, 1, 2]\n"
     "assert rotate([], 3) == []"),
    ("chunks(xs, n)", "returns xs split into consecutive lists of n items (the last may "
     "be shorter)", "assert chunks([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]\n"
     "assert chunks([], 3) == []"),
    ("to_binary(n)", "returns the binary digits of the non-negative integer n as a string",
     "assert to_binary(0) == '0'\nassert to_binary(5) == '101'\nassert to_binary(256) == '100000000'"),
    ("median(xs)", "returns the median of a non-empty list of numbers (the mean of the "
     "middle two for an even count)", "assert median([3, 1, 2]) == 2\n"
     "assert median([4, 1, 3, 2]) == 2.5\nassert median([7]) == 7"),
    ("caesar(s, k)", "shifts each ASCII letter of s by k places in the alphabet, keeping "
     "case, other characters unchanged", "assert caesar('abc', 1) == 'bcd'\n"
     "assert caesar('Zz!', 2) == 'Bb!'\nassert caesar('hi', 26) == 'hi'"),
    ("balanced(s)", "tells whether the brackets ()[]{} in s are balanced",
     "assert balanced('([]{})')\nassert not balanced('(]')\nassert not balanced('((')\n"
     "assert balanced('a(b)c')"),
    ("second_largest(xs)", "returns the second largest distinct value of xs, or None if "
     "there is none", "assert second_largest([3, 1, 3, 2]) == 2\n"
     "assert second_largest([5, 5]) is None\nassert second_largest([]) is None"),
    ("roman(n)", "returns the Roman numeral for 1 <= n <= 3999",
     "assert roman(4) == 'IV'\nassert roman(1994) == 'MCMXCIV'\nassert roman(3999) == 'MMMCMXCIX'"),
    ("merge_sorted(a, b)", "merges two sorted lists into one sorted list",
     "assert merge_sorted([1, 4], [2, 3, 5]) == [1, 2, 3, 4, 5]\nassert merge_sorted([], []) == []"),
    ("anagrams(a, b)", "tells whether a and b are anagrams, ignoring case and spaces",
     "assert anagrams('Dormitory', 'dirty room')\nassert not anagrams('abc', 'abd')"),
    ("pascal_row(n)", "returns row n of Pascal's triangle, row 0 being [1]",
     "assert pascal_row(0) == [1]\nassert pascal_row(4) == [1, 4, 6, 4, 1]"),
    ("collatz_steps(n)", "returns how many Collatz steps take n (>= 1) to 1",
     "assert collatz_steps(1) == 0\nassert collatz_steps(6) == 8\nassert collatz_steps(27) == 111"),
    ("title_case(s)", "capitalises the first letter of each space-separated word and "
     "lower-cases the rest", "assert title_case('hELLO wORLD') == 'Hello World'\n"
     "assert title_case('') == ''"),
    ("interleave(a, b)", "returns the items of a and b alternately, the rest of the longer "
     "at the end", "assert interleave([1, 2, 3], ['a']) == [1, 'a', 2, 3]\n"
     "assert interleave([], [1]) == [1]"),
    ("max_subarray(xs)", "returns the largest sum of a non-empty contiguous run of xs",
     "assert max_subarray([-2, 1, -3, 4, -1, 2, 1, -5, 4]) == 6\nassert max_subarray([-3, -1]) == -1"),
    ("hamming(a, b)", "returns the number of positions at which equal-length strings a and "
     "b differ", "assert hamming('karolin', 'kathrin') == 3\nassert hamming('', '') == 0"),
    ("compress(s)", "run-length encodes s as letter then count, e.g. 'aab' -> 'a2b1'",
     "assert compress('aab') == 'a2b1'\nassert compress('') == ''\nassert compress('zzzz') == 'z4'"),
]  # fmt: skip


def coding_tasks() -> list[Task]:
    tasks = []
    for k, (signature, description, tests) in enumerate(_FUNCTIONS):
        entry = signature.split("(")[0]
        prompt = (
            f"Write a Python function `{signature}` that {description}. You may run code "
            "with the python tool to check it. Reply with the whole function in one "
            "```python block."
        )
        tasks.append(Task(
            task_id=f"coding-{k:04d}", workload="coding",
            messages=(Message("system", SYSTEM), Message("user", prompt)),
            tools=("python",),
            verifier=Verifier("unit_tests", entry_point=entry, tests=tests),
            metadata={"function": entry},
        ))  # fmt: skip
    return tasks


# ---- search: an invented world, so that only the corpus knows the answers ---------------

_SYLLABLES = ["vel", "mor", "qua", "ten", "dris", "ol", "ka", "shen", "bri", "tor", "ean",
              "lum", "sa", "rek", "ith", "pol", "zan", "ur", "fen", "gal", "ost", "rin"]  # fmt: skip
_REGIONS = ["the Ostrel valley", "the Kessan coast", "the Umber highlands", "the Varn plain",
            "the Serith marshes", "the Dalo steppe"]  # fmt: skip
_EXPORTS = ["copper bells", "blue glass", "salted fish", "wool cloth", "river pearls",
            "clockwork toys", "cedar barrels", "paper lanterns", "iron nails", "dried figs"]  # fmt: skip
_PROFESSIONS = ["engineer", "cartographer", "botanist", "composer", "physician", "astronomer",
                "weaver", "architect"]  # fmt: skip
_WORKS = ["a tide clock", "a folding bridge", "a seed vault", "a river survey", "a star atlas",
          "a fever remedy", "a loom pattern", "a lighthouse lens"]  # fmt: skip


@dataclass(frozen=True)
class Town:
    name: str
    region: str
    founded: int
    river: str
    population: int
    export: str


@dataclass(frozen=True)
class Person:
    name: str
    born: int
    town: Town
    profession: str
    work: str


def _word(rng: random.Random, parts: int) -> str:
    return "".join(rng.choice(_SYLLABLES) for _ in range(parts)).capitalize()


def invented_world(
    towns: int = 200, people: int = 100, seed: int = SEED
) -> tuple[list[Town], list[Person]]:
    rng = random.Random(seed)
    names: set[str] = set()

    def fresh(parts: int) -> str:
        while True:
            name = _word(rng, parts)
            if name not in names:
                names.add(name)
                return name

    town_list = [
        Town(fresh(3), rng.choice(_REGIONS), rng.randint(1100, 1899), fresh(2),
             rng.randint(8, 900) * 100, rng.choice(_EXPORTS))
        for _ in range(towns)
    ]  # fmt: skip
    person_list = []
    for _ in range(people):
        town = rng.choice(town_list)
        person_list.append(Person(
            f"{fresh(2)} {fresh(3)}", rng.randint(max(town.founded + 20, 1500), 1990), town,
            rng.choice(_PROFESSIONS), rng.choice(_WORKS),
        ))  # fmt: skip
    return town_list, person_list


def corpus_documents(towns: list[Town], people: list[Person]) -> list[dict[str, str]]:
    docs = [
        {"title": t.name, "text": (
            f"{t.name} is a town in {t.region}, founded in {t.founded} on the banks of the "
            f"river {t.river}. It has a population of {t.population}, and it is known for its "
            f"{t.export}.")}
        for t in towns
    ]  # fmt: skip
    docs += [
        {"title": p.name, "text": (
            f"{p.name} (born {p.born} in {p.town.name}) is a {p.profession}, remembered for "
            f"{p.work}.")}
        for p in people
    ]  # fmt: skip
    return docs


def search_tasks(
    towns: list[Town], people: list[Person], n: int = 120, seed: int = SEED
) -> list[Task]:
    rng = random.Random(seed + 1)
    questions: list[tuple[str, list[str], str, str]] = []
    for t in towns:
        questions += [
            (f"In what year was the town of {t.name} founded?", [str(t.founded)], "exact_match", "one-hop"),
            (f"Which river does the town of {t.name} stand on?", [t.river], "exact_match", "one-hop"),
            (f"What is the town of {t.name} known for?", [t.export], "f1", "one-hop"),
        ]  # fmt: skip
    for p in people:
        questions += [
            (f"In which town was {p.name} born?", [p.town.name], "exact_match", "one-hop"),
            (f"On which river stands the town where {p.name} was born?", [p.town.river],
             "exact_match", "two-hop"),
        ]  # fmt: skip
    picked = rng.sample(questions, n)
    return [
        Task(
            task_id=f"search-{k:04d}", workload="search",
            messages=(Message("system", SYSTEM), Message("user", q + " Use the search tool.")),
            tools=("search",),
            verifier=Verifier("qa", answers=tuple(answers), metric=metric),
            metadata={"hops": hops},
        )
        for k, (q, answers, metric, hops) in enumerate(picked)
    ]  # fmt: skip


# ---- the files -----------------------------------------------------------------------


def shipped() -> dict[str, list[dict[str, Any]]]:
    """Each shipped file (relative to heddle/data) and its lines."""
    towns, people = invented_world()
    seed_docs = [
        json.loads(line) for line in (DATA / "corpus_seed.jsonl").read_text().splitlines() if line
    ]
    return {
        "corpus.jsonl": seed_docs + corpus_documents(towns, people),
        "tasks/math.jsonl": [dump_task(t) for t in math_tasks()],
        "tasks/coding.jsonl": [dump_task(t) for t in coding_tasks()],
        "tasks/search.jsonl": [dump_task(t) for t in search_tasks(towns, people)],
    }


def render(lines: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines)


def main() -> None:
    for name, lines in shipped().items():
        path = DATA / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render(lines), encoding="utf-8")
        print(f"wrote {path} ({len(lines)} lines)")


if __name__ == "__main__":
    main()
