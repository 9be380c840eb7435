"""The determinism boundary is an import boundary (STYLE.md 1), and the policy core is pure."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_workflows_import_nothing_heavy() -> None:
    code = (
        "import sys, json, workflows.trajectory, workflows.batch;"
        "print(json.dumps(sorted(m.split('.')[0] for m in sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    loaded = set(json.loads(out.stdout))
    forbidden = {
        "torch",
        "ray",
        "vllm",
        "lightgbm",
        "sqlalchemy",
        "alembic",
        "activities",
        "engines",
    }
    assert not loaded & forbidden


FORBIDDEN_CALLS = {("time", "time"), ("time", "monotonic"), ("uuid", "uuid4"), ("os", "environ")}


def _impure_uses(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and (node.value.id, node.attr) in FORBIDDEN_CALLS
        ):
            found.append(f"{path.name}:{node.lineno} {node.value.id}.{node.attr}")
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
            if any(n.split(".")[0] in {"temporalio", "torch", "random"} for n in names):
                found.append(f"{path.name}:{node.lineno} imports {names}")
    return found


def test_policy_core_takes_time_as_an_argument() -> None:
    pure = [p for p in (ROOT / "scheduler").glob("*.py") if p.name != "service.py"]
    pure += [ROOT / "engines" / "core.py", ROOT / "engines" / "costmodel.py"]
    problems = [u for p in pure for u in _impure_uses(p)]
    assert not problems
