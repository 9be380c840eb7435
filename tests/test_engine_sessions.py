"""The engine core's sessions: a trajectory admitted under a KV reservation is held from
its first step to its last, and a new one waits while the reservations fill the cache."""

from __future__ import annotations

import pytest

from engines.core import EngineCore, modelled_core
from heddle.config import ClusterConfig
from tests.factories import create_core, request, run_until_done


def _until_gone(core: EngineCore, request_id: str) -> None:
    while request_id in core:
        core.step()


def _two_turns_beside_a_third(reserve: int) -> tuple[EngineCore, int]:
    """Trajectories a, b and c of 4,000-token contexts on a 10,000-token cache: a makes a
    short turn and comes back from its tool call while b decodes on. Returns the core
    and the tokens of a's context that its second turn found cached."""
    core = create_core(kv_capacity_tokens=10_000, max_num_seqs=4, policy="priority")
    core.add_request(request("a/0", 4000, 10, key="a", reserve=reserve))
    core.add_request(request("b/0", 4000, 3000, key="b", reserve=reserve))
    core.add_request(request("c/0", 4000, 10, key="c", reserve=reserve))
    _until_gone(core, "a/0")
    for _ in range(5):  # a's tool call
        core.step()
    core.add_request(request("a/1", 4060, 10, key="a", reserve=reserve, ends=True))
    core.step()
    return core, core._by_id["a/1"].num_cached_tokens


def test_without_reservations_a_new_trajectory_evicts_one_in_its_tool_call() -> None:
    """vLLM's admission: c takes the room a's cached context left, and a prefills it
    again when it comes back."""
    core, cached = _two_turns_beside_a_third(reserve=0)
    assert cached == 0
    assert not core.admitting
    assert not core.sessions


def test_a_reservation_keeps_the_context_of_a_trajectory_in_its_tool_call() -> None:
    core, cached = _two_turns_beside_a_third(reserve=4500)
    assert cached == 4009  # a's whole context but the token its next turn recomputes
    assert [r.request_id for r in core.admitting] == ["c/0"]  # 9,000 of 10,000 reserved
    assert [r.request_id for r in core.queued()] == ["c/0"]
    # a's last step ends its session: c is admitted at the next iteration.
    _until_gone(core, "a/1")
    assert core.sessions == {"b": 4500}
    core.step()
    assert not core.admitting
    assert set(core.sessions) == {"b", "c"}
    assert run_until_done(core)
    # Neither b's last step nor c's said it ended, so both looked like tool calls; b's
    # decode outgrew the cache and evicted c's context, which ends c's hold. b's waits
    # out the TTL.
    assert "c" not in core.prefix_cache
    assert core.sessions == {"b": 4500}


def test_a_session_that_never_comes_back_lapses_after_its_ttl() -> None:
    """A trajectory that failed in its tool call (or an agent turn, whose end the engine
    is not told) holds its reservation only for the TTL, in engine time."""
    core = create_core(kv_capacity_tokens=10_000, policy="priority", session_ttl_s=0.5)
    core.add_request(request("a/0", 4000, 10, key="a", reserve=6000))
    core.add_request(request("b/0", 100, 5_000, key="b", reserve=1000))
    core.add_request(request("c/0", 1000, 10, key="c", reserve=6000))
    _until_gone(core, "a/0")  # a is now in a tool call it never returns from
    assert [r.request_id for r in core.admitting] == ["c/0"]
    while core.admitting:
        core.step()
    assert core.clock_s >= 0.5
    assert set(core.sessions) == {"b", "c"}


def test_an_idle_engine_admits_past_its_reservations() -> None:
    """With nothing running or waiting the head is admitted anyway: the engine never
    idles with work, whatever the forecasts reserved."""
    core = create_core(kv_capacity_tokens=10_000, policy="priority")
    core.add_request(request("a/0", 1000, 10, key="a", reserve=9000))
    _until_gone(core, "a/0")
    core.add_request(request("c/0", 1000, 10, key="c", reserve=9000))
    core.step()
    assert set(core.sessions) == {"a", "c"}
    assert core.num_reserved_kv_tokens == 18_000


