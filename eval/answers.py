"""Answer-model calls of one evaluation run, batched and cached.

Answers never feed back into the replay (the canonical response continues it), so the replay only queues
each question with a callback that scores the prediction; `flush()` then generates every queued answer in
length-sorted batches (little padding) and fills in the records. A disk cache keyed by the model, the
generation length and the exact prompt makes reruns, and rows whose contexts coincide (an ablation that
does not change a question's context), free.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path
from typing import Callable

from tqdm import tqdm

ANSWER_SYSTEM = ("Answer the question from the memory context. Computed values and UpdateEvidence come first; "
                 "for 'previous' questions give the old value, otherwise the current one. Reply with the answer only.")


def messages(context: str, question: str) -> list[dict]:
    return [{"role": "system", "content": ANSWER_SYSTEM},
            {"role": "user", "content": f"{context}\n\nQuestion: {question}\nAnswer:"}]


class AnswerCache:
    """prompt hash -> answer, in SQLite (safe to share between runs; a crashed run loses nothing stored)."""

    def __init__(self, path: str | Path):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(str(path))
        self.db.execute("CREATE TABLE IF NOT EXISTS answers (key TEXT PRIMARY KEY, answer TEXT NOT NULL)")

    def get(self, key: str) -> str | None:
        row = self.db.execute("SELECT answer FROM answers WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def put_many(self, items: list[tuple[str, str]]) -> None:
        with self.db:
            self.db.executemany("INSERT OR REPLACE INTO answers VALUES (?, ?)", items)

    def close(self) -> None:
        self.db.close()


class Answers:
    def __init__(self, llm, max_new_tokens: int, cache: str | Path | None = None, progress: bool = True):
        self.llm, self.max_new_tokens, self.progress = llm, max_new_tokens, progress
        self.cache = AnswerCache(cache) if cache else None
        self.queue: list[tuple[list[dict], Callable[[str], None]]] = []
        self.stats = {"answers": 0, "cached": 0, "generated": 0}

    def ask(self, context: str, question: str, done: Callable[[str], None]) -> None:
        self.queue.append((messages(context, question), done))

    def _key(self, msgs: list[dict]) -> str:
        blob = json.dumps([getattr(self.llm, "cache_id", getattr(self.llm, "name", type(self.llm).__name__)), self.max_new_tokens, msgs],
                          sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()

    def flush(self) -> dict:
        """Generate (or look up) every queued answer, then run the callbacks in queue order."""
        keys = [self._key(m) for m, _ in self.queue]
        preds: dict[str, str] = {}
        if self.cache:
            for k in set(keys):
                hit = self.cache.get(k)
                if hit is not None:
                    preds[k] = hit
        todo = sorted({k: m for k, (m, _) in zip(keys, self.queue) if k not in preds}.items(),
                      key=lambda kv: len(kv[1][1]["content"]))
        bs = max(1, int(getattr(self.llm, "batch_size", 8) or 8))
        bar = tqdm(total=len(todo), desc="answers", unit="q", disable=not self.progress or not todo)
        for i in range(0, len(todo), bs):
            chunk = todo[i : i + bs]
            outs = self.llm.chat([m for _, m in chunk], max_new_tokens=self.max_new_tokens)
            got = [(k, o) for (k, _), o in zip(chunk, outs)]
            preds.update(got)
            if self.cache:
                self.cache.put_many(got)
            bar.update(len(chunk))
        bar.close()
        for k, (_, done) in zip(keys, self.queue):
            done(preds[k])
        self.stats = {"answers": len(keys), "cached": len(keys) - len(todo), "generated": len(todo)}
        self.queue = []
        return self.stats

    def close(self) -> None:
        if self.cache:
            self.cache.close()
