"""SQLite persistence of the forest and the evidence store (stdlib sqlite3, WAL, FTS5).

SQLite is the single source of truth: one memory commit is one transaction, so a process killed in
the middle of a commit leaves the database exactly as it was before that commit. The vector index
(index.py) is derived from the embeddings stored here and caught up on open.

Keyword/entity recall uses SQLite's built-in FTS5 (BM25 ranking, Porter stemming), which lives inside
the same transaction as the node it indexes: no second store to keep consistent.
"""

from __future__ import annotations

import json
import re
import sqlite3
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from .schema import AtomicFact, Artifact, Event, Node, StateRecord
from .text import STOPWORDS, content_words

SCHEMA_VERSION = 1

DDL = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS nodes(
  id INTEGER PRIMARY KEY, conversation_id TEXT NOT NULL, seq INTEGER NOT NULL, ts TEXT,
  parent_id INTEGER REFERENCES nodes(id), root_id INTEGER NOT NULL, depth INTEGER NOT NULL,
  user_text TEXT NOT NULL, assistant_text TEXT NOT NULL, node_summary TEXT NOT NULL,
  path_summary TEXT NOT NULL, topic_key TEXT NOT NULL, entities TEXT NOT NULL, keywords TEXT NOT NULL,
  embedding BLOB, UNIQUE(conversation_id, seq));
CREATE INDEX IF NOT EXISTS nodes_root ON nodes(root_id, seq);
CREATE INDEX IF NOT EXISTS nodes_parent ON nodes(parent_id);
CREATE VIRTUAL TABLE IF NOT EXISTS node_fts USING fts5(conv, lex, tokenize='porter unicode61');
CREATE VIRTUAL TABLE IF NOT EXISTS root_fts USING fts5(conv, topic, tokenize='porter unicode61');
CREATE TABLE IF NOT EXISTS facts(
  id INTEGER PRIMARY KEY, conversation_id TEXT NOT NULL, text TEXT NOT NULL, entities TEXT NOT NULL,
  tags TEXT NOT NULL, sources TEXT NOT NULL, timestamps TEXT NOT NULL, seq INTEGER NOT NULL,
  root_id INTEGER NOT NULL, superseded_by INTEGER);
