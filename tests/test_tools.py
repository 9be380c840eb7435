"""Real tools: the Python sandbox's limits, the calculator, local search; bad calls are
error observations, never exceptions."""

from __future__ import annotations

import asyncio
import os
import socket
import threading

import pytest

from activities.toolkit import ToolUnavailable, custom_tool, default_registry
from activities.toolkit.base import Observation, count_tokens
from activities.toolkit.isolation import launcher
from activities.toolkit.python_exec import NOBODY, PythonSandbox


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def test_python_runs_code_in_a_throwaway_directory() -> None:
    obs = run(PythonSandbox().run("import os; print(os.getcwd()); open('f.txt','w').write('x')"))
    assert obs.status == "ok"
    workdir = obs.text.strip()
    if launcher().isolated:
        assert workdir == "/tmp"  # the call's own tmpfs, gone with its mount namespace
    else:
        assert "heddle-py-" in workdir
        assert not os.path.exists(workdir)  # deleted afterwards


def test_python_does_not_run_as_root() -> None:
    obs = run(PythonSandbox().run("import os; print(os.getuid())"))
    assert obs.status == "ok"
    if os.geteuid() == 0:
        assert launcher().as_nobody
        assert obs.text.strip() == str(NOBODY)


def test_python_wall_clock_timeout_kills_the_process_group() -> None:
    code = "import subprocess, time\nsubprocess.Popen(['sleep', '30'])\ntime.sleep(30)"
    obs = run(PythonSandbox(timeout_s=1.0).run(code))
    assert obs.status == "timeout"
    assert "timed out after 1 s" in obs.text


def test_python_cpu_limit() -> None:
    obs = run(PythonSandbox(timeout_s=20, cpu_s=1).run("while True: pass"))
    assert obs.status == "error"
    assert "CPU time limit" in obs.text


def test_python_memory_limit() -> None:
    obs = run(PythonSandbox(memory_bytes=256 * 1024 * 1024).run("x = bytearray(1024 ** 3)"))
    assert obs.status == "error"
    assert "MemoryError" in obs.text


def test_python_has_no_network() -> None:
    # A real listener on loopback: the sandbox still cannot reach it.
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    accepted: list[object] = []
    t = threading.Thread(target=lambda: accepted.append(server.accept()), daemon=True)
    t.start()
    try:
        code = (
            f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
            "print('connected')"
        )
        obs = run(PythonSandbox().run(code))
    finally:
        server.close()
    assert obs.status == "error"
    assert "connected" not in obs.text.split("\n")[-2:]
    assert not accepted


def test_python_error_is_an_observation() -> None:
    obs = run(PythonSandbox().run("raise ValueError('boom')"))
    assert obs.status == "error"
    assert "ValueError: boom" in obs.text


def test_registry_turns_bad_calls_into_error_observations() -> None:
    registry = default_registry()

    async def crash(_: str) -> Observation:
        raise RuntimeError("tool exploded")

    registry.register("crashy", crash)
    unknown = run(registry.call("nope", "x"))
    assert unknown.status == "error"
    assert "unknown tool 'nope'" in unknown.text
    assert "python" in unknown.text  # lists what exists
    assert run(registry.call("python", None)).status == "error"
    crashed = run(registry.call("crashy", "x"))
    assert crashed.status == "error"
    assert "tool exploded" in crashed.text


def test_custom_tools_answer_and_an_unavailable_one_raises_to_be_retried() -> None:
    registry = default_registry(
        custom={"echo": "tests.crashing_tool:echo", "down": "tests.crashing_tool:down"}
    )
    assert run(registry.call("echo", "hi")) == Observation("ok", "HI")
    # Its service is down: not the model's to read, so the call fails and is retried.
    with pytest.raises(ToolUnavailable, match="down"):
        run(registry.call("down", "x"))
    with pytest.raises(ValueError, match="module:function"):
        custom_tool("no_function_here")


def test_calculator() -> None:
    registry = default_registry()
    assert run(registry.call("calculator", "2**10 + sqrt(16)")) == Observation("ok", "1028.0")
    for bad in ("__import__('os')", "1/0", "9**99999", "x + 1", "(((("):
        assert run(registry.call("calculator", bad)).status == "error", bad


def test_search_over_the_local_corpus() -> None:
    obs = run(default_registry().call("search", "capital of France"))
    assert obs.status == "ok"
    assert obs.text.startswith("[1] Paris")
    assert run(default_registry().call("search", 'NEAR( " OR *')).status == "ok"  # no FTS syntax


def test_count_tokens() -> None:
    assert count_tokens("") == 0
    assert count_tokens("abcd" * 10) == 10
