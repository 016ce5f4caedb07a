"""The runtime command line: ingest / ask / show / export / render, input validation, a real subprocess run."""

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from arbor_train.paths import CONF_DIR, REPO_ROOT
from arbor_train.runtime.cli import run

# Two interleaved topics: Maria's Lisbon trip (turns 1, 3, 5) and Dr. Chen's NeurIPS talk (turns 2, 4, 6).
CONVERSATION = {
    "turns": [
        {"user": "I'm planning a trip to Lisbon with my sister Maria in May. Can you help?",
         "assistant": "Sure, Lisbon in May is lovely. How many days?", "timestamp": "2024-03-01"},
        {"user": "Dr. Chen is presenting at the NeurIPS conference in Vancouver. She needs a talk outline.",
         "assistant": "Happy to help Dr. Chen with a NeurIPS talk outline.", "timestamp": "2024-03-02"},
        {"user": "For the Lisbon trip, our hotel budget is 150 euros per night.",
         "assistant": "Got it, 150 euros per night in Lisbon.", "timestamp": "2024-03-03"},
        {"user": "Dr. Chen's NeurIPS talk is 20 minutes about graph transformers.",
         "assistant": "A 20-minute graph transformers talk: intro, method, results."},
        {"user": "Maria wants to visit the Belem Tower on our Lisbon trip.",
         "assistant": "Belem Tower is a great stop in Lisbon."},
        {"user": "Dr. Chen also wants a slide on the Vancouver poster session at NeurIPS.",
         "assistant": "Added a slide about the NeurIPS poster session."},
    ]
}
LISBON_TURNS = {1, 3, 5}


def make_cfg(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="runtime_cli", overrides=list(overrides))


def write_json(path: Path, data) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def node_count(mem_path: Path) -> int:
    if not mem_path.exists():
        return 0
    db = sqlite3.connect(mem_path)
    try:
        return db.execute("SELECT COUNT(*) FROM nodes").fetchone()[0]
    finally:
        db.close()


@pytest.fixture
def ingested(tmp_path):
    conv = write_json(tmp_path / "conv.json", CONVERSATION)
    mem = tmp_path / "m.sqlite"
    res = run(make_cfg("command=ingest", f"input={conv}", f"memory={mem}"))
    return mem, res


def test_ingest_routes_interleaved_topics(tmp_path, capsys):
    conv = write_json(tmp_path / "conv.json", CONVERSATION)
    res = run(make_cfg("command=ingest", f"input={conv}", f"memory={tmp_path / 'm.sqlite'}"))
    assert res["counts"]["nodes"] == 6 and res["counts"]["roots"] == 2
    assert [r["turn"] for r in res["routes"]] == [1, 2, 3, 4, 5, 6]
    root_of = {r["turn"]: r["root_id"] for r in res["routes"]}
    assert len({root_of[t] for t in LISBON_TURNS}) == 1
    assert len({root_of[t] for t in (2, 4, 6)}) == 1
    assert root_of[1] != root_of[2]
    out = capsys.readouterr().out
    assert sum(line.startswith("turn ") for line in out.splitlines()) == 6  # one line per turn (< 50 turns)
    assert "nodes=6" in out


def test_ingest_jsonl_and_file_conversation_id(tmp_path):
    lines = [json.dumps(t) for t in CONVERSATION["turns"][:3]]
    conv = tmp_path / "conv.jsonl"
    conv.write_text("\n".join(lines) + "\n\n", encoding="utf-8")
    mem = tmp_path / "m.sqlite"
    res = run(make_cfg("command=ingest", f"input={conv}", f"memory={mem}"))
    assert res["conversation_id"] == "default" and res["counts"]["nodes"] == 3
    # a JSON file's conversation_id is used when the option is left at 'default'
    named = write_json(tmp_path / "named.json", {"conversation_id": "maria", **CONVERSATION})
    res = run(make_cfg("command=ingest", f"input={named}", f"memory={mem}"))
    assert res["conversation_id"] == "maria" and res["counts"]["nodes"] == 6
    # ... but an explicit option wins
    res = run(make_cfg("command=ingest", f"input={named}", f"memory={mem}", "conversation_id=other"))
    assert res["conversation_id"] == "other"
    shown = run(make_cfg("command=show", f"memory={mem}", "conversation_id=maria"))
    assert shown["counts"]["nodes"] == 6 and set(shown["other_conversations"]) == {"default", "other"}


