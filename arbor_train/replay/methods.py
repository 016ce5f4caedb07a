"""Memory methods compared in one harness, under one answer model and one read budget.

Every method ingests turns online (`observe`) and, at a question, returns a context (`read`) built only
from what was committed before the question. Baselines may prefilter up to twice the budget before
packing, as in the method paper. `forget(turns)` deletes turns on request (the forgetting evaluation):
the runtime and the fact store through `ArborMemory.forget`, the flat baselines by dropping the turns.

- ArborMemoryMethod   the reference runtime (heuristic, prompted or tuned components; ablations)
- FullContextMethod   the most recent turns that fit the budget
- PreviousMessageMethod  full context that routes each turn to the one before it (IRC's baseline)
- BM25Method          BM25 top-k turns (SQLite FTS5), packed by score
- DenseMethod         embedding top-k turns (the runtime's embedder), packed by score
- FactStoreMethod     extracted atomic facts (the runtime's extractors) retrieved by BM25, no forest
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field

import numpy as np

from arbor_train.runtime import ArborMemory, Localization, TokenCounter
from arbor_train.runtime.extract import TurnInput
from arbor_train.runtime.store import fts_query


@dataclass
class ReadResult:
    """What every method's `read` returns: the context, and for a method that localizes (route not
    None) the state it selected."""

    text: str
    tokens: int
    turn_ids: list[int] = field(default_factory=list)      # turn indices whose raw text is in the context
    selected_turn: int | None = None                        # the state a localizing method chose
    route: str | None = None                                # None: the method does not localize
    primary: str | None = None                              # the block holding the selected trajectory
                                                            # ("" when it is empty); None: no such block
    runner_up: tuple[int, ...] = ()                         # states of other trajectories the read also
                                                            # reads (read_margin), as turn indices
    localized: tuple[int, ...] = ()                         # the question's candidate states, best first
                                                            # (turn indices; a localizing method only)


@dataclass(frozen=True)
class Observation:
    """What every method's `observe` returns: where the turn was attached (the parent's turn index, None
    for a new root), and how (route; None for a method that does not route turns)."""

    parent_turn: int | None = None
    route: str | None = None
    secondary: tuple[int, ...] = ()           # turns a multi-intent commit also links to
    confidence: float | None = None          # the chosen trajectory's confidence, when the method ranks them
    runner_up: tuple[int, float] | None = None  # the best trajectory a link could join: its state's turn, its best score


UNROUTED = Observation()


class Method:
    name = "method"

    def observe(self, turn: int, user: str, assistant: str, ts: str | None, is_question: bool,
                speaker: str | None = None) -> Observation:
        """Commit one turn; `speaker` names who said it in group chats (the runtime stores it)."""
        raise NotImplementedError

    def read(self, question: str, now: str | None, budget: int) -> ReadResult:
        raise NotImplementedError

    def prefetch(self, turns: list[tuple[str, str, str | None]]) -> None:
        """Told the (user, assistant, timestamp) turns that `observe` will receive next, in order: a method
        may do per-turn work that reads nothing but the turn itself (extraction) ahead, in batches."""

    def forget(self, turns: list[int]) -> None:
        """Delete what these turns (indices as given to `observe`) put into the memory."""
        raise NotImplementedError

    def close(self) -> None:
        pass


class _ArborBacked(Method):
    """Methods kept in an ArborMemory: turn index <-> node id, and forgetting through the runtime."""

    def __init__(self, runtime_cfg: dict, components: dict, session_id: str):
        self.mem = ArborMemory.open(":memory:", session_id, runtime_cfg, components=components)
        self.turn_of: dict[int, int] = {}
        self._extracted: dict[tuple, list] = {}

    PREFETCH_CHUNK = 64  # turns per extraction call (each kind's model batches within it)

    def prefetch(self, turns: list[tuple[str, str, str | None]]) -> None:
        """Run the model extractors over the coming turns in batches. Extraction reads the interaction
        alone, so this is exactly what each commit would extract; heuristic-only memories skip it."""
        ex = self.mem.extractors
        if not ex.uses_models or not turns:
            return
        from tqdm import tqdm

        inputs = [TurnInput(u, a, ts) for u, a, ts in turns]
        for i in tqdm(range(0, len(inputs), self.PREFETCH_CHUNK), desc="extracting", unit="chunk", leave=False,
                      disable=None):
            chunk = inputs[i : i + self.PREFETCH_CHUNK]
            for t, e in zip(chunk, ex.extract(chunk)):
                self._extracted.setdefault((t.user_text, t.assistant_text, t.timestamp), []).append(e)

    def _take(self, user: str, assistant: str, ts: str | None):
        """The prefetched extraction of this turn, if any (None: commit extracts it)."""
        got = self._extracted.get((user, assistant, ts))
        return got.pop(0) if got else None

    def forget(self, turns: list[int]) -> None:
        want = set(turns)
        nodes = [n for n, t in self.turn_of.items() if t in want]
        if nodes:
            self.mem.forget(nodes=nodes)
        for n in nodes:
            del self.turn_of[n]

    def close(self) -> None:
        self.mem.store.close()


def _pack(counter: TokenCounter, header: str, items: list[tuple[int, str]], budget: int) -> ReadResult:
    """Greedy packing of (turn, text) items in the given order; output in chronological order."""
    used = counter.count(header)
    kept: list[tuple[int, str]] = []
    for turn, text in items:
        n = counter.count(text) + 1
        if used + n > budget:
            continue
        kept.append((turn, text))
        used += n
    kept.sort()
    return ReadResult(header + "\n" + "\n".join(t for _, t in kept), used, [t for t, _ in kept])


class ArborMemoryMethod(_ArborBacked):
    def __init__(self, runtime_cfg: dict, components: dict, session_id: str):
        super().__init__(runtime_cfg, components, session_id)
        self.name = "arbormem"
        self._pending: Localization | None = None

    def observe(self, turn, user, assistant, ts, is_question, speaker=None) -> Observation:
        loc = (self._pending if (is_question and self._pending is not None)
               else self.mem.localize(user, speaker=speaker, timestamp=ts))
        self._pending = None
        node = self.mem.commit(user, assistant, loc, ts, extraction=self._take(user, assistant, ts), speaker=speaker)
        self.turn_of[node.id] = turn
        other = loc.link_candidate
        runner = (self.turn_of[other.node_id], other.score) if other and other.node_id in self.turn_of else None
        conf = loc.confidence if loc.alternatives else None
        return Observation(self.turn_of.get(loc.parent_id) if loc.parent_id is not None else None, loc.route,
                           tuple(self.turn_of[i] for i in loc.secondary if i in self.turn_of), conf, runner)

    def read(self, question, now, budget) -> ReadResult:
        loc, ctx = self.mem.read(question, now=now, budget=budget)
        self._pending = loc  # the question turn is committed where the question was localized
        turns = sorted({self.turn_of[i] for i in ctx.node_ids if i in self.turn_of})
        sel = self.turn_of.get(loc.parent_id) if loc.parent_id is not None else None
        path = ctx.block("PrimaryPath")
        ranked = sorted(loc.candidates, key=lambda c: -c.score)
        return ReadResult(ctx.text, ctx.tokens, turns, sel, loc.route,
                          primary=path.render() if path is not None and path.lines else "",
                          runner_up=tuple(self.turn_of[i] for i in loc.runner_up if i in self.turn_of),
                          localized=tuple(self.turn_of[c.node_id] for c in ranked if c.node_id in self.turn_of))


def _pack_ranked(m: "_TurnStore", positions: list[int], now: str | None, budget: int) -> ReadResult:
    """Pack a flat baseline's ranked turns: taken in rank order up to `prefilter` x the budget, then
    packed by score (_pack)."""
    items, used = [], 0
    for i in positions:
        text = m.text(i)
        used += m.counter.count(text)
        items.append((m.turns[i][0], text))
        if used > m.prefilter * budget:
            break
    return _pack(m.counter, f"Current time: {now}", items, budget)


class _TurnStore(Method):
    """Shared state of the flat baselines: the committed turns, in order."""

    def __init__(self, counter: TokenCounter, resolve_dates: bool = False):
        self.counter = counter
        self.turns: list[tuple[int, str, str | None]] = []
        self.forgotten: set[int] = set()  # positions in self.turns deleted on request
        self.resolve_dates = resolve_dates  # write relative dates out, as the runtime's turn layers can

    def text(self, i: int) -> str:
        turn, raw, ts = self.turns[i]
        if self.resolve_dates:
            from arbor_train.runtime.text import resolve_dates

            raw = resolve_dates(raw, ts)
        return f"[{ts}] {raw}" if ts else raw

    def observe(self, turn, user, assistant, ts, is_question, speaker=None) -> Observation:
        self.turns.append((turn, f"User: {user}\nAssistant: {assistant}", ts))
        return UNROUTED

    def forget(self, turns: list[int]) -> None:
        want = set(turns)
        for i, (turn, _, ts) in enumerate(self.turns):
            if turn in want and i not in self.forgotten:
                self.turns[i] = (turn, "", ts)  # the text goes; positions stay (they are index row ids)
                self.forgotten.add(i)
                self._drop(i)

    def _drop(self, i: int) -> None:
        """Remove position i from the method's own index (none for the plain list)."""


