"""Tool calls parsed from a model's turn, and the verifiers that score its answer (the
unit tests in the real Python sandbox)."""

from __future__ import annotations

import asyncio

import pytest

from activities.verify import Verdict, parse_number, token_f1, verify
from heddle.tasks import Verifier
from heddle.toolcalls import final_answer, parse_turn

TOOLS = ("calculator", "python", "search")


def test_well_formed_calls_are_parsed_with_their_prose() -> None:
    turn = (
        "Let me compute it.\n<tool_call>\n"
        '{"name": "calculator", "arguments": {"expression": "17 * 23"}}\n</tool_call>\n'
        '<tool_call>{"name": "search", "arguments": "{\\"query\\": \\"Velmora\\"}"}</tool_call>'
    )
    parsed = parse_turn(turn, TOOLS)
    assert parsed.text == "Let me compute it."
    assert [(c.name, c.arguments, c.error) for c in parsed.calls] == [
        ("calculator", {"expression": "17 * 23"}, ""),
        ("search", {"query": "Velmora"}, ""),  # arguments sent as a JSON string
    ]
    assert not parsed.final
    assert parse_turn("Answer: 391", TOOLS).final


@pytest.mark.parametrize(
    ("turn", "error"),
    [
        ('<tool_call>{"name": "calculator", "arguments": {</tool_call>', "not valid JSON"),
        ('<tool_call>{"name": "browser", "arguments": {}}</tool_call>', "unknown tool 'browser'"),
        ('<tool_call>{"arguments": {}}</tool_call>', "has no name"),
        ('<tool_call>{"name": "python"}</tool_call>', "must be a JSON object"),
        (
            '<tool_call>{"name": "python", "arguments": {}}</tool_call>',
            "needs the string argument 'code'",
        ),
        ('<tool_call>["python"]</tool_call>', "must be {"),
        ('<tool_call>{"name": "python", "arguments": {}}', "no closing </tool_call>"),
    ],
)
def test_a_malformed_call_is_kept_with_its_error(turn: str, error: str) -> None:
    (call,) = parse_turn(turn, TOOLS).calls
    assert error in call.error


def test_answers_are_read_from_the_final_turn() -> None:
    assert final_answer("So 17*23 is... Answer: 391\n") == "391"
    assert final_answer("first answer: 3, but then ANSWER: 4") == "4"
    assert parse_number("Answer: 1,234.5") == 1234.5
    assert parse_number("it is \\boxed{3/4} so") == 0.75
    assert parse_number("no digits") is None
    assert token_f1("the copper bells", "copper bells") == 1.0
    assert 0 < token_f1("copper", "copper bells") < 1


def _score(v: Verifier, text: str) -> Verdict:
    return asyncio.run(verify(v, text))


def test_numeric_exact_and_qa_verifiers() -> None:
    numeric = Verifier("numeric", answer=391.0)
    assert _score(numeric, "17 * 23 = 391. Answer: 391").reward == 1.0
    assert _score(numeric, "Answer: 390").reward == 0.0
    assert _score(numeric, "I give up").reason == "no number in the answer"
    exact = Verifier("exact", answer="Paris")
    assert _score(exact, "Answer: paris.").reward == 1.0
    assert (
        _score(Verifier("exact", answer="Paris", case_sensitive=True), "Answer: paris").reward == 0
    )
    qa = Verifier("qa", answers=("Quen", "river Quen"))
    assert _score(qa, "Answer: the river Quen").reward == 1.0
    assert _score(qa, "Answer: Ostrel").reward == 0.0
    f1 = _score(Verifier("qa", answers=("copper bells",), metric="f1"), "Answer: bells")
    assert 0 < f1.reward < 1


TESTS = "assert add(1, 2) == 3\nassert add(-1, 1) == 0"


@pytest.mark.parametrize(
    ("answer", "reward", "reason"),
    [
        ("```python\ndef add(a, b):\n    return a + b\n```", 1.0, "all tests passed"),
        ("```python\ndef add(a, b):\n    return a - b\n```", 0.0, "AssertionError"),
        ("def add(a, b): return a + b", 1.0, "all tests passed"),  # no fence: the text
        # Code that ends the run before the tests must not pass.
        ("```python\nimport os\nos._exit(0)\n```", 0.0, "tests failed"),
        ("```python\nimport sys\nsys.exit(0)\n```", 0.0, "tests failed"),
        ("```python\nwhile True:\n    pass\n```", 0.0, "timed out"),
    ],
)
def test_unit_tests_run_the_models_code_in_the_sandbox(
    answer: str, reward: float, reason: str
) -> None:
    verdict = _score(Verifier("unit_tests", entry_point="add", tests=TESTS, timeout_s=2), answer)
    assert verdict.reward == reward
    assert reason in verdict.reason
    assert verdict.error == ""


def failing_verifier(text: str, params: dict[str, object]) -> float:
    raise RuntimeError("verifier bug")


def half_verifier(text: str, params: dict[str, object]) -> tuple[float, str]:
    return float(params["score"]), "by params"  # type: ignore[arg-type]


def test_a_custom_verifier_is_imported_and_its_crash_is_a_reward_error() -> None:
    ok = _score(Verifier("custom", import_path="tests.test_verify:half_verifier",
                         params={"score": 0.5}), "x")  # fmt: skip
    assert (ok.reward, ok.reason, ok.error) == (0.5, "by params", "")
    crashed = _score(Verifier("custom", import_path="tests.test_verify:failing_verifier"), "x")
    assert crashed.reward == 0.0
    assert crashed.error == "RuntimeError: verifier bug"
    missing = _score(Verifier("custom", import_path="no_such_module:fn"), "x")
    assert "ModuleNotFoundError" in missing.error
