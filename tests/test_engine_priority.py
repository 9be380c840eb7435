"""A worker that leads its session lowers the session as a whole (Linux's autogroup),
since the CPU is shared between sessions before niceness counts; one that does not lead
its session (run from a terminal) leaves it alone. Runs without vLLM."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

AUTOGROUP = Path("/proc/self/autogroup")
PROBE = (
    "from engines.vllm import lower_session; "
    "print(lower_session(7)); print(open('/proc/self/autogroup').read().strip())"
)


def _probe(new_session: bool) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        capture_output=True, text=True, check=True, start_new_session=new_session,
    )  # fmt: skip
    return out.stdout.split("\n")


@pytest.mark.skipif(not AUTOGROUP.exists(), reason="a kernel without autogroup")
def test_a_session_leader_lowers_its_session() -> None:
    lowered, group = _probe(new_session=True)[:2]
    assert lowered == "True"
    assert group.endswith("nice 7")


@pytest.mark.skipif(not AUTOGROUP.exists(), reason="a kernel without autogroup")
def test_a_process_inside_another_session_leaves_it_alone() -> None:
    before = AUTOGROUP.read_text().strip()
    lowered, group = _probe(new_session=False)[:2]
    assert lowered == "False"
    assert group == before
