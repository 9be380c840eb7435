"""How model-written code is kept from the host: bubblewrap namespaces, cgroup caps.

The isolation is bubblewrap's (Debian's `bubblewrap`), a tool that Flatpak and others
keep hardened, rather than Python hooks, which code can step past with `ctypes`. Each
call gets fresh user, mount, PID, network, IPC and UTS namespaces: read-only `/usr`, a
size-capped tmpfs `/tmp` as the only writable place (plus a tiny `/dev/shm`), no view of
the project, the store or other calls, and no network. When the call's first process
ends, the PID namespace ends and every descendant with it, however it was forked.

Where bubblewrap is missing or cannot make namespaces, code is refused with an error
naming the package, unless the operator sets `HEDDLE_SANDBOX=unisolated`: then code runs
with rlimits, a fresh network namespace where `unshare` can make one, and as `nobody`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache

SANDBOX_ENV = "HEDDLE_SANDBOX"  # bwrap (the default) | unisolated (the operator's opt-out)
NOBODY = 65534
CGROUP_ROOT = "/sys/fs/cgroup"


class SandboxUnavailable(RuntimeError):
    """The isolation the sandbox needs is missing here; the message says what to install."""


@dataclass(frozen=True)
class Launcher:
    """How to start one sandboxed Python: `prefix` runs before the interpreter."""

    prefix: tuple[str, ...]
    python: str
    isolated: bool  # bubblewrap's namespaces (else the operator's unisolated opt-out)
    as_nobody: bool  # the code's processes run as the host's `nobody`


def _works(argv: list[str]) -> bool:
    try:
        return subprocess.run(argv, capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _host_python() -> str | None:
    """An interpreter under /usr (the only tree the sandbox sees): the worker's own base
    interpreter where it lives there, else the system's."""
    for candidate in (os.path.realpath(sys.executable), "/usr/bin/python3"):
        if candidate.startswith("/usr/") and os.access(candidate, os.X_OK):
            return candidate
    return None


