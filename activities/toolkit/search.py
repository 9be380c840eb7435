"""Full-text search over a small local corpus (SQLite FTS5), the stand-in for web search."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from importlib import resources

from activities.toolkit.base import Observation

MAX_RESULTS = 3


def _load_corpus() -> list[tuple[str, str]]:
    text = resources.files("heddle").joinpath("data/corpus.jsonl").read_text(encoding="utf-8")
    return [(d["title"], d["text"]) for d in map(json.loads, text.splitlines()) if d]


class LocalSearch:
    """An FTS5 index, built in memory from the bundled corpus unless a database is given."""

    def __init__(self, db_path: str | None = None) -> None:
        self._db_path = db_path
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    def _connect(self) -> sqlite3.Connection:
        if self._conn is None:
            if self._db_path:
                self._conn = sqlite3.connect(self._db_path, check_same_thread=False)
            else:
                conn = sqlite3.connect(":memory:", check_same_thread=False)
                conn.execute("CREATE VIRTUAL TABLE docs USING fts5(title, text)")
                conn.executemany("INSERT INTO docs VALUES (?, ?)", _load_corpus())
                self._conn = conn
        return self._conn

    def _query(self, query: str) -> list[tuple[str, str]]:
        # Quote every term: model text must not be parsed as FTS5 syntax.
        terms = [t.replace('"', '""') for t in query.split() if t.strip()]
        if not terms:
            return []
        match = " OR ".join(f'"{t}"' for t in terms)
        with self._lock:
            return (
                self._connect()
                .execute(
                    "SELECT title, snippet(docs, 1, '', '', '…', 24) FROM docs WHERE docs MATCH ? "
                    "ORDER BY rank LIMIT ?",
                    (match, MAX_RESULTS),
                )
                .fetchall()
            )

    async def search(self, query: str) -> Observation:
        if not query.strip():
            return Observation("error", "empty search query")
        rows = await asyncio.to_thread(self._query, query)
        if not rows:
            return Observation("ok", "no results")
        return Observation("ok", "\n".join(f"[{i + 1}] {t}: {s}" for i, (t, s) in enumerate(rows)))
