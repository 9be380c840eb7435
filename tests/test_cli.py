"""The `heddle` command as a user runs it: bad input refused before anything starts, the
embedded stack runs a rollout, `heddle dev` stops every child and restarts on its state."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from temporalio.client import Client

from heddle.runtime.stack import free_port, port_in_use
from heddle.store import TrajectoryStore
from heddle.workloads import generate
from tests.factories import traj, write_records, write_trace
from tests.live import in_process_worker

HEDDLE = [sys.executable, "-m", "heddle.cli"]


def heddle(
    *args: str, timeout: float = 240, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*HEDDLE, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=os.environ | {"COLUMNS": "200"},
    )


def test_bad_worker_options_are_one_error_line(tmp_path: Path) -> None:
    for args, message in [
        (["--tool", "nonsense"], "expected NAME=module:function"),
        (["--tool", "x=no.such.module:f"], "No module named 'no'"),
        (["--metrics", "localhost"], "--metrics 'localhost': expected HOST:PORT"),
        (["--metrics", "10.255.255.1:9464"], "cannot serve metrics at 10.255.255.1:9464"),
    ]:
        result = heddle("worker", "--state-dir", str(tmp_path), *args, timeout=60)
        assert result.returncode == 2, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, lines
        assert lines[0].startswith("error:")
        assert message in lines[0]


def test_malformed_trace_is_refused_before_anything_starts(tmp_path: Path) -> None:
    good = traj("a", [{"output_tokens": 3}])
    bad = traj("b", [{"output_tokens": 3, "tool": "python"}, {"output_tokens": 1}])
    path = write_trace(tmp_path / "bad.jsonl", [good, bad])
    state = tmp_path / "state"
    result = heddle("rollout", "--trace", str(path), "--state-dir", str(state), "--headless")
    assert result.returncode == 2
    assert f"{path}:2: field 'steps[0].tool_latency_s'" in result.stderr.replace("\n", "")
    assert not state.exists()  # no server, no store: nothing half-started


def test_a_learning_policy_on_an_empty_store_is_one_error_line(
    tmp_path: Path, temporal_address: str
) -> None:
    """heddle learns from an earlier batch: with none in the store the command says so
    in one `error:` line, exit status 2, and stores nothing."""
    trace = write_records(tmp_path / "t.jsonl", generate("math", prompts=1, samples=2))
    store = f"sqlite:///{tmp_path / 'store.db'}"
    result = heddle(
        "rollout", "--trace", str(trace), "--policy", "heddle", "--address", temporal_address,
        "--store", store, "--state-dir", str(tmp_path / "s"),
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines[0].startswith("error: policy 'heddle' learns from an earlier batch")
    assert "".join(lines).count("error:") == 1
    assert TrajectoryStore.open(store).list_batches() == []


def test_bad_cluster_and_policy_are_refused(tmp_path: Path) -> None:
    trace = write_records(tmp_path / "t.jsonl", generate("math", prompts=1, samples=2))
    cluster = tmp_path / "c.yaml"
    cluster.write_text("model: qwen3-8b\nnum_gpus: 0\n")
    result = heddle(
        "rollout",
        "--trace",
        str(trace),
        "--cluster",
        str(cluster),
        "--state-dir",
        str(tmp_path / "s"),
    )
    assert result.returncode == 2
    assert f"{cluster}:2: field 'num_gpus'" in result.stderr.replace("\n", "")
    result = heddle(
        "rollout", "--trace", str(trace), "--policy", "magic", "--state-dir", str(tmp_path / "s")
    )
    assert result.returncode == 2
    assert "valid policies" in result.stderr
    assert not (tmp_path / "s").exists()


def test_a_vllm_engine_without_a_model_is_refused_before_anything_starts(tmp_path: Path) -> None:
    trace = write_records(tmp_path / "t.jsonl", generate("math", prompts=1, samples=2))
    state = tmp_path / "s"
    result = heddle(
        "rollout", "--trace", str(trace), "--engine", "vllm", "--model", str(tmp_path / "none"),
        "--state-dir", str(state),
    )  # fmt: skip
    assert result.returncode == 2
    assert "has no config.json" in result.stderr.replace("\n", "")
    cluster = tmp_path / "c.yaml"
    cluster.write_text("num_gpus: 2\nengine:\n  kind: vllm\n")
    result = heddle(
        "rollout", "--trace", str(trace), "--cluster", str(cluster), "--state-dir", str(state)
    )
    assert result.returncode == 2
    assert f"{cluster}:3: field 'engine.model_path'" in result.stderr.replace("\n", "")
    assert not state.exists()


def test_trace_gen_and_validate(tmp_path: Path) -> None:
    out = tmp_path / "g.jsonl"
    assert (
        heddle(
            "trace", "gen", "--workload", "search", "--prompts", "2", "--out", str(out)
        ).returncode
        == 0
    )
    assert len(out.read_text().splitlines()) == 32
    ok = heddle("trace", "validate", str(out))
    assert ok.returncode == 0
    assert "32 trajectories, valid" in ok.stdout
    assert heddle("trace", "gen", "--workload", "poetry", "--out", str(out)).returncode == 2
    family = tmp_path / "f.jsonl"
    made = heddle("trace", "gen", "--family", "random", "--seed", "4", "--prompts", "3",
                  "--iteration", "1", "--out", str(family))  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert "48 trajectories" in heddle("trace", "validate", str(family)).stdout
    assert '"workload":"random-4"' in family.read_text()


def test_trace_import_then_bench(tmp_path: Path) -> None:
    csv = tmp_path / "turns.csv"
    csv.write_text(
        "trajectory_id,turn,prompt_tokens,output_tokens,tool,tool_latency_s,tool_output_tokens\n"
        "a,0,100,50,search,1.5,200\na,1,,400,,,\nb,0,80,40,,,\n"
    )
    out = tmp_path / "t.jsonl"
    made = heddle("trace", "import", str(csv), "--format", "csv", "--out", str(out))
    assert made.returncode == 0, made.stderr
    assert "2 trajectories, 490 tokens" in made.stdout
    cluster = str(Path(__file__).parent.parent / "examples/cluster-demo.yaml")
    ran = heddle("bench", "--trace", str(out), "--cluster", cluster, "--policy", "verl")
    assert ran.returncode == 0, ran.stderr


def test_rollout_on_the_embedded_stack(tmp_path: Path) -> None:
    trace = write_records(tmp_path / "t.jsonl", generate("math", prompts=2, samples=8, seed=5))
    tokens = sum(r.spec.generated_tokens for r in generate("math", prompts=2, samples=8, seed=5))
    report_path = tmp_path / "report.json"
    result = heddle(
        "rollout",
        "--trace",
        str(trace),
        "--state-dir",
        str(tmp_path / "state"),
        "--headless",
        "--port",
        str(free_port()),
        "--time-scale",
        "0.05",
        "--json",
        str(report_path),
    )
    assert result.returncode == 0, result.stderr + result.stdout
    report = json.loads(report_path.read_text())
    for key in (
        "batch_id",
        "trajectories",
        "completed",
        "failed",
        "generated_tokens",
        "makespan_s",
        "throughput_tok_s",
    ):
        assert key in report
    assert report["trajectories"] == report["completed"] == 16
    assert report["generated_tokens"] == tokens
    assert "generated tokens" in result.stdout
    assert f"{tokens:,}" in result.stdout
    listing = heddle(
        "trajectories", "list", report["batch_id"], "--state-dir", str(tmp_path / "state")
    )
    assert listing.returncode == 0
    assert listing.stdout.count("completed") == 16


@pytest.mark.parametrize("source", ["trace", "spec"])
def test_rollout_against_a_running_server(
    temporal_address: str, store_url: str, queue_prefix: str, tmp_path: Path, source: str
) -> None:
    if source == "trace":
        path = write_records(tmp_path / "t.jsonl", generate("search", prompts=1, samples=4))
    else:
        path = tmp_path / "spec.yaml"
        path.write_text("workload: search\nprompts: 1\nsamples: 4\n")

    async def run() -> subprocess.CompletedProcess[str]:
        async with in_process_worker(temporal_address, store_url, queue_prefix, time_scale=0.02):
            return await asyncio.to_thread(
                heddle,
                "rollout",
                f"--{source}",
                str(path),
                "--address",
                temporal_address,
                "--store",
                store_url,
                "--queue-prefix",
                queue_prefix,
                "--quiet",
            )

    result = asyncio.run(run())
    assert result.returncode == 0, result.stderr
    assert "4 (4 completed, 0 failed)" in result.stdout


def _wait_port(port: int, up: bool, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while port_in_use(port) != up:
        assert time.monotonic() < deadline, f"port {port} never became {'up' if up else 'free'}"
        time.sleep(0.2)


@pytest.mark.timeout(300)
def test_dev_stops_every_child_on_ctrl_c_and_restarts_on_its_state(tmp_path: Path) -> None:
    state = tmp_path / "state"
    port, ui_port = free_port(), free_port()
    args = [
        *HEDDLE,
        "dev",
        "--state-dir",
        str(state),
        "--port",
        str(port),
        "--ui-port",
        str(ui_port),
        "--time-scale",
        "0.02",
    ]
    trace = write_records(tmp_path / "t.jsonl", generate("math", prompts=1, samples=4, seed=9))

    def start() -> subprocess.Popen[str]:
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        _wait_port(port, True)
        _wait_port(ui_port, True)
        return proc

    dev = start()
    try:
        first = heddle(
            "rollout",
            "--trace",
            str(trace),
            "--address",
            f"127.0.0.1:{port}",
            "--state-dir",
            str(state),
            "--json",
            str(tmp_path / "r.json"),
            "--quiet",
        )
        assert first.returncode == 0, first.stderr
        batch_id = json.loads((tmp_path / "r.json").read_text())["batch_id"]
    finally:
        dev.send_signal(signal.SIGINT)
        out, _ = dev.communicate(timeout=60)
    assert dev.returncode == 0, out
    assert "stack stopped" in out
    _wait_port(port, False, 10)
    _wait_port(ui_port, False, 10)
    leftovers = subprocess.run(["pgrep", "-f", str(state)], capture_output=True, text=True)
    assert leftovers.stdout.strip() == ""

    dev = start()
    try:

        async def count() -> int:
            client = await Client.connect(f"127.0.0.1:{port}")
            return (await client.count_workflows(f'HeddleBatch="{batch_id}"')).count

        assert asyncio.run(count()) == 4  # the server's state survived the restart
    finally:
        dev.send_signal(signal.SIGINT)
        dev.communicate(timeout=60)


def test_detached_stack_is_found_by_rollout_and_stopped(tmp_path: Path) -> None:
    state = tmp_path / "state"
    port = free_port()
    trace = write_records(tmp_path / "t.jsonl", generate("math", prompts=1, samples=4, seed=4))
    up = heddle(
        "dev",
        "--detach",
        "--headless",
        "--state-dir",
        str(state),
        "--port",
        str(port),
        "--time-scale",
        "0.02",
    )
    try:
        assert up.returncode == 0, up.stderr + up.stdout
        assert f"127.0.0.1:{port}" in up.stdout
        again = heddle("dev", "--detach", "--headless", "--state-dir", str(state))
        assert again.returncode == 0
        assert "already runs" in again.stdout
        # No --address: the rollout finds the stack running on its state directory.
        run = heddle("rollout", "--trace", str(trace), "--state-dir", str(state), "--quiet")
        assert run.returncode == 0, run.stderr
        assert "4 (4 completed, 0 failed)" in run.stdout
        assert "The stack has stopped" not in run.stdout
        # The cluster plan: shown, changed, and a change that does not fit refused.
        plan = heddle("cluster", "plan", "--state-dir", str(state))
        assert plan.returncode == 0, plan.stderr
        assert "cluster plan v0" in plan.stdout
        assert "i3" in plan.stdout
        bad = heddle("cluster", "reshape", "--retire", "i3", "--create", "w0:2:2",
                     "--state-dir", str(state))  # fmt: skip
        assert bad.returncode == 2
        assert "reshape refused" in bad.stderr
        assert "free [3]" in bad.stderr
        good = heddle("cluster", "reshape", "--retire", "i2", "--retire", "i3", "--create",
                      "w0:2:2", "--state-dir", str(state))  # fmt: skip
        assert good.returncode == 0, good.stderr
        assert "cluster plan v3" in good.stdout
        assert "w0" in good.stdout
        assert "2-3" in good.stdout
        run = heddle("rollout", "--trace", str(trace), "--state-dir", str(state), "--quiet")
        assert "4 (4 completed, 0 failed)" in run.stdout
    finally:
        down = heddle("stop", "--state-dir", str(state))
    assert down.returncode == 0
    assert "stack stopped" in down.stdout
    _wait_port(port, False, 10)
    assert heddle("stop", "--state-dir", str(state)).stdout.startswith("no stack")


def test_bench_compares_policies_and_writes_json_and_plots(tmp_path: Path) -> None:
    trace = write_records(tmp_path / "t.jsonl", generate("math", prompts=4, samples=8, seed=2))
    cluster = tmp_path / "c.yaml"
    cluster.write_text("model: qwen3-8b\ngpu: h100\nnum_gpus: 4\ndefault_tp: 1\n")
    out = tmp_path / "bench.json"
    result = heddle(
        "bench",
        "--trace",
        str(trace),
        "--cluster",
        str(cluster),
        "--policy",
        "verl",
        "--policy",
        "slime",
        "--json",
        str(out),
        "--plot",
        str(tmp_path / "plots"),
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(out.read_text())
    assert data["lower_bound_s"] > 0
    for name in ("verl", "slime"):
        p = data["policies"][name]
        for key in (
            "makespan_s",
            "throughput_tok_s",
            "generated_tokens",
            "trajectories",
            "migrations",
            "reconfigurations",
            "gpu_busy_frac",
        ):
            assert key in p
        assert set(p["completion_s"]) == {"p50", "p90", "p99", "max"}
        assert p["makespan_s"] >= data["lower_bound_s"]
    assert "1.00x" in result.stdout  # the first policy's ratio to itself
    terms = data["lower_bound"]
    assert set(terms) >= {
        "longest_alone_s", "work_s", "memory_reads_s", "streams_s", "streams_lp_s"
    }  # fmt: skip
    assert data["lower_bound_s"] == max(v for k, v in terms.items() if k != "lower_bound_s")
    printed = " ".join(result.stdout.split())
    assert f"iteration streams {terms['streams_s']:,.1f} s" in printed
    assert f"streams LP {terms['streams_lp_s']:,.1f} s" in printed
    pngs = sorted(x.name for x in (tmp_path / "plots").iterdir())
    assert pngs == ["completion_cdf.png", "gantt_slime.png", "gantt_verl.png", "throughput.png"]


def test_bench_rejects_bad_input_before_running(tmp_path: Path) -> None:
    trace = write_records(tmp_path / "t.jsonl", generate("math", prompts=1, samples=2))
    cluster = tmp_path / "c.yaml"
    cluster.write_text("model: qwen3-8b\ngpu: h100\nnum_gpus: 4\ndefault_tp: 3\n")
    bad = heddle("bench", "--trace", str(trace), "--cluster", str(cluster), "--policy", "verl")
    assert bad.returncode == 2
    assert f"{cluster}:4: field 'default_tp'" in bad.stderr.replace("\n", "")
    cluster.write_text("model: qwen3-8b\nnum_gpus: 4\n")
    bad = heddle("bench", "--trace", str(trace), "--cluster", str(cluster), "--policy", "nope")
    assert bad.returncode == 2
    assert "valid policies" in bad.stderr
    bad = heddle("bench", "--trace", str(trace), "--cluster", str(cluster), "--policy", "heddle")
    assert bad.returncode == 2
    assert "--history FILE" in bad.stderr.replace("\n", "")
    broken = write_trace(tmp_path / "b.jsonl", [traj("x", [{"output_tokens": 0}])])
    bad = heddle("bench", "--trace", str(broken), "--cluster", str(cluster), "--policy", "verl")
    assert bad.returncode == 2
    assert f"{broken}:1: field 'steps[0].output_tokens'" in bad.stderr.replace("\n", "")


def test_trace_stats(tmp_path: Path) -> None:
    trace = write_records(tmp_path / "t.jsonl", generate("coding", prompts=2, samples=8, seed=1))
    result = heddle("trace", "stats", str(trace))
    assert result.returncode == 0
    stats = json.loads(result.stdout)
    assert stats["trajectories"] == 16
    assert stats["groups"] == 2


def test_a_learning_policy_starts_from_a_history_file_and_a_batch_becomes_a_trace(
    temporal_address: str, store_url: str, queue_prefix: str, tmp_path: Path
) -> None:
    """`rollout --history FILE` on an empty store: heddle plans from the file (stored
    as a "history" batch just before); `trace from-batch` writes what the batch did; a
    bad history file is one `error:` line naming its line and field, and stores nothing."""
    from heddle.trace import load_trace

    earlier = write_records(tmp_path / "it0.jsonl", generate("math", prompts=1, samples=4))
    now = generate("math", prompts=1, samples=4, iteration=1)
    trace = write_records(tmp_path / "it1.jsonl", now)
    bad = tmp_path / "bad-export.jsonl"
    bad.write_text(
        json.dumps({"trajectory_id": "a", "group_id": "g", "loss_mask": [0, 1]}) + "\n"
        + json.dumps({"trajectory_id": "b", "group_id": "g", "loss_mask": [0, 2]}) + "\n"
    )  # fmt: skip
    common = ["--address", temporal_address, "--store", store_url, "--queue-prefix", queue_prefix]
    refused = heddle("rollout", "--trace", str(trace), "--history", str(bad), *common)
    assert refused.returncode == 2
    assert f"{bad}:2: field 'loss_mask'" in refused.stderr.replace("\n", "")
    assert TrajectoryStore.open(store_url).list_batches() == []

    async def run() -> subprocess.CompletedProcess[str]:
        async with in_process_worker(temporal_address, store_url, queue_prefix, time_scale=0.02):
            return await asyncio.to_thread(
                heddle, "rollout", "--trace", str(trace), "--policy", "heddle",
                "--history", str(earlier), "--quiet", *common,
            )  # fmt: skip

    result = asyncio.run(run())
    assert result.returncode == 0, result.stderr
    assert "4 (4 completed, 0 failed)" in result.stdout
    store = TrajectoryStore.open(store_url)
    rolled, history = store.list_batches()  # newest first
    assert history["status"] == "history"
    assert store.batch_before(rolled["batch_id"]) == history["batch_id"]
    out = tmp_path / "from-batch.jsonl"
    written = heddle("trace", "from-batch", rolled["batch_id"], "--out", str(out), "--store",
                     store_url)  # fmt: skip
    assert written.returncode == 0, written.stderr
    by_id = {r.spec.trajectory_id: r.spec for r in now}
    for record in load_trace(out):
        assert record.spec == by_id[record.spec.trajectory_id]
    missing = heddle("trace", "from-batch", "nope", "--store", store_url)
    assert missing.returncode == 2
    assert "error: no batch 'nope'" in missing.stderr
