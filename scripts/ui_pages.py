"""The Temporal UI as an operator sees it, driven in headless Chromium (Debian's
`chromium`) against an embedded stack: the trajectory list filtered by Heddle's search
attributes, a running and a finished trajectory's summary and current details, and the
control workflow's plan. `python scripts/ui_pages.py` writes the screenshots to
docs/images/ui/; `tests/test_temporal_ui.py` checks what the same pages hold.

Chromium is driven through its WebDriver (Debian's `chromium-driver`, with selenium):
the UI fills its pages in after they load and keeps polling a running workflow, so a
page is read once what is looked for is on it.
"""

from __future__ import annotations

import asyncio
import html
import re
import shutil
import sys
import tempfile
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from heddle.client import HeddleClient  # noqa: E402
from heddle.config import ClusterConfig  # noqa: E402
from heddle.runtime.stack import EmbeddedStack, free_port  # noqa: E402
from heddle.types import RolloutOptions  # noqa: E402
from heddle.workloads import generate  # noqa: E402

SIZE = (1400, 900)
WAIT_S = 30.0


def chromedriver() -> str | None:
    return shutil.which("chromedriver")


class Browser:
    """One headless Chromium through its driver (Debian's `chromium-driver`): a page is
    read once what the test waits for is on it, since the UI fills itself in after load
    and keeps polling a running workflow."""

    def __init__(self) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        driver = chromedriver()
        if driver is None:
            raise RuntimeError("headless Chromium's driver is needed (Debian `chromium-driver`)")
        options = webdriver.ChromeOptions()
        for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"):
            options.add_argument(arg)
        options.add_argument(f"--window-size={SIZE[0]},{SIZE[1]}")
        self.driver = webdriver.Chrome(service=Service(driver), options=options)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.driver.quit()

    def open(self, url: str, ready: str, shot: Path | None = None) -> str:
        """Load `url`, wait until the XPath `ready` matches, return the DOM (and save a
        screenshot to `shot`)."""
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support import expected_conditions as ec
        from selenium.webdriver.support.ui import WebDriverWait

        self.driver.get(url)
        WebDriverWait(self.driver, WAIT_S).until(ec.presence_of_element_located((By.XPATH, ready)))
        time.sleep(1.0)  # the frames' content and the table's last rows
        if shot is not None:
            shot.parent.mkdir(parents=True, exist_ok=True)
            self.driver.save_screenshot(str(shot))
        return str(self.driver.page_source)


def visible_text(dom: str) -> str:
    """The page's text, without scripts, styles and the time-zone menu."""
    dom = re.sub(r"<script.*?</script>|<style.*?</style>|<select.*?</select>", "", dom, flags=re.S)
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", dom)))


def frame_content(dom: str, frame_id: str) -> str:
    """What the UI renders in one of its markdown frames (summary, details)."""
    match = re.search(rf'<iframe[^>]*src="([^"]*)"[^>]*id="{frame_id}"', dom)
    if match is None:
        return ""
    query = urllib.parse.urlparse(html.unescape(match.group(1))).query
    return urllib.parse.parse_qs(query).get("content", [""])[0]


def list_url(ui: str, query: str) -> str:
    return f"{ui}/namespaces/default/workflows?query={urllib.parse.quote(query)}"


def workflow_url(ui: str, workflow_id: str, run_id: str, tab: str = "") -> str:
    wid = urllib.parse.quote(workflow_id, safe="")
    return f"{ui}/namespaces/default/workflows/{wid}/{run_id}" + (f"/{tab}" if tab else "")


@dataclass
class Seen:
    """What the pages showed, for the test to check and the docs to picture."""

    batch_id: str = ""
    trajectories: int = 0
    listed_by_forecast: set[str] = field(default_factory=set)  # ids on the filtered list
    running: dict[str, str] = field(default_factory=dict)  # workflow id, summary, details
    finished: dict[str, str] = field(default_factory=dict)
    attributes_text: str = ""
    plan_details: str = ""
    shots: list[Path] = field(default_factory=list)


async def _run_id(client: HeddleClient, workflow_id: str) -> str:
    desc = await client.temporal.get_workflow_handle(workflow_id).describe()
    return desc.run_id or ""


METADATA_READY = "//iframe[@id='user-metadata-current-details' and contains(@src, 'content=')]"


