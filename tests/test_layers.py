"""Imports run one way (DESIGN.md, "Layout"): the shared vocabulary, then `engines/`,
`scheduler/`, `workflows/` and `activities/`, the runtime, the face. A module imports
its own layer and those below, never one above; lazy imports inside functions count."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("heddle", "engines", "scheduler", "workflows", "activities")

# Bottom to top; a module belongs to the first layer with a prefix it starts with.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "face",
        (
            "heddle.client",
            "heddle.cli",
            "heddle.report",
            "heddle.bench",
            "heddle.sim",
            "heddle.tracestats",
            "heddle.teach",
        ),
    ),
    ("runtime", ("heddle.runtime",)),
    ("workflows and activities", ("workflows", "activities")),
    ("scheduler", ("scheduler",)),
    ("engines", ("engines",)),
    ("vocabulary", ("heddle",)),
]
ORDER = [name for name, _ in reversed(LAYERS)]


def layer_of(module: str) -> str:
    for name, prefixes in LAYERS:
        if any(module == p or module.startswith(f"{p}.") for p in prefixes):
            return name
    raise ValueError(f"{module} is in no layer")


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every absolute import of the project's packages in a file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found += [(node.lineno, n) for n in names if n.split(".")[0] in PACKAGES]
    return found


def back_imports(root: Path) -> list[str]:
    """Every import of a higher layer, as `file:line: module (layer) imports ...`."""
    found = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            here = layer_of(module_name(path, root))
            for line, target in imports_of(path):
                there = layer_of(target)
                if ORDER.index(there) > ORDER.index(here):
                    rel = path.relative_to(root)
                    found.append(f"{rel}:{line}: {here} imports {target} ({there})")
    return found


def test_imports_run_one_way() -> None:
    assert back_imports(ROOT) == []


def test_a_planted_back_import_is_found(tmp_path: Path) -> None:
    """The check can fail: the policy core importing the simulator is caught."""
    for package in PACKAGES:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "scheduler" / "policy.py").write_text(
        "from engines.costmodel import CostModel\n\n\ndef plan():\n"
        "    from heddle.sim import simulate\n"
    )
    assert back_imports(tmp_path) == ["scheduler/policy.py:5: scheduler imports heddle.sim (face)"]


def test_every_module_is_in_a_layer() -> None:
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            layer_of(module_name(path, ROOT))
