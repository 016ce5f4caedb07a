"""Turn identity from each turn's own content (issue #39): a re-export that edits, deletes, inserts or
re-formats turns at the source stores each distinct turn once, reports what it matched and added, and
warns about stored turns the file lacks; v4 memories (chained keys) migrate on open; files that are not
memories are refused untouched."""

import hashlib
import sqlite3

import pytest
from test_runtime_cli import make_cfg, write_json
from test_runtime_reliability import content, ingest

from arbor_train.errors import UserError
from arbor_train.runtime.cli import run
from arbor_train.runtime.store import Store
from arbor_train.runtime.turnkeys import chain_keys, turn_keys

KM = [3, 5, 8, 4, 6, 10]  # 36 km in all


def runs(kms, stamp=lambda d: f"2024-05-{d:02d}"):
    return {"turns": [{"user": f"I ran {k} km today.", "assistant": "Nice run!", "timestamp": stamp(i + 1)}
                      for i, k in enumerate(kms)]}


def stored_texts(mem) -> list[str]:
    s = Store(str(mem))
    try:
        return [n.user_text for n in s.nodes("default")]
    finally:
        s.close()


def test_a_reexport_with_a_turn_removed_and_one_added_stores_each_distinct_turn_once(tmp_path, capsys):
    """Before: keys were chained over every earlier turn, so removing turn 2 re-keyed turns 3-6 and the memory
    held 10 nodes, and "how many km in total" summed 63 km."""
    mem = tmp_path / "m.sqlite"
    ingest(write_json(tmp_path / "a.json", runs(KM)), mem)
    capsys.readouterr()
    res = ingest(write_json(tmp_path / "b.json", runs([3, 8, 4, 6, 10, 7])), mem)  # 5 km gone, 7 km new
    assert (res["matched"], res["added"], res["counts"]["nodes"]) == (5, 1, 7)
    texts = stored_texts(mem)
    assert len(texts) == len(set(texts)) == 7
    out = capsys.readouterr()
    assert "5 already stored, 0 forgotten on request (skipped), 1 to add" in out.out
    assert "warning: 1 stored turns of this conversation are not in the file" in out.err
    assert len(res["missing_from_file"]) == 1


def test_reformatted_timestamps_and_white_space_match_every_turn(tmp_path):
    mem = tmp_path / "m.sqlite"
    ingest(write_json(tmp_path / "a.json", runs(KM)), mem)
    before = content(mem)
    other = runs(KM, stamp=lambda d: f"May {d}, 2024")
    for t in other["turns"]:
        t["user"] = "  " + t["user"].replace(" ", "  ") + "\n"
    res = ingest(write_json(tmp_path / "b.json", other), mem)
    assert (res["matched"], res["added"]) == (6, 0) and content(mem) == before


def test_an_edited_turn_rekeys_only_itself_and_repeats_keep_their_own_identity(tmp_path):
    assert len(set(turn_keys([{"user": "ok", "assistant": "ok"}] * 3))) == 3
    edited = runs(KM)
    edited["turns"][1]["user"] = "I ran 50 km today."
    assert sum(a != b for a, b in zip(turn_keys(runs(KM)["turns"]), turn_keys(edited["turns"]))) == 1
    mem = tmp_path / "m.sqlite"
    ingest(write_json(tmp_path / "a.json", runs(KM)), mem)
    res = ingest(write_json(tmp_path / "b.json", edited), mem)
    assert (res["matched"], res["added"], len(res["missing_from_file"])) == (5, 1, 1)


def make_v4(mem, turns):
    """Turn a v5 memory into what v4 wrote: chained turn keys, schema_version 4."""
    db = sqlite3.connect(str(mem))
    ids = [r[0] for r in db.execute("SELECT id FROM nodes ORDER BY seq")]
    db.execute("DROP INDEX IF EXISTS nodes_turn")
    db.executemany("UPDATE nodes SET turn_key=? WHERE id=?", list(zip(chain_keys(turns), ids)))
    db.execute("UPDATE meta SET value='4' WHERE key='schema_version'")
    db.commit()
    db.close()
    return ids


def test_a_v4_memory_migrates_its_keys_on_open_and_keeps_its_forgets(tmp_path):
    mem = tmp_path / "m.sqlite"
    conv = runs(KM)
    ingest(write_json(tmp_path / "a.json", conv), mem)
    ids = make_v4(mem, conv["turns"])
    # a turn forgotten under v4 is recorded by its chained key (its text is gone)
    db = sqlite3.connect(str(mem))
    db.execute("INSERT INTO forgotten_turns VALUES('default', ?)", (chain_keys(conv["turns"])[2],))
    db.commit()
    db.close()
    run(make_cfg("command=forget", f"memory={mem}", f"nodes=[{ids[2]}]"))  # opens: the migration runs first
    s = Store(str(mem))
    assert s.get_meta("schema_version") == "5" and s.check() == []
    s.close()
    res = ingest(write_json(tmp_path / "b.json", conv), mem)
    assert (res["matched"], res["forgotten"], res["added"]) == (5, 1, 0)
    assert "I ran 8 km today." not in stored_texts(mem)


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_file_without_the_memory_schema_is_refused_untouched(tmp_path):
    other = tmp_path / "app.sqlite"
    db = sqlite3.connect(str(other))
    db.execute("CREATE TABLE users(id INTEGER PRIMARY KEY, name TEXT)")
    db.execute("INSERT INTO users(name) VALUES('ana')")
    db.commit()
    db.close()
    before = digest(other)
    conv = write_json(tmp_path / "c.json", runs(KM[:2]))
    for cmd in (["command=ingest", f"input={conv}"], ["command=ask", "question=hi"], ["command=show"],
                ["command=forget", "entity=ana"]):
        with pytest.raises(UserError, match="without the ArborMem schema .*left as it is"):
            run(make_cfg(*cmd, f"memory={other}"))
        assert digest(other) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.sqlite", "c.json"]  # no WAL, lock or index


def test_a_schema_version_that_is_not_a_number_is_an_error(tmp_path):
    mem = tmp_path / "m.sqlite"
    ingest(write_json(tmp_path / "c.json", runs(KM[:2])), mem)
    db = sqlite3.connect(str(mem))
    db.execute("UPDATE meta SET value='four' WHERE key='schema_version'")
    db.commit()
    db.close()
    before = digest(mem)
    with pytest.raises(UserError, match="is schema version 'four'; a read command reads v4 to v5"):
        run(make_cfg("command=show", f"memory={mem}"))
    with pytest.raises(UserError, match="schema version 'four' is not one this runtime reads"):
        run(make_cfg("command=forget", "entity=km", f"memory={mem}"))
    assert digest(mem) == before
