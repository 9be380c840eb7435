"""The code sandbox tried as a hostile model would: each escape that the Python-hook
sandbox let through, and the bombs, contained by bubblewrap's namespaces and the caps,
with the worker's process unharmed and the next call clean."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
import time
from pathlib import Path

import pytest

from activities.toolkit import isolation
from activities.toolkit.python_exec import PythonSandbox
from activities.verify import score_unit_tests
from heddle.tasksets import Verifier

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _bubblewrap() -> None:
    if os.environ.get(isolation.SANDBOX_ENV) == "unisolated":
        if os.environ.get("HEDDLE_REQUIRE_BWRAP"):
            pytest.fail("bubblewrap is required (HEDDLE_REQUIRE_BWRAP) but cannot run here")
        pytest.skip("bubblewrap cannot run here (the suite runs code unisolated)")


def run(code: str, **limits: float) -> tuple[str, str]:
    obs = asyncio.run(PythonSandbox(**limits).run(code))  # type: ignore[arg-type]
    return obs.status, obs.text


def _procs_with(marker: str) -> list[int]:
    """Host processes whose command line holds `marker`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline.replace(b"\0", b" "):
            found.append(int(pid))
    return found


def test_sees_neither_the_project_nor_the_store(tmp_path: Path) -> None:
    # A store under a state directory with ordinary permissions, world-readable.
    state = tmp_path / "state"
    state.mkdir()
    (state / "heddle.db").write_text("other trajectories' rewards")
    for d in (tmp_path, state):
        d.chmod(0o755)
    (state / "heddle.db").chmod(0o644)
    targets = [str(REPO / "heddle" / "__init__.py"), str(state / "heddle.db"), "/etc/passwd"]
    code = (
        "import os\n"
        f"for p in {targets!r}:\n"
        "    print(p, os.path.exists(p))\n"
        "print(sorted(os.listdir('/')))\n"
    )
    status, text = run(code)
    assert status == "ok", text
    for target in targets:
        assert f"{target} False" in text
    top = set(eval(text.strip().splitlines()[-1]))
    assert top <= {"bin", "sbin", "lib", "lib32", "lib64", "usr", "tmp", "dev", "proc"}


def test_the_system_is_read_only_and_tmp_is_capped() -> None:
    code = (
        "import os\n"
        "for d in ('/', '/usr', '/dev', '/proc'):\n"
        "    try:\n"
        "        open(os.path.join(d, 'x'), 'w').write('x'); print(d, 'writable')\n"
        "    except OSError as e:\n"
        "        print(d, 'refused')\n"
        "n = 0\n"
        "try:\n"
        "    while True:\n"  # a disk filler: files under the per-file cap, until the tmpfs is full
        "        with open(f'/tmp/fill{n}', 'wb') as fh:\n"
        "            fh.write(b'x' * (4 << 20))\n"
        "        n += 1\n"
        "except OSError as e:\n"
        "    print('full after', n, 'files:', e.strerror)\n"
    )
    status, text = run(code, tmp_bytes=16 << 20)
    assert status == "ok", text
    for d in ("/", "/usr", "/dev", "/proc"):
        assert f"{d} refused" in text
    assert "full after 3 files: No space left on device" in text or "full after 4 files" in text


def test_files_do_not_outlive_the_call() -> None:
    write = "open('/tmp/answer', 'w').write('42'); open('/dev/shm/answer', 'w').write('42')"
    assert run(write)[0] == "ok"
    status, text = run(
        "import os; print([os.path.exists(p) for p in ('/tmp/answer', '/dev/shm/answer')])"
    )
    assert status == "ok"
    assert text.strip() == "[False, False]"
    assert not os.path.exists("/tmp/answer")
    assert not os.path.exists("/dev/shm/answer")


