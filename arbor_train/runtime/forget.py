"""Forgetting on request: select what goes, then one transaction removes it and everything derived from it.

    report = mem.forget(nodes=[12, 13])            # by node id
    report = mem.forget(branch=4)                  # a node and everything below it (a root: its branch)
    report = mem.forget(entity="Caroline")         # every node and derived item that mentions it
    report = mem.forget(question="Where did Caroline go?")   # the nodes a read cites that match the question
    report = mem.forget(entity="Caroline", dry_run=True)     # what would go (counts only)

What a selector takes (runtime.forget in conf/runtime/default.yaml):
- `question=`: of the nodes a read of the question cites, only those that match it: a node matches when
  its text (user and assistant text, entities, keywords) holds at least `question_min_share` of the
  question's content words (stop words dropped, stemmed; at least one word), or a name the question names
  (a capitalised span of the question, whole words, case-insensitive). A question that matches no node
  forgets nothing and raises NothingMatches (the CLI exits 2): a read always cites some state, and
  forgetting the state a question merely routed to would delete turns that never mentioned it.
- `entity=`: every node and item that mentions it; more than `entity_max_share` of the conversation's
  nodes needs `force=True` (a dry run shows the counts without it).
- any selector in a conversation the memory does not hold is an error naming the conversations it has.

The cascade (all in one SQLite transaction, so a killed process leaves the state before or after):
- derived items (facts, state records, artifacts, events) whose every source is forgotten are deleted;
  items with other sources stay, without the forgotten sources (a record's evidence quote goes too when
  its first source is forgotten); an entity forget also deletes every item that mentions the entity;
- revision chains are re-linked around a deleted record or artifact: when the value that superseded
  another is forgotten, the older value is current again;
- the forest stays a forest: a surviving child of a forgotten node attaches to its nearest surviving
  ancestor, or becomes a root; every moved node's depth, root, topic key and path summary is rebuilt
  (top-down), and the topic anchor of every branch that lost or gained nodes is rebuilt, so no summary
  or anchor quotes forgotten text;
- FTS rows, provenance, forked-root flags and stored embeddings go with their rows; the turns'
  identities go to `forgotten_turns`, so re-ingesting the transcript does not bring them back; the
  HNSW labels go to `index_tombstones` and, after the commit, their vectors are zeroed and marked
  deleted in the index file (index.py);
- after the commit the WAL is checkpointed and truncated, so the deleted text is in no file the memory
  owns (tests/test_forget.py scans their raw bytes).

Cost follows what is forgotten (provenance lookups by node, subtree walks from the moved children),
not the memory's size: eval/bench.py `target=forget` measures it at 1k and 10k nodes.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable

from ..errors import InputError
from .store import DERIVED_TABLES, FTS_SECURE_DELETE, FTS_TABLES, conv_token

# `mem` below is an ArborMemory (memory.py calls in here; importing it back would be a cycle)

CHUNK = 500  # ids per IN (...) query


class NothingMatches(InputError):
    """A forget whose selectors select nothing: nothing was changed."""


class _DryRun(Exception):
    """Raised inside the transaction of a dry run, so SQLite rolls the whole cascade back."""


@dataclass
class ForgetReport:
    """What a forget removed (or, for a dry run, would remove): counts only, never the text."""

    dry_run: bool
    selectors: dict[str, Any]
    node_ids: list[int]
    counts: Counter = field(default_factory=Counter)
    seconds: float = 0.0

    def to_json(self) -> dict:
        return {"dry_run": self.dry_run, "selectors": self.selectors, "node_ids": self.node_ids,
                "counts": dict(sorted(self.counts.items())), "seconds": round(self.seconds, 5)}

    def summary(self) -> str:
        c = self.counts
        head = "would forget" if self.dry_run else "forgot"
        parts = [f"{c['nodes']} nodes"]
        for table in DERIVED_TABLES:
            d, t = c[f"{table}_deleted"], c[f"{table}_trimmed"]
            if d or t:
                parts.append(f"{table}: {d} deleted" + (f", {t} kept with other sources" if t else ""))
        if c["revisions_relinked"]:
            parts.append(f"{c['revisions_relinked']} revision links re-joined")
        if c["nodes_moved"]:
            parts.append(f"{c['nodes_reattached']} children re-attached ({c['new_roots']} new roots), "
                         f"{c['nodes_moved']} nodes re-summarized")
        if not self.dry_run and c["index_vectors"]:
            parts.append(f"{c['index_vectors']} index vectors zeroed"
                         + (" (index rebuilt)" if c["index_compacted"] else ""))
        return f"{head} " + "; ".join(parts)


def _chunks(ids: Iterable[int]) -> Iterable[list[int]]:
    ids = list(ids)
    for i in range(0, len(ids), CHUNK):
        yield ids[i : i + CHUNK]


def _mentions(entity: str):
    words = entity.split()
    if not words:
        raise InputError("forget: option entity is empty")
    rx = re.compile(r"(?<!\w)" + r"\s+".join(map(re.escape, words)) + r"(?!\w)", re.I)
    return rx, '"' + " ".join(w.replace('"', '""') for w in words) + '"'


# ---------------------------------------------------------------------- selection
def select(mem: "ArborMemory", nodes: list[int] | None = None, branch: int | None = None,
           entity: str | None = None, question: str | None = None) -> tuple[set[int], dict[str, set[int]]]:
    """(node ids to forget, derived items to delete whatever their other sources, per table)."""
    st, conv = mem.store, mem.conv
    chosen: set[int] = set()
    forced: dict[str, set[int]] = {t: set() for t in DERIVED_TABLES}
    for nid in nodes or []:
        n = st.get_node(int(nid))
        if n is None or n.conversation_id != conv:
            raise InputError(f"forget: option nodes: node {nid} is not a node of conversation {conv!r}")
        chosen.add(n.id)
    if branch is not None:
        top = st.get_node(int(branch))
        if top is None or top.conversation_id != conv:
            raise InputError(f"forget: option branch: node {branch} is not a node of conversation {conv!r}")
        chosen |= st.subtree(top.id)
    if entity is not None:
        rx, phrase = _mentions(str(entity))
        tok = conv_token(conv)
        for (nid,) in st.db.execute("SELECT rowid FROM node_fts WHERE node_fts MATCH ?",
                                    (f"conv:{tok} AND lex:{phrase}",)).fetchall():
            n = st.get_node(int(nid))
            text = " ".join([n.user_text, n.assistant_text, *n.entities, *n.keywords])
            if rx.search(text):
                chosen.add(n.id)
        for table in DERIVED_TABLES:
            fts = FTS_TABLES_FOR[table]
            for (iid,) in st.db.execute(f"SELECT rowid FROM {fts} WHERE {fts} MATCH ?",
                                        (f"conv:{tok} AND lex:{phrase}",)).fetchall():
                row = st.db.execute(f"SELECT * FROM {table} WHERE id=?", (iid,)).fetchone()
                if row is not None and rx.search(json.dumps([v for v in row if isinstance(v, str)],
                                                            ensure_ascii=False)):
                    forced[table].add(int(iid))
    if question is not None:
        _, ctx = mem.read(str(question))
        matches = question_match(str(question), float(mem.cfg["forget"]["question_min_share"]))
        chosen |= {nid for nid in ctx.node_ids if matches(st.get_node(nid))}
    return chosen, forced


def question_match(question: str, min_share: float):
    """The rule `question=` forgets by (module docstring): a predicate over nodes."""
    from .text import entities, stems

    terms = stems(question)
    need = max(1, math.ceil(min_share * len(terms))) if terms else None
    names = [_mentions(e)[0] for e in entities(question) if any(ch.isalpha() for ch in e)]

    def matches(n) -> bool:
        body = " ".join([n.user_text, n.assistant_text, *n.entities, *n.keywords])
        if need is not None and len(terms & stems(body)) >= need:
            return True
        return any(rx.search(body) for rx in names)

    return matches


FTS_TABLES_FOR = {base: fts for fts, base in FTS_TABLES.items() if fts != "node_fts" and fts != "root_fts"}


# ---------------------------------------------------------------------- the cascade
def forget(mem: "ArborMemory", nodes: list[int] | None = None, branch: int | None = None,
           entity: str | None = None, question: str | None = None, dry_run: bool = False,
           force: bool = False) -> ForgetReport:
    t0 = time.perf_counter()
    selectors = {k: v for k, v in (("nodes", nodes), ("branch", branch), ("entity", entity),
                                   ("question", question)) if v is not None}
    if not selectors:
        raise InputError("forget: name what to forget: nodes=[ids], branch=ID, entity=NAME or question=TEXT")
    held = mem.store.conversations()
    if mem.conv not in held:
        raise InputError(f"forget: conversation {mem.conv!r} is not in this memory; it holds "
                         + (", ".join(map(repr, held)) if held else "no conversation") + " (option conversation_id)")
    if not dry_run:
        mem.lock_for_writing()
    st = mem.store
    report = ForgetReport(dry_run, selectors, [])
    try:
        with st.transaction():
            chosen, forced = select(mem, nodes, branch, entity, question)
            if not chosen and not any(forced.values()):
                what = " and ".join(f"{k}=" for k in selectors)
                raise NothingMatches(f"forget: nothing in conversation {mem.conv!r} matches {what} "
                                     "(the rule: arbor_train/runtime/forget.py); nothing was forgotten")
            share = float(mem.cfg["forget"]["entity_max_share"])
            if entity is not None and not force and not dry_run and len(chosen) > share * held[mem.conv]:
                raise InputError(f"forget: entity= would take {len(chosen)} of the {held[mem.conv]} nodes of "
                                 f"conversation {mem.conv!r}, more than runtime.forget.entity_max_share={share:g}; "
                                 "pass force=true to forget them (dry_run=true shows the counts); nothing was forgotten")
            report.node_ids = sorted(chosen)
            _cascade(mem, chosen, forced, report.counts)
            if dry_run:
                raise _DryRun
    except _DryRun:
        pass
    if not dry_run and (chosen or any(forced.values())):
        if chosen:
            done = mem.index.remove(sorted(chosen))
            report.counts["index_vectors"] = done["vectors"]
            report.counts["index_compacted"] = int(done["compacted"])
        busy = st.checkpoint()
        report.counts["wal_checkpoint_busy"] = int(busy)  # 1: a reader held an old snapshot; retried on close
        st.checkpoint_pending = bool(busy)
    report.seconds = time.perf_counter() - t0
    return report


def _cascade(mem: "ArborMemory", chosen: set[int], forced: dict[str, set[int]], counts: Counter) -> None:
    st, db, conv = mem.store, mem.store.db, mem.conv
    gone = sorted(chosen)
    rows: dict[int, tuple] = {}
    for chunk in _chunks(gone):
        for r in db.execute(f"SELECT id, parent_id, root_id, seq, turn_key FROM nodes WHERE id IN "
                            f"({','.join('?' * len(chunk))})", chunk):
            rows[int(r[0])] = r
    counts["nodes"] = len(rows)

    # 1. derived items
    for table in DERIVED_TABLES:
        items: set[int] = set(forced.get(table, ()))
        for chunk in _chunks(gone):
            items |= {int(r[0]) for r in db.execute(
                f"SELECT item_id FROM provenance WHERE kind=? AND node_id IN ({','.join('?' * len(chunk))})",
                (table, *chunk))}
        for iid in sorted(items):
            r = db.execute(f"SELECT sources, timestamps FROM {table} WHERE id=?", (iid,)).fetchone()
            if r is None:
                continue
            sources, stamps = json.loads(r[0]), json.loads(r[1])
            keep = [(s, t) for s, t in zip(sources, stamps) if s not in chosen]
            if not keep or iid in forced.get(table, ()):
                _delete_item(st, table, iid, sources, counts)
                counts[f"{table}_deleted"] += 1
            else:
                sets = {"sources": json.dumps([s for s, _ in keep]), "timestamps": json.dumps([t for _, t in keep])}
                if table == "records" and sources[0] in chosen:
                    sets["evidence"] = ""  # quoted from the forgotten turn
                db.execute(f"UPDATE {table} SET {', '.join(f'{k}=?' for k in sets)} WHERE id=?", (*sets.values(), iid))
                counts[f"{table}_trimmed"] += 1
    for chunk in _chunks(gone):
        db.execute(f"DELETE FROM provenance WHERE node_id IN ({','.join('?' * len(chunk))})", chunk)

    # 2. the forest: re-attach surviving children, then delete the nodes
    def surviving_ancestor(nid: int) -> int | None:
        p = rows[nid][1]
        while p is not None and p in chosen:
            p = rows[p][1]
        return p

    children: list[tuple[int, int | None]] = []
    for chunk in _chunks(gone):
        for cid, pid in db.execute(f"SELECT id, parent_id FROM nodes WHERE parent_id IN "
                                   f"({','.join('?' * len(chunk))}) ORDER BY seq", chunk):
            if int(cid) not in chosen:
                children.append((int(cid), surviving_ancestor(int(pid))))
    for cid, pid in children:  # detach first: the foreign key must not point at a deleted row
        db.execute("UPDATE nodes SET parent_id=? WHERE id=?", (pid, cid))
        # a secondary link to the new parent says nothing the forest does not (links to and from the
        # deleted nodes go with them: ON DELETE CASCADE)
        db.execute("DELETE FROM links WHERE node_id=? AND target_id IS ?", (cid, pid))
    old_roots = {int(rows[n][2]) for n in rows}
    forgotten_roots = {n for n in rows if rows[n][1] is None}
    for chunk in _chunks(sorted(rows, key=lambda n: -rows[n][3])):  # newest first: children before parents
        q = ",".join("?" * len(chunk))
        db.execute(f"DELETE FROM node_fts WHERE rowid IN ({q})", chunk)
        db.execute(f"DELETE FROM root_fts WHERE rowid IN ({q})", chunk)
        db.execute(f"DELETE FROM forked_roots WHERE root_id IN ({q})", chunk)
        db.execute(f"DELETE FROM nodes WHERE id IN ({q})", chunk)
    keys = [(conv, rows[n][4]) for n in rows if rows[n][4] is not None]
    db.executemany("INSERT OR IGNORE INTO forgotten_turns VALUES(?,?)", keys)
    db.executemany("INSERT OR IGNORE INTO index_tombstones VALUES(?,?)", [(conv, n) for n in rows])
    if rows:
        floor = max(int(st.get_meta("node_id_floor") or 0), max(rows))
        st.set_meta("node_id_floor", str(floor))

    new_roots: set[int] = set()
    touched_roots = old_roots - forgotten_roots
    rebuilt: set[int] = set()
    children.sort(key=lambda c: st.get_node(c[0]).seq)  # ancestors first: a subtree is rebuilt once
    for cid, pid in children:
        counts["nodes_reattached"] += 1
        if pid is None:
            new_roots.add(cid)
        elif db.execute("SELECT COUNT(*) FROM nodes WHERE parent_id=?", (pid,)).fetchone()[0] > 1:
            db.execute("INSERT OR IGNORE INTO forked_roots SELECT root_id FROM nodes WHERE id=?", (pid,))
        if cid not in rebuilt:
            counts["nodes_moved"] += _rebuild_subtree(mem, cid, pid, rebuilt)
    if children:
        counts["nodes_depth_fixed"] = _fix_depths(db, [c for c, _ in children])
    counts["new_roots"] = len(new_roots)

    # items that named a forgotten root as theirs follow their first surviving source
    for table in DERIVED_TABLES:
        for root in sorted(forgotten_roots):
            for iid, sources in db.execute(f"SELECT id, sources FROM {table} WHERE root_id=?", (root,)).fetchall():
                new = db.execute("SELECT root_id FROM nodes WHERE id=?", (json.loads(sources)[0],)).fetchone()
                db.execute(f"UPDATE {table} SET root_id=? WHERE id=?", (new[0], iid))

    for root in sorted(touched_roots | new_roots):
        mem.rebuild_anchor(root)
    if not FTS_SECURE_DELETE:  # an old SQLite keeps deleted terms in the index until a merge
        for fts in FTS_TABLES:
            db.execute(f"INSERT INTO {fts}({fts}) VALUES('optimize')")


def _delete_item(st, table: str, iid: int, sources: list[int], counts: Counter) -> None:
    db = st.db
    if table in ("records", "artifacts"):
        sup, by = db.execute(f"SELECT supersedes, superseded_by FROM {table} WHERE id=?", (iid,)).fetchone()
        if by is not None:
            db.execute(f"UPDATE {table} SET supersedes=? WHERE id=?", (sup, by))
        if sup is not None:
            db.execute(f"UPDATE {table} SET superseded_by=? WHERE id=?", (by, sup))
        if sup is not None or by is not None:
            counts["revisions_relinked"] += 1
        if table == "records":
            head = db.execute("SELECT id FROM records WHERE chain_id=? AND id<>? ORDER BY seq, id LIMIT 1",
                              (iid, iid)).fetchone()
            if head is not None:
                db.execute("UPDATE records SET chain_id=? WHERE chain_id=? AND id<>?", (head[0], iid, iid))
    db.execute(f"DELETE FROM {FTS_TABLES_FOR[table]} WHERE rowid=?", (iid,))
    db.executemany("DELETE FROM provenance WHERE node_id=? AND kind=? AND item_id=?",
                   [(s, table, iid) for s in sources])
    db.execute(f"DELETE FROM {table} WHERE id=?", (iid,))


def _rebuild_subtree(mem: "ArborMemory", top: int, parent_id: int | None, done: set[int]) -> int:
    """Root, topic key and path summary of `top` (now below parent_id, or a root) and of the nodes below
    it, parents before children. Returns how many nodes were rewritten one by one.

    A path summary keeps only the newest part of a long trajectory, so a few nodes below the forgotten
    one the rebuilt path equals the stored one again: below that point nothing but the depth changes,
    and `_fix_depths` sets every depth of the moved subtrees in one pass at the end.
    """
    st, db = mem.store, mem.store.db
    todo = [(top, parent_id)]
    rewritten = 0
    while todo:
        nid, pid = todo.pop()
        n = st.get_node(nid)
        if pid is None:
            topic = mem.topic_key_of(n.entities, n.keywords, n.node_summary)
            fields = {"parent_id": None, "root_id": nid, "depth": 0, "topic_key": topic,
                      "path_summary": f"{topic}: {n.node_summary}"}
        else:
            p = st.get_node(pid)
            fields = {"parent_id": pid, "root_id": p.root_id, "depth": p.depth + 1, "topic_key": p.topic_key,
                      "path_summary": mem.roll_path(p.path_summary, n.node_summary)}
        db.execute(f"UPDATE nodes SET {', '.join(f'{k}=?' for k in fields)} WHERE id=?", (*fields.values(), nid))
        rewritten += 1
        done.add(nid)
        kids = [int(r[0]) for r in db.execute("SELECT id FROM nodes WHERE parent_id=? ORDER BY seq", (nid,))]
        if len(kids) > 1:
            db.execute("INSERT OR IGNORE INTO forked_roots VALUES(?)", (fields["root_id"],))
        same = (fields["root_id"], fields["topic_key"], fields["path_summary"]) == (n.root_id, n.topic_key, n.path_summary)
        if not same:  # else the subtree below reads the same: only its depths change (_fix_depths)
            todo.extend((k, nid) for k in kids)
    return rewritten


def _fix_depths(db, tops: list[int]) -> int:
    """Depth = parent's depth + 1 over the subtrees of the re-attached children, each node visited once
    (nested subtrees are one pass, not one per forgotten ancestor); returns the rows changed."""
    db.execute("CREATE TEMP TABLE IF NOT EXISTS forget_moved(id INTEGER PRIMARY KEY)")
    db.execute("CREATE TEMP TABLE IF NOT EXISTS forget_depth(id INTEGER PRIMARY KEY, depth INTEGER NOT NULL)")
    db.execute("DELETE FROM forget_moved")
    db.execute("DELETE FROM forget_depth")
    db.executemany("INSERT OR IGNORE INTO forget_moved VALUES(?)", [(t,) for t in tops])
    db.execute("""INSERT OR IGNORE INTO forget_moved WITH RECURSIVE down(id) AS (SELECT id FROM forget_moved
                  UNION SELECT c.id FROM nodes c JOIN down ON c.parent_id = down.id) SELECT id FROM down""")
    db.execute("""INSERT INTO forget_depth WITH RECURSIVE d(id, depth) AS (
                    SELECT n.id, COALESCE((SELECT p.depth + 1 FROM nodes p WHERE p.id = n.parent_id), 0)
                    FROM forget_moved m JOIN nodes n ON n.id = m.id
                    WHERE n.parent_id IS NULL OR n.parent_id NOT IN (SELECT id FROM forget_moved)
                  UNION ALL SELECT c.id, d.depth + 1 FROM nodes c JOIN d ON c.parent_id = d.id)
                  SELECT id, depth FROM d""")
    cur = db.execute("""UPDATE nodes SET depth = (SELECT depth FROM forget_depth f WHERE f.id = nodes.id)
                        WHERE id IN (SELECT id FROM forget_depth)
                        AND depth <> (SELECT depth FROM forget_depth f WHERE f.id = nodes.id)""")
    changed = cur.rowcount
    db.execute("DELETE FROM forget_moved")
    db.execute("DELETE FROM forget_depth")
    return changed