class FullContextMethod(_TurnStore):
    name = "full_context"

    def read(self, question, now, budget) -> ReadResult:
        items = [(self.turns[i][0], self.text(i)) for i in range(len(self.turns) - 1, -1, -1)
                 if i not in self.forgotten]
        used, kept = self.counter.count(f"Current time: {now}"), []
        for turn, text in items:  # most recent first, stop at the first turn that does not fit
            n = self.counter.count(text) + 1
            if used + n > budget:
                break
            kept.append((turn, text))
            used += n
        kept.sort()
        return ReadResult(f"Current time: {now}\n" + "\n".join(t for _, t in kept), used, [t for t, _ in kept])


class PreviousMessageMethod(FullContextMethod):
    """Routes every turn to the turn before it (the "previous message" baseline of reply-structure
    benchmarks); reads like full context."""

    name = "previous_message"

    def observe(self, turn, user, assistant, ts, is_question, speaker=None) -> Observation:
        prev = self.turns[-1][0] if self.turns else None
        super().observe(turn, user, assistant, ts, is_question)
        return Observation(prev, "previous" if prev is not None else "first")


class BM25Method(_TurnStore):
    name = "bm25"

    def __init__(self, counter: TokenCounter, prefilter: float = 2.0, resolve_dates: bool = False):
        super().__init__(counter, resolve_dates)
        self.db = sqlite3.connect(":memory:")
        self.db.execute("CREATE VIRTUAL TABLE t USING fts5(lex, tokenize='porter unicode61')")
        self.prefilter = prefilter

    def observe(self, turn, user, assistant, ts, is_question, speaker=None) -> Observation:
        out = super().observe(turn, user, assistant, ts, is_question)
        self._index(len(self.turns) - 1, user, assistant)
        return out

    def _index(self, i: int, user: str, assistant: str) -> None:
        self.db.execute("INSERT INTO t(rowid, lex) VALUES(?, ?)", (i, f"{user} {assistant}"))

    def ranked(self, question: str, k: int = 200) -> list[int]:
        """Positions of the stored turns, best BM25 first (at most k)."""
        q = fts_query(question)
        return [] if not q else [i for (i,) in self.db.execute(
            "SELECT rowid FROM t WHERE t MATCH ? ORDER BY bm25(t) LIMIT ?", (q, k)).fetchall()]

    def read(self, question, now, budget) -> ReadResult:
        return _pack_ranked(self, self.ranked(question), now, budget)

    def _drop(self, i: int) -> None:
        self.db.execute("DELETE FROM t WHERE rowid=?", (i,))

    def close(self) -> None:
        self.db.close()


