"""SQLite persistence of the forest and the evidence store (stdlib sqlite3, WAL, FTS5).

SQLite is the single source of truth: one memory commit is one transaction, so a process killed in
the middle of a commit leaves the database exactly as it was before that commit. The vector index
(index.py) is derived from the embeddings stored here and caught up on open.

Guarantees (tests/test_runtime_reliability.py shows each):
- atomic commit: a turn is stored whole or not at all (one `BEGIN IMMEDIATE` transaction);
- single writer: `lock_for_writing` takes an exclusive `flock` on `<file>.lock`; a second writer waits
  up to its timeout and is then refused with a message naming the holder's pid;
- isolated conversations: every row carries its conversation id, and the FTS5 token and the HNSW file
  name derived from the id are injective (`conv_token`, `index.index_path`);
- consistent reads: `snapshot()` reads one committed state (WAL snapshot), never a half-commit;
- resumable ingest: a node can carry its turn's identity (`turn_key`, unique per conversation), so
  replaying a file skips the turns already stored;
- `check()` lists every broken invariant (SQLite and FTS5 integrity, forest links, provenance);
- forgetting leaves no residue: `PRAGMA secure_delete` zeroes freed pages, FTS5 `secure-delete` (SQLite
  3.42+) removes a deleted row's terms from the full-text index itself, and `forget.py` checkpoints the
  WAL away after a forget. Every derived row's sources are also in `provenance` (node -> item), so a
  forget finds what a node supports without scanning the memory.

SQLite comes from `pysqlite3` (a current SQLite, 3.51) where that wheel is installed, else the standard
library's; with a library older than 3.42 a forget rewrites the touched FTS5 indexes instead ('optimize').

Keyword/entity recall uses SQLite's built-in FTS5 (BM25 ranking, Porter stemming), which lives inside
the same transaction as the node it indexes: no second store to keep consistent.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import time
import unicodedata
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import numpy as np

try:  # a current SQLite (FTS5 secure-delete needs 3.42; the stdlib's may be older)
    from pysqlite3 import dbapi2 as sqlite3
except ImportError:  # pragma: no cover - platforms without the wheel
    import sqlite3

from ..errors import InputError, UserError
from .schema import Artifact, AtomicFact, Event, Node, StateRecord
from .text import STOPWORDS, content_words

SCHEMA_VERSION = 5  # v2: injective conversation tokens, nodes.turn_key; v3: provenance, forgetting; v4: links;
# v5: turn keys from each turn's own content (turnkeys.py), not chained over the turns before it
FTS_SECURE_DELETE = sqlite3.sqlite_version_info >= (3, 42, 0)

DDL = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS nodes(
  id INTEGER PRIMARY KEY, conversation_id TEXT NOT NULL, seq INTEGER NOT NULL, ts TEXT,
  parent_id INTEGER REFERENCES nodes(id), root_id INTEGER NOT NULL, depth INTEGER NOT NULL,
  user_text TEXT NOT NULL, assistant_text TEXT NOT NULL, node_summary TEXT NOT NULL,
  path_summary TEXT NOT NULL, topic_key TEXT NOT NULL, entities TEXT NOT NULL, keywords TEXT NOT NULL,
  embedding BLOB, turn_key TEXT, speaker TEXT, UNIQUE(conversation_id, seq));
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
CREATE TABLE IF NOT EXISTS provenance(
  node_id INTEGER NOT NULL, kind TEXT NOT NULL, item_id INTEGER NOT NULL,
  PRIMARY KEY(node_id, kind, item_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS forgotten_turns(
  conversation_id TEXT NOT NULL, turn_key TEXT NOT NULL, PRIMARY KEY(conversation_id, turn_key)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS index_tombstones(
  conversation_id TEXT NOT NULL, node_id INTEGER NOT NULL, PRIMARY KEY(conversation_id, node_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS links(
  node_id INTEGER NOT NULL REFERENCES nodes(id) ON DELETE CASCADE,
  target_id INTEGER NOT NULL REFERENCES nodes(id) ON DELETE CASCADE,
  conversation_id TEXT NOT NULL, confidence REAL NOT NULL, PRIMARY KEY(node_id, target_id)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS links_target ON links(target_id);
CREATE INDEX IF NOT EXISTS facts_root ON facts(root_id);
CREATE INDEX IF NOT EXISTS records_root ON records(root_id);
CREATE INDEX IF NOT EXISTS artifacts_root ON artifacts(root_id);
CREATE INDEX IF NOT EXISTS events_root ON events(root_id);
"""
SPEAKER_INDEX = "CREATE INDEX IF NOT EXISTS nodes_speaker ON nodes(conversation_id, speaker, seq)"
# created after a v1 file gained the column (CREATE TABLE IF NOT EXISTS does not add it)
TURN_KEY_INDEX = ("CREATE UNIQUE INDEX IF NOT EXISTS nodes_turn ON nodes(conversation_id, turn_key) "
                  "WHERE turn_key IS NOT NULL")
# FTS5 table -> the table whose row ids it shares (root_fts rows are root nodes)
FTS_TABLES = {"node_fts": "nodes", "root_fts": "nodes", "fact_fts": "facts", "record_fts": "records",
              "artifact_fts": "artifacts", "event_fts": "events"}
DATA_TABLES = ("meta", "nodes", "forked_roots", "facts", "records", "artifacts", "events", "provenance",
               "forgotten_turns", "index_tombstones", "links")
# derived tables: every row lists its source nodes (JSON `sources`, mirrored in `provenance`)
DERIVED_TABLES = ("facts", "records", "artifacts", "events")
DERIVED_FTS = {base: fts for fts, base in FTS_TABLES.items() if base in DERIVED_TABLES}  # table -> its FTS5 table


# what a damaged or unusable file raises from SQLite: its errors, and UnicodeDecodeError when the driver cannot
# decode an error message that quotes a damaged page's bytes (a schema name, an FTS5 token)
SQLITE_ERRORS = (sqlite3.DatabaseError, UnicodeDecodeError)


def damage_text(e: BaseException) -> str:
    """What SQLite said, for an error line. A damaged page can put invalid UTF-8 into SQLite's own error
    message (a schema name, an FTS5 token), which the driver then fails to decode: that is said plainly."""
    if isinstance(e, UnicodeDecodeError):
        return (f"an error whose text is not valid UTF-8 ({e.reason} at byte {e.start}), which a damaged page "
                "of the file causes")
    return str(e)


class MemoryBusy(UserError):
    """Another process holds the memory file's writer lock."""

_NODE_COLS = ("id, conversation_id, seq, ts, parent_id, root_id, depth, user_text, assistant_text, "
              "node_summary, path_summary, topic_key, entities, keywords, embedding, speaker")


SQL_CHUNK = 500  # ids per IN (...) query: well under SQLite's bound-variable limit


