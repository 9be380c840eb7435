"""Run model-written Python in a throw-away sandbox.

The isolation (namespaces, the read-only system, the capped tmpfs, cgroups) is
`isolation`'s; this module adds what one Python call needs: the program through stdin
(so no file holds it, nor the hidden tests a verifier appends), rlimits on CPU seconds,
address space, file size and process count, a wall-clock timeout, and a cap on the
output the worker keeps, read as it comes so a flood cannot fill the worker's memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import tempfile
from dataclasses import dataclass

from activities.toolkit.base import Observation
from activities.toolkit.isolation import (
    NOBODY,
    SandboxUnavailable,
    bwrap_args,
    cgroup_caps,
    enter_cgroups_prefix,
    launcher,
)

__all__ = ["NOBODY", "PythonSandbox", "SandboxUnavailable"]

# Runs before the user's code in the child: the program from stdin (then stdin is
# /dev/null), the limits, and an audit hook that refuses Python's own sockets (the
# network namespace is what holds against ctypes). Limits are set here rather than in a
# preexec_fn, which is unsafe in the worker's multi-threaded process.
_BOOTSTRAP = """
import os, resource, sys
cpu_s, memory_bytes, file_bytes, max_procs = (int(a) for a in sys.argv[1:5])
_code = compile(sys.stdin.buffer.read().decode("utf-8", "replace"), "main.py", "exec")
_null = os.open(os.devnull, os.O_RDONLY)
os.dup2(_null, 0)
os.close(_null)
sys.stdin = open(0, closefd=False)
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
del _deny_network, _null, resource
sys.argv = ["main.py"]
exec(_code, {"__name__": "__main__", "__file__": "main.py"})
"""


@dataclass(frozen=True)
class PythonSandbox:
    timeout_s: float = 10.0
    cpu_s: int = 10
    memory_bytes: int = 512 * 1024 * 1024  # each process (rlimit) and all together (cgroup)
    max_output_chars: int = 8_000
    max_file_bytes: int = 16 * 1024 * 1024
    max_procs: int = 64
    tmp_bytes: int = 64 * 1024 * 1024  # the writable /tmp, all files together
    shm_bytes: int = 1024 * 1024

    async def run(self, code: str) -> Observation:
        try:
            how = launcher()
        except SandboxUnavailable as exc:
            return Observation("error", f"the python tool refused to run: {exc}")
        workdir = None if how.isolated else tempfile.mkdtemp(prefix="heddle-py-")
        try:
            if how.isolated:
                prefix = [*how.prefix, *bwrap_args(self.tmp_bytes, self.shm_bytes)]
                env: dict[str, str] = {}
            else:
                assert workdir is not None
                if how.as_nobody:
                    os.chown(workdir, NOBODY, NOBODY)
                prefix = list(how.prefix)
                env = {"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir}
                env["LANG"] = "C.UTF-8"
            limits = (self.cpu_s, self.memory_bytes, self.max_file_bytes, self.max_procs)
            python = [how.python, "-I", "-S", "-c", _BOOTSTRAP, *map(str, limits)]
            with cgroup_caps(self.max_procs, self.memory_bytes) as caps:
                enter, cg_env = enter_cgroups_prefix(caps)
                return await self._run([*enter, *prefix, *python], {**env, **cg_env}, workdir, code)
        finally:
            if workdir is not None:
                shutil.rmtree(workdir, ignore_errors=True)

    async def _run(
        self, argv: list[str], env: dict[str, str], cwd: str | None, code: str
    ) -> Observation:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=cwd or "/",
            env=env,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,  # its own process group, killed as one
        )
        limit = self.max_output_chars * 4  # bytes: room for multi-byte text
        try:
            kept, truncated = await asyncio.wait_for(self._talk(proc, code, limit), self.timeout_s)
        except TimeoutError:
            _kill_group(proc.pid)
            assert proc.stdout is not None
            while await proc.stdout.read(1 << 16):  # a paused pipe never reports its end
                pass
            await proc.wait()
            return Observation("timeout", f"timed out after {self.timeout_s:g} s")
        text = kept.decode("utf-8", errors="replace")
        if truncated or len(text) > self.max_output_chars:
            text = text[: self.max_output_chars] + "\n[output truncated]"
        if proc.returncode == 0:
            return Observation("ok", text)
        killed_by = _signal_of(proc.returncode)
        if killed_by is not None:
            sig = killed_by.name
            reason = "CPU time limit" if sig == "SIGXCPU" else sig
            return Observation("error", f"{text}\nkilled: {reason}")
        return Observation("error", text or f"exit status {proc.returncode}")

    @staticmethod
    async def _talk(proc: asyncio.subprocess.Process, code: str, limit: int) -> tuple[bytes, bool]:
        """Send the program, then read the output up to `limit` bytes and drain the rest."""
        assert proc.stdin is not None
        assert proc.stdout is not None
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            proc.stdin.write(code.encode("utf-8"))
            await proc.stdin.drain()
        proc.stdin.close()
        kept = bytearray()
        truncated = False
        while chunk := await proc.stdout.read(1 << 16):
            if len(kept) < limit:
                kept += chunk[: limit - len(kept)]
            else:
                truncated = True
        await proc.wait()
        return bytes(kept), truncated


def _signal_of(returncode: int | None) -> signal.Signals | None:
    """The signal that ended the code: negative from the process itself, 128 + n from
    bubblewrap's PID-1 reaper, which reports its child's death as an exit status."""
    if returncode is None or returncode == 0:
        return None
    number = -returncode if returncode < 0 else returncode - 128
    try:
        return signal.Signals(number) if number > 0 else None
    except ValueError:
        return None


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