def test_a_move_ends_the_session_and_a_new_forecast_resizes_it() -> None:
    core = create_core(kv_capacity_tokens=10_000, policy="priority")
    core.add_request(request("a/0", 1000, 10, key="a", reserve=3000))
    _until_gone(core, "a/0")
    core.add_request(request("a/1", 1100, 10, key="a", reserve=5000))
    assert core.sessions == {"a": 5000}
    _until_gone(core, "a/1")
    assert core.drop_prefix("a") == 1109
    assert core.sessions == {}
    assert core.num_reserved_kv_tokens == 0


def test_a_trajectory_moved_in_is_held_at_once() -> None:
    """The hold follows the context: a trajectory whose KV another instance sent here is
    not new to the batch, so it runs at once where a new one waits for room (made to
    wait, the policy's move of a long decode onto a full instance stopped it there:
    paper 32B search seed 2, 280 -> 301 s), up to the overcommit's cap of 1.25 caches
    (a cold start's reshaping moves hundreds at once: draw 1001 at 800, heddle-cold
    522 -> 597 s without the cap)."""
    core = create_core(kv_capacity_tokens=10_000, policy="priority")
    core.add_request(request("b/0", 100, 5000, key="b", reserve=9000))
    core.step()
    core.add_request(request("c/0", 2000, 10, key="c", reserve=2000))
    assert core.put_prefix("a", 2000)
    core.add_request(request("a/3", 2000, 10, key="a", reserve=2000))
    assert core.put_prefix("d", 2000)
    core.add_request(request("d/5", 2000, 10, key="d", reserve=2000))
    # c is new, d would take the reservations past 1.25 caches: both wait for room.
    assert [r.request_id for r in core.admitting] == ["c/0", "d/5"]
    assert core.sessions == {"b": 9000, "a": 2000}
    core.step()
    assert core._by_id["a/3"] in core.running


def test_a_reservation_is_at_most_the_cache() -> None:
    core = create_core(kv_capacity_tokens=10_000, policy="priority")
    core.add_request(request("a/0", 1000, 10, key="a", reserve=50_000))
    core.step()
    assert core.sessions == {"a": 10_000}


def test_an_admissible_trajectory_cuts_a_decode_block() -> None:
    """The simulator's fast path runs plain decodes in one event; a trajectory that a
    finished session made room for must join at the next iteration instead."""
    core = create_core(kv_capacity_tokens=10_000, max_num_seqs=4, policy="priority")
    core.add_request(request("b/0", 100, 5000, key="b", reserve=6000))
    core.add_request(request("c/0", 100, 10, key="c", reserve=6000))
    core.step()
    assert core.decode_block() is not None  # c cannot be admitted: b decodes alone
    core.sessions["b"] = 1000  # as a new forecast of b would leave it
    core.num_reserved_kv_tokens = 1000
    assert core.decode_block() is None
    core.step()
    assert not core.admitting


def test_an_aborted_request_leaves_the_admission_queue() -> None:
    core = create_core(kv_capacity_tokens=10_000, policy="priority")
    core.add_request(request("b/0", 100, 5000, key="b", reserve=9000))
    core.add_request(request("c/0", 100, 10, key="c", reserve=9000))
    core.step()
    assert core.abort("c/0")
    assert not core.admitting
    assert "c/0" not in core


def _b_decodes_while_c_waits(**overcommit: float) -> EngineCore:
    """b holds 6,000 of a 10,000-token cache and decodes long; c needs 5,000 more, so it
    fits only once the engine admits 1.1 caches of reservations."""
    core = create_core(kv_capacity_tokens=10_000, max_num_seqs=4, policy="priority", **overcommit)
    core.add_request(request("b/0", 100, 5000, key="b", reserve=6000))
    core.add_request(request("c/0", 100, 10, key="c", reserve=5000))
    return core


