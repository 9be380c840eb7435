"""Every panel of the Grafana dashboard (docker/grafana/heddle.json) queried on a real
Prometheus that scraped an embedded stack through a batch: each query is valid PromQL
over metrics that exist, and returns data. Needs Debian's `prometheus` (CI installs it;
`HEDDLE_REQUIRE_PROMETHEUS=1` makes its absence a failure rather than a skip)."""

from __future__ import annotations

import asyncio
import math
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from scripts import dashboard

pytestmark = pytest.mark.skipif(
    dashboard.prometheus_binary() is None and not os.environ.get("HEDDLE_REQUIRE_PROMETHEUS"),
    reason="needs Prometheus (Debian `prometheus`)",
)

# Panels with nothing to show after this batch, and why.
NOTHING_TO_SHOW = {
    "KV move time p50 / p95": "the policy plans one instance for this trace: nothing moves",
}


def test_every_dashboard_query_returns_data_from_a_scraped_batch(tmp_path: Path) -> None:
    def check(batch: dashboard.ScrapedBatch) -> dict[str, bool]:
        shown = {}
        for title, exprs in dashboard.panels():
            values = [
                float(v)
                for expr in exprs
                for series in batch.prometheus.query_range(expr, batch.started, batch.ended)
                for _, v in series["values"]
            ]
            shown[title] = any(not math.isnan(v) for v in values)
        return shown

    shown = asyncio.run(dashboard.scraped_batch(tmp_path, check))
    empty = sorted(t for t, ok in shown.items() if not ok)
    assert empty == sorted(NOTHING_TO_SHOW), empty


def test_the_scrape_configs_are_valid_and_the_compose_file_mounts_what_exists() -> None:
    docker = dashboard.REPO / "docker"
    promtool = shutil.which("promtool")
    assert promtool is not None, "promtool comes with Debian's prometheus"
    for config in ("prometheus.yml", "prometheus-dev.yml"):
        result = subprocess.run([promtool, "check", "config", str(docker / config)],
                                capture_output=True, text=True)  # fmt: skip
        assert result.returncode == 0, result.stdout + result.stderr
    compose = yaml.safe_load((docker / "compose.yaml").read_text())
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (docker / source).exists(), f"{name} mounts {source}, which is missing"