def test_ask_returns_the_right_branch(ingested, capsys):
    mem, res = ingested
    capsys.readouterr()
    out = run(make_cfg("command=ask", f"memory={mem}",
                       "question='What hotel budget did we set for the Lisbon trip?'", "now=2024-04-01"))
    loc, ctx = out["localization"], out["context"]
    lisbon_nodes = {r["node_id"] for r in res["routes"] if r["turn"] in LISBON_TURNS}
    assert loc["parent_id"] in lisbon_nodes
    primary = next(b for b in ctx["blocks"] if b["name"] == "PrimaryPath")
    assert set(primary["node_ids"]) == lisbon_nodes
    text = "\n".join(primary["lines"])
    assert "150 euros per night" in text and "Belem Tower" in text
    assert "NeurIPS" not in text
    printed = capsys.readouterr().out
    assert f"state: node {loc['parent_id']}" in printed
    assert "top candidates" in printed and "Current time: 2024-04-01" in printed
    json.dumps(out)  # JSON-serialisable


def test_export_forest_json(ingested, tmp_path):
    mem, _ = ingested
    out = tmp_path / "sub" / "forest.json"
    run(make_cfg("command=export", f"memory={mem}", f"out={out}"))
    data = json.loads(out.read_text(encoding="utf-8"))
    nodes = {n["id"]: n for n in data["nodes"]}
    assert len(nodes) == 6 and data["counts"]["nodes"] == 6
    for n in nodes.values():
        assert "embedding" not in n
        if n["parent_id"] is None:
            assert n["root_id"] == n["id"] and n["depth"] == 0
        else:
            p = nodes[n["parent_id"]]
            assert p["seq"] < n["seq"] and p["root_id"] == n["root_id"] and n["depth"] == p["depth"] + 1
    assert sorted(r["id"] for r in data["roots"]) == sorted(i for i, n in nodes.items() if n["parent_id"] is None)
    assert sum(r["size"] for r in data["roots"]) == 6
    assert set(data["evidence"]) == {"facts", "records", "artifacts", "events"}
    assert len(data["evidence"]["facts"]) == data["counts"]["facts"] > 0
    for r in data["evidence"]["records"]:
        assert "supersedes" in r and "superseded_by" in r


def test_render_png_and_svg(ingested, tmp_path):
    mem, _ = ingested
    png = tmp_path / "forest.png"
    res = run(make_cfg("command=render", f"memory={mem}", f"out={png}",
                       "highlight_question='What hotel budget did we set for the Lisbon trip?'"))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 1000
    assert len(res["highlight"]) == 3
    svg = tmp_path / "forest.svg"
    run(make_cfg("command=render", f"memory={mem}", f"out={svg}"))
    assert "<svg" in svg.read_text(encoding="utf-8")[:2000]


def test_render_edge_sizes(tmp_path, runtime_cfg):
    """0 nodes, 1 node and a few hundred nodes all render (the last without per-node labels)."""
    from arbor_train.runtime import ArborMemory
    from arbor_train.runtime.render import forest_json, render_forest

    with ArborMemory.open(tmp_path / "e.sqlite", "c", runtime_cfg) as mem:
        out = render_forest(mem, str(tmp_path / "empty.png"))
        assert Path(out).read_bytes()[:4] == b"\x89PNG"
        assert forest_json(mem)["nodes"] == []
        mem.step("I adopted a dog named Rex.", "Congratulations!")
        one = Path(render_forest(mem, str(tmp_path / "one.svg"), highlight=[1])).read_text(encoding="utf-8")
        import re
        import xml.etree.ElementTree as ET

        assert ET.fromstring(one.encode()).tag == "{http://www.w3.org/2000/svg}svg"  # well-formed SVG
        texts = [t.strip() for t in re.findall(r"<!--(.*?)-->", one, re.S)]  # matplotlib keeps each text drawn
        node = mem.nodes()[0]
        assert "conversation 'c': 1 node, 1 root (highlighted path: 1 node)" in texts  # the title
        assert str(node.id) in texts  # the node's id label
        lane = next(t for t in texts if t.endswith("(1)"))  # the lane: the root's topic key and its size
        shown = lane.removesuffix("(1)").strip().rstrip("…")
        assert len(shown) >= 10 and node.topic_key.startswith(shown)
        topics = ["Lisbon trip", "Porto conference", "Rex the dog", "garden tomatoes", "marathon training"]
        for i in range(300):
            mem.step(f"About the {topics[i % 5]}: note number {i} for {topics[i % 5]}.", "Noted.")
        big = render_forest(mem, str(tmp_path / "big.png"), highlight=[n.id for n in mem.nodes()[-5:]])
        assert Path(big).read_bytes()[:4] == b"\x89PNG"
        with pytest.raises(ValueError, match="out="):
            render_forest(mem, str(tmp_path / "forest.pdf"))