def test_the_engine_overcommits_its_reservations_as_time_goes_by_without_loss() -> None:
    core = _b_decodes_while_c_waits(overcommit_per_s=1.0, max_overcommit=1.25)
    core.step()
    assert [r.request_id for r in core.admitting] == ["c/0"]
    while core.admitting:
        core.step()
    # Admitted the iteration after the factor reached 1.1: 0.1 engine seconds.
    assert 0.1 <= core.clock_s < 0.1 + 0.05
    assert set(core.sessions) == {"b", "c"}


def test_without_overcommit_the_reservations_bound_admission() -> None:
    core = _b_decodes_while_c_waits(overcommit_per_s=0.0)
    for _ in range(500):
        core.step()
    assert [r.request_id for r in core.admitting] == ["c/0"]
    assert core.admission_factor == 1.0


def test_evicting_a_held_context_halves_the_overcommit() -> None:
    """a is in its tool call, its context cached; b's decode needs the room, so a's
    prefix goes, and the engine admits less from then on."""
    core = create_core(
        kv_capacity_tokens=10_000,
        max_num_seqs=4,
        policy="priority",
        overcommit_per_s=0.0,
        release_evicted=False,
    )
    core.add_request(request("a/0", 4000, 10, key="a", reserve=4000))
    core.add_request(request("b/0", 100, 9000, key="b", reserve=4000))
    _until_gone(core, "a/0")
    core.admission_factor = 1.2  # as growth would have left it
    while "a" in core.prefix_cache:
        core.step()
    assert "a" in core.sessions  # still held: its context was lost in its tool call
    assert core.admission_factor == 1.1


def test_a_decode_block_ends_when_the_overcommit_admits_the_next_trajectory() -> None:
    """The simulator's fast path must admit c at the same iteration as step-by-step."""
    stepped = _b_decodes_while_c_waits(overcommit_per_s=0.5)
    while stepped.admitting:
        stepped.step()
    blocked = _b_decodes_while_c_waits(overcommit_per_s=0.5)
    blocked.step()
    while blocked.admitting:
        block = blocked.decode_block()
        if block is None:
            blocked.step()
        else:
            blocked.advance_decode(block, block.num_iterations)
    assert blocked.running[0].num_output_tokens == stepped.running[0].num_output_tokens
    assert abs(blocked.clock_s - stepped.clock_s) < 1e-9 * stepped.clock_s + 1e-12


def test_the_cluster_file_sets_the_simulated_engines_overcommit_and_release() -> None:
    cluster = ClusterConfig(num_gpus=8, kv_overcommit_per_s=0.0002, kv_release_evicted=False)
    core, _ = modelled_core(cluster.shape(), 1, "priority")
    assert core.limits.overcommit_per_s == 0.0002
    assert not core.limits.release_evicted
    default, _ = modelled_core(ClusterConfig(num_gpus=8).shape(), 1, "priority")
    assert default.limits.overcommit_per_s == 0.0  # off unless the file says
    assert default.limits.release_evicted  # on unless the file says


@pytest.mark.parametrize("release", [False, True])
def test_an_evicted_context_in_a_tool_call_ends_the_hold_when_asked(release: bool) -> None:
    """a was admitted on a small reservation and is in its tool call when b's decode
    needs its room. Released, a comes back to wait for room like a new trajectory
    rather than crowd b out again; held, it is scheduled at once."""
    core = create_core(
        kv_capacity_tokens=10_000, max_num_seqs=4, policy="priority", release_evicted=release
    )
    core.add_request(request("a/0", 4000, 10, key="a", reserve=4000))
    core.add_request(request("b/0", 100, 9000, key="b", reserve=4000))
    _until_gone(core, "a/0")
    while "a" in core.prefix_cache:
        core.step()
    assert ("a" in core.sessions) is not release
    core.add_request(request("a/1", 4060, 10, key="a", reserve=7000))
    assert [r.request_id for r in core.admitting] == (["a/1"] if release else [])
