"""Bad input, fuzzed: traces, task sets, cluster and batch files mutated from valid ones
through their parsers (always an error naming the file, never another exception), and
CLI mistakes (always one `error:` line and exit status 2, before any work starts)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from heddle.cli import main
from heddle.config import load_batch_spec, load_cluster
from heddle.errors import InputError
from heddle.tasks import load_tasks
from heddle.trace import dump_record, load_trace
from heddle.workloads import generate

REPO = Path(__file__).resolve().parents[1]
FUZZ = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)


@st.composite
def mutated(draw: st.DrawFn, value: Any) -> Any:
    """`value` with one place changed: a key dropped or a value replaced, anywhere in it."""
    if isinstance(value, dict) and value and draw(st.booleans()):
        key = draw(st.sampled_from(sorted(value)))
        out = dict(value)
        if draw(st.booleans()):
            del out[key]
        else:
            out[key] = draw(mutated(value[key]))
        return out
    if isinstance(value, list) and value and draw(st.booleans()):
        i = draw(st.integers(0, len(value) - 1))
        return [*value[:i], draw(mutated(value[i])), *value[i + 1 :]]
    return draw(json_values)


def _lines(objs: list[Any]) -> str:
    return "".join(json.dumps(o, allow_nan=True) + "\n" for o in objs)


def _parses_or_names_the_file(load: Any, path: Path) -> None:
    error: InputError | None = None
    try:
        load(path)
    except InputError as exc:
        error = exc
    if error is not None:
        assert str(error).startswith(str(path)), error
        assert error.message


TRACE = [dump_record(r) for r in generate("math", prompts=1, samples=2, seed=3)]
TASKS = [json.loads(line) for line in (REPO / "heddle/data/tasks/math.jsonl").open()][:2]
CLUSTER = yaml.safe_load((REPO / "examples/cluster-demo.yaml").read_text())


@FUZZ
@given(data=st.data())
def test_trace_lines_fuzzed(tmp_path: Path, data: st.DataObject) -> None:
    i = data.draw(st.integers(0, len(TRACE) - 1))
    objs = [*TRACE[:i], data.draw(mutated(TRACE[i])), *TRACE[i + 1 :]]
    path = tmp_path / "trace.jsonl"
    path.write_text(_lines(objs))
    _parses_or_names_the_file(load_trace, path)


@FUZZ
@given(data=st.data())
def test_task_lines_fuzzed(tmp_path: Path, data: st.DataObject) -> None:
    objs = [data.draw(mutated(TASKS[0])), TASKS[1]]
    path = tmp_path / "tasks.jsonl"
    path.write_text(_lines(objs))
    _parses_or_names_the_file(load_tasks, path)


@FUZZ
@given(text=st.text(max_size=200))
def test_raw_bytes_in_jsonl_files(tmp_path: Path, text: str) -> None:
    path = tmp_path / "raw.jsonl"
    path.write_text(text)
    _parses_or_names_the_file(load_trace, path)
    _parses_or_names_the_file(load_tasks, path)


@FUZZ
@given(data=st.data())
def test_cluster_and_batch_files_fuzzed(tmp_path: Path, data: st.DataObject) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(data.draw(mutated(CLUSTER)), allow_unicode=True))
    _parses_or_names_the_file(load_cluster, path)
    spec = tmp_path / "batch.yaml"
    spec.write_text(data.draw(st.text(max_size=120)))
    _parses_or_names_the_file(load_batch_spec, spec)


def _cli_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    out, err = capsys.readouterr()
    assert exited.value.code == 2, (argv, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, (argv, err)
    assert lines[0].startswith("error: "), (argv, err)
    assert "Traceback" not in out + err
    return lines[0]


COMMANDS = [
    ["rollout"],
    ["bench"],
    ["trace", "gen"],
    ["trace", "stats"],
    ["trace", "import"],
    ["tasks", "validate"],
    ["campaign", "start"],
    ["cluster", "plan"],
    ["export"],
]


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    command=st.sampled_from(COMMANDS),
    junk=st.text(st.characters(codec="ascii", categories=["L", "N"]), min_size=1, max_size=8),
)
def test_cli_usage_mistakes_are_one_error_line(
    capsys: pytest.CaptureFixture[str], command: list[str], junk: str
) -> None:
    _cli_error(capsys, [*command, f"--no-such-{junk}"])


def test_cli_bad_files_and_values_are_one_error_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"trajectory_id": 1}\n')
    cluster = str(REPO / "examples/cluster-demo.yaml")
    cases = [
        (["rollout", "--samples", "many"], "--samples"),
        (["trace", "validate", str(bad)], f"{bad}:1"),
        (["tasks", "validate", str(bad)], f"{bad}:1"),
        (["bench", "--trace", str(bad), "--cluster", cluster, "--policy", "verl"], f"{bad}:1"),
        (["trace", "gen", "--workload", "nope", "--out", str(tmp_path / "t.jsonl")], "nope"),
        (["trace", "gen", "--family", "nope", "--out", str(tmp_path / "t.jsonl")], "nope"),
        (["trace", "gen", "--out", str(tmp_path / "t.jsonl")], "--workload and --family"),
        (["trace", "import", str(bad), "--format", "csv", "--out", str(tmp_path / "t.jsonl")],
         f"{bad}:1"),
        (["trace", "import", str(bad), "--format", "llmservingsim",
          "--out", str(tmp_path / "t.jsonl")], f"{bad}:1"),
        (["trace", "import", str(bad), "--format", "parquet"], "parquet"),
        (["campaign", "start", "c", "--max-staleness", "-1", "--state-dir", str(tmp_path)],
         "max_staleness"),
        (["campaign", "start", "c", "--on-stale", "keep", "--state-dir", str(tmp_path)],
         "on_stale"),
    ]  # fmt: skip
    for argv, names in cases:
        assert names in _cli_error(capsys, argv)
    assert not (tmp_path / "t.jsonl").exists()
