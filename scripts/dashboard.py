"""The dashboard's queries on a real Prometheus (Debian's `prometheus`) scraping an
embedded stack through a batch: `python scripts/dashboard.py` writes
docs/images/dashboard.png, the panels of docker/grafana/heddle.json drawn from that
Prometheus' answers to their queries (Grafana is not packaged for Debian, so matplotlib
draws what it would chart). `tests/test_dashboard.py` checks that every panel's query returns data.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from heddle.client import HeddleClient  # noqa: E402
from heddle.runtime.stack import EmbeddedStack, free_port  # noqa: E402
from heddle.trace import load_trace  # noqa: E402
from heddle.types import RolloutOptions  # noqa: E402
from tests.live import SMALL_CLUSTER  # noqa: E402

DASHBOARD = REPO / "docker" / "grafana" / "heddle.json"
SCRAPE_S = 1


def prometheus_binary() -> str | None:
    return shutil.which("prometheus")


def panels() -> list[tuple[str, list[str]]]:
    """Each panel's title and its queries."""
    dash = json.loads(DASHBOARD.read_text())
    return [(p["title"], [t["expr"] for t in p["targets"]]) for p in dash["panels"]]


@dataclass
class Prometheus:
    address: str

    def api(self, path: str, **params: Any) -> Any:
        url = f"http://{self.address}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=30) as reply:
            body = json.loads(reply.read())
        if body.get("status") != "success":
            raise RuntimeError(f"{path} {params}: {body}")
        return body["data"]

    def query_range(self, expr: str, start: float, end: float) -> list[dict[str, Any]]:
        data = self.api("query_range", query=expr, start=start, end=end, step=SCRAPE_S)
        return list(data["result"])

    def wait_for_targets(self, jobs: set[str], timeout_s: float = 60) -> None:
        """Until a scrape of every job's targets succeeded."""
        deadline = time.monotonic() + timeout_s
        while True:
            targets = self.api("targets")["activeTargets"]
            up = {t["labels"]["job"] for t in targets if t["health"] == "up"}
            if jobs <= up:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"Prometheus never scraped {jobs - up}: {targets}")
            time.sleep(0.5)


@contextmanager
def prometheus(targets_file: Path, workdir: Path) -> Iterator[Prometheus]:
    """A Prometheus scraping the targets an embedded stack lists, every second."""
    binary = prometheus_binary()
    if binary is None:
        raise RuntimeError("Prometheus is needed (Debian `prometheus`)")
    config = workdir / "prometheus.yml"
    config.write_text(
        json.dumps({
            "global": {"scrape_interval": f"{SCRAPE_S}s", "evaluation_interval": f"{SCRAPE_S}s"},
            "scrape_configs": [{
                "job_name": "heddle-dev",
                "file_sd_configs": [{"files": [str(targets_file)], "refresh_interval": "1s"}],
            }],
        })
    )  # fmt: skip
    address = f"127.0.0.1:{free_port()}"
    log = (workdir / "prometheus.log").open("ab")
    proc = subprocess.Popen(
        [binary, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'tsdb'}",
         f"--web.listen-address={address}"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://{address}/-/ready", timeout=2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"Prometheus did not start; see {workdir}") from None
                time.sleep(0.2)
        yield Prometheus(address)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@dataclass
class ScrapedBatch:
    prometheus: Prometheus
    started: float
    ended: float


async def scraped_batch(workdir: Path, then: Any = None) -> Any:
    """Run the demo trace under Heddle's policy on a two-worker embedded stack that a
    Prometheus scrapes; calls `then(ScrapedBatch)` with Prometheus still up."""
    stack = EmbeddedStack(
        state_dir=workdir / "stack", port=free_port(), headless=True, cluster=SMALL_CLUSTER,
        time_scale=0.1, num_workers=2,
    )  # fmt: skip
    records = load_trace(REPO / "examples" / "demo-coding-64.jsonl")
    await stack.start()
    try:
        with prometheus(stack.state_dir / "prometheus-targets.json", workdir) as prom:
            prom.wait_for_targets({"heddle", "temporal-sdk", "temporal-server"})
            started = time.time()
            client = await HeddleClient.connect(stack.address, store_url=stack.store_url)
            async with client:
                handle = await client.start_rollout(
                    records=records, options=RolloutOptions(policy="heddle"), history=records
                )
                await asyncio.wait_for(handle.report(), 300)
            await asyncio.sleep(3 * SCRAPE_S)  # the last counts scraped
            return then(ScrapedBatch(prom, started, time.time())) if then else None
    finally:
        stack.stop()


def legend(fmt: str, labels: dict[str, str]) -> str:
    """A series' name as Grafana's legend format writes it ({{label}} replaced)."""
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt)


def render(batch: ScrapedBatch, out: Path) -> None:
    """Each dashboard panel drawn from Prometheus' answers to its queries over the batch
    (matplotlib: the data Grafana would chart, without a Grafana here)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dash = json.loads(DASHBOARD.read_text())
    cols = 3
    rows = -(-len(dash["panels"]) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(cols * 6, rows * 3.2), squeeze=False)
    for ax, panel in zip(axes.flat, dash["panels"], strict=False):
        drawn = 0
        for target in panel["targets"]:
            result = batch.prometheus.query_range(target["expr"], batch.started, batch.ended)
            for series in result[:8]:
                xs = [float(t) - batch.started for t, _ in series["values"]]
                ys = [float(v) for _, v in series["values"]]
                ax.plot(xs, ys, label=legend(target["legendFormat"], series["metric"])[:40])
                drawn += 1
        ax.set_title(panel["title"], fontsize=10)
        ax.set_xlabel("s into the batch", fontsize=8)
        ax.tick_params(labelsize=7)
        if drawn:
            ax.legend(fontsize=6, loc="upper right")
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    for ax in list(axes.flat)[len(dash["panels"]) :]:
        ax.axis("off")
    fig.suptitle(
        f"{dash['title']}: the demo trace under Heddle's policy, scraped every {SCRAPE_S} s"
    )
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)
    plt.close(fig)


def main() -> None:
    out = REPO / "docs" / "images" / "dashboard.png"
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(scraped_batch(Path(tmp), lambda batch: render(batch, out)))
    print(f"wrote {out.relative_to(REPO)}")


if __name__ == "__main__":
    main()
