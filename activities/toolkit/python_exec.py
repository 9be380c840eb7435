"""Run model-written Python in a throw-away sandbox.

Limits: a wall-clock timeout (the process group is killed), CPU seconds and address space
(rlimits), no network (a fresh network namespace where the kernel allows it, and an audit
hook that refuses sockets in any case), a temporary working directory deleted afterwards,
and a cap on the output kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from functools import cache

from activities.toolkit.base import Observation

# Runs before the user's code in the child: socket use raises, whatever the code imports.
_BOOTSTRAP = """
import sys
def _deny_network(event, args):
    if event in ("socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo",
                 "socket.gethostbyname", "socket.sendto"):
        raise PermissionError("network access is disabled in the sandbox")
sys.addaudithook(_deny_network)
del _deny_network
__file__ = "main.py"
exec(compile(open("main.py", encoding="utf-8").read(), "main.py", "exec"), {"__name__": "__main__"})
"""


@cache
def _netns_prefix() -> tuple[str, ...]:
    """`unshare -n` (or `-rn` without root) if this kernel lets us make a network namespace."""
    exe = shutil.which("unshare")
    if exe is None:
        return ()
    for flags in (["-n"], ["-rn"]):
        try:
            ok = (
                subprocess.run([exe, *flags, "true"], capture_output=True, timeout=5).returncode
                == 0
            )
        except (OSError, subprocess.TimeoutExpired):
            ok = False
        if ok:
            return (exe, *flags)
    return ()


@dataclass(frozen=True)
class PythonSandbox:
    timeout_s: float = 10.0
    cpu_s: int = 10
    memory_bytes: int = 512 * 1024 * 1024
    max_output_chars: int = 8_000
    max_file_bytes: int = 16 * 1024 * 1024

    def _limits(self) -> None:  # runs in the child between fork and exec
        os.setsid()
        # SIGXCPU at the soft limit (reported as such), SIGKILL a second later.
        resource.setrlimit(resource.RLIMIT_CPU, (self.cpu_s, self.cpu_s + 1))
        resource.setrlimit(resource.RLIMIT_AS, (self.memory_bytes, self.memory_bytes))
        resource.setrlimit(resource.RLIMIT_FSIZE, (self.max_file_bytes, self.max_file_bytes))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    async def run(self, code: str) -> Observation:
        workdir = tempfile.mkdtemp(prefix="heddle-py-")
        try:
            with open(os.path.join(workdir, "main.py"), "w", encoding="utf-8") as fh:
                fh.write(code)
            argv = [*_netns_prefix(), sys.executable, "-I", "-S", "-c", _BOOTSTRAP]
            env = {"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8"}
            proc = await asyncio.create_subprocess_exec(
                *argv,
                cwd=workdir,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                preexec_fn=self._limits,
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
