"""Damaged derived files and sessions across processes (issue #39): a damaged vector index is rebuilt from
SQLite instead of crashing the process, temp files of dead processes go, and a long-lived session sees
another process's forget: it never returns the forgotten node, and never writes its vector back."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_runtime_cli import make_cfg, write_json
from test_runtime_reliability import content, ingest, long_conversation

from arbor_train.errors import UserError
from arbor_train.runtime import ArborMemory, default_config
from arbor_train.runtime.cli import run
from arbor_train.runtime.index import index_path
from arbor_train.runtime.store import Store


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "arbor_train.runtime.cli", *args, f"hydra.run.dir={cwd / 'h'}"],
                          capture_output=True, text=True, timeout=300)


@pytest.fixture
def memory(tmp_path) -> Path:
    mem = tmp_path / "m.sqlite"
    ingest(write_json(tmp_path / "c.json", long_conversation(24)), mem)
    return mem


def damage(path: Path, offsets: list[int]) -> None:
    """Overwrite bytes of a file (hnswlib's header: offsetLevel0, max_elements, element count, ..., the
    entry point and the max level, then level-0 neighbour ids)."""
    data = bytearray(path.read_bytes())
    for i, off in enumerate(offsets):
        data[off:off + 4] = (0x7FFFFFF0 + i).to_bytes(4, "little")
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("offsets", [[48, 52], [8, 16, 24], [100, 104, 108, 112], [2000, 3000, 4000]],
                         ids=["entry-point-and-level", "counts", "level0-neighbours", "vectors"])
def test_a_damaged_index_file_is_rebuilt_not_loaded(memory, tmp_path, offsets):
    """Before: ask and ingest of the conversation ended in SIGSEGV (exit 139) with no message."""
    ix = index_path(str(memory), "default")
    damage(ix, offsets)
    before = content(memory)
    proc = cli("command=ask", f"memory={memory}", "question='What is the hotel budget?'", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "context (" in proc.stdout and content(memory) == before
    more = write_json(tmp_path / "more.json", {"turns": [{"user": "Maria's hotel budget is now 180 euros."}]})
    proc = cli("command=ingest", f"input={more}", f"memory={memory}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    m = ArborMemory.open(memory, "default", default_config())
    try:
        assert len(m.index) == m.stats()["nodes"] == 25
    finally:
        m.close()


def test_temp_files_of_dead_processes_are_removed_on_open(memory):
    """A save killed half-way leaves `<index>.<pid>.tmp`, which may hold a vector forgotten since."""
    ix = index_path(str(memory), "default")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = ix.with_name(f"{ix.name}.{dead.pid}.tmp")
    stale.write_bytes(ix.read_bytes())
    live = ix.with_name(f"{ix.name}.{__import__('os').getpid()}.tmp")  # ours: a live process's is kept
    live.write_bytes(b"x")
    ArborMemory.open(memory, "default", default_config()).close()
    assert not stale.exists() and live.exists()
    live.unlink()


def test_an_index_folder_that_is_a_file_is_an_error_line(tmp_path):
    mem = tmp_path / "m.sqlite"
    Path(f"{mem}.hnsw").write_text("not a folder")
    conv = write_json(tmp_path / "c.json", long_conversation(3))
    with pytest.raises(UserError, match=r"m.sqlite.hnsw: the memory's vector index folder is not a folder"):
        ingest(conv, mem)
    proc = cli("command=ingest", f"input={conv}", f"memory={mem}", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and "Traceback" not in proc.stderr


def test_a_long_lived_session_sees_a_forget_by_another_process(memory, tmp_path):
    """Before: the session's next read raised KeyError for the forgotten node (its graph still returned the
    label), and its close wrote the in-memory graph back over the scrubbed file."""
    app = ArborMemory.open(memory, "default", default_config())
    try:
        app.read("What is Maria's hotel budget?")  # the graph is loaded and in use
        s = Store(str(memory))
        gone = {n.id: n.embedding for n in s.nodes("default") if "Maria" in n.user_text}
        s.close()
        proc = cli("command=forget", f"memory={memory}", "entity=Maria", "force=true", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-2000:]
        loc, ctx = app.read("What is Maria's hotel budget?")
        assert not (ctx.node_ids & set(gone)) and loc.parent_id not in gone
        assert not {c.node_id for c in loc.candidates} & set(gone)
        app.step("Bob's venue budget is now $6000.", "Noted.")  # a commit after the other process's forget
    finally:
        app.close()
    raw = index_path(str(memory), "default").read_bytes()
    for nid, emb in gone.items():
        assert emb.astype(np.float32).tobytes() not in raw, f"node {nid}'s vector was written back"
    m = ArborMemory.open(memory, "default", default_config())
    try:
        assert not {lbl for lbl, _ in m.index.search(next(iter(gone.values())), 50)} & set(gone)
    finally:
        m.close()
