"""Your own conversations: the file format (arbor_train/conversations/files.py), the generic miner
(python -m data_gen.conversations) and the conversations benchmark of eval.run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from arbor_train.conversations.files import load_conversation, load_conversations
from arbor_train.errors import InputError
from arbor_train.paths import CONF_DIR, REPO_ROOT

EXAMPLE = REPO_ROOT / "docs" / "examples" / "chats.jsonl"


def write_jsonl(path: Path, turns: list) -> Path:
    path.write_text("\n".join(t if isinstance(t, str) else json.dumps(t) for t in turns) + "\n", encoding="utf-8")
    return path


def mcfg(*overrides: str):
    from arbor_train.runtime.config import compose

    return compose("conversations", ["progress=false", *overrides])


def test_a_file_holds_conversations_with_ids_speakers_and_parent_labels(tmp_path):
    f = write_jsonl(tmp_path / "c.jsonl", [
        {"conversation_id": "a", "id": "m1", "user": "alice: who runs the build?", "speaker": "alice"},
        {"conversation_id": "b", "user": "Plan the trip to Oslo", "assistant": "Sure.", "parent": None},
        {"conversation_id": "a", "id": "m2", "user": "bob: the CI bot", "speaker": "bob", "parent": "m1"},
        {"conversation_id": "b", "user": "Budget is $900", "timestamp": "2024-05-01T09:30", "parent": 1},
        {"conversation_id": "a", "id": 7, "user": "carol: and the tests?", "parent": ["m1", "m2"]},
    ])
    a, b = load_conversations(f)
    assert (a.conversation_id, b.conversation_id) == ("a", "b")
    assert [t["id"] for t in a.turns] == ["m1", "m2", "7"] and [t["id"] for t in b.turns] == ["1", "2"]
    assert [t["parents"] for t in a.turns] == [None, (0,), (0, 1)]  # positions; None: not labelled
    assert [t["parents"] for t in b.turns] == [(), (0,)]  # (): starts a new thread
    assert a.turns[0]["speaker"] == "alice" and b.turns[0]["assistant"] == "Sure." and a.turns[1]["assistant"] == ""
    assert a.labelled and b.labelled
    with pytest.raises(InputError, match=r"holds 2 conversations \('a', 'b'\); ingest takes one per file"):
        load_conversation(f)
    # a JSON object file: one conversation, its id from the object
    j = tmp_path / "one.json"
    j.write_text(json.dumps({"conversation_id": "trip", "turns": [{"user": "hi"}, {"user": "again", "parent": 1}]}))
    conv_id, turns = load_conversation(j)
    assert conv_id == "trip" and turns[1]["parents"] == (0,)


@pytest.mark.parametrize("lines, msg", [
    ([{"user": "a"}, {"user": "b", "parent": 5}],
     r"c\.jsonl: turn 2 \(line 2\): field 'parent' '5' names no earlier turn of conversation 'c'"),
    ([{"user": "a", "id": 1}, {"user": "b", "id": 1}], r"turn 2 \(line 2\): field 'id' '1' is used twice"),
    ([{"user": "a", "parent": 1}], r"turn 1 \(line 1\): field 'parent' '1' names no earlier turn"),  # itself
    ([{"user": "a"}, {"user": "b", "parent": {"id": 1}}], r"turn 2 \(line 2\): field 'parent' must be a string or an integer, got object"),
    ([{"user": "a"}, {"user": "b", "parent": []}], r"turn 2 \(line 2\): field 'parent' is an empty list"),
    ([{"user": "a", "speaker": 3}], r"turn 1 \(line 1\): field 'speaker' must be a string, got number"),
    ([{"user": "a", "reply_to": 1}], r"turn 1 \(line 1\): unknown field 'reply_to'"),
    ([{"assistant": "hello"}], r"turn 1 \(line 1\) is missing field 'user'"),
    ([{"user": "   "}], r"turn 1 \(line 1\): field 'user' is empty"),
    ([{"user": "a"}, "{not json"], r"c\.jsonl: invalid JSON on line 2"),
    ([{"user": "a", "id": True}], r"field 'id' must be a string or an integer, got boolean"),
])
def test_a_malformed_file_is_refused_naming_file_line_and_field(tmp_path, lines, msg):
    with pytest.raises(InputError, match=msg):
        load_conversations(write_jsonl(tmp_path / "c.jsonl", lines))


def test_the_miner_refuses_a_bad_file_with_one_error_line_and_writes_nothing(tmp_path):
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"user": "a"}, {"user": "b", "parent": "x"}])
    out = tmp_path / "out"
    p = subprocess.run([sys.executable, "-m", "data_gen.conversations", f"input={bad}", f"out_dir={out}"],
                       cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, ARBOR_OUTPUT_ROOT=str(tmp_path / "o")))
    assert p.returncode == 2 and "Traceback" not in p.stderr + p.stdout
    assert p.stderr.strip().splitlines()[-1] == (
        f"error: {bad}: turn 2 (line 2): field 'parent' 'x' names no earlier turn of conversation 'bad' "
        "(a parent is an id that comes before the turn)")
    assert not out.exists()


def test_gold_links_become_routing_rows_and_whole_conversations_are_held_out(tmp_path):
    from data_gen.conversations import run

    stats = run(mcfg(f"input={EXAMPLE}", f"out_dir={tmp_path / 'm'}", "heldout=0.25"))
    convs = {c.conversation_id: c for c in load_conversations(EXAMPLE)}
    rows = {s: [json.loads(x) for x in (tmp_path / "m" / s / "jsonl" / "routing.jsonl").read_text().splitlines()]
            for s in ("train", "heldout")}
    ids = {s: {r["session_id"] for r in rows[s]} for s in rows}
    assert not ids["train"] & ids["heldout"] and len(ids["heldout"]) == 3 and len(ids["train"]) == 9
    assert stats["labels"] == "gold" and stats["splits"]["heldout"]["conversations"] == 3
    for r in rows["train"] + rows["heldout"]:
        t = convs[r["session_id"]].turns[r["turn"] - 1]  # rows number turns by position, 1-based
        gold = [p + 1 for p in t["parents"]] or [-1]
        assert r["gold_parent"] == gold[0] and r["gold_states"] == gold and r["label_rule"] == "gold_link"
        assert r["gold_parent"] == -1 or any(c["turn"] == r["gold_parent"] for c in r["candidates"])
    assert sum(len(r) for r in rows.values()) == sum(len(c.turns) for c in convs.values())
    assert (tmp_path / "m" / "README.md").read_text().count("| heldout | 3 |") == 1


def test_one_conversation_is_split_by_time_and_its_held_out_turns_read_the_whole_prefix(tmp_path):
    from data_gen.conversations import run

    one = [json.loads(x) for x in EXAMPLE.read_text().splitlines()]
    first = [t for t in one if t["conversation_id"] == one[0]["conversation_id"]]
    f = write_jsonl(tmp_path / "one.jsonl", first)
    run(mcfg(f"input={f}", f"out_dir={tmp_path / 'm'}", "heldout=0.2"))
    train = [json.loads(x) for x in (tmp_path / "m/train/jsonl/routing.jsonl").read_text().splitlines()]
    held = [json.loads(x) for x in (tmp_path / "m/heldout/jsonl/routing.jsonl").read_text().splitlines()]
    n = len(first)
    assert len(held) == round(0.2 * n) and len(train) == n - len(held)
    assert max(r["turn"] for r in train) < min(r["turn"] for r in held)
    # the held-out turns were routed with the earlier turns in the forest: their candidates reach back
    assert any(c["turn"] <= len(train) for r in held for c in r["candidates"])


def test_a_file_without_labels_is_labelled_by_the_runtimes_rules(tmp_path):
    from data_gen.conversations import run

    bare = [{k: v for k, v in json.loads(x).items() if k != "parent"} for x in EXAMPLE.read_text().splitlines()]
    f = write_jsonl(tmp_path / "bare.jsonl", bare)
    stats = run(mcfg(f"input={f}", f"out_dir={tmp_path / 'm'}"))
    rows = [json.loads(x) for x in (tmp_path / "m/train/jsonl/routing.jsonl").read_text().splitlines()]
    assert stats["labels"] == "weak" and 0 < len(rows) < len(bare)
    assert all(r["gold_parent"] == r["runtime_choice"] for r in rows)
    assert Counter(r["label_rule"] for r in rows).keys() <= {"runtime_rerank", "runtime_temporal_return"}
    assert stats["splits"]["train"]["unsure"] + len(rows) <= len(bare)
    # a stricter confidence labels fewer turns
    strict = run(mcfg(f"input={f}", f"out_dir={tmp_path / 's'}", "weak.min_confidence=0.99"))
    assert strict["splits"]["train"]["messages"] < len(rows)


def test_the_conversations_benchmark_scores_routing_against_the_labels(tmp_path):
    """previous_message on a hand-made file: turn 1 starts a thread (right: nothing before it), turn 2 replies
    to 1 (right), turn 3 starts a thread (wrong: it routes to 2), turn 4 returns to 2 (wrong: 3); so 2 of 4."""
    from arbor_train.runtime.config import compose
    from eval.run import run

    f = write_jsonl(tmp_path / "h.jsonl", [
        {"user": "Plan Ana's trip to Oslo", "parent": None}, {"user": "Ana's budget is $900", "parent": 1},
        {"user": "Separately, Bo's party needs a venue", "parent": None},
        {"user": "Back to Ana's trip: the hotel is Nobis", "parent": 2}])
    res = run(compose("eval", ["benchmark=conversations", f"conversations.input={f}", "method=previous_message",
                               "wandb.enabled=false", f"run_dir={tmp_path / 'r'}"]))
    assert res["messages"] == 4 and res["routing_accuracy"] == 0.5


def test_the_miner_config_reads_the_runtime_group():
    c = OmegaConf.load(CONF_DIR / "conversations.yaml")
    assert {"runtime": "default"} in [dict(d) if not isinstance(d, str) else {d: None} for d in c.defaults]
