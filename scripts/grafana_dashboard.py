# ruff: noqa: E501 (PromQL queries read best on one line each)
"""Writes docker/grafana/heddle.json, the Grafana dashboard of Heddle's metrics
(`heddle.metrics`), the Temporal SDK's and the server's: `python scripts/grafana_dashboard.py`.
`tests/test_dashboard.py` runs every panel's query on a real Prometheus scraping a batch."""

import json
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "docker" / "grafana" / "heddle.json"

panels_spec = [
    # (title, unit, [(expr, legend)], kind)
    (
        "Steps per second, by instance",
        "ops",
        [("sum by (engine) (rate(heddle_llm_steps_total[1m]))", "{{engine}}")],
        "timeseries",
    ),
    (
        "Tokens per second, by instance",
        "short",
        [("sum by (engine) (rate(heddle_generated_tokens_total[1m]))", "{{engine}}")],
        "timeseries",
    ),
    (
        "Queued steps, by instance",
        "short",
        [("sum by (engine) (heddle_engine_queued_steps)", "{{engine}}")],
        "timeseries",
    ),
    (
        "Running steps, by instance",
        "short",
        [("sum by (engine) (heddle_engine_running_steps)", "{{engine}}")],
        "timeseries",
    ),
    (
        "KV cache in use, by instance",
        "percentunit",
        [("max by (engine) (heddle_engine_kv_usage_ratio)", "{{engine}}")],
        "timeseries",
    ),
    (
        "Tensor-parallel degree, by instance",
        "short",
        [("max by (engine) (heddle_engine_tp)", "{{engine}}")],
        "timeseries",
    ),
    (
        "Longest predicted remaining (tokens)",
        "short",
        [
            (
                "max by (rank, trajectory, engine) (heddle_predicted_remaining_tokens)",
                "#{{rank}} {{trajectory}} on {{engine}}",
            )
        ],
        "table",
    ),
    (
        "Running trajectories with a forecast",
        "short",
        [("sum(heddle_forecast_trajectories)", "forecast")],
        "stat",
    ),
    (
        "Migrations per minute",
        "short",
        [("sum by (when) (increase(heddle_migrations_total[1m]))", "{{when}}")],
        "timeseries",
    ),
    (
        "KV move time p50 / p95",
        "s",
        [
            (
                "histogram_quantile(0.5, sum by (le) (rate(heddle_kv_move_seconds_bucket[5m])))",
                "p50",
            ),
            (
                "histogram_quantile(0.95, sum by (le) (rate(heddle_kv_move_seconds_bucket[5m])))",
                "p95",
            ),
        ],
        "timeseries",
    ),
    (
        "Reshapes",
        "short",
        [("sum by (kind, outcome) (heddle_reshapes_total)", "{{kind}} {{outcome}}")],
        "stat",
    ),
    (
        "Reshape time (mean), by kind",
        "s",
        [
            (
                "sum by (kind) (heddle_reshape_seconds_sum) / sum by (kind) (heddle_reshape_seconds_count)",
                "{{kind}}",
            )
        ],
        "timeseries",
    ),
    (
        "Trajectories ended per minute",
        "short",
        [
            (
                "sum by (status, finish_reason) (increase(heddle_trajectories_total[1m]))",
                "{{status}} ({{finish_reason}})",
            )
        ],
        "timeseries",
    ),
    (
        "Tool latency p95, by tool",
        "s",
        [
            (
                "histogram_quantile(0.95, sum by (le, tool) (rate(heddle_tool_seconds_bucket[5m])))",
                "{{tool}}",
            )
        ],
        "timeseries",
    ),
    (
        "Tool errors per minute, by tool",
        "short",
        [("sum by (tool, status) (increase(heddle_tool_errors_total[1m]))", "{{tool}} {{status}}")],
        "timeseries",
    ),
    (
        "Decide latency p50 / p99",
        "s",
        [
            (
                "histogram_quantile(0.5, sum by (le) (rate(heddle_decide_seconds_bucket[5m])))",
                "p50",
            ),
            (
                "histogram_quantile(0.99, sum by (le) (rate(heddle_decide_seconds_bucket[5m])))",
                "p99",
            ),
        ],
        "timeseries",
    ),
    (
        "LLM step time p50 / p95",
        "s",
        [
            (
                "histogram_quantile(0.5, sum by (le) (rate(heddle_llm_step_seconds_bucket[5m])))",
                "p50",
            ),
            (
                "histogram_quantile(0.95, sum by (le) (rate(heddle_llm_step_seconds_bucket[5m])))",
                "p95",
            ),
        ],
        "timeseries",
    ),
    (
        "Temporal SDK: workflow task schedule-to-start p95",
        "ms",
        [
            (
                "histogram_quantile(0.95, sum by (le) (rate(temporal_workflow_task_schedule_to_start_latency_bucket[5m])))",
                "p95",
            )
        ],
        "timeseries",
    ),
    (
        "Temporal SDK: activity execution p95, by activity",
        "ms",
        [
            (
                "histogram_quantile(0.95, sum by (le, activity_type) (rate(temporal_activity_execution_latency_bucket[5m])))",
                "{{activity_type}}",
            )
        ],
        "timeseries",
    ),
    (
        "Temporal server: requests per second, by operation",
        "reqps",
        [("sum by (operation) (rate(service_requests[1m]))", "{{operation}}")],
        "timeseries",
    ),
    (
        "Temporal SDK: sticky cache size",
        "short",
        [("sum(temporal_sticky_cache_size)", "cached workflows")],
        "timeseries",
    ),
]

panels = []
for n, (title, unit, targets, kind) in enumerate(panels_spec):
    w = 12 if kind != "stat" else 6
    panels.append(
        {
            "id": n + 1,
            "type": kind,
            "title": title,
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "gridPos": {"h": 8, "w": w, "x": (n % 2) * 12, "y": (n // 2) * 8},
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "options": {},
            "targets": [
                {
                    "refId": chr(65 + i),
                    "expr": expr,
                    "legendFormat": legend,
                    **({"instant": True, "format": "table"} if kind == "table" else {}),
                }
                for i, (expr, legend) in enumerate(targets)
            ],
        }
    )

dash = {
    "title": "Heddle rollout",
    "uid": "heddle-rollout",
    "schemaVersion": 39,
    "version": 1,
    "editable": True,
    "refresh": "5s",
    "time": {"from": "now-30m", "to": "now"},
    "tags": ["heddle", "temporal"],
    "templating": {
        "list": [
            {
                "name": "datasource",
                "type": "datasource",
                "query": "prometheus",
                "label": "Prometheus",
                "current": {},
            }
        ]
    },
    "panels": panels,
}
with OUT.open("w") as f:
    json.dump(dash, f, indent=2)
    f.write("\n")
