"""The Temporal UI in a real browser (headless Chromium through its driver) after and
during a heddle batch: the pages an operator reads show Heddle's attributes, summaries,
current details and the cluster plan (scripts/ui_pages.py, which also makes the docs'
screenshots)."""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path

import pytest

from scripts import ui_pages


@pytest.mark.timeout(600)
def test_the_ui_shows_trajectories_by_forecast_their_details_and_the_plan(
    tmp_path: Path,
) -> None:
    if ui_pages.chromedriver() is None:
        if os.environ.get("HEDDLE_REQUIRE_CHROMIUM"):
            pytest.fail("Chromium is required (HEDDLE_REQUIRE_CHROMIUM) but not installed")
        pytest.skip("headless Chromium and its driver are not installed")
    seen = asyncio.run(ui_pages.capture(tmp_path / "state", tmp_path / "shots"))

    # The list filtered by batch, status and forecast shows running trajectories of it.
    assert seen.listed_by_forecast
    assert all(w.startswith(f"{seen.batch_id}/") for w in seen.listed_by_forecast)
    # A running trajectory's page: its summary, and where it is now with what is left.
    assert re.search(r"\d+ steps, \d+ tokens to generate \(coding\)", seen.running["summary"])
    running = re.fullmatch(
        r"turn (\d+) on (\S+), (\d+) tokens, predicted remaining (\d+)", seen.running["details"]
    )
    assert running, seen.running
    assert int(running.group(1)) >= 1
    assert int(running.group(4)) > 0
    # A finished one: how it ended, where, and its reward; its attributes say none is left.
    assert re.fullmatch(
        r"completed \(answer\) after \d+ turns, \d+ tokens on \S+, reward 1",
        seen.finished["details"],
    ), seen.finished
    for attr in ('"HeddlePredictedRemaining" : 0', '"HeddleStatus" : "completed"'):
        assert attr in seen.attributes_text
    assert '"HeddleInstance"' in seen.attributes_text
    # The control workflow's page: the plan, instance by instance.
    head, *rows = seen.plan_details.splitlines()
    assert re.match(r"plan v\d+ on 4 GPUs", head), seen.plan_details
    assert rows
    assert all(re.fullmatch(r"- \S+: TP \d, GPUs \d-\d, active", r) for r in rows), rows
    assert len(seen.shots) == 6
    assert all(p.stat().st_size > 10_000 for p in seen.shots)