CREATE INDEX IF NOT EXISTS facts_text ON facts(conversation_id, text);
CREATE VIRTUAL TABLE IF NOT EXISTS fact_fts USING fts5(conv, lex, tokenize='porter unicode61');
CREATE TABLE IF NOT EXISTS records(
  id INTEGER PRIMARY KEY, conversation_id TEXT NOT NULL, key TEXT NOT NULL, subject TEXT NOT NULL,
  value TEXT NOT NULL, tag TEXT NOT NULL, entities TEXT NOT NULL, evidence TEXT NOT NULL,
  sources TEXT NOT NULL, timestamps TEXT NOT NULL, seq INTEGER NOT NULL, root_id INTEGER NOT NULL,
  supersedes INTEGER REFERENCES records(id), superseded_by INTEGER REFERENCES records(id),
  chain_id INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS records_key ON records(conversation_id, key, subject);
CREATE INDEX IF NOT EXISTS records_chain ON records(chain_id, seq);
CREATE TABLE IF NOT EXISTS artifacts(
  id INTEGER PRIMARY KEY, conversation_id TEXT NOT NULL, name TEXT NOT NULL, subject TEXT NOT NULL,
  items TEXT NOT NULL, entities TEXT NOT NULL, sources TEXT NOT NULL, timestamps TEXT NOT NULL,
  seq INTEGER NOT NULL, root_id INTEGER NOT NULL, supersedes INTEGER, superseded_by INTEGER);
CREATE INDEX IF NOT EXISTS artifacts_name ON artifacts(conversation_id, name, subject);
CREATE TABLE IF NOT EXISTS events(
  id INTEGER PRIMARY KEY, conversation_id TEXT NOT NULL, subject TEXT NOT NULL, action TEXT NOT NULL,
  category TEXT NOT NULL, quantity REAL, unit TEXT, date TEXT, text TEXT NOT NULL, entities TEXT NOT NULL,
  sources TEXT NOT NULL, timestamps TEXT NOT NULL, seq INTEGER NOT NULL, root_id INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS events_conv ON events(conversation_id, seq);
CREATE TABLE IF NOT EXISTS forked_roots(root_id INTEGER PRIMARY KEY);
CREATE VIRTUAL TABLE IF NOT EXISTS record_fts USING fts5(conv, lex, tokenize='porter unicode61');
CREATE VIRTUAL TABLE IF NOT EXISTS artifact_fts USING fts5(conv, lex, tokenize='porter unicode61');
CREATE VIRTUAL TABLE IF NOT EXISTS event_fts USING fts5(conv, lex, tokenize='porter unicode61');
"""

_NODE_COLS = ("id, conversation_id, seq, ts, parent_id, root_id, depth, user_text, assistant_text, "
              "node_summary, path_summary, topic_key, entities, keywords, embedding")


def fts_query(text: str, max_terms: int = 16) -> str | None:
    """An FTS5 OR-query of the distinct content words of text (quoted, so no syntax leaks)."""
    terms: list[str] = []
    for w in content_words(text):
        w = re.sub(r"[^\w]", "", w)
        if w and w not in STOPWORDS and w not in terms:
            terms.append(w)
        if len(terms) >= max_terms:
            break
    if not terms:
        return None
    return " OR ".join(f'"{t}"' for t in terms)


def conv_token(conversation_id: str) -> str:
    return '"c' + re.sub(r"[^0-9A-Za-z]", "_", conversation_id) + '"'


class Store:
    def __init__(self, path: str | Path, synchronous: str = "NORMAL"):
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(f"PRAGMA synchronous={synchronous}")
        self.db.execute("PRAGMA foreign_keys=ON")
        self.db.executescript(DDL)
        row = self.db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        if row is None:
            self.db.execute("INSERT INTO meta VALUES('schema_version', ?)", (str(SCHEMA_VERSION),))
        elif int(row[0]) != SCHEMA_VERSION:
            raise RuntimeError(f"{self.path}: memory schema v{row[0]}, this runtime reads v{SCHEMA_VERSION}")
        self._in_tx = False

    def close(self) -> None:
        self.db.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        if self._in_tx:
            yield self.db
            return
        self.db.execute("BEGIN IMMEDIATE")
        self._in_tx = True
        try:
            yield self.db
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        finally:
            self._in_tx = False

    # ------------------------------------------------------------------ meta
    def get_meta(self, key: str) -> str | None:
        row = self.db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return row[0] if row else None

    def set_meta(self, key: str, value: str) -> None:
        self.db.execute("INSERT INTO meta VALUES(?, ?) ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                        (key, value))

    # ------------------------------------------------------------------ nodes
    @staticmethod
    def _node(row) -> Node:
        emb = np.frombuffer(row[14], dtype=np.float32).copy() if row[14] is not None else None
        return Node(id=row[0], conversation_id=row[1], seq=row[2], timestamp=row[3], parent_id=row[4],
                    root_id=row[5], depth=row[6], user_text=row[7], assistant_text=row[8],
                    node_summary=row[9], path_summary=row[10], topic_key=row[11],
                    entities=json.loads(row[12]), keywords=json.loads(row[13]), embedding=emb)

    def next_seq(self, conv: str) -> int:
        row = self.db.execute("SELECT COALESCE(MAX(seq) + 1, 0) FROM nodes WHERE conversation_id=?", (conv,)).fetchone()
        return int(row[0])

    def insert_node(self, n: Node) -> int:
        """Insert a node; id and root_id are assigned when n.id < 0 (root_id=-1 means "itself")."""
        emb = n.embedding.astype(np.float32).tobytes() if n.embedding is not None else None
        cur = self.db.execute(
            f"INSERT INTO nodes({_NODE_COLS}) VALUES(NULL,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (n.conversation_id, n.seq, n.timestamp, n.parent_id, n.root_id, n.depth, n.user_text,
             n.assistant_text, n.node_summary, n.path_summary, n.topic_key, json.dumps(n.entities),
             json.dumps(n.keywords), emb),
        )
        nid = int(cur.lastrowid)
        if n.parent_id is not None and self.db.execute(
                "SELECT 1 FROM nodes WHERE parent_id=? AND id<>? LIMIT 1", (n.parent_id, nid)).fetchone():
            self.db.execute("INSERT OR IGNORE INTO forked_roots VALUES(?)", (n.root_id,))
        if n.root_id < 0:
            self.db.execute("UPDATE nodes SET root_id=? WHERE id=?", (nid, nid))
            n.root_id = nid
        n.id = nid
        lex = " ".join([n.user_text, n.assistant_text, " ".join(n.entities), " ".join(n.keywords)])
        self.db.execute("INSERT INTO node_fts(rowid, conv, lex) VALUES(?,?,?)",
                        (nid, conv_token(n.conversation_id).strip('"'), lex))
        return nid

    def set_root_topic(self, conv: str, root_id: int, topic: str) -> None:
        self.db.execute("DELETE FROM root_fts WHERE rowid=?", (root_id,))
        self.db.execute("INSERT INTO root_fts(rowid, conv, topic) VALUES(?,?,?)",
                        (root_id, conv_token(conv).strip('"'), topic))

    def update_node_text(self, node_id: int, **fields: Any) -> None:
        cols = []
        vals = []
        for k, v in fields.items():
            cols.append(f"{k}=?")
            vals.append(json.dumps(v) if isinstance(v, list) else v)
        self.db.execute(f"UPDATE nodes SET {', '.join(cols)} WHERE id=?", (*vals, node_id))

    def get_node(self, node_id: int) -> Node | None:
        row = self.db.execute(f"SELECT {_NODE_COLS} FROM nodes WHERE id=?", (node_id,)).fetchone()
        return self._node(row) if row else None

    def get_nodes(self, ids: list[int]) -> dict[int, Node]:
        if not ids:
            return {}
        out: dict[int, Node] = {}
        for i in range(0, len(ids), 500):
            chunk = ids[i : i + 500]
            q = f"SELECT {_NODE_COLS} FROM nodes WHERE id IN ({','.join('?' * len(chunk))})"
            for row in self.db.execute(q, chunk):
                out[row[0]] = self._node(row)
        return out

    def nodes(self, conv: str, after_id: int = 0) -> list[Node]:
        rows = self.db.execute(f"SELECT {_NODE_COLS} FROM nodes WHERE conversation_id=? AND id>? ORDER BY seq",
                               (conv, after_id))
        return [self._node(r) for r in rows]

    def count_nodes(self, conv: str) -> int:
        return int(self.db.execute("SELECT COUNT(*) FROM nodes WHERE conversation_id=?", (conv,)).fetchone()[0])

    def latest_node(self, conv: str) -> Node | None:
        row = self.db.execute(f"SELECT {_NODE_COLS} FROM nodes WHERE conversation_id=? ORDER BY seq DESC LIMIT 1",
                              (conv,)).fetchone()
        return self._node(row) if row else None

    def recent_nodes(self, conv: str, n: int) -> list[Node]:
        rows = self.db.execute(
            f"SELECT {_NODE_COLS} FROM nodes WHERE conversation_id=? ORDER BY seq DESC LIMIT ?", (conv, n))
        return [self._node(r) for r in rows][::-1]

    def trajectory(self, node_id: int, max_nodes: int | None = None) -> list[Node]:
        """Root-to-node trajectory; with max_nodes, the root plus the newest max_nodes - 1 nodes."""
        limit = -1 if max_nodes is None else max(1, max_nodes - 1)
        rows = self.db.execute(
            f"""WITH RECURSIVE up(id, k) AS (SELECT ?, 0 UNION ALL
                SELECT n.parent_id, up.k + 1 FROM nodes n JOIN up ON n.id = up.id
                WHERE n.parent_id IS NOT NULL AND (? < 0 OR up.k + 1 < ?))
                SELECT {', '.join('n.' + c.strip() for c in _NODE_COLS.split(','))} FROM up JOIN nodes n ON n.id = up.id
                ORDER BY up.k DESC""",
            (node_id, limit, limit),
        )
        path = [self._node(r) for r in rows]
        if path and path[0].parent_id is not None:  # truncated: keep the root in front for its topic
            path.insert(0, self.get_node(path[0].root_id))
        return path

    def tip(self, node_id: int) -> int:
        """Latest node of the trajectory through node_id (its latest descendant).

        A root whose nodes form a single chain (the usual case: localization attaches at tips) answers
        from the (root_id, seq) index; a forked root walks the subtree.
        """
        row = self.db.execute("SELECT root_id FROM nodes WHERE id=?", (node_id,)).fetchone()
        if row is None:
            raise KeyError(f"node {node_id} does not exist")
        if not self.db.execute("SELECT 1 FROM forked_roots WHERE root_id=?", (row[0],)).fetchone():
            return self.latest_in_root(int(row[0]))
        return self.latest_descendant(node_id)

    def latest_descendant(self, node_id: int) -> int:
        row = self.db.execute(
            """WITH RECURSIVE down(id) AS (SELECT ? UNION ALL
               SELECT n.id FROM nodes n JOIN down ON n.parent_id = down.id)
               SELECT n.id FROM down JOIN nodes n ON n.id = down.id ORDER BY n.seq DESC LIMIT 1""",
            (node_id,),
        ).fetchone()
        return int(row[0])

    def latest_in_root(self, root_id: int) -> int:
        return int(self.db.execute("SELECT id FROM nodes WHERE root_id=? ORDER BY seq DESC LIMIT 1",
                                   (root_id,)).fetchone()[0])

    def fts_search(self, table: str, conv: str, text: str, k: int) -> list[tuple[int, float]]:
        """BM25 search of one conversation's rows in an FTS5 table (columns: conv, then the text column)."""
        q = fts_query(text)
        if not q:
            return []
        column = "topic" if table == "root_fts" else "lex"
        rows = self.db.execute(
            f"SELECT rowid, -bm25({table}, 0.0, 1.0) FROM {table} WHERE {table} MATCH ? "
            f"ORDER BY bm25({table}, 0.0, 1.0) LIMIT ?",
            (f"conv:{conv_token(conv)} AND {column}:({q})", k),
        )
        return [(int(r[0]), float(r[1])) for r in rows]

    def keyword_search(self, conv: str, text: str, k: int) -> list[tuple[int, float]]:
        return self.fts_search("node_fts", conv, text, k)

    def topic_search(self, conv: str, text: str, k: int) -> list[tuple[int, float]]:
        """Branch roots whose topic anchor matches the text."""
        return self.fts_search("root_fts", conv, text, k)

    def roots(self, conv: str) -> list[int]:
        return [int(r[0]) for r in self.db.execute(
            "SELECT id FROM nodes WHERE conversation_id=? AND parent_id IS NULL ORDER BY seq", (conv,))]

    # ------------------------------------------------------------------ evidence: facts
    @staticmethod
    def _fact(r) -> AtomicFact:
        return AtomicFact(id=r[0], text=r[1], entities=json.loads(r[2]), tags=json.loads(r[3]),
                          sources=json.loads(r[4]), timestamps=json.loads(r[5]), seq=r[6], root_id=r[7],
                          superseded_by=r[8])

    _FACT_COLS = "id, text, entities, tags, sources, timestamps, seq, root_id, superseded_by"

    def add_fact(self, conv: str, text: str, entities: list[str], tags: list[str], node_id: int,
                 ts: str | None, seq: int, root_id: int) -> int:
        """Insert an atomic fact; an identical fact adds provenance to the existing row instead."""
        row = self.db.execute("SELECT id, sources, timestamps FROM facts WHERE conversation_id=? AND text=?",
                              (conv, text)).fetchone()
        if row:
            sources, stamps = json.loads(row[1]), json.loads(row[2])
            if node_id not in sources:
                sources.append(node_id)
                stamps.append(ts)
                self.db.execute("UPDATE facts SET sources=?, timestamps=?, seq=? WHERE id=?",
                                (json.dumps(sources), json.dumps(stamps), seq, row[0]))
            return int(row[0])
        cur = self.db.execute(
            "INSERT INTO facts(conversation_id, text, entities, tags, sources, timestamps, seq, root_id) "
            "VALUES(?,?,?,?,?,?,?,?)",
            (conv, text, json.dumps(entities), json.dumps(tags), json.dumps([node_id]), json.dumps([ts]), seq, root_id))
        fid = int(cur.lastrowid)
        self.db.execute("INSERT INTO fact_fts(rowid, conv, lex) VALUES(?,?,?)",
                        (fid, conv_token(conv).strip('"'), text + " " + " ".join(entities)))
        return fid

    def search_facts(self, conv: str, text: str, k: int) -> list[tuple[AtomicFact, float]]:
        q = fts_query(text)
        if not q:
            return []
        rows = self.db.execute(
            f"SELECT {', '.join('f.' + c.strip() for c in self._FACT_COLS.split(','))}, -bm25(fact_fts, 0.0, 1.0) "
            "FROM fact_fts JOIN facts f ON f.id = fact_fts.rowid WHERE fact_fts MATCH ? "
            "ORDER BY bm25(fact_fts, 0.0, 1.0) LIMIT ?",
            (f"conv:{conv_token(conv)} AND lex:({q})", k))
        return [(self._fact(r), float(r[9])) for r in rows]

    def facts(self, conv: str) -> list[AtomicFact]:
        return [self._fact(r) for r in self.db.execute(
            f"SELECT {self._FACT_COLS} FROM facts WHERE conversation_id=? ORDER BY id", (conv,))]

    def facts_from_nodes(self, conv: str, node_ids: list[int]) -> list[AtomicFact]:
        ids = set(node_ids)
        return [f for f in self.facts(conv) if ids & set(f.sources)] if ids else []

    # ------------------------------------------------------------------ evidence: mutable states
    _REC_COLS = ("id, key, subject, value, tag, entities, evidence, sources, timestamps, seq, root_id, "
                 "supersedes, superseded_by, chain_id")

    @staticmethod
    def _rec(r) -> StateRecord:
        return StateRecord(id=r[0], key=r[1], subject=r[2], value=r[3], tag=r[4], entities=json.loads(r[5]),
                           evidence=r[6], sources=json.loads(r[7]), timestamps=json.loads(r[8]), seq=r[9],
                           root_id=r[10], supersedes=r[11], superseded_by=r[12], chain_id=r[13])

    def current_records(self, conv: str, key: str, subject: str) -> list[StateRecord]:
        return [self._rec(r) for r in self.db.execute(
            f"SELECT {self._REC_COLS} FROM records WHERE conversation_id=? AND key=? AND subject=? "
            "AND superseded_by IS NULL ORDER BY seq", (conv, key, subject))]

    def add_record(self, conv: str, key: str, subject: str, value: str, tag: str, entities: list[str],
                   evidence: str, node_id: int, ts: str | None, seq: int, root_id: int,
                   supersedes: int | None) -> int:
        chain = None
        if supersedes is not None:
            chain = self.db.execute("SELECT chain_id FROM records WHERE id=?", (supersedes,)).fetchone()[0]
        cur = self.db.execute(
            "INSERT INTO records(conversation_id, key, subject, value, tag, entities, evidence, sources, "
            "timestamps, seq, root_id, supersedes, chain_id) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (conv, key, subject, value, tag, json.dumps(entities), evidence, json.dumps([node_id]),
             json.dumps([ts]), seq, root_id, supersedes, chain if chain is not None else -1))
        rid = int(cur.lastrowid)
        if chain is None:
            self.db.execute("UPDATE records SET chain_id=? WHERE id=?", (rid, rid))
        if supersedes is not None:
            self.db.execute("UPDATE records SET superseded_by=? WHERE id=?", (rid, supersedes))
        self.db.execute("INSERT INTO record_fts(rowid, conv, lex) VALUES(?,?,?)",
                        (rid, conv_token(conv).strip('"'), f"{key.replace('_', ' ')} {subject} {value} {' '.join(entities)}"))
        return rid

    def add_record_source(self, rec: StateRecord, node_id: int, ts: str | None) -> None:
        if node_id in rec.sources:
            return
        self.db.execute("UPDATE records SET sources=?, timestamps=? WHERE id=?",
                        (json.dumps(rec.sources + [node_id]), json.dumps(rec.timestamps + [ts]), rec.id))

    def records(self, conv: str, include_superseded: bool = True) -> list[StateRecord]:
        q = f"SELECT {self._REC_COLS} FROM records WHERE conversation_id=?"
        if not include_superseded:
            q += " AND superseded_by IS NULL"
        return [self._rec(r) for r in self.db.execute(q + " ORDER BY seq, id", (conv,))]

    def get_record(self, rid: int) -> StateRecord | None:
        r = self.db.execute(f"SELECT {self._REC_COLS} FROM records WHERE id=?", (rid,)).fetchone()
        return self._rec(r) if r else None

    def record_history(self, rid: int, last: int | None = None) -> list[StateRecord]:
        """Old-to-new revision chain that passes through record rid (its newest `last` versions)."""
        row = self.db.execute("SELECT chain_id FROM records WHERE id=?", (rid,)).fetchone()
        if row is None:
            return []
        rows = self.db.execute(f"SELECT {self._REC_COLS} FROM records WHERE chain_id=? ORDER BY seq DESC, id DESC"
                               + (" LIMIT ?" if last else ""), (row[0], last) if last else (row[0],))
        return [self._rec(r) for r in rows][::-1]

    # ------------------------------------------------------------------ evidence: artifacts
    _ART_COLS = "id, name, subject, items, entities, sources, timestamps, seq, root_id, supersedes, superseded_by"

    @staticmethod
    def _art(r) -> Artifact:
        return Artifact(id=r[0], name=r[1], subject=r[2], items=json.loads(r[3]), entities=json.loads(r[4]),
                        sources=json.loads(r[5]), timestamps=json.loads(r[6]), seq=r[7], root_id=r[8],
                        supersedes=r[9], superseded_by=r[10])

    def current_artifact(self, conv: str, name: str, subject: str) -> Artifact | None:
        r = self.db.execute(f"SELECT {self._ART_COLS} FROM artifacts WHERE conversation_id=? AND name=? AND "
                            "subject=? AND superseded_by IS NULL", (conv, name, subject)).fetchone()
        return self._art(r) if r else None

    def add_artifact(self, conv: str, name: str, subject: str, items: list[str], entities: list[str],
                     node_id: int, ts: str | None, seq: int, root_id: int, supersedes: int | None) -> int:
        cur = self.db.execute(
            "INSERT INTO artifacts(conversation_id, name, subject, items, entities, sources, timestamps, seq, "
            "root_id, supersedes) VALUES(?,?,?,?,?,?,?,?,?,?)",
            (conv, name, subject, json.dumps(items), json.dumps(entities), json.dumps([node_id]),
             json.dumps([ts]), seq, root_id, supersedes))
        aid = int(cur.lastrowid)
        if supersedes is not None:
            self.db.execute("UPDATE artifacts SET superseded_by=? WHERE id=?", (aid, supersedes))
        self.db.execute("INSERT INTO artifact_fts(rowid, conv, lex) VALUES(?,?,?)",
                        (aid, conv_token(conv).strip('"'), f"{name} {subject} {' '.join(items)} {' '.join(entities)}"))
        return aid

    def artifacts(self, conv: str, include_superseded: bool = False) -> list[Artifact]:
        q = f"SELECT {self._ART_COLS} FROM artifacts WHERE conversation_id=?"
        if not include_superseded:
            q += " AND superseded_by IS NULL"
        return [self._art(r) for r in self.db.execute(q + " ORDER BY seq, id", (conv,))]

    # ------------------------------------------------------------------ evidence: events
    _EV_COLS = "id, subject, action, category, quantity, unit, date, text, entities, sources, timestamps, seq, root_id"

    @staticmethod
    def _ev(r) -> Event:
        return Event(id=r[0], subject=r[1], action=r[2], category=r[3], quantity=r[4], unit=r[5], date=r[6],
                     text=r[7], entities=json.loads(r[8]), sources=json.loads(r[9]),
                     timestamps=json.loads(r[10]), seq=r[11], root_id=r[12])

    def add_event(self, conv: str, ev: dict, node_id: int, ts: str | None, seq: int, root_id: int) -> int:
        cur = self.db.execute(
            "INSERT INTO events(conversation_id, subject, action, category, quantity, unit, date, text, entities, "
            "sources, timestamps, seq, root_id) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (conv, ev.get("subject", ""), ev["action"], ev.get("category", ""), ev.get("quantity"), ev.get("unit"),
             ev.get("date") or ts, ev["text"], json.dumps(ev.get("entities", [])), json.dumps([node_id]),
             json.dumps([ts]), seq, root_id))
        eid = int(cur.lastrowid)
        self.db.execute("INSERT INTO event_fts(rowid, conv, lex) VALUES(?,?,?)",
                        (eid, conv_token(conv).strip('"'), f"{ev.get('subject', '')} {ev['action']} {ev.get('category', '')} "
                         f"{ev['text']} {' '.join(ev.get('entities', []))}"))
        return eid

    def events(self, conv: str) -> list[Event]:
        return [self._ev(r) for r in self.db.execute(
            f"SELECT {self._EV_COLS} FROM events WHERE conversation_id=? ORDER BY seq, id", (conv,))]

    def _search_ids(self, table: str, conv: str, text: str, k: int) -> list[int]:
        return [i for i, _ in self.fts_search(table, conv, text, k)]

    def search_records(self, conv: str, text: str, k: int, versions: int = 4) -> list[list[StateRecord]]:
        """Revision chains (old -> new, newest `versions` versions) of the records matching the text."""
        ids = self._search_ids("record_fts", conv, text, k)
        if not ids:
            return []
        q = f"SELECT DISTINCT chain_id FROM records WHERE id IN ({','.join('?' * len(ids))})"
        chains = [int(r[0]) for r in self.db.execute(q, ids)]
        return [self.record_history(c, versions) for c in chains]

    def _search_rows(self, table: str, cols: str, conv: str, text: str, k: int) -> list[tuple]:
        ids = self._search_ids(f"{table[:-1]}_fts", conv, text, k)
        if not ids:
            return []
        q = f"SELECT {cols} FROM {table} WHERE id IN ({','.join('?' * len(ids))}) ORDER BY seq, id"
        return list(self.db.execute(q, ids))

    def search_artifacts(self, conv: str, text: str, k: int) -> list[Artifact]:
        return [self._art(r) for r in self._search_rows("artifacts", self._ART_COLS, conv, text, k)]

    def search_events(self, conv: str, text: str, k: int) -> list[Event]:
        return [self._ev(r) for r in self._search_rows("events", self._EV_COLS, conv, text, k)]

    def counts(self, conv: str) -> dict[str, int]:
        out = {}
        for table in ("nodes", "facts", "records", "artifacts", "events"):
            out[table] = int(self.db.execute(f"SELECT COUNT(*) FROM {table} WHERE conversation_id=?",
                                             (conv,)).fetchone()[0])
        out["roots"] = int(self.db.execute("SELECT COUNT(*) FROM nodes WHERE conversation_id=? AND parent_id IS NULL",
                                           (conv,)).fetchone()[0])
        return out