class DenseMethod(_TurnStore):
    name = "dense"

    def __init__(self, counter: TokenCounter, embedder, prefilter: float = 2.0, resolve_dates: bool = False):
        super().__init__(counter, resolve_dates)
        self.embedder, self.prefilter = embedder, prefilter
        self.vecs: list[np.ndarray] = []

    def observe(self, turn, user, assistant, ts, is_question, speaker=None) -> Observation:
        out = super().observe(turn, user, assistant, ts, is_question)
        self._index(len(self.turns) - 1, user, assistant)
        return out

    def _index(self, i: int, user: str, assistant: str) -> None:
        assert i == len(self.vecs)  # positions are the turns' order
        self.vecs.append(self.embedder.encode([f"{user}\n{assistant}"])[0])

    def _drop(self, i: int) -> None:
        self.vecs[i] = np.zeros_like(self.vecs[i])

    def ranked(self, question: str, k: int | None = None) -> list[int]:
        """Positions of the stored turns, most similar first (at most k), forgotten ones left out."""
        if not self.vecs:
            return []
        sims = np.stack(self.vecs) @ self.embedder.encode([question])[0]
        out = [int(i) for i in np.argsort(-sims) if int(i) not in self.forgotten]
        return out if k is None else out[:k]

    def read(self, question, now, budget) -> ReadResult:
        return _pack_ranked(self, self.ranked(question), now, budget)


