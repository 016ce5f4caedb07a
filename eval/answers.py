"""Answer-model calls of one evaluation run, batched and cached.

Answers never feed back into the replay (the canonical response continues it), so the replay only queues
each question with a callback that scores the prediction; `flush()` then generates every queued answer in
length-sorted batches (little padding) and fills in the records. A disk cache keyed by the model, the
generation length and the exact prompt makes reruns, and rows whose contexts coincide (an ablation that
does not change a question's context), free.

Each cached answer also records where its context came from (a unit, e.g. "arbormem/<session>", and
the turns the context cited), so a forget request removes the answers built from the forgotten turns
(`Answers.forget`): no answer derived from forgotten text outlives the request in the cache.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from tqdm import tqdm

from arbor_train.prompts import answer_messages as messages  # the reader's versioned prompt layout
from arbor_train.runtime.kvcache import SqliteKV, cache_key

Sources = tuple[str, list[int]]  # (unit, turns cited by the context)


class AnswerCache(SqliteKV):
    """prompt hash -> answer, in SQLite (safe to share between runs; a crashed run loses nothing stored), with
    the turns each answer's context cited, so a forget request deletes the answers built from them."""

    def __init__(self, path: str | Path):
        super().__init__(path, table="answers", value="answer", secure_delete=True)  # forgotten bytes zeroed
        self.db.execute("CREATE TABLE IF NOT EXISTS answer_sources (unit TEXT NOT NULL, turn INTEGER NOT NULL, "
                        "key TEXT NOT NULL, PRIMARY KEY(unit, turn, key)) WITHOUT ROWID")

    def put_many(self, items: list[tuple[str, str]], sources: dict[str, list[Sources]] | None = None) -> None:
        with self.db:
            self._put(items)
            rows = [(unit, int(turn), k) for k, _ in items for unit, turns in (sources or {}).get(k, [])
                    for turn in turns]
            self.db.executemany("INSERT OR IGNORE INTO answer_sources VALUES (?, ?, ?)", rows)

    def forget(self, unit: str, turns: list[int]) -> int:
        """Delete every answer whose context cited one of these turns of this unit; returns how many."""
        q = ",".join("?" * len(turns))
        with self.db:
            keys = [k for (k,) in self.db.execute(
                f"SELECT DISTINCT key FROM answer_sources WHERE unit = ? AND turn IN ({q})", (unit, *turns))]
            self.db.executemany("DELETE FROM answers WHERE key = ?", [(k,) for k in keys])
            self.db.executemany("DELETE FROM answer_sources WHERE key = ?", [(k,) for k in keys])
        return len(keys)


class Answers:
    def __init__(self, llm, max_new_tokens: int, cache: str | Path | None = None, progress: bool = True):
        self.llm, self.max_new_tokens, self.progress = llm, max_new_tokens, progress
        self.cache = AnswerCache(cache) if cache else None
        self.queue: list[tuple[list[dict], Callable[[str], None]]] = []
        self.sources: list[Sources | None] = []  # per queued item
        self.uncacheable: set[int] = set()        # queued items whose context cites forgotten turns
        self.stats = {"answers": 0, "cached": 0, "generated": 0}

    def ask(self, context: str, question: str, done: Callable[[str], None], sources: Sources | None = None) -> None:
        self.queue.append((messages(context, question), done))
        self.sources.append(sources)

    def forget(self, unit: str, turns: list[int]) -> int:
        """A forget request: cached answers built from these turns go, and queued ones are not stored."""
        want = set(turns)
        for i, src in enumerate(self.sources):
            if src is not None and src[0] == unit and want & set(src[1]):
                self.uncacheable.add(i)
        return self.cache.forget(unit, list(want)) if self.cache else 0

    def _key(self, msgs: list[dict]) -> str:
        return cache_key(getattr(self.llm, "cache_id", getattr(self.llm, "name", type(self.llm).__name__)),
                         self.max_new_tokens, msgs)

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
        no_store = {keys[i] for i in self.uncacheable}
        sources: dict[str, list[Sources]] = {}
        for k, src in zip(keys, self.sources):
            if src is not None:
                sources.setdefault(k, []).append(src)
        bs = max(1, int(getattr(self.llm, "batch_size", 8) or 8))
        bar = tqdm(total=len(todo), desc="answers", unit="q", disable=not self.progress or not todo)
        for i in range(0, len(todo), bs):
            chunk = todo[i : i + bs]
            outs = self.llm.chat([m for _, m in chunk], max_new_tokens=self.max_new_tokens)
            got = [(k, o) for (k, _), o in zip(chunk, outs)]
            preds.update(got)
            if self.cache:
                self.cache.put_many([(k, o) for k, o in got if k not in no_store], sources)
            bar.update(len(chunk))
        bar.close()
        for k, (_, done) in zip(keys, self.queue):
            done(preds[k])
        self.stats = {"answers": len(keys), "cached": len(keys) - len(todo), "generated": len(todo)}
        self.queue, self.sources, self.uncacheable = [], [], set()
        return self.stats

    def close(self) -> None:
        if self.cache:
            self.cache.close()
