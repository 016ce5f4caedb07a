"""Approximate nearest-neighbour index over node embeddings (hnswlib, HNSW graphs).

The index is *derived*: embeddings live in SQLite, and the index file is a cache that is saved on
close (and every `save_every` additions). On open it is loaded and caught up with the nodes SQLite
holds beyond it; an index that is missing, unreadable or ahead of the database (a crash between the
SQLite commit and a save cannot cause that, but a copied or edited file could) is rebuilt.

Forgetting: `remove` overwrites a node's vector with zeros, then marks its label deleted (hnswlib never
returns a deleted label), so the saved file keeps no trace of the forgotten embedding. The labels are
also listed in SQLite (`index_tombstones`, written in the forget's transaction), so a file saved before
a crash is brought up to date on open. When deleted labels pass `compact_deleted_share` of the file,
`remove` rebuilds the index from SQLite (graph quality and file size return to a fresh build's).

Trust: hnswlib trusts its file (a few changed header bytes make it read out of bounds and end the
process with SIGSEGV), so every save also writes the file's sha256 beside it (`<file>.sha256`), and a
file whose checksum is missing or differs is never loaded: it is rebuilt from SQLite. Temp files that a
killed process left (`<file>.<pid>.tmp`, holding vectors a forget may since have removed) are deleted on
open.

Sessions in several processes: SQLite's change counter (`PRAGMA data_version`) is read before every
search and every save. When another process has committed since (an ingest, a forget), the graph is
brought in line with SQLite first: nodes it lacks are added, and labels SQLite no longer has are zeroed
and deleted, so a search never returns a forgotten node and a save never writes one back.

Why hnswlib: a small, well-kept C++ library with Python wheels, incremental `add_items`, filtered and
exact-k queries, and O(log n) search; faiss-cpu would also do, at ~10x the install size.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from pathlib import Path

import hnswlib
import numpy as np

from ..errors import InputError
from .store import Store

log = logging.getLogger(__name__)


class VectorIndex:
    def __init__(self, store: Store, conversation_id: str, dim: int, path: Path | None, ef_search: int = 64,
                 M: int = 16, ef_construction: int = 100, save_every: int = 1000, initial_capacity: int = 1024,
                 compact_deleted_share: float = 0.25, read_only: bool = False):
        self.store, self.conv, self.dim, self.path = store, conversation_id, dim, path
        self.read_only = read_only  # never saves; catches up and rebuilds in memory only
        self.ef_search, self.M, self.ef_construction, self.save_every = ef_search, M, ef_construction, save_every
        self.initial_capacity = initial_capacity
        self.compact_deleted_share = compact_deleted_share
        self._unsaved = 0
        self._deleted: set[int] = set()  # labels in the graph that are marked deleted
        self._version: int | None = None  # the store's data_version the graph is in line with
        self._open()

    # ------------------------------------------------------------------ lifecycle
    def _new(self, capacity: int) -> hnswlib.Index:
        idx = hnswlib.Index(space="ip", dim=self.dim)  # embeddings are L2-normalised: ip == cosine
        idx.init_index(max_elements=max(capacity, 16), ef_construction=self.ef_construction, M=self.M,
                       allow_replace_deleted=False)
        idx.set_ef(self.ef_search)
        return idx

    def _open(self) -> None:
        self.index: hnswlib.Index | None = None
        if self.path is not None:
            folder = self.path.parent
            if folder.exists() and not folder.is_dir():
                raise InputError(f"{folder}: the memory's vector index folder is not a folder; move it away "
                                 f"(the index is derived, and is rebuilt from {self.store.path})")
            if not self.read_only:
                self._remove_dead_temp_files()
        if self.path is not None and self.path.exists():
            why = index_file_problem(self.path)
            if why:
                log.warning("vector index %s %s; rebuilding it from the database", self.path, why)
            else:
                try:
                    idx = hnswlib.Index(space="ip", dim=self.dim)
                    idx.load_index(str(self.path), max_elements=0)
                    idx.set_ef(self.ef_search)
                    self.index = idx
                except Exception as e:  # unreadable cache: rebuild from SQLite
                    log.warning("vector index %s unreadable (%s); rebuilding from the database", self.path, e)
        ids = set(self.index.get_ids_list()) if self.index is not None else set()
        db_ids = set(self.store.node_ids(self.conv))
        gone = self.store.tombstones(self.conv) & ids
        if self.index is not None and not (ids - gone) <= db_ids:
            log.warning("vector index %s holds nodes the database does not; rebuilding", self.path)
            self.index, ids, gone = None, set(), set()
        for label in sorted(gone):  # forgotten in SQLite; a file saved before the forget still holds them
            self._scrub(label)
        ids -= gone
        if self.index is None:
            self.index = self._new(max(self.initial_capacity, 2 * len(db_ids)))
        missing = sorted(db_ids - ids)
        if missing:
            got = self.store.get_nodes(missing)
            vecs = [(i, got[i].embedding) for i in missing if got[i].embedding is not None]
            if vecs:
                self.add([i for i, _ in vecs], np.stack([v for _, v in vecs]), autosave=False)
                self.save()
        elif self.path is not None and not self.path.exists() and len(db_ids) == 0:
            self._unsaved = 0
        self._version = self.store.data_version()

    def _remove_dead_temp_files(self) -> None:
        """Delete `<index>.<pid>.tmp` files whose process is gone (a save killed half-way)."""
        folder = self.path.parent
        if not folder.is_dir():
            return
        for f in folder.glob("*.tmp"):
            m = re.fullmatch(r".+\.(\d+)\.tmp", f.name)
            if m is None or _alive(int(m.group(1))):
                continue
            f.unlink(missing_ok=True)

    def refresh(self) -> None:
        """Bring the graph in line with SQLite when another process committed since the last look."""
        v = self.store.data_version()
        if v == self._version or self.index is None:
            return
        with self.store.snapshot():
            ids = set(self.index.get_ids_list())
            db_ids = set(self.store.node_ids(self.conv))
            for label in sorted(ids - self._deleted - db_ids):  # forgotten (or reset) by another process
                self._scrub(label)
            missing = sorted(db_ids - ids)
            if missing:  # committed by another process
                got = self.store.get_nodes(missing)
                vecs = [(i, got[i].embedding) for i in missing if got[i].embedding is not None]
                if vecs:
                    self.add([i for i, _ in vecs], np.stack([v for _, v in vecs]), autosave=False)
        self._version = v

    def save(self) -> None:
        """Write the index file when it holds additions the file lacks (a read-only session writes nothing)."""
        if self.path is None or self.index is None or self.read_only:
            return
        self.refresh()  # never write back a label another process has forgotten
        if self._unsaved == 0 and self.path.exists():
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")  # one per process: no shared half-file
        self.index.save_index(str(tmp))
        digest = hashlib.sha256(tmp.read_bytes()).hexdigest()
        final = checksum_path(self.path)
        sums = final.with_name(f"{final.name}.{os.getpid()}.tmp")
        sums.write_text(digest + "\n")
        tmp.replace(self.path)  # a crash between these two leaves a mismatch: the next open rebuilds
        sums.replace(final)
        self._unsaved = 0

    # ------------------------------------------------------------------ operations
    def __len__(self) -> int:
        return self.index.get_current_count() - len(self._deleted)

    def _scrub(self, label: int) -> None:
        """Overwrite a label's vector with zeros and mark it deleted (idempotent)."""
        try:
            self.index.mark_deleted(label)
        except RuntimeError:  # already deleted: it was scrubbed before it was marked
            self._deleted.add(label)
            return
        self.index.unmark_deleted(label)
        self.index.add_items(np.zeros((1, self.dim), dtype=np.float32), np.asarray([label], dtype=np.int64))
        self.index.mark_deleted(label)
        self._deleted.add(label)
        self._unsaved += 1

    def remove(self, labels: list[int]) -> dict:
        """Forget these nodes' vectors (the caller has committed their tombstones); saves the file.

        Returns what was done: labels scrubbed, and whether the index was rebuilt (compacted)."""
        live = set(self.index.get_ids_list()) - self._deleted
        hit = [int(l) for l in labels if int(l) in live]
        for label in hit:
            self._scrub(label)
        total = self.index.get_current_count()
        compacted = bool(total) and len(self._deleted) / total > self.compact_deleted_share
        if compacted:
            self.rebuild()
        else:
            self.save()
        return {"vectors": len(hit), "compacted": compacted}

    def rebuild(self) -> None:
        """A fresh graph from the embeddings SQLite holds; the conversation's tombstones are cleared."""
        rows = self.store.embeddings(self.conv)
        self.index = self._new(max(self.initial_capacity, 2 * len(rows)))
        self._deleted = set()
        if rows:
            vecs = np.stack([np.frombuffer(r[1], dtype=np.float32) for r in rows])
            self.add([int(r[0]) for r in rows], vecs, autosave=False)
        self._unsaved = max(self._unsaved, 1)
        self.save()
        self.store.clear_tombstones(self.conv)

    def add(self, ids: list[int], vecs: np.ndarray, autosave: bool = True) -> None:
        need = self.index.get_current_count() + len(ids)
        if need > self.index.get_max_elements():
            self.index.resize_index(max(need, 2 * self.index.get_max_elements()))
        self.index.add_items(vecs.astype(np.float32), np.asarray(ids, dtype=np.int64))
        self._unsaved += len(ids)
        if autosave and self._unsaved >= self.save_every:
            self.save()

    def search(self, vec: np.ndarray, k: int) -> list[tuple[int, float]]:
        self.refresh()
        n = len(self)
        if n <= 0:
            return []
        k = min(k, n)
        q = vec.reshape(1, -1).astype(np.float32)
        ef = self.ef_search
        try:
            while True:
                try:
                    labels, dist = self.index.knn_query(q, k=k)
                    break
                except RuntimeError:
                    # fewer than k live results reached: deleted labels can cut the graph's paths. Search
                    # wider first, then ask for fewer
                    if ef < 8 * max(k, self.ef_search):
                        ef *= 2
                        self.index.set_ef(ef)
                    elif k > 1:
                        k //= 2
                    else:
                        return []
        finally:
            if ef != self.ef_search:
                self.index.set_ef(self.ef_search)
        return [(int(l), float(1.0 - d)) for l, d in zip(labels[0], dist[0])]


def checksum_path(path: Path) -> Path:
    """Where an index file's sha256 is kept: beside it, `<file>.sha256`."""
    return path.with_name(path.name + ".sha256")


def index_file_problem(path: Path) -> str | None:
    """Why a saved index file must not be loaded: no checksum beside it, or one that differs (None: valid)."""
    try:
        want = checksum_path(path).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return "has no checksum"
    got = hashlib.sha256(path.read_bytes()).hexdigest()
    return None if got == want else "does not match its checksum (damaged or edited)"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def index_path(db_path: str, conversation_id: str) -> Path | None:
    """`<db>.hnsw/<readable prefix>-<sha256 of the exact id>.bin`: one file per conversation id.

    The hash keeps ids apart that the readable prefix (and a case-insensitive file system) would merge:
    `a-b`, `a_b`, `a/b`, `A-b`, NFC and NFD spellings all get their own file.
    """
    if db_path == ":memory:":
        return None
    safe = re.sub(r"[^0-9A-Za-z_-]", "_", conversation_id)[:40]
    digest = hashlib.sha256(conversation_id.encode("utf-8")).hexdigest()[:20]
    return Path(db_path + ".hnsw") / f"{safe}-{digest}.bin"
