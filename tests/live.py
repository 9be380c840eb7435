"""Helpers for tests that run rollouts against the session's Temporal server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from temporalio.client import Client

from heddle.client import HeddleClient
from heddle.config import ClusterConfig
from heddle.runtime.stack import free_port
from heddle.runtime.worker import WorkerOptions, run_worker

SMALL_CLUSTER = ClusterConfig(model="qwen3-8b", gpu="h100", num_gpus=4, default_tp=1)


@contextlib.asynccontextmanager
async def in_process_worker(
    address: str,
    store_url: str,
    prefix: str,
    *,
    time_scale: float = 0.05,
    cluster: ClusterConfig = SMALL_CLUSTER,
) -> AsyncIterator[None]:
    stop = asyncio.Event()
    task = asyncio.create_task(
        run_worker(
            WorkerOptions(
                address=address,
                store_url=store_url,
                cluster=cluster,
                time_scale=time_scale,
                queue_prefix=prefix,
            ),
            stop,
        )
    )
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


@contextlib.asynccontextmanager
async def live_client(
    address: str,
    store_url: str,
    prefix: str,
    *,
    time_scale: float = 0.05,
    cluster: ClusterConfig = SMALL_CLUSTER,
) -> AsyncIterator[HeddleClient]:
    """A worker in this process and a client for it, on a fresh task-queue prefix."""
    async with in_process_worker(
        address, store_url, prefix, time_scale=time_scale, cluster=cluster
    ):
        client = await HeddleClient.connect(address, store_url=store_url, queue_prefix=prefix)
        async with client:
            yield client


def worker_process(
    address: str,
    store_url: str,
    prefix: str,
    log: Path,
    *,
    time_scale: float,
    cluster: ClusterConfig = SMALL_CLUSTER,
    engines: bool = True,
    extra: tuple[str, ...] = (),
    run_with: tuple[str, ...] = (),
) -> subprocess.Popen[bytes]:
    """A worker in its own process, as `heddle worker` runs it (hosting the engines, or
    not: one process of a stack does); `extra`: more of its options; `run_with`: what
    runs it (`ip netns exec NS` for another network namespace)."""
    argv = [
        *run_with, sys.executable, "-m", "heddle.cli", "worker",
        "--address", address, "--store", store_url,
        "--cluster-json", json.dumps(cluster.model_dump(mode="json")),
        "--time-scale", str(time_scale), "--queue-prefix", prefix,
        "--engines" if engines else "--no-engines", *extra,
    ]  # fmt: skip
    with open(log, "ab") as fh:
        return subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)


async def wait_for_poller(client: Client, task_queue: str, pid: int) -> None:
    """Wait until process `pid` polls `task_queue` for workflow tasks: a process that
    has not started polling yet gets none, so a test about where work runs waits."""
    from temporalio.api.enums.v1 import TaskQueueType
    from temporalio.api.taskqueue.v1 import TaskQueue
    from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest

    request = DescribeTaskQueueRequest(
        namespace=client.namespace,
        task_queue=TaskQueue(name=task_queue),
        task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
    )
    deadline = time.monotonic() + 60
    while True:
        described = await client.workflow_service.describe_task_queue(request)
        if any(p.identity.startswith(f"{pid}@") for p in described.pollers):
            return
        assert time.monotonic() < deadline, f"process {pid} never polled {task_queue}"
        await asyncio.sleep(0.2)


def scheduled_activities(history: Any) -> dict[int, str]:
    """A workflow history's scheduled activities: event id -> activity name."""
    return {
        e.event_id: e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    }


def kill_process(proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
    proc.wait(30)


async def count_workflows(client: Client, query: str, expected: int, timeout_s: float = 20) -> int:
    """Visibility is eventually consistent: poll until the count settles on `expected`."""
    deadline = time.monotonic() + timeout_s
    while True:
        n = (await client.count_workflows(query)).count
        if n == expected or time.monotonic() > deadline:
            return n
        await asyncio.sleep(0.3)


def pg_bindir() -> Path | None:
    """Debian's PostgreSQL server binaries, the newest installed."""
    for candidate in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (candidate / "initdb").exists():
            return candidate
    return None


class PostgresServer:
    """A throw-away PostgreSQL server on loopback with a `store` database, which a test
    may stop and start again (its data directory stays)."""

    def __init__(self, host: str = "127.0.0.1", netns: str = "") -> None:
        """`netns`: a network namespace to run the server in, listening on `host`."""
        self.host = host
        self.netns = ["ip", "netns", "exec", netns] if netns else []
        bindir = pg_bindir()
        if bindir is None:
            raise RuntimeError("PostgreSQL server binaries are not installed (Debian postgresql)")
        self.bindir = bindir
        # Not under pytest's tmp (0700, root's): the server user must reach its directory.
        self.root = Path(tempfile.mkdtemp(prefix="heddle-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        # initdb refuses to run as root: run the server as the postgres user where we are.
        self.prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        self.prefix = [*self.netns, *self.prefix]
        if self.prefix:
            subprocess.run(["chown", "-R", "postgres", str(self.root)], check=True)
            self.root.chmod(0o777)
        subprocess.run(
            [*self.prefix, str(bindir / "initdb"), "-D", str(self.data), "-U", "heddle",
             "--auth=trust"],
            check=True, capture_output=True,
        )  # fmt: skip
        if host != "127.0.0.1":  # clients on other (namespaced) machines: trusted too
            with (self.data / "pg_hba.conf").open("a") as hba:
                hba.write("host all all 0.0.0.0/0 trust\n")
        self.start()
        subprocess.run(
            [*self.netns, str(bindir / "createdb"), "-h", host, "-p", str(self.port), "-U",
             "heddle", "store"],
            check=True, capture_output=True,
        )  # fmt: skip

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://heddle@{self.host}:{self.port}/store"

    def _ctl(self, *args: str) -> None:
        subprocess.run(
            [*self.prefix, str(self.bindir / "pg_ctl"), "-D", str(self.data), *args],
            check=True, capture_output=True,
        )  # fmt: skip

    def start(self) -> None:
        self._ctl("-l", str(self.root / "log"), "-w", "-o",
                  f"-p {self.port} -k {self.root} -h {self.host}", "start")  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        """Stop the server: `fast` closes every connection; `immediate` is a crash."""
        self._ctl("-m", mode, "-w", "stop")

    def close(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)
