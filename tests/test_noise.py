"""benchmarks/noise.py's comparison of two commits' paper grids: a cell counts as slower
only when its mean over predictor seeds moved by more than the seeds' own spread."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def noise(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "benchmarks"))
    import noise  # the benchmark script, which imports its sibling paper_setting

    return noise


def test_compare_names_only_the_cell_slower_beyond_its_seeds(noise, capsys) -> None:
    before = {
        "m/coding/0": {"0": 100.0, "1": 101.0, "2": 99.0},  # moved 5%, seeds within 1%
        "m/search/0": {"0": 100.0, "1": 120.0, "2": 80.0},  # moved 5%, seeds 40% apart
        "m/math/0": {"0": 50.0, "1": 50.0, "2": 50.0},  # unchanged
    }
    now = {
        "m/coding/0": {"0": 105.0, "1": 106.0, "2": 104.0},
        "m/search/0": {"0": 105.0, "1": 125.0, "2": 85.0},
        "m/math/0": {"0": 50.0, "1": 50.0, "2": 50.0},
    }
    noise.compare(now, before)
    summary = next(line for line in capsys.readouterr().out.splitlines() if "cells:" in line)
    assert "slower by over 0.5% on 2 (m/coding/0, m/search/0)" in summary
    assert "beyond 2 standard errors 1 (m/coding/0)" in summary
    assert "max 1.050" in summary


def test_compare_sums_each_workload_over_its_trace_seeds(noise, capsys) -> None:
    """A trace seed is one draw of its workload: one seed slower, one faster and one
    unchanged can make the workload faster as a whole, and the sums say so."""
    before = {
        "m/coding/0": {"0": 100.0, "1": 100.0},
        "m/coding/1": {"0": 200.0, "1": 200.0},
        "m/coding/2": {"0": 100.0, "1": 100.0},
        "m/math/0": {"0": 50.0, "1": 50.0},
    }
    now = {
        "m/coding/0": {"0": 102.0, "1": 102.0},  # 2% slower
        "m/coding/1": {"0": 190.0, "1": 190.0},  # 5% faster
        "m/coding/2": {"0": 100.0, "1": 100.0},
        "m/math/0": {"0": 51.0, "1": 51.0},
    }
    noise.compare(now, before)
    out = capsys.readouterr().out
    assert "| m/coding | 400.0 | 392.0 | 0.980 |" in out
    assert "| m/math | 50.0 | 51.0 | 1.020 |" in out