async def _metadata(
    client: HeddleClient, browser: Browser, ui: str, workflow_id: str, shot: Path | None
) -> dict[str, str]:
    url = workflow_url(ui, workflow_id, await _run_id(client, workflow_id), "user-metadata")
    dom = browser.open(url, METADATA_READY, shot)
    return {
        "workflow_id": workflow_id,
        "url": url,
        "summary": frame_content(dom, "user-metadata-summary"),
        "details": frame_content(dom, "user-metadata-current-details"),
    }


async def _running_page(
    client: HeddleClient,
    browser: Browser,
    ui: str,
    query: str,
    shot: Path | None,
) -> dict[str, str]:
    """The page of the running trajectory predicted to run longest. Visibility lags and a
    page takes seconds to load on a loaded machine, so the one picked may have finished by
    the time its page shows; then the next longest is tried, while any are left."""
    page: dict[str, str] = {}
    for _ in range(5):
        running = [wf async for wf in client.temporal.list_workflows(query)]
        if not running:
            break
        longest = max(
            running, key=lambda wf: (wf.search_attributes.get("HeddlePredictedRemaining") or [0])[0]
        )
        page = await _metadata(client, browser, ui, longest.id, shot)
        if page["details"].startswith("turn "):
            break
    return page


async def capture(state_dir: Path, shots: Path | None, time_scale: float = 0.2) -> Seen:
    """An embedded stack with the UI; a batch to give the heddle policy its history, then
    a heddle batch looked at while it runs and after it ends."""
    stack = EmbeddedStack(
        state_dir=state_dir,
        port=free_port(),
        ui_port=free_port(),
        cluster=ClusterConfig(num_gpus=4, tp_choices=(1, 2)),
        time_scale=time_scale,
        persist=False,
    )
    seen = Seen()
    await stack.start()
    try:
        ui = stack.ui_url
        assert ui is not None
        client = await HeddleClient.connect(stack.address, store_url=stack.store_url)
        async with client:
            first = await client.start_rollout(
                records=generate("coding", prompts=2, samples=8, seed=11, iteration=0)
            )
            await asyncio.wait_for(first.report(), 300)
            records = generate("coding", prompts=3, samples=8, seed=11, iteration=1)
            handle = await client.start_rollout(
                records=records, options=RolloutOptions(policy="heddle")
            )
            seen.batch_id, seen.trajectories = handle.batch_id, len(records)
            batch = f'HeddleBatch="{handle.batch_id}"'
            longest = f'{batch} AND HeddleStatus="running" AND HeddlePredictedRemaining > 0'
            # While it runs: the trajectories predicted to run longest, and one's page.
            for _ in range(120):
                if (await client.temporal.count_workflows(longest)).count >= 3:
                    break
                await asyncio.sleep(0.25)

            def shot(name: str) -> Path | None:
                if shots is None:
                    return None
                seen.shots.append(shots / f"{name}.png")
                return seen.shots[-1]

            listed = f"//a[contains(@href, '{handle.batch_id}')]"
            with Browser() as browser:
                dom = browser.open(list_url(ui, longest), listed, shot("list-longest-running"))
                seen.listed_by_forecast = set(re.findall(rf"{handle.batch_id}/[\w-]+", dom))
                seen.running = await _running_page(
                    client, browser, ui, longest, shot("trajectory-running")
                )
                report = await asyncio.wait_for(handle.report(), 600)
                assert report.completed == len(records), report
                browser.open(list_url(ui, batch), listed, shot("list-batch"))
                done = f"{handle.batch_id}/{records[0].spec.trajectory_id}"
                seen.finished = await _metadata(
                    client, browser, ui, done, shot("trajectory-finished")
                )
                attrs = workflow_url(ui, done, await _run_id(client, done), "search-attributes")
                named = "//*[contains(text(), 'HeddlePredictedRemaining')]"
                dom = browser.open(attrs, named, shot("trajectory-search-attributes"))
                seen.attributes_text = visible_text(dom)
                plan = await _metadata(
                    client, browser, ui, "heddle-cluster-control", shot("control-plan")
                )
                seen.plan_details = plan["details"]
    finally:
        stack.stop()
    return seen


def main() -> None:
    out = REPO / "docs" / "images" / "ui"
    with tempfile.TemporaryDirectory(prefix="heddle-ui-") as state:
        seen = asyncio.run(capture(Path(state), out))
    print(f"batch {seen.batch_id}: {len(seen.listed_by_forecast)} listed as running longest")
    print(f"running: {seen.running.get('details')}")
    print(f"finished: {seen.finished.get('details')}")
    print(f"plan: {seen.plan_details}")
    for shot in seen.shots:
        print(f"wrote {shot.relative_to(REPO)}")


if __name__ == "__main__":
    main()
