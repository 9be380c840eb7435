"""Run model-written Python in a throw-away sandbox.

Limits: a wall-clock timeout (the process group is killed), CPU seconds, address space,
file size and process count (rlimits), no network (a fresh network namespace where the
kernel allows it, and an audit hook that refuses sockets in any case), the unprivileged
user `nobody` when the worker runs as root, a temporary working directory deleted
afterwards, and a cap on the output kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from functools import cache

from activities.toolkit.base import Observation

# Runs before the user's code in the child: the limits, then an audit hook that refuses
# sockets whatever the code imports. Limits are set here rather than in a preexec_fn,
# which is unsafe in the worker's multi-threaded process.
_BOOTSTRAP = """
import resource, sys
cpu_s, memory_bytes, file_bytes, max_procs = (int(a) for a in sys.argv[1:5])
resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
if max_procs:
    resource.setrlimit(resource.RLIMIT_NPROC, (max_procs, max_procs))
def _deny_network(event, args):
    if event in ("socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo",
                 "socket.gethostbyname", "socket.sendto"):
        raise PermissionError("network access is disabled in the sandbox")
sys.addaudithook(_deny_network)
del _deny_network, resource
sys.argv = ["main.py"]
__file__ = "main.py"
exec(compile(open("main.py", encoding="utf-8").read(), "main.py", "exec"), {"__name__": "__main__"})
"""
NOBODY = 65534


def _works(argv: list[str]) -> bool:
    try:
        return subprocess.run(argv, capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@cache
def _launcher() -> tuple[tuple[str, ...], str, bool]:
    """How to start the sandbox here: (argv prefix, python, drops to nobody).

    A fresh network namespace (`unshare -n`, or `-rn` without root) where the kernel
    allows it; as root, privileges dropped to nobody with `setpriv` where a Python that
    nobody may run exists.
    """
    prefix: tuple[str, ...] = ()
    unshare = shutil.which("unshare")
    if unshare is not None:
        for flags in (["-n"], ["-rn"]):
            if _works([unshare, *flags, "true"]):
                prefix = (unshare, *flags)
                break
    setpriv = shutil.which("setpriv")
    if os.geteuid() == 0 and setpriv is not None:
        drop = (setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups")
        for python in (sys.executable, "/usr/bin/python3"):
            if os.path.exists(python) and _works([*prefix, *drop, python, "-c", "pass"]):
                return (*prefix, *drop), python, True
    return prefix, sys.executable, False


@dataclass(frozen=True)
class PythonSandbox:
    timeout_s: float = 10.0
    cpu_s: int = 10
    memory_bytes: int = 512 * 1024 * 1024
    max_output_chars: int = 8_000
    max_file_bytes: int = 16 * 1024 * 1024
    max_procs: int = 64  # applied when running as nobody (the limit counts the user's)

    async def run(self, code: str) -> Observation:
        workdir = tempfile.mkdtemp(prefix="heddle-py-")
        try:
            with open(os.path.join(workdir, "main.py"), "w", encoding="utf-8") as fh:
                fh.write(code)
            prefix, python, as_nobody = _launcher()
            if as_nobody:
                os.chown(workdir, NOBODY, NOBODY)
                os.chown(os.path.join(workdir, "main.py"), NOBODY, NOBODY)
            limits = (self.cpu_s, self.memory_bytes, self.max_file_bytes, self.max_procs)
            argv = [*prefix, python, "-I", "-S", "-c", _BOOTSTRAP, *map(str, limits)]
            env = {"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8"}
            proc = await asyncio.create_subprocess_exec(
                *argv,
                cwd=workdir,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,  # its own process group, killed as one
            )
            try:
                stdout, _ = await asyncio.wait_for(proc.communicate(), self.timeout_s)
            except TimeoutError:
                _kill_group(proc.pid)
                await proc.wait()
                return Observation("timeout", f"timed out after {self.timeout_s:g} s")
            text = stdout.decode("utf-8", errors="replace")
            if len(text) > self.max_output_chars:
                text = text[: self.max_output_chars] + "\n[output truncated]"
            if proc.returncode == 0:
                return Observation("ok", text)
            if proc.returncode is not None and proc.returncode < 0:
                sig = signal.Signals(-proc.returncode).name
                reason = "CPU time limit" if sig == "SIGXCPU" else sig
                return Observation("error", f"{text}\nkilled: {reason}")
            return Observation("error", text or f"exit status {proc.returncode}")
        finally:
            shutil.rmtree(workdir, ignore_errors=True)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
