"""A small key -> text cache in SQLite, shared by the extraction cache (runtime/extract.py) and the answer
cache (eval/answers.py): keys are hashes of what the output depends on; writes are transactions, so a crashed
run loses nothing already stored, and a file is safe to share between runs."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path


def cache_key(*parts) -> str:
    """sha256 over the JSON of the parts (the model identity, generation length, prompt messages, ...)."""
    blob = json.dumps(list(parts), ensure_ascii=False, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


class SqliteKV:
    """`table(key TEXT PRIMARY KEY, <value> TEXT)`; `secure_delete` zeroes the bytes of deleted rows."""

    def __init__(self, path: str | Path, table: str, value: str, secure_delete: bool = False):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.table, self.value = table, value
        self.db = sqlite3.connect(str(path))
        if secure_delete:
            self.db.execute("PRAGMA secure_delete=ON")
        self.db.execute(f"CREATE TABLE IF NOT EXISTS {table} (key TEXT PRIMARY KEY, {value} TEXT NOT NULL)")

    def get(self, key: str) -> str | None:
        row = self.db.execute(f"SELECT {self.value} FROM {self.table} WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def get_many(self, keys: list[str]) -> dict[str, str]:
        out: dict[str, str] = {}
        for i in range(0, len(keys), 500):  # SQLite's bound-parameter limit
            part = keys[i : i + 500]
            q = ",".join("?" * len(part))
            out.update(self.db.execute(f"SELECT key, {self.value} FROM {self.table} WHERE key IN ({q})", part).fetchall())
        return out

    def values(self) -> list[str]:
        """Every stored value, in key order."""
        return [v for (v,) in self.db.execute(f"SELECT {self.value} FROM {self.table} ORDER BY key").fetchall()]

    def put_many(self, items: list[tuple[str, str]]) -> None:
        with self.db:
            self._put(items)

    def _put(self, items: list[tuple[str, str]]) -> None:
        self.db.executemany(f"INSERT OR REPLACE INTO {self.table} VALUES (?, ?)", items)

    def close(self) -> None:
        self.db.close()