def _chunks(ids) -> Iterator[list[int]]:
    """The ids in lists of at most SQL_CHUNK, for IN (...) queries."""
    ids = list(ids)
    for i in range(0, len(ids), SQL_CHUNK):
        yield ids[i : i + SQL_CHUNK]


def fts_terms(text: str, max_terms: int = 16) -> list[str]:
    """The distinct content words of text, as FTS5 terms (word characters only, so no syntax leaks)."""
    terms: list[str] = []
    for w in content_words(text):
        w = re.sub(r"[^\w]", "", w)
        if w and w not in STOPWORDS and w not in terms:
            terms.append(w)
        if len(terms) >= max_terms:
            break
    return terms


def fts_query(text: str, max_terms: int = 16) -> str | None:
    """An FTS5 OR-query of the distinct content words of text (quoted, so no syntax leaks)."""
    terms = fts_terms(text, max_terms)
    return " OR ".join(f'"{t}"' for t in terms) if terms else None


_PORTER = None


def _porter(word: str) -> str:
    """A word as FTS5's `porter unicode61` tokenizer indexes it (Porter's original stemmer, as SQLite's)."""
    global _PORTER
    if _PORTER is None:
        import Stemmer

        _PORTER = Stemmer.Stemmer("porter")
    plain = "".join(c for c in unicodedata.normalize("NFKD", word.lower()) if not unicodedata.combining(c))
    return _PORTER.stemWord(plain)


def conv_token(conversation_id: str) -> str:
    """The FTS5 phrase that selects one conversation's rows: "c" + the hex of the id's UTF-8 bytes.

    Injective (ids that differ in punctuation, case or Unicode normalisation get different tokens) and
    a single unicode61 token (hex digits only), so `conv:<token>` matches exactly one conversation.
    """
    return '"c' + conversation_id.encode("utf-8").hex() + '"'


def _v1_conv_token(conversation_id: str) -> str:
    return "c" + re.sub(r"[^0-9A-Za-z]", "_", conversation_id)


READABLE_VERSIONS = (4, 5)  # a read-only store reads these without migrating (v4 differs only in turn keys)


