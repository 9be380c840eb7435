"""The tables of a benchmark that runs each case plain and in variants (an engine lever
on or off): per case and policy the plain makespan and plain over each variant, each
(policy, variant)'s spread, and heddle over the best peer (the policies not named
heddle*) in each. `benchmarks/speculation.py` and `benchmarks/disaggregation.py` print
them."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from robustness import Draw  # this folder's sibling


def spread(values: list[float]) -> str:
    return f"{min(values):.3f} / {statistics.median(values):.3f} / {max(values):.3f}"


def case_label(key: str) -> str:
    """A robustness draw by its model and cluster; a paper cell as it is named."""
    if not key.startswith("draw"):
        return key
    d = Draw.of(int(key[4:]))
    return f"{d.index} {d.model} {d.cluster}"


def print_tables(
    keys: Sequence[str],
    policies: Sequence[str],
    variants: Sequence[Hashable],
    done: dict[tuple[str, Any], dict[str, Any]],
    *,
    plain: str,
    name: Callable[[Any], str],
    note: Callable[[dict[str, Any], str], str],
    note_head: str,
    kind: str,
) -> None:
    """`done[(key, variant)]` (variant None: plain) holds `makespan_s` by policy; `note`
    says what a variant's run did for a policy beside its ratio (`note_head` names it)."""
    head = " | ".join(f"{plain} / {name(v)} ({note_head})" for v in variants)
    print(f"| case | policy | {plain} (s) | {head} |")
    print("|---|---|---:|" + "---:|" * len(variants))
    gains: dict[tuple[str, Any], list[float]] = {}
    leads: dict[tuple[str, Any], list[float]] = {}
    lead_rows: list[str] = []
    for key in keys:
        base = done[(key, None)]
        label = case_label(key)
        for p in policies:
            cols = []
            for v in variants:
                run = done[(key, v)]
                ratio = base["makespan_s"][p] / run["makespan_s"][p]
                gains.setdefault((p, v), []).append(ratio)
                cols.append(f"{ratio:.3f} ({note(run, p)})")
            print(f"| {label} | {p} | {base['makespan_s'][p]:.1f} | " + " | ".join(cols) + " |")
        heddles = [p for p in policies if p.startswith("heddle")]
        peers = [p for p in policies if not p.startswith("heddle")]
        for h in heddles if peers else ():
            row = []
            for v, run in ((None, base), *((v, done[(key, v)]) for v in variants)):
                lead = min(run["makespan_s"][p] for p in peers) / run["makespan_s"][h]
                leads.setdefault((h, v), []).append(lead)
                row.append(f"{lead:.3f}")
            lead_rows.append(f"| {label} | {h} | " + " | ".join(row) + " |")
    print()
    print(f"| policy | {kind} | {plain} / {kind}: min / median / max |")
    print("|---|---|---|")
    for (p, v), values in gains.items():
        print(f"| {p} | {name(v)} | {spread(values)} |")
    if leads:
        print()
        print(f"| case | heddle / best peer: | {plain} | " + " | ".join(map(name, variants)) + " |")
        print("|---|---|---:|" + "---:|" * len(variants))
        print("\n".join(lead_rows))
        print()
        print(f"| policy | {kind} | heddle / best peer: min / median / max |")
        print("|---|---|---|")
        for (h, v), values in leads.items():
            print(f"| {h} | {plain if v is None else name(v)} | {spread(values)} |")