def test_show_subprocess(ingested, tmp_path):
    mem, _ = ingested
    env = dict(os.environ, ARBOR_OUTPUT_ROOT=str(tmp_path / "outputs"))
    proc = subprocess.run([sys.executable, "-m", "arbor_train.runtime.cli", "command=show", f"memory={mem}"],
                          capture_output=True, text=True, cwd=REPO_ROOT, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "nodes=6" in proc.stdout and "roots=2" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "arbor_train.runtime.cli", "command=nope", f"memory={mem}"],
                          capture_output=True, text=True, cwd=REPO_ROOT, env=env, timeout=300)
    assert proc.returncode == 2 and "command" in proc.stderr and "ingest" in proc.stderr


# ---------------------------------------------------------------------- bad input: clear errors, nothing written
def _bad_ingest(tmp_path, conv: Path, match: str):
    mem = tmp_path / "m.sqlite"
    with pytest.raises(ValueError, match=match):
        run(make_cfg("command=ingest", f"input={conv}", f"memory={mem}"))
    assert node_count(mem) == 0
    assert not mem.exists()


def test_ingest_missing_user_field(tmp_path):
    turns = [dict(t) for t in CONVERSATION["turns"]]
    del turns[1]["user"]
    conv = write_json(tmp_path / "bad.json", {"turns": turns})
    _bad_ingest(tmp_path, conv, r"bad\.json: turn 2 is missing field 'user'")


def test_ingest_invalid_jsonl_line(tmp_path):
    conv = tmp_path / "bad.jsonl"
    conv.write_text("\n".join([json.dumps(CONVERSATION["turns"][0]), json.dumps(CONVERSATION["turns"][1]),
                               '{"user": "unterminated', json.dumps(CONVERSATION["turns"][2])]), encoding="utf-8")
    _bad_ingest(tmp_path, conv, r"bad\.jsonl: invalid JSON on line 3")


def test_ingest_jsonl_missing_field_names_line(tmp_path):
    conv = tmp_path / "bad.jsonl"
    conv.write_text("\n".join([json.dumps(CONVERSATION["turns"][0]), "", json.dumps({"assistant": "hi"})]),
                    encoding="utf-8")
    _bad_ingest(tmp_path, conv, r"bad\.jsonl: turn 2 \(line 3\) is missing field 'user'")


def test_ingest_invalid_json_and_missing_file(tmp_path):
    conv = tmp_path / "bad.json"
    conv.write_text('{"turns": [\n  {"user": "a", "assistant": "b"},\n  oops\n]}', encoding="utf-8")
    _bad_ingest(tmp_path, conv, r"bad\.json: invalid JSON at line 3")
    _bad_ingest(tmp_path, tmp_path / "nowhere.json", r"input=.*nowhere\.json.*does not exist")
    _bad_ingest(tmp_path, write_json(tmp_path / "empty.json", {"turns": []}), r"empty\.json: no turns")
    with pytest.raises(ValueError, match="option input"):
        run(make_cfg("command=ingest", f"memory={tmp_path / 'm.sqlite'}"))


def test_bad_ingest_leaves_existing_memory_unchanged(ingested, tmp_path):
    mem, _ = ingested
    turns = [dict(t) for t in CONVERSATION["turns"]] + [{"assistant": "no user here"}]
    conv = write_json(tmp_path / "bad.json", {"turns": turns})
    with pytest.raises(ValueError, match="turn 7 is missing field 'user'"):
        run(make_cfg("command=ingest", f"input={conv}", f"memory={mem}"))
    assert node_count(mem) == 6


def test_unknown_and_missing_command(tmp_path):
    with pytest.raises(ValueError, match=r"option command: 'nope' is unknown; valid values: ingest, ask, show"):
        run(make_cfg("command=nope", f"memory={tmp_path / 'm.sqlite'}"))
    with pytest.raises(ValueError, match=r"option command: not set"):
        run(make_cfg(f"memory={tmp_path / 'm.sqlite'}"))
    assert not (tmp_path / "m.sqlite").exists()


def test_ask_requires_question(ingested):
    mem, _ = ingested
    with pytest.raises(ValueError, match="option question"):
        run(make_cfg("command=ask", f"memory={mem}"))


def test_bad_out_and_missing_memory(ingested, tmp_path):
    mem, _ = ingested
    with pytest.raises(ValueError, match=r"out=.*\.json"):
        run(make_cfg("command=export", f"memory={mem}", f"out={tmp_path / 'f.txt'}"))
    with pytest.raises(ValueError, match="option out"):
        run(make_cfg("command=render", f"memory={mem}"))
    with pytest.raises(ValueError, match=r"out=.*\.png or \.svg"):
        run(make_cfg("command=render", f"memory={mem}", f"out={tmp_path / 'f.pdf'}"))
    with pytest.raises(ValueError, match="memory=.*does not exist"):
        run(make_cfg("command=show", f"memory={tmp_path / 'missing.sqlite'}"))
    assert not (tmp_path / "missing.sqlite").exists()