class Store:
    """One memory file. `read_only=True` (the CLI's ask, show, export, render) never writes: no schema
    migration, no meta; a file the process may not write (a read-only copy) is opened immutable."""

    def __init__(self, path: str | Path, synchronous: str = "NORMAL", read_only: bool = False):
        self.path = str(path)
        self.read_only = read_only
        if self.path != ":memory:" and not read_only:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        if self.path != ":memory:" and Path(self.path).is_dir():
            raise InputError(f"memory={self.path!r} is a folder; pass the memory's SQLite file")
        if self.path != ":memory:" and Path(self.path).is_file() and Path(self.path).stat().st_size > 0:
            with open(self.path, "rb") as f:  # SQLite would take a short or foreign file for an empty database
                if f.read(16) != b"SQLite format 3\x00":
                    raise InputError(f"memory={self.path!r} is not an SQLite file (no SQLite header: damaged, or "
                                     "another kind of file); it was left as it is")
        if read_only and self.path != ":memory:":
            if not Path(self.path).is_file():
                raise InputError(f"memory={self.path!r} does not exist")
            from urllib.parse import quote

            uri = f"file:{quote(os.path.abspath(self.path))}?mode=ro" + ("&immutable=1" if self._quiet() else "")
            self.db = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        else:
            self.db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA busy_timeout=30000")  # wait out another connection's short write locks
        try:  # before anything is written: a file that is not a memory is refused untouched
            tables = {r[0] for r in self.db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            ours = "meta" in tables and self.db.execute(
                "SELECT 1 FROM meta WHERE key='schema_version'").fetchone() is not None
        except SQLITE_ERRORS as e:
            self.db.close()
            raise InputError(f"memory={self.path!r} is not an ArborMem memory (SQLite says: {damage_text(e)}); "
                             "it was left as it is") from None
        if tables and not ours:
            self.db.close()
            raise InputError(f"memory={self.path!r} is an SQLite file without the ArborMem schema (tables: "
                             f"{', '.join(sorted(tables)[:5])}); it was left as it is")
        self._in_tx = False
        self._lock_fd: int | None = None
        self.db.execute("PRAGMA temp_store=MEMORY")  # no temporary file ever holds a row
        if read_only:
            row = self.db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() if ours else None
            if row is None or not str(row[0]).isdigit() or int(row[0]) not in READABLE_VERSIONS:
                self.db.close()
                got = "an empty file" if row is None else f"schema version {row[0]!r}"
                raise InputError(f"memory={self.path!r} is {got}; a read command reads v{READABLE_VERSIONS[0]} to "
                                 f"v{SCHEMA_VERSION} (a writing command, ingest or forget, migrates older files)")
            return
        try:
            self.db.execute("PRAGMA journal_mode=WAL")
        except SQLITE_ERRORS as e:
            self.db.close()
            raise InputError(f"memory={self.path!r} is not an ArborMem memory (SQLite says: {damage_text(e)})") from None
        self.db.execute(f"PRAGMA synchronous={synchronous}")
        self.db.execute("PRAGMA foreign_keys=ON")
        self.db.execute("PRAGMA secure_delete=ON")  # freed pages are zeroed: deleted text leaves the file
        try:
            row = self.db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        except sqlite3.OperationalError:  # a new file
            row = None
        if row is None or row[0] != str(SCHEMA_VERSION):
            self._create_or_migrate()

    def _quiet(self) -> bool:
        """For a read-only open: True when no writer can change the file while it is read, so SQLite may
        read it as immutable and create nothing beside it (no -wal, no -shm). That is a file this process
        may not write (a read-only copy), or one whose writer lock this reader can share (held until close:
        a writer waits for it) and whose write-ahead log is empty. Otherwise SQLite reads through the log."""
        self._read_fd: int | None = None
        if not (os.access(self.path, os.W_OK) and os.access(Path(self.path).parent, os.W_OK)):
            return True
        wal = Path(self.path + "-wal")
        if wal.exists() and wal.stat().st_size > 0:
            return False
        try:
            fd = os.open(self.path + ".lock", os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return not wal.exists()  # never opened by a writer of this runtime (a copy)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:  # a writer holds it
            os.close(fd)
            return False
        self._read_fd = fd
        return not (wal.exists() and wal.stat().st_size > 0)

    def _create_or_migrate(self) -> None:
        with self.transaction():
            for stmt in DDL.split(";"):  # not executescript: it would commit this transaction first
                if stmt.strip():
                    self.db.execute(stmt)
            row = self.db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            if row is None:
                self.db.execute("INSERT INTO meta VALUES('schema_version', ?)", (str(SCHEMA_VERSION),))
                self.db.execute(SPEAKER_INDEX)
            else:
                version = int(row[0]) if str(row[0]).isdigit() else None
                if version not in (1, 2, 3, 4, SCHEMA_VERSION):
                    raise InputError(f"{self.path}: memory schema version {row[0]!r} is not one this runtime reads "
                                     f"(v1 to v{SCHEMA_VERSION}); the file was left as it is")
                if version == 1:
                    self._migrate_v1()
                if version <= 2:
                    self._migrate_v2()
                # v3 -> v4: the links table and its index come from the DDL above
                if version <= 4:
                    self._migrate_v4()
                self.db.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION),))
            self.db.execute(TURN_KEY_INDEX)
            if FTS_SECURE_DELETE:  # persistent per table: deletes remove the row's terms from the index
                for fts in FTS_TABLES:
                    self.db.execute(f"INSERT INTO {fts}({fts}, rank) VALUES('secure-delete', 1)")

    def _migrate_v1(self) -> None:
        """v1 -> v2 in one transaction: re-token the FTS rows injectively, add nodes.turn_key.

        A v1 file whose ids collided (`a-b` and `a_b`) shared FTS rows under one token; the rows carry
        their own conversation id in the base tables, so re-tokening separates them again.
        """
        cols = [r[1] for r in self.db.execute("PRAGMA table_info(nodes)")]
        if "turn_key" not in cols:
            self.db.execute("ALTER TABLE nodes ADD COLUMN turn_key TEXT")
        for fts, base in FTS_TABLES.items():
            for (conv,) in self.db.execute(f"SELECT DISTINCT conversation_id FROM {base}").fetchall():
                self.db.execute(f"UPDATE {fts} SET conv=? WHERE rowid IN (SELECT id FROM {base} WHERE "
                                "conversation_id=?)", (conv_token(conv).strip('"'), conv))

    def _migrate_v2(self) -> None:
        """v2 -> v3: nodes.speaker, and the provenance table filled from every derived row's sources (the
        new tables and indexes come from the DDL)."""
        if "speaker" not in [r[1] for r in self.db.execute("PRAGMA table_info(nodes)")]:
            self.db.execute("ALTER TABLE nodes ADD COLUMN speaker TEXT")
        self.db.execute(SPEAKER_INDEX)
        for table in DERIVED_TABLES:
            self.db.execute(f"INSERT OR IGNORE INTO provenance SELECT CAST(j.value AS INTEGER), ?, t.id "
                            f"FROM {table} t, json_each(t.sources) j", (table,))
        self.db.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION),))

    def _migrate_v4(self) -> None:
        """v4 -> v5: every stored turn re-keyed from its own content (turnkeys.py), in commit order per
        conversation (the occurrence counter runs in that order). Forgotten turns keep their old keys."""
        from .turnkeys import content_keys

        self.db.execute("DROP INDEX IF EXISTS nodes_turn")  # rebuilt below with the new keys
        for (conv,) in self.db.execute("SELECT DISTINCT conversation_id FROM nodes").fetchall():
            rows = self.db.execute("SELECT id, speaker, user_text, assistant_text FROM nodes WHERE conversation_id=? "
                                   "AND turn_key IS NOT NULL ORDER BY seq", (conv,)).fetchall()
            keys = content_keys((r[1], r[2], r[3]) for r in rows)
            self.db.executemany("UPDATE nodes SET turn_key=? WHERE id=?", [(k, r[0]) for k, r in zip(keys, rows)])

    def close(self) -> None:
        if getattr(self, "checkpoint_pending", False):  # a forget's checkpoint found a reader: retry now
            try:
                self.checkpoint_pending = bool(self.checkpoint())
            except sqlite3.Error:  # the next forget or close checkpoints again
                pass
        self.db.close()
        self.release_writer()
        if getattr(self, "_read_fd", None) is not None:
            os.close(self._read_fd)  # the shared lock of a read-only open
            self._read_fd = None

    # ------------------------------------------------------------------ single writer
    @property
    def lock_path(self) -> str | None:
        return None if self.path == ":memory:" else self.path + ".lock"

    def lock_for_writing(self, timeout_s: float = 0.0) -> None:
        """Take the memory file's writer lock (exclusive flock on `<file>.lock`), waiting up to timeout_s.

        Raises MemoryBusy naming the holder when another process keeps it. The lock goes with the process
        (a killed writer releases it), and is held until close().
        """
        if self._lock_fd is not None or self.lock_path is None:
            return
        if self.read_only:
            raise InputError(f"memory={self.path!r} was opened read-only; this step writes")
        try:  # never through a link: the lock is this memory's own file
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as e:
            raise InputError(f"{self.lock_path}: cannot be the memory's lock file ({e.strerror}; a link is "
                             "never followed)") from None
        deadline = time.monotonic() + max(0.0, float(timeout_s))
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
                    os.close(fd)
                    raise MemoryBusy(
                        f"memory {self.path} is being written by another process (pid {holder}); waited "
                        f"{timeout_s:g} s. Wait for it to finish, or raise store.lock_timeout_s") from None
                time.sleep(0.05)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._lock_fd = fd

    def release_writer(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor drops the flock
            self._lock_fd = None

    @property
    def is_writer(self) -> bool:
        return self._lock_fd is not None

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
            try:
                self.db.execute("ROLLBACK")
            except sqlite3.Error:  # SQLite already rolled back (disk full, I/O error): its own error says why
                pass
            raise
        finally:
            self._in_tx = False

    @contextmanager
    def snapshot(self) -> Iterator[sqlite3.Connection]:
        """Read one committed state: every query inside sees the same commit (a WAL read transaction)."""
        if self._in_tx:
            yield self.db
            return
        self.db.execute("BEGIN DEFERRED")
        self._in_tx = True
        try:
            self.db.execute("SELECT 1 FROM meta LIMIT 1").fetchall()  # start the read snapshot now
            yield self.db
        finally:
            self._in_tx = False
            self.db.execute("COMMIT")

    # ------------------------------------------------------------------ checks
    def content_hash(self) -> str:
        """SHA-256 over every stored row (base tables and FTS contents), in key order."""
        h = hashlib.sha256()
        with self.snapshot():
            for table in DATA_TABLES + tuple(FTS_TABLES):
                order = "key" if table == "meta" else ("rowid" if table.endswith("_fts") else "1")
                sel = f"SELECT rowid, * FROM {table}" if table.endswith("_fts") else f"SELECT * FROM {table}"
                h.update(table.encode())
                for row in self.db.execute(f"{sel} ORDER BY {order}"):
                    h.update(repr(row).encode("utf-8", "backslashreplace"))
        return h.hexdigest()

    def check(self) -> list[str]:
        """Every broken invariant of the file, as messages (empty: consistent).

        SQLite page integrity, FTS5 index integrity, one FTS row per indexed row with its conversation's
        token, forest links (parent in the same conversation, root and depth follow the parent, seq
        0..n-1 per conversation), secondary links (both ends nodes of one conversation, pointing back,
        never to the parent) and provenance (every source is a node of the same conversation).
        """
        bad: list[str] = []
        with self.snapshot():
            ok = self.db.execute("PRAGMA integrity_check").fetchone()[0]
            if ok != "ok":
                bad.append(f"sqlite integrity_check: {ok}")
            for fts, base in FTS_TABLES.items():
                try:
                    self.db.execute(f"INSERT INTO {fts}({fts}) VALUES('integrity-check')")
                except SQLITE_ERRORS as e:
                    bad.append(f"{fts}: {damage_text(e)}")
                where = " WHERE parent_id IS NULL" if fts == "root_fts" else ""
                want = {int(i): conv_token(c).strip('"') for i, c in
                        self.db.execute(f"SELECT id, conversation_id FROM {base}{where}")}
                have = {int(i): c for i, c in self.db.execute(f"SELECT rowid, conv FROM {fts}")}
                if fts == "root_fts":  # a root gets its anchor in the same commit as its node
                    missing = set(want) - set(have)
                else:
                    missing = set(want) ^ set(have)
                if missing:
                    bad.append(f"{fts}: rows {sorted(missing)[:5]} without a counterpart in {base}")
                wrong = [i for i in set(want) & set(have) if want[i] != have[i]]
                if wrong:
                    bad.append(f"{fts}: rows {sorted(wrong)[:5]} carry another conversation's token")
            nodes = {int(r[0]): r for r in self.db.execute(
                "SELECT id, conversation_id, seq, parent_id, root_id, depth FROM nodes")}
            seqs: dict[str, list[int]] = {}
            for nid, (_, conv, seq, parent, root, depth) in nodes.items():
                seqs.setdefault(conv, []).append(int(seq))
                if parent is None:
                    if root != nid or depth != 0:
                        bad.append(f"node {nid}: a root must have root_id=id and depth 0")
                    continue
                p = nodes.get(int(parent))
                if p is None or p[1] != conv:
                    bad.append(f"node {nid}: parent {parent} is not a node of conversation {conv!r}")
                elif root != p[4] or depth != p[5] + 1 or seq <= p[2]:
                    bad.append(f"node {nid}: root/depth/seq do not follow parent {parent}")
            for conv, ss in seqs.items():  # gaps are left by forget; order and uniqueness are not
                if len(set(ss)) != len(ss):
                    bad.append(f"conversation {conv!r}: two nodes share a seq")
            prov = {(int(n), k, int(i)) for n, k, i in self.db.execute("SELECT node_id, kind, item_id FROM provenance")}
            want_prov = set()
            for table in DERIVED_TABLES:
                for rid, conv, sources, stamps in self.db.execute(
                        f"SELECT id, conversation_id, sources, timestamps FROM {table}"):
                    src_list = json.loads(sources)
                    if not src_list:
                        bad.append(f"{table} row {rid}: no source node")
                    if len(json.loads(stamps)) != len(src_list):
                        bad.append(f"{table} row {rid}: sources and timestamps differ in length")
                    for src in src_list:
                        want_prov.add((int(src), table, int(rid)))
                        n = nodes.get(int(src))
                        if n is None or n[1] != conv:
                            bad.append(f"{table} row {rid}: source {src} is not a node of conversation {conv!r}")
            if prov != want_prov:
                diff = sorted(prov ^ want_prov)[:5]
                bad.append(f"provenance: {len(prov ^ want_prov)} entries differ from the rows' sources, e.g. {diff}")
            for table in ("records", "artifacts"):
                ids = {int(r[0]): (r[1], r[2]) for r in self.db.execute(
                    f"SELECT id, supersedes, superseded_by FROM {table}")}
                for rid, (sup, by) in ids.items():
                    if sup is not None and (sup not in ids or ids[sup][1] != rid):
                        bad.append(f"{table} row {rid}: supersedes {sup}, which is not superseded by it")
                    if by is not None and (by not in ids or ids[by][0] != rid):
                        bad.append(f"{table} row {rid}: superseded by {by}, which does not supersede it")
            for nid, target, conv in self.db.execute("SELECT node_id, target_id, conversation_id FROM links"):
                n, t = nodes.get(int(nid)), nodes.get(int(target))
                if n is None or t is None or n[1] != conv or t[1] != conv:
                    bad.append(f"link {nid} -> {target}: not two nodes of conversation {conv!r}")
                elif t[2] >= n[2] or int(target) == n[3]:
                    bad.append(f"link {nid} -> {target}: a link points to an earlier node other than the parent")
            for (tk_conv, n) in self.db.execute("SELECT conversation_id, COUNT(*) FROM index_tombstones "
                                                "WHERE node_id IN (SELECT id FROM nodes) GROUP BY 1"):
                bad.append(f"conversation {tk_conv!r}: {n} index tombstones name live nodes")
        return bad

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
                    entities=json.loads(row[12]), keywords=json.loads(row[13]), embedding=emb, speaker=row[15])

    def next_seq(self, conv: str) -> int:
        row = self.db.execute("SELECT COALESCE(MAX(seq) + 1, 0) FROM nodes WHERE conversation_id=?", (conv,)).fetchone()
        return int(row[0])

    def insert_node(self, n: Node, turn_key: str | None = None) -> int:
        """Insert a node; id and root_id are assigned when n.id < 0 (root_id=-1 means "itself").

        turn_key: the identity of the source turn (unique per conversation; see `turn_keys`)."""
        emb = n.embedding.astype(np.float32).tobytes() if n.embedding is not None else None
        # ids are never reused after a forget (an id names one turn forever: caches, exports, index labels)
        floor = self.get_meta("node_id_floor")
        new_id = None
        if floor is not None:
            top = self.db.execute("SELECT COALESCE(MAX(id), 0) FROM nodes").fetchone()[0]
            new_id = max(int(floor), int(top)) + 1
        cur = self.db.execute(
            f"INSERT INTO nodes({_NODE_COLS}, turn_key) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (new_id, n.conversation_id, n.seq, n.timestamp, n.parent_id, n.root_id, n.depth, n.user_text,
             n.assistant_text, n.node_summary, n.path_summary, n.topic_key, json.dumps(n.entities),
             json.dumps(n.keywords), emb, n.speaker, turn_key),
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

    def turn_keys(self, conv: str) -> set[str]:
        """Identities of the turns stored for a conversation (nodes committed with a turn_key)."""
        return {r[0] for r in self.db.execute(
            "SELECT turn_key FROM nodes WHERE conversation_id=? AND turn_key IS NOT NULL", (conv,))}

    def nodes_with_turn_keys(self, conv: str, keys: set[str]) -> list[int]:
        """The ids of a conversation's nodes stored with these turn keys, in commit order."""
        if not keys:
            return []
        rows = self.db.execute("SELECT id, turn_key FROM nodes WHERE conversation_id=? AND turn_key IS NOT NULL "
                               "ORDER BY seq", (conv,)).fetchall()
        return [int(i) for i, k in rows if k in keys]

    def forgotten_turn_keys(self, conv: str) -> set[str]:
        """Identities of turns forgotten on request: a replayed transcript must not bring them back."""
        return {r[0] for r in self.db.execute(
            "SELECT turn_key FROM forgotten_turns WHERE conversation_id=?", (conv,))}

    def add_provenance(self, node_id: int, kind: str, item_id: int) -> None:
        self.db.execute("INSERT OR IGNORE INTO provenance VALUES(?,?,?)", (node_id, kind, item_id))

    def root_topic(self, root_id: int) -> str | None:
        """The topic anchor a branch root has in the root index, or None."""
        row = self.db.execute("SELECT topic FROM root_fts WHERE rowid=?", (root_id,)).fetchone()
        return row[0] if row else None

    def branch_entities(self, root_id: int) -> Iterator[list[str]]:
        """The entities of a branch's nodes, in commit order."""
        for (ents,) in self.db.execute("SELECT entities FROM nodes WHERE root_id=? ORDER BY seq", (root_id,)):
            yield json.loads(ents)

    def node_ids(self, conv: str) -> list[int]:
        """Every node id of a conversation, in id order."""
        return [int(r[0]) for r in self.db.execute("SELECT id FROM nodes WHERE conversation_id=? ORDER BY id", (conv,))]

    def embeddings(self, conv: str) -> list[tuple[int, bytes]]:
        """(node id, stored embedding bytes) of a conversation's embedded nodes, in id order."""
        return [(int(r[0]), r[1]) for r in self.db.execute(
            "SELECT id, embedding FROM nodes WHERE conversation_id=? AND embedding IS NOT NULL ORDER BY id", (conv,))]

    def tombstones(self, conv: str) -> set[int]:
        """Node ids forgotten in SQLite whose vectors a saved index may still hold."""
        return {int(r[0]) for r in self.db.execute(
            "SELECT node_id FROM index_tombstones WHERE conversation_id=?", (conv,))}

    def clear_tombstones(self, conv: str) -> None:
        with self.transaction():
            self.db.execute("DELETE FROM index_tombstones WHERE conversation_id=?", (conv,))

    def data_version(self) -> int:
        """SQLite's change counter for this connection: it moves when another connection (another process)
        commits, and costs one pragma to read (https://sqlite.org/pragma.html#pragma_data_version)."""
        return int(self.db.execute("PRAGMA data_version").fetchone()[0])

    def rebuild_text_indexes(self) -> None:
        """Rebuild every FTS5 index from the rows it holds (derived: `command=repair`)."""
        with self.transaction():
            for fts in FTS_TABLES:
                self.db.execute(f"INSERT INTO {fts}({fts}) VALUES('rebuild')")

    CHECKPOINT_WAIT_MS = 2000  # how long a checkpoint waits for readers of an old snapshot to finish

    def checkpoint(self) -> int:
        """Truncate the write-ahead log into the file; 1 when a reader's snapshot kept it busy (after waiting
        up to CHECKPOINT_WAIT_MS for it, not the 30 s a write waits)."""
        self.db.execute(f"PRAGMA busy_timeout={self.CHECKPOINT_WAIT_MS}")
        try:
            return int(self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0])
        finally:
            self.db.execute("PRAGMA busy_timeout=30000")

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
        """The node, or None (also for an id SQLite cannot hold: beyond 64 bits)."""
        if not -2**63 <= int(node_id) < 2**63:
            return None
        row = self.db.execute(f"SELECT {_NODE_COLS} FROM nodes WHERE id=?", (node_id,)).fetchone()
        return self._node(row) if row else None

    def get_nodes(self, ids: list[int]) -> dict[int, Node]:
        if not ids:
            return {}
        out: dict[int, Node] = {}
        for chunk in _chunks(ids):
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

    def conversations(self) -> dict[str, int]:
        """Every conversation of the file and its node count, by id."""
        return {c: n for c, n in self.db.execute(
            "SELECT conversation_id, COUNT(*) FROM nodes GROUP BY conversation_id ORDER BY 1")}

    def reset(self) -> dict[str, int]:
        """Empty the file in one transaction (the writer lock held): every conversation, every table but the
        schema version. Returns the node counts removed, by conversation."""
        removed = self.conversations()
        with self.transaction():
            for table in DATA_TABLES[1:] + tuple(FTS_TABLES):
                self.db.execute(f"DELETE FROM {table}")
            self.db.execute("DELETE FROM meta WHERE key != 'schema_version'")
        return removed

    # ------------------------------------------------------------------ portable dump (export / import)
    DUMP_FORMAT, DUMP_VERSION = "arbormem-memory", 1
    DUMP_META = ("embedding_dim", "embedder", "node_id_floor")

    def _dump_where(self, conv: str) -> dict[str, tuple[str, tuple]]:
        """Per table, the WHERE clause selecting one conversation's rows (ordered by key)."""
        nodes = "(SELECT id FROM nodes WHERE conversation_id=?)"
        where = {t: ("conversation_id=?", (conv,)) for t in ("nodes", "facts", "records", "artifacts", "events",
                                                             "forgotten_turns", "index_tombstones", "links")}
        where["forked_roots"] = (f"root_id IN {nodes}", (conv,))
        where["provenance"] = (f"node_id IN {nodes}", (conv,))
        for fts, base in FTS_TABLES.items():
            where[fts] = (f"rowid IN (SELECT id FROM {base} WHERE conversation_id=?)", (conv,))
        return where

    def dump(self, conv: str) -> dict[str, Any]:
        """Every stored row of one conversation (and the file's embedder settings), as JSON values: what
        `load_dump` restores, row for row (blobs as base64)."""
        import base64

        def cell(v):
            return {"b64": base64.b64encode(v).decode()} if isinstance(v, bytes) else v

        tables = {}
        with self.snapshot():
            for table, (where, args) in self._dump_where(conv).items():
                fts = table in FTS_TABLES
                n = len(self.db.execute(f"PRAGMA table_info({table})").fetchall())
                order = "rowid" if fts else ", ".join(str(i + 1) for i in range(min(n, 3)))
                cur = self.db.execute(f"SELECT {'rowid, ' if fts else ''}* FROM {table} WHERE {where} ORDER BY {order}",
                                      args)
                cols = [d[0] for d in cur.description]
                tables[table] = {"columns": cols, "rows": [[cell(v) for v in r] for r in cur]}
            meta = {k: self.get_meta(k) for k in self.DUMP_META if self.get_meta(k) is not None}
        return {"format": self.DUMP_FORMAT, "version": self.DUMP_VERSION, "schema_version": SCHEMA_VERSION,
                "conversation_id": conv, "meta": meta, "tables": tables}

    def load_dump(self, dump: Any, source: str) -> tuple[str, int]:
        """Restore a `dump` into this file, in one transaction; refused (naming `source` and the field) when
        malformed, when the file already holds its conversation, or when the embedders differ. Returns the
        conversation id and its node count."""
        import base64

        def bad(msg: str) -> InputError:
            return InputError(f"{source}: {msg}; nothing was imported")

        if not isinstance(dump, dict) or dump.get("format") != self.DUMP_FORMAT:
            raise bad(f"field 'memory.format' must be {self.DUMP_FORMAT!r} (write the file with command=export)")
        if dump.get("version") != self.DUMP_VERSION or dump.get("schema_version") != SCHEMA_VERSION:
            raise bad(f"fields 'memory.version'/'memory.schema_version' are {dump.get('version')!r}/"
                      f"{dump.get('schema_version')!r}; this runtime reads {self.DUMP_VERSION}/{SCHEMA_VERSION}")
        conv, meta, tables = dump.get("conversation_id"), dump.get("meta"), dump.get("tables")
        if not isinstance(conv, str) or not conv:
            raise bad("field 'memory.conversation_id' must be a non-empty string")
        if not isinstance(meta, dict) or not all(k in self.DUMP_META and isinstance(v, str) for k, v in meta.items()):
            raise bad(f"field 'memory.meta' must map some of {', '.join(self.DUMP_META)} to strings")
        for k in ("embedding_dim", "node_id_floor"):
            if k in meta and not meta[k].isdigit():
                raise bad(f"field 'memory.meta.{k}' must be a whole number, got {meta[k]!r}")
        want = self._dump_where(conv)
        if not isinstance(tables, dict) or set(tables) != set(want):
            raise bad(f"field 'memory.tables' must hold exactly the tables {', '.join(sorted(want))}")
        if conv in self.conversations():
            raise bad(f"memory {self.path} already holds conversation {conv!r} (import into a new file, or "
                      "forget it first)")
        for k in ("embedding_dim", "embedder"):
            have = self.get_meta(k)
            if have is not None and k in meta and have != meta[k]:
                raise bad(f"its {k} is {meta[k]!r}, this memory's is {have!r}")
        rows_by_table = {}
        for table in want:
            t = tables[table]
            fts = table in FTS_TABLES
            cols = (["rowid"] if fts else []) + [r[1] for r in self.db.execute(f"PRAGMA table_info({table})")]
            if not isinstance(t, dict) or t.get("columns") != cols or not isinstance(t.get("rows"), list):
                raise bad(f"field 'memory.tables.{table}' must be {{columns: {cols}, rows: [...]}}")
            rows = []
            for i, r in enumerate(t["rows"]):
                if not isinstance(r, list) or len(r) != len(cols):
                    raise bad(f"memory.tables.{table}.rows[{i}] must be a list of {len(cols)} values")
                row = []
                for c, v in zip(cols, r):
                    if isinstance(v, dict) and set(v) == {"b64"} and isinstance(v["b64"], str):
                        try:
                            v = base64.b64decode(v["b64"], validate=True)
                        except ValueError:
                            raise bad(f"memory.tables.{table}.rows[{i}].{c} is not valid base64") from None
                    elif not (v is None or isinstance(v, (str, float)) or (isinstance(v, int) and not isinstance(v, bool))):
                        raise bad(f"memory.tables.{table}.rows[{i}].{c} must be a string, number, null or "
                                  f"{{b64}}, got {type(v).__name__}")
                    elif isinstance(v, int) and not -2**63 <= v < 2**63:
                        raise bad(f"memory.tables.{table}.rows[{i}].{c} = {v} is beyond 64 bits")
                    row.append(v)
                rows.append(row)
            rows_by_table[table] = (cols, rows)
        order = ["nodes", "links", "forked_roots", "facts", "records", "artifacts", "events", "provenance",
                 "forgotten_turns", "index_tombstones", *FTS_TABLES]
        try:
            with self.transaction():
                self.db.execute("PRAGMA defer_foreign_keys=ON")  # parents and revision links in any row order
                for k, v in meta.items():
                    if k == "node_id_floor":
                        v = str(max(int(v), int(self.get_meta(k) or 0)))
                    self.set_meta(k, v)
                for table in order:
                    cols, rows = rows_by_table[table]
                    for i, row in enumerate(rows):
                        try:
                            self.db.execute(f"INSERT INTO {table}({', '.join(cols)}) VALUES({', '.join('?' * len(cols))})",
                                            row)
                        except sqlite3.IntegrityError as e:
                            raise bad(f"memory.tables.{table}.rows[{i}]: {e}") from None
                problems = [p for p in self.check() if "integrity_check" not in p]
                if problems:
                    raise bad("the rows are not a consistent memory: " + "; ".join(problems[:3]))
        except sqlite3.IntegrityError as e:
            raise bad(f"the rows are not a consistent memory: {e}") from None
        return conv, len(rows_by_table["nodes"][1])

    def speakers(self, conv: str) -> set[str]:
        return {r[0] for r in self.db.execute(
            "SELECT DISTINCT speaker FROM nodes WHERE conversation_id=? AND speaker IS NOT NULL", (conv,))}

    def latest_by_speaker(self, conv: str, speaker: str, k: int) -> list[int]:
        """Ids of the speaker's k most recent nodes, newest first."""
        return [int(r[0]) for r in self.db.execute(
            "SELECT id FROM nodes WHERE conversation_id=? AND speaker=? ORDER BY seq DESC LIMIT ?", (conv, speaker, k))]

    def count_by_speaker_since(self, conv: str, speaker: str, seq: int) -> int:
        """How many nodes the speaker wrote after position seq."""
        return int(self.db.execute("SELECT COUNT(*) FROM nodes WHERE conversation_id=? AND speaker=? AND seq>?",
                                   (conv, speaker, seq)).fetchone()[0])

    def recent_ids(self, conv: str, k: int) -> list[int]:
        return [int(r[0]) for r in self.db.execute(
            "SELECT id FROM nodes WHERE conversation_id=? ORDER BY seq DESC LIMIT ?", (conv, k))]

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

    def children(self, node_ids, per_node: int | None = None) -> dict[int, list[int]]:
        """Each node's children, oldest first (its first `per_node` of them when given): the states that
        continued it."""
        out: dict[int, list[int]] = {int(i): [] for i in node_ids}
        if per_node is not None and per_node <= 0:
            return out
        for chunk in _chunks(out):
            for pid, cid in self.db.execute(
                    f"SELECT parent_id, id FROM nodes WHERE parent_id IN ({','.join('?' * len(chunk))}) ORDER BY seq",
                    chunk):
                if per_node is None or len(out[pid]) < per_node:
                    out[pid].append(int(cid))
        return out

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

    def subtree(self, node_id: int) -> set[int]:
        """The node and every node below it."""
        return {int(r[0]) for r in self.db.execute(
            """WITH RECURSIVE down(id) AS (SELECT ? UNION ALL
               SELECT n.id FROM nodes n JOIN down ON n.parent_id = down.id) SELECT id FROM down""", (node_id,))}

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

    max_postings = 2000  # fts_search leaves out terms found in more rows than this (runtime.recall)

    def term_rows(self, table: str, terms: list[str]) -> dict[str, int]:
        """How many rows of an FTS5 table (every conversation) hold each term, from its fts5vocab view (a
        temp table: nothing is written to the file). Terms are stemmed as the table's porter tokenizer does."""
        vocab = f"temp.{table}_vocab"
        if not getattr(self, "_vocab", None):
            self._vocab: set[str] = set()
        if table not in self._vocab:
            self.db.execute(f"CREATE VIRTUAL TABLE IF NOT EXISTS {vocab} USING fts5vocab(main, {table}, 'row')")
            self._vocab.add(table)
        out = {}
        for t in terms:
            row = self.db.execute(f"SELECT doc FROM {vocab} WHERE term=?", (_porter(t),)).fetchone()
            out[t] = int(row[0]) if row else 0
        return out

    def _query(self, table: str, text: str) -> str | None:
        """The FTS5 OR-query of text's content words, less those held by more than `max_postings` rows."""
        words = fts_terms(text)
        if words and self.max_postings:
            df = self.term_rows(table, words)
            words = [w for w in words if df[w] <= self.max_postings]
        return " OR ".join(f'"{t}"' for t in words) or None

    def fts_search(self, table: str, conv: str, text: str, k: int) -> list[tuple[int, float]]:
        """BM25 search of one conversation's rows in an FTS5 table (columns: conv, then the text column).

        A term held by more than `max_postings` rows is left out: BM25 would score every row holding it
        (the cost grew with the conversation on common words) while its weight is close to nothing. A
        text made only of such terms finds nothing here; the other recall channels still run."""
        q = self._query(table, text)
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
                self.add_provenance(node_id, "facts", int(row[0]))
            return int(row[0])
        cur = self.db.execute(
            "INSERT INTO facts(conversation_id, text, entities, tags, sources, timestamps, seq, root_id) "
            "VALUES(?,?,?,?,?,?,?,?)",
            (conv, text, json.dumps(entities), json.dumps(tags), json.dumps([node_id]), json.dumps([ts]), seq, root_id))
        fid = int(cur.lastrowid)
        self.add_provenance(node_id, "facts", fid)
        self.db.execute("INSERT INTO fact_fts(rowid, conv, lex) VALUES(?,?,?)",
                        (fid, conv_token(conv).strip('"'), text + " " + " ".join(entities)))
        return fid

    def search_facts(self, conv: str, text: str, k: int) -> list[tuple[AtomicFact, float]]:
        q = self._query("fact_fts", text)
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
        self.add_provenance(node_id, "records", rid)
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
        self.add_provenance(node_id, "records", rec.id)

    def records_from(self, node_ids: list[int]) -> dict[int, list[StateRecord]]:
        """The state records each of these nodes is a source of (provenance), oldest first."""
        out: dict[int, list[StateRecord]] = {}
        if not node_ids:
            return out
        q = (f"SELECT p.node_id, {', '.join('r.' + c.strip() for c in self._REC_COLS.split(','))} FROM provenance p "
             f"JOIN records r ON r.id = p.item_id WHERE p.kind = 'records' "
             f"AND p.node_id IN ({','.join('?' * len(node_ids))}) ORDER BY r.seq, r.id")
        for row in self.db.execute(q, list(node_ids)):
            out.setdefault(int(row[0]), []).append(self._rec(row[1:]))
        return out

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
        self.add_provenance(node_id, "artifacts", aid)
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
        self.add_provenance(node_id, "events", eid)
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

    # ------------------------------------------------------------------ secondary links
    def add_link(self, conv: str, node_id: int, target_id: int, confidence: float) -> None:
        """A secondary link: node_id (a multi-intent turn) also continues target_id's trajectory
        (`confidence`: the reranker's score of the target when the turn was routed)."""
        self.db.execute("INSERT OR REPLACE INTO links VALUES(?,?,?,?)", (node_id, target_id, conv, float(confidence)))

    def links_from(self, node_ids: list[int]) -> list[tuple[int, int, float]]:
        """(node, target, confidence) of the links leaving these nodes, in node order."""
        if not node_ids:
            return []
        q = f"SELECT node_id, target_id, confidence FROM links WHERE node_id IN ({','.join('?' * len(node_ids))})"
        return sorted((int(a), int(b), float(c)) for a, b, c in self.db.execute(q, node_ids))

    def links_to(self, node_ids: list[int]) -> list[tuple[int, int, float]]:
        """(node, target, confidence) of the links arriving at these nodes (index links_target)."""
        if not node_ids:
            return []
        q = f"SELECT node_id, target_id, confidence FROM links WHERE target_id IN ({','.join('?' * len(node_ids))})"
        return sorted((int(a), int(b), float(c)) for a, b, c in self.db.execute(q, node_ids))

    def links(self, conv: str) -> list[dict[str, Any]]:
        return [{"node_id": int(a), "target_id": int(b), "confidence": round(float(c), 4)} for a, b, c in self.db.execute(
            "SELECT node_id, target_id, confidence FROM links WHERE conversation_id=? ORDER BY node_id, target_id", (conv,))]

    def counts(self, conv: str) -> dict[str, int]:
        out = {}
        for table in ("nodes", "facts", "records", "artifacts", "events"):
            out[table] = int(self.db.execute(f"SELECT COUNT(*) FROM {table} WHERE conversation_id=?",
                                             (conv,)).fetchone()[0])
        out["roots"] = int(self.db.execute("SELECT COUNT(*) FROM nodes WHERE conversation_id=? AND parent_id IS NULL",
                                           (conv,)).fetchone()[0])
        out["links"] = int(self.db.execute("SELECT COUNT(*) FROM links WHERE conversation_id=?", (conv,)).fetchone()[0])
        return out

    # ------------------------------------------------------------------ erasure (runtime/forget.py decides what)
    # The statements forgetting runs, each a step of the cascade that forget.py orders inside one transaction.
    def nodes_matching(self, conv: str, phrase: str) -> list[int]:
        """The conversation's nodes whose lexical index holds `phrase` (an FTS5 phrase query)."""
        return [int(r[0]) for r in self.db.execute("SELECT rowid FROM node_fts WHERE node_fts MATCH ?",
                                                   (f"conv:{conv_token(conv)} AND lex:{phrase}",))]

    def items_matching(self, conv: str, table: str, phrase: str) -> list[tuple[int, tuple]]:
        """(id, row) of the conversation's derived items of `table` whose lexical index holds `phrase`."""
        fts = DERIVED_FTS[table]
        out = []
        for (iid,) in self.db.execute(f"SELECT rowid FROM {fts} WHERE {fts} MATCH ?",
                                      (f"conv:{conv_token(conv)} AND lex:{phrase}",)).fetchall():
            row = self.db.execute(f"SELECT * FROM {table} WHERE id=?", (iid,)).fetchone()
            if row is not None:
                out.append((int(iid), tuple(row)))
        return out

    def node_rows(self, ids) -> dict[int, tuple]:
        """id -> (id, parent_id, root_id, seq, turn_key) of these nodes (those that exist)."""
        out: dict[int, tuple] = {}
        for chunk in _chunks(ids):
            for r in self.db.execute(f"SELECT id, parent_id, root_id, seq, turn_key FROM nodes WHERE id IN "
                                     f"({','.join('?' * len(chunk))})", chunk):
                out[int(r[0])] = tuple(r)
        return out

    def items_citing(self, table: str, node_ids) -> set[int]:
        """The derived items of `table` that cite any of these nodes (provenance)."""
        out: set[int] = set()
        for chunk in _chunks(node_ids):
            out |= {int(r[0]) for r in self.db.execute(
                f"SELECT item_id FROM provenance WHERE kind=? AND node_id IN ({','.join('?' * len(chunk))})",
                (table, *chunk))}
        return out

    def item_sources(self, table: str, iid: int) -> tuple[list[int], list] | None:
        """(source node ids, their timestamps) of a derived item, or None when it is gone."""
        r = self.db.execute(f"SELECT sources, timestamps FROM {table} WHERE id=?", (iid,)).fetchone()
        return None if r is None else (json.loads(r[0]), json.loads(r[1]))

    def trim_item_sources(self, table: str, iid: int, sources: list[int], timestamps: list,
                          clear_evidence: bool = False) -> None:
        """Keep only these sources of an item (and drop a record's evidence quote, quoted from a forgotten turn)."""
        sets = {"sources": json.dumps(sources), "timestamps": json.dumps(timestamps)}
        if clear_evidence:
            sets["evidence"] = ""
        self.db.execute(f"UPDATE {table} SET {', '.join(f'{k}=?' for k in sets)} WHERE id=?", (*sets.values(), iid))

    def delete_item(self, table: str, iid: int, sources: list[int]) -> bool:
        """Delete a derived item, its FTS row and provenance; a record's or artifact's revision chain is
        re-linked around it (the value it superseded is current again; a chain it headed gets the next
        record as its head). Returns whether a revision link was re-linked."""
        db, relinked = self.db, False
        if table in ("records", "artifacts"):
            sup, by = db.execute(f"SELECT supersedes, superseded_by FROM {table} WHERE id=?", (iid,)).fetchone()
            if by is not None:
                db.execute(f"UPDATE {table} SET supersedes=? WHERE id=?", (sup, by))
            if sup is not None:
                db.execute(f"UPDATE {table} SET superseded_by=? WHERE id=?", (by, sup))
            relinked = sup is not None or by is not None
            if table == "records":
                head = db.execute("SELECT id FROM records WHERE chain_id=? AND id<>? ORDER BY seq, id LIMIT 1",
                                  (iid, iid)).fetchone()
                if head is not None:
                    db.execute("UPDATE records SET chain_id=? WHERE chain_id=? AND id<>?", (head[0], iid, iid))
        db.execute(f"DELETE FROM {DERIVED_FTS[table]} WHERE rowid=?", (iid,))
        db.executemany("DELETE FROM provenance WHERE node_id=? AND kind=? AND item_id=?",
                       [(s, table, iid) for s in sources])
        db.execute(f"DELETE FROM {table} WHERE id=?", (iid,))
        return relinked

    def drop_provenance(self, node_ids) -> None:
        for chunk in _chunks(node_ids):
            self.db.execute(f"DELETE FROM provenance WHERE node_id IN ({','.join('?' * len(chunk))})", chunk)

    def reparent(self, node_id: int, parent_id: int | None) -> None:
        """Attach a node below parent_id (None: a root); a secondary link to its new parent goes (the forest
        says it already)."""
        self.db.execute("UPDATE nodes SET parent_id=? WHERE id=?", (parent_id, node_id))
        self.db.execute("DELETE FROM links WHERE node_id=? AND target_id IS ?", (node_id, parent_id))

    def delete_nodes(self, conv: str, rows: dict[int, tuple]) -> None:
        """Delete these nodes (`node_rows`; none may still be a parent) with their FTS rows and forked-root
        flags (links go by ON DELETE CASCADE); remember their turns' identities (`forgotten_turns`: a
        re-ingest does not bring them back) and their index labels (`index_tombstones`), and raise the node
        id floor so no id is ever reused."""
        db = self.db
        for chunk in _chunks(sorted(rows, key=lambda n: -rows[n][3])):  # newest first
            q = ",".join("?" * len(chunk))
            db.execute(f"DELETE FROM node_fts WHERE rowid IN ({q})", chunk)
            db.execute(f"DELETE FROM root_fts WHERE rowid IN ({q})", chunk)
            db.execute(f"DELETE FROM forked_roots WHERE root_id IN ({q})", chunk)
            db.execute(f"DELETE FROM nodes WHERE id IN ({q})", chunk)
        db.executemany("INSERT OR IGNORE INTO forgotten_turns VALUES(?,?)",
                       [(conv, rows[n][4]) for n in rows if rows[n][4] is not None])
        db.executemany("INSERT OR IGNORE INTO index_tombstones VALUES(?,?)", [(conv, n) for n in rows])
        if rows:
            self.set_meta("node_id_floor", str(max(int(self.get_meta("node_id_floor") or 0), max(rows))))

    def mark_forked(self, root_id: int) -> None:
        self.db.execute("INSERT OR IGNORE INTO forked_roots VALUES(?)", (root_id,))

    def set_node_fields(self, node_id: int, fields: dict[str, Any]) -> None:
        """Rewrite these columns of a node (parent, root, depth, topic key, path summary after a move)."""
        self.db.execute(f"UPDATE nodes SET {', '.join(f'{k}=?' for k in fields)} WHERE id=?",
                        (*fields.values(), node_id))

    def fix_depths(self, tops: list[int]) -> int:
        """Depth = parent's depth + 1 over the subtrees of these nodes, each node visited once (nested
        subtrees are one pass); returns the rows changed."""
        db = self.db
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

    def reroot_items(self, roots) -> None:
        """Derived items that named one of these (deleted) roots as theirs follow their first source's root."""
        db = self.db
        for table in DERIVED_TABLES:
            for root in sorted(roots):
                for iid, sources in db.execute(f"SELECT id, sources FROM {table} WHERE root_id=?", (root,)).fetchall():
                    new = db.execute("SELECT root_id FROM nodes WHERE id=?", (json.loads(sources)[0],)).fetchone()
                    db.execute(f"UPDATE {table} SET root_id=? WHERE id=?", (new[0], iid))

    def purge_deleted_terms(self) -> None:
        """An SQLite without FTS5 secure-delete keeps a deleted row's terms until a merge: merge now."""
        if not FTS_SECURE_DELETE:
            for fts in FTS_TABLES:
                self.db.execute(f"INSERT INTO {fts}({fts}) VALUES('optimize')")