@pytest.mark.parametrize("ending", ["returns", "times out"])
def test_a_double_forked_daemon_dies_with_the_call(ending: str) -> None:
    marker = f"31.{int(time.time() * 1000) % 100000}{len(ending)}"
    code = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        f"        os.execv('/usr/bin/sleep', ['sleep', '{marker}'])\n"
        "    os._exit(0)\n"
        "time.sleep(0.5)\n"
        "print('parent done')\n" + ("time.sleep(30)\n" if ending == "times out" else "")
    )
    status, _ = run(code, timeout_s=3.0)
    assert status == ("ok" if ending == "returns" else "timeout")
    deadline = time.monotonic() + 3
    while _procs_with(f"sleep {marker}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _procs_with(f"sleep {marker}") == []


def test_ctypes_sockets_reach_nothing() -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(3)
    port = server.getsockname()[1]
    accepted: list[object] = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            accepted.append(server.accept())

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    # The socket syscall through libc, past Python's audit hook.
    code = (
        "import ctypes, struct\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "fd = libc.socket(2, 1, 0)\n"
        "print('socket fd', fd)\n"
        f"addr = struct.pack('!HH4s8x', 2, {port}, bytes([127, 0, 0, 1]))\n"
        "addr = struct.pack('=H', 2) + addr[2:]\n"
        "rc = libc.connect(fd, ctypes.c_char_p(addr), len(addr))\n"
        "print('connect', rc, ctypes.get_errno())\n"
    )
    try:
        status, text = run(code)
    finally:
        t.join(timeout=4)
        server.close()
    assert status == "ok", text
    assert "connect -1" in text  # ENETUNREACH: the namespace has no route to the host
    assert not accepted


def test_a_fork_bomb_is_contained_and_the_worker_unharmed() -> None:
    code = (
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    )
    status, _ = run(code, timeout_s=3.0, max_procs=32)
    assert status in ("timeout", "error")
    assert run("print('next call')") == ("ok", "next call\n")


def test_a_memory_bomb_is_contained() -> None:
    one = run("x = bytearray(2 << 30)", memory_bytes=256 << 20)
    assert one[0] == "error"
    assert "MemoryError" in one[1]
    # Many processes, each under its own rlimit: the call's cgroup caps them together.
    code = (
        "import os, time\n"
        "kids = []\n"
        "for _ in range(6):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        x = bytearray(150 << 20)\n"
        "        for i in range(0, len(x), 4096): x[i] = 1\n"
        "        time.sleep(1.5)\n"
        "        os._exit(0)\n"
        "    kids.append(pid)\n"
        "ok = sum(os.waitpid(k, 0)[1] == 0 for k in kids)\n"
        "print('held', ok)\n"
    )
    status, text = run(code, memory_bytes=256 << 20, timeout_s=20)
    with isolation.cgroup_caps(8, 1 << 20) as caps:
        has_cgroups = caps is not None
    if has_cgroups:  # 6 x 150 MiB cannot all be held under 256 MiB
        assert status != "ok" or int(text.split("held")[1]) < 6, text
    assert run("print('next call')") == ("ok", "next call\n")


def test_the_verifiers_answers_cannot_be_read() -> None:
    # The hidden tests reach the interpreter through stdin, never a file; the task set
    # and the store are outside the sandbox.
    tasks = str(REPO / "heddle/data/tasks/coding.jsonl")
    cheat = (
        "```python\n"
        "import os, sys\n"
        f"found = [p for p in ({tasks!r},) if os.path.exists(p)]\n"
        "for top in ('/tmp', '/dev'):\n"  # /usr is the host's system, /proc the call's own
        "    found += [os.path.join(d, f) for d, _, fs in os.walk(top) for f in fs\n"
        "              if f.endswith(('.jsonl', '.db', '.py'))]\n"
        "print('found', found, os.path.exists(__file__), sys.stdin.read() == '')\n"
        "def add(a, b):\n"
        "    return found and 0\n"
        "```"
    )
    v = Verifier(kind="unit_tests", tests="assert add(2, 3) == 5", timeout_s=10)
    verdict = asyncio.run(score_unit_tests(v, cheat, PythonSandbox()))
    assert verdict.reward == 0.0
    code = cheat.split("```python\n")[1].split("```")[0]
    status, text = run(code)
    assert status == "ok"
    assert "found [] False True" in text


def test_missing_bubblewrap_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv(isolation.SANDBOX_ENV, raising=False)
    status, text = run("print('ran')")
    assert status == "error"
    assert "bubblewrap" in text
    assert "HEDDLE_SANDBOX=unisolated" in text
    monkeypatch.setenv(isolation.SANDBOX_ENV, "unisolated")
    assert run("print('ran')") == ("ok", "ran\n")