def _drop_to_nobody() -> tuple[str, ...]:
    """As root, `setpriv` to nobody first, so the code's processes count against
    nobody's process limits and bubblewrap makes an unprivileged user namespace."""
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        return ()
    return (setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups")


def _system_dirs() -> list[str]:
    """/usr read-only, and the top-level links or directories that point into it."""
    args = ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64"):
        path = f"/{name}"
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    return args


def bwrap_args(tmp_bytes: int, shm_bytes: int) -> list[str]:
    """bubblewrap's options for one call (after the binary, before the command)."""
    return [
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",  # no nested user namespace to gain capabilities in
        "--die-with-parent",
        "--new-session",
        "--hostname",
        "sandbox",
        *_system_dirs(),
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--size",
        str(tmp_bytes),
        "--perms",
        "1777",
        "--tmpfs",
        "/tmp",
        "--size",
        str(shm_bytes),
        "--perms",
        "1777",
        "--tmpfs",
        "/dev/shm",
        "--remount-ro",
        "/dev",
        "--remount-ro",
        "/",
        "--chdir",
        "/tmp",
        "--clearenv",
        "--setenv",
        "PATH",
        "/usr/bin:/bin",
        "--setenv",
        "HOME",
        "/tmp",
        "--setenv",
        "TMPDIR",
        "/tmp",
        "--setenv",
        "LANG",
        "C.UTF-8",
        "--",
    ]


@cache
def _bwrap_launcher(bwrap: str, python: str) -> Launcher | str:
    """The bubblewrap launcher, or why it cannot run here (probed once per binary)."""
    drop = _drop_to_nobody()
    prefix = (*drop, bwrap, *bwrap_args(1 << 20, 1 << 16))
    probe = [*prefix, python, "-I", "-S", "-c", "pass"]
    try:
        done = subprocess.run(probe, capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{bwrap} could not start: {exc}"
    if done.returncode != 0:
        return f"{bwrap} cannot make namespaces here: {done.stderr.decode(errors='replace')[:300]}"
    return Launcher((*drop, bwrap), python, isolated=True, as_nobody=bool(drop))


@cache
def _unisolated_launcher() -> Launcher:
    """The opt-out: a fresh network namespace where `unshare` can make one, nobody."""
    prefix: tuple[str, ...] = ()
    unshare = shutil.which("unshare")
    if unshare is not None:
        for flags in (["-n"], ["-rn"]):
            if _works([unshare, *flags, "true"]):
                prefix = (unshare, *flags)
                break
    drop = _drop_to_nobody()
    if drop:
        for python in (sys.executable, "/usr/bin/python3"):
            if os.path.exists(python) and _works([*prefix, *drop, python, "-c", "pass"]):
                return Launcher((*prefix, *drop), python, isolated=False, as_nobody=True)
    return Launcher(prefix, sys.executable, isolated=False, as_nobody=False)


def launcher() -> Launcher:
    """How to start the sandbox here, by `HEDDLE_SANDBOX`; raises `SandboxUnavailable`
    where the isolation is missing and the operator has not opted out."""
    mode = os.environ.get(SANDBOX_ENV, "bwrap")
    if mode == "unisolated":
        return _unisolated_launcher()
    if mode != "bwrap":
        raise SandboxUnavailable(f"{SANDBOX_ENV}={mode!r}: expected 'bwrap' or 'unisolated'")
    bwrap = shutil.which("bwrap")
    python = _host_python()
    if bwrap is None:
        raise SandboxUnavailable(
            "the code sandbox needs bubblewrap (Debian/Ubuntu package `bubblewrap`), which "
            f"is not installed; to run model code without isolation set {SANDBOX_ENV}=unisolated"
        )
    if python is None:
        raise SandboxUnavailable("the code sandbox needs a Python under /usr (/usr/bin/python3)")
    found = _bwrap_launcher(bwrap, python)
    if isinstance(found, str):
        raise SandboxUnavailable(
            f"{found}; to run model code without isolation set {SANDBOX_ENV}=unisolated"
        )
    return found


@dataclass(frozen=True)
class CgroupCaps:
    """One call's cgroup: the processes its code may hold at once and their memory, all
    together (rlimits cap each process alone). `procs_files` are the `cgroup.procs` the
    launcher writes its own pid into before it execs the sandbox."""

    dirs: tuple[str, ...]

    @property
    def procs_files(self) -> tuple[str, ...]:
        return tuple(os.path.join(d, "cgroup.procs") for d in self.dirs)

    def kill_all(self) -> None:
        for procs in self.procs_files:
            with contextlib.suppress(OSError), open(procs) as fh:
                for line in fh:
                    with contextlib.suppress(ProcessLookupError, ValueError):
                        os.kill(int(line), signal.SIGKILL)

    def remove(self) -> None:
        deadline = time.monotonic() + 5.0
        for d in self.dirs:
            while os.path.isdir(d):
                try:
                    os.rmdir(d)
                except OSError:  # busy until the killed processes are reaped
                    if time.monotonic() > deadline:
                        break
                    self.kill_all()
                    time.sleep(0.02)


def _write(path: str, value: str) -> None:
    with open(path, "w") as fh:
        fh.write(value)


def _v1_dirs(name: str) -> tuple[str, str] | None:
    pids, memory = (os.path.join(CGROUP_ROOT, c, "heddle-sandbox") for c in ("pids", "memory"))
    if not (
        os.access(os.path.dirname(pids), os.W_OK) and os.access(os.path.dirname(memory), os.W_OK)
    ):
        return None
    return os.path.join(pids, name), os.path.join(memory, name)


@contextlib.contextmanager
def cgroup_caps(max_procs: int, memory_bytes: int) -> Iterator[CgroupCaps | None]:
    """A fresh cgroup for one call where this host lets the worker make one (cgroup v2
    with the pids and memory controllers delegated, or v1's pids and memory
    hierarchies), else None: the rlimits then stand alone."""
    name = uuid.uuid4().hex[:12]
    caps: CgroupCaps | None = None
    try:
        caps = _make_v2(name, max_procs, memory_bytes) or _make_v1(name, max_procs, memory_bytes)
    except OSError:
        caps = None
    try:
        yield caps
    finally:
        if caps is not None:
            caps.kill_all()
            caps.remove()


def _make_v2(name: str, max_procs: int, memory_bytes: int) -> CgroupCaps | None:
    parent = os.path.join(CGROUP_ROOT, "heddle-sandbox")
    try:
        with open(os.path.join(CGROUP_ROOT, "cgroup.controllers")) as fh:
            if not {"pids", "memory"} <= set(fh.read().split()):
                return None
    except OSError:
        return None
    os.makedirs(parent, exist_ok=True)
    _write(os.path.join(parent, "cgroup.subtree_control"), "+pids +memory")
    group = os.path.join(parent, name)
    os.mkdir(group)
    caps = CgroupCaps((group,))
    try:
        _write(os.path.join(group, "pids.max"), str(max_procs))
        _write(os.path.join(group, "memory.max"), str(memory_bytes))
        _write(os.path.join(group, "memory.swap.max"), "0")
    except OSError:
        caps.remove()
        raise
    return caps


def _make_v1(name: str, max_procs: int, memory_bytes: int) -> CgroupCaps | None:
    dirs = _v1_dirs(name)
    if dirs is None:
        return None
    pids, memory = dirs
    for d in dirs:
        os.makedirs(d)
    caps = CgroupCaps(dirs)
    try:
        _write(os.path.join(pids, "pids.max"), str(max_procs))
        _write(os.path.join(memory, "memory.limit_in_bytes"), str(memory_bytes))
        with contextlib.suppress(OSError):  # absent where swap accounting is off
            _write(os.path.join(memory, "memory.memsw.limit_in_bytes"), str(memory_bytes))
    except OSError:
        caps.remove()
        raise
    return caps


# Joins the call's cgroups, then execs the sandbox: every process the code makes is born
# inside them, with no window for a fork to escape (a preexec_fn is unsafe in a worker).
ENTER_CGROUPS = 'for f in $HEDDLE_CGROUP_PROCS; do echo $$ > "$f" || exit 126; done; exec "$@"'


def enter_cgroups_prefix(caps: CgroupCaps | None) -> tuple[tuple[str, ...], dict[str, str]]:
    """The argv prefix and environment that put the launched process in `caps`."""
    if caps is None:
        return (), {}
    return ("/bin/sh", "-c", ENTER_CGROUPS, "sh"), {
        "HEDDLE_CGROUP_PROCS": " ".join(caps.procs_files)
    }
