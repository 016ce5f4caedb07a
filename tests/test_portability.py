"""Memory portability (issue #39): `command=import` of a `command=export` file restores a memory whose content
hash equals the original's; a malformed file is refused, naming the field, and imports nothing."""

import copy
import json

import pytest
from test_runtime_cli import make_cfg, write_json
from test_runtime_reliability import content, ingest, long_conversation

from arbor_train.errors import UserError
from arbor_train.runtime import ArborMemory, default_config
from arbor_train.runtime.cli import run


@pytest.fixture
def exported(tmp_path):
    mem = tmp_path / "orig.sqlite"
    ingest(write_json(tmp_path / "c.json", long_conversation(24)), mem)
    run(make_cfg("command=forget", f"memory={mem}", "entity=Dr. Chen", "force=true"))  # tombstones, floors, re-links
    out = tmp_path / "export.json"
    run(make_cfg("command=export", f"memory={mem}", f"out={out}"))
    return mem, out


def test_an_export_imports_to_the_same_content(exported, tmp_path):
    mem, out = exported
    copy_ = tmp_path / "copy.sqlite"
    res = run(make_cfg("command=import", f"input={out}", f"memory={copy_}"))
    assert res["nodes"] > 0 and content(copy_) == content(mem)
    a, b = (ArborMemory.open(p, "default", default_config()) for p in (mem, copy_))
    try:
        q = "What is Maria's hotel budget?"
        assert a.read(q)[1].text == b.read(q)[1].text
    finally:
        a.close()
        b.close()
    with pytest.raises(UserError, match="already holds conversation 'default'"):
        run(make_cfg("command=import", f"input={out}", f"memory={copy_}"))
    assert content(copy_) == content(mem)


def _broken(data: dict, how: str) -> dict:
    d = copy.deepcopy(data)
    m = d["memory"]
    if how == "format":
        m["format"] = "something-else"
    elif how == "table":
        del m["tables"]["facts"]
    elif how == "columns":
        m["tables"]["nodes"]["columns"] = m["tables"]["nodes"]["columns"][:-1]
    elif how == "row length":
        m["tables"]["nodes"]["rows"][0] = m["tables"]["nodes"]["rows"][0][:3]
    elif how == "value type":
        m["tables"]["nodes"]["rows"][0][1] = {"x": 1}
    elif how == "beyond 64 bits":
        m["tables"]["nodes"]["rows"][0][0] = 2**70
    elif how == "dangling parent":
        cols = m["tables"]["nodes"]["columns"]
        m["tables"]["nodes"]["rows"][-1][cols.index("parent_id")] = 999999
    elif how == "floor":
        m["meta"]["node_id_floor"] = "many"
    elif how == "duplicate id":
        m["tables"]["nodes"]["rows"].append(list(m["tables"]["nodes"]["rows"][0]))
    return d


@pytest.mark.parametrize("how, msg", [
    ("format", "field 'memory.format'"), ("table", "field 'memory.tables' must hold exactly"),
    ("columns", "field 'memory.tables.nodes' must be"), ("row length", r"memory.tables.nodes.rows\[0\] must be a list"),
    ("value type", r"rows\[0\].conversation_id must be a string, number, null"),
    ("beyond 64 bits", "is beyond 64 bits"), ("dangling parent", "not a consistent memory|FOREIGN KEY|rows"),
    ("duplicate id", r"memory.tables.nodes.rows\[\d+\]: UNIQUE"),
    ("floor", "field 'memory.meta.node_id_floor' must be a whole number"),
])
def test_a_malformed_export_is_refused_and_imports_nothing(exported, tmp_path, how, msg):
    _, out = exported
    bad = write_json(tmp_path / "bad.json", _broken(json.loads(out.read_text()), how))
    target = tmp_path / "target.sqlite"
    ingest(write_json(tmp_path / "other.json", long_conversation(3)), target, "conversation_id=other")
    before = content(target)
    with pytest.raises(UserError, match=msg):
        run(make_cfg("command=import", f"input={bad}", f"memory={target}"))
    assert content(target) == before


def test_a_file_that_is_not_an_export_is_refused(tmp_path):
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(UserError, match="x.json: not a JSON export"):
        run(make_cfg("command=import", f"input={tmp_path / 'x.json'}", f"memory={tmp_path / 'm.sqlite'}"))
    write_json(tmp_path / "y.json", {"nodes": []})
    with pytest.raises(UserError, match="y.json: field 'memory' missing"):
        run(make_cfg("command=import", f"input={tmp_path / 'y.json'}", f"memory={tmp_path / 'm.sqlite'}"))
