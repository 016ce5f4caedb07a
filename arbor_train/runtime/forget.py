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
from typing import Any

from ..errors import InputError
from .store import DERIVED_TABLES

# `mem` below is an ArborMemory (memory.py calls in here; importing it back would be a cycle). Every SQL
# statement the cascade runs is a Store method (store.py, "erasure"): this module decides what goes, and in
# which order.


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
        for nid in st.nodes_matching(conv, phrase):
            n = st.get_node(nid)
            text = " ".join([n.user_text, n.assistant_text, *n.entities, *n.keywords])
            if rx.search(text):
                chosen.add(n.id)
        for table in DERIVED_TABLES:
            for iid, row in st.items_matching(conv, table, phrase):
                if rx.search(json.dumps([v for v in row if isinstance(v, str)], ensure_ascii=False)):
                    forced[table].add(iid)
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
    st, conv = mem.store, mem.conv
    gone = sorted(chosen)
    rows = st.node_rows(gone)
    counts["nodes"] = len(rows)

    # 1. derived items
    for table in DERIVED_TABLES:
        items = set(forced.get(table, ())) | st.items_citing(table, gone)
        for iid in sorted(items):
            found = st.item_sources(table, iid)
            if found is None:
                continue
            sources, stamps = found
            keep = [(s, t) for s, t in zip(sources, stamps) if s not in chosen]
            if not keep or iid in forced.get(table, ()):
                if st.delete_item(table, iid, sources):
                    counts["revisions_relinked"] += 1
                counts[f"{table}_deleted"] += 1
            else:
                st.trim_item_sources(table, iid, [s for s, _ in keep], [t for _, t in keep],
                                     clear_evidence=table == "records" and sources[0] in chosen)
                counts[f"{table}_trimmed"] += 1
    st.drop_provenance(gone)

    # 2. the forest: re-attach surviving children, then delete the nodes
    def surviving_ancestor(nid: int) -> int | None:
        p = rows[nid][1]
        while p is not None and p in chosen:
            p = rows[p][1]
        return p

    children = [(cid, surviving_ancestor(pid)) for pid, kids in st.children(gone).items() for cid in kids
                if cid not in chosen]
    for cid, pid in children:  # detach first: the foreign key must not point at a deleted row
        st.reparent(cid, pid)  # (links to and from the deleted nodes go with them: ON DELETE CASCADE)
    old_roots = {int(rows[n][2]) for n in rows}
    forgotten_roots = {n for n in rows if rows[n][1] is None}
    st.delete_nodes(conv, rows)

    new_roots: set[int] = set()
    touched_roots = old_roots - forgotten_roots
    rebuilt: set[int] = set()
    children.sort(key=lambda c: st.get_node(c[0]).seq)  # ancestors first: a subtree is rebuilt once
    for cid, pid in children:
        counts["nodes_reattached"] += 1
        if pid is None:
            new_roots.add(cid)
        elif len(st.children([pid])[pid]) > 1:
            st.mark_forked(st.get_node(pid).root_id)
        if cid not in rebuilt:
            counts["nodes_moved"] += _rebuild_subtree(mem, cid, pid, rebuilt)
    if children:
        counts["nodes_depth_fixed"] = st.fix_depths([c for c, _ in children])
    counts["new_roots"] = len(new_roots)

    st.reroot_items(forgotten_roots)  # items that named a forgotten root follow their first surviving source
    for root in sorted(touched_roots | new_roots):
        mem.rebuild_anchor(root)
    st.purge_deleted_terms()


def _rebuild_subtree(mem: "ArborMemory", top: int, parent_id: int | None, done: set[int]) -> int:
    """Root, topic key and path summary of `top` (now below parent_id, or a root) and of the nodes below
    it, parents before children. Returns how many nodes were rewritten one by one.

    A path summary keeps only the newest part of a long trajectory, so a few nodes below the forgotten
    one the rebuilt path equals the stored one again: below that point nothing but the depth changes,
    and `Store.fix_depths` sets every depth of the moved subtrees in one pass at the end.
    """
    st = mem.store
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
        st.set_node_fields(nid, fields)
        rewritten += 1
        done.add(nid)
        kids = st.children([nid])[nid]
        if len(kids) > 1:
            st.mark_forked(fields["root_id"])
        same = (fields["root_id"], fields["topic_key"], fields["path_summary"]) == (n.root_id, n.topic_key, n.path_summary)
        if not same:  # else the subtree below reads the same: only its depths change (Store.fix_depths)
            todo.extend((k, nid) for k in kids)
    return rewritten