class HybridMethod(_TurnStore):
    """BM25 and dense retrieval of turns, fused by reciprocal rank (1 / (rrf_k + rank), summed)."""

    name = "hybrid"

    def __init__(self, counter: TokenCounter, embedder, prefilter: float = 2.0, rrf_k: float = 60.0, k: int = 200,
                 resolve_dates: bool = False):
        super().__init__(counter, resolve_dates)
        self.bm25, self.dense = BM25Method(counter, prefilter), DenseMethod(counter, embedder, prefilter)
        for m in (self.bm25, self.dense):  # one list of turns and one forgotten set; each keeps only its index
            m.turns, m.forgotten = self.turns, self.forgotten
        self.prefilter, self.rrf_k, self.k = prefilter, rrf_k, k

    def observe(self, turn, user, assistant, ts, is_question, speaker=None) -> Observation:
        out = super().observe(turn, user, assistant, ts, is_question)
        for m in (self.bm25, self.dense):
            m._index(len(self.turns) - 1, user, assistant)
        return out

    def _drop(self, i: int) -> None:
        for m in (self.bm25, self.dense):
            m._drop(i)

    def read(self, question, now, budget) -> ReadResult:
        fused: dict[int, float] = {}
        for ranks in (self.bm25.ranked(question, self.k), self.dense.ranked(question, self.k)):
            for rank, i in enumerate(ranks):
                fused[i] = fused.get(i, 0.0) + 1.0 / (self.rrf_k + rank + 1)
        return _pack_ranked(self, sorted(fused, key=lambda i: -fused[i]), now, budget)

    def close(self) -> None:
        self.bm25.close()


class FactStoreMethod(_ArborBacked):
    """Extraction + retrieval of atomic facts only: the runtime's extractors write facts, BM25 reads them."""

    name = "fact_store"

    def __init__(self, runtime_cfg: dict, components: dict, session_id: str, counter: TokenCounter):
        super().__init__(runtime_cfg, components, session_id)
        self.counter = counter

    def observe(self, turn, user, assistant, ts, is_question, speaker=None) -> Observation:
        node = self.mem.commit(user, assistant, Localization(None, "flat", 1.0), ts,  # no forest
                               extraction=self._take(user, assistant, ts), speaker=speaker)
        self.turn_of[node.id] = turn
        return UNROUTED

    def read(self, question, now, budget) -> ReadResult:
        hits = self.mem.store.search_facts(self.mem.conv, question, 64)
        items = [(self.turn_of.get(f.sources[-1], -1), f"[{f.timestamps[-1]}] {f.text}") for f, _ in hits]
        return _pack(self.counter, f"Current time: {now}", items, budget)


def _dates(cfg: dict) -> bool:
    return bool(cfg["context"].get("resolve_dates", False))


# method name -> builder(runtime_cfg, components, session_id, counter, prefilter); the one list of methods
BUILDERS = {
    "arbormem": lambda cfg, comps, sid, counter, prefilter: ArborMemoryMethod(cfg, comps, sid),
    "full_context": lambda cfg, comps, sid, counter, prefilter: FullContextMethod(counter),
    # the flat baselines render turns as they were written, or with relative dates written out when
    # runtime.context.resolve_dates is set (a baseline row beside a runtime that writes them out)
    "bm25": lambda cfg, comps, sid, counter, prefilter: BM25Method(counter, prefilter, _dates(cfg)),
    "dense": lambda cfg, comps, sid, counter, prefilter: DenseMethod(counter, comps["embedder"], prefilter,
                                                                     _dates(cfg)),
    "hybrid": lambda cfg, comps, sid, counter, prefilter: HybridMethod(counter, comps["embedder"], prefilter,
                                                                       float(cfg["recall"]["rrf_k"]),
                                                                       resolve_dates=_dates(cfg)),
    "fact_store": lambda cfg, comps, sid, counter, prefilter: FactStoreMethod(cfg, comps, sid, counter),
    "previous_message": lambda cfg, comps, sid, counter, prefilter: PreviousMessageMethod(counter),
}
METHODS = tuple(BUILDERS)
MEMORY_METHODS = tuple(m for m in METHODS if m != "previous_message")  # `eval.compare methods`: memories


def build_method(name: str, runtime_cfg: dict, components: dict, session_id: str, counter: TokenCounter,
                 prefilter: float) -> Method:
    from arbor_train.errors import parse_choice

    return BUILDERS[parse_choice(name, "method", METHODS)](runtime_cfg, components, session_id, counter, prefilter)
