"""A trajectory's token ids on the vLLM host: stand-ins fill what was never seen (tool
output, a host restart), generated ids are kept, and the same trajectory always gets the
same stand-ins, so a context rebuilt elsewhere still matches the prefix cache."""

from __future__ import annotations

from engines.vllm import FIRST_PLAIN_ID, TokenSessions


def test_a_context_has_the_asked_length_and_keeps_generated_ids() -> None:
    sessions = TokenSessions(vocab_size=100)
    prompt = sessions.context("t", 20)
    assert len(prompt) == 20
    assert all(FIRST_PLAIN_ID <= i < 100 for i in prompt)
    sessions.extend("t", [7, 8, 9])
    turn = sessions.context("t", 30)  # the generated ids, then 7 tool-output stand-ins
    assert turn[:20] == prompt
    assert turn[20:23] == [7, 8, 9]
    assert len(turn) == 30
    assert sessions.context("t", 21) == [*prompt, 7]  # a step retried from fewer tokens


def test_stand_ins_are_the_same_wherever_they_are_rebuilt() -> None:
    one, other = TokenSessions(vocab_size=500), TokenSessions(vocab_size=500)
    assert one.context("t", 64) == other.context("t", 64)
    assert one.context("t", 64) != one.context("u", 64)
    one.forget("t")
    assert "t" not in one.ids


def test_the_least_recently_used_sessions_make_room() -> None:
    sessions = TokenSessions(vocab_size=100, max_tokens=110)
    sessions.context("old", 60)
    sessions.context("new", 30)
    sessions.extend("old", [5] * 5)  # "old" is now the most recently used
    sessions.context("newest", 40)  # 135 tokens: the least recently used one goes
    assert list(sessions.ids) == ["old", "newest"]
    assert len(sessions.context("new", 30)) == 30  # rebuilt from stand-ins
