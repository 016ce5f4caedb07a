"""LoCoMo: loader (both layouts), conversion to supervision, weak-label rules, bad input."""

import json
import shutil

import pytest
from hydra import compose, initialize_config_dir

from arbor_train.conversations.locomo import load_locomo, to_combined
from arbor_train.conversations.schema import BenchmarkFormatError, Conversation, Question, Session, Turn, interactions
from arbor_train.paths import CONF_DIR, REPO_ROOT
from data_gen.locomo import run, weak_labels

LOCOMO = REPO_ROOT.parent / "shared" / "data" / "locomo"
FILES = sorted(LOCOMO.glob("*.json"))
pytestmark = pytest.mark.skipif(not FILES, reason="../shared/data/locomo is not beside the repository")


def cfg(*overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="locomo", overrides=["progress=false", *overrides])


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    out = tmp_path_factory.mktemp("locomo") / "out"
    stats = run(cfg(f"input={LOCOMO}", f"out_dir={out}"))
    return out, stats


def test_eight_conversations_convert_with_their_statistics(converted):
    out, stats = converted
    assert stats["conversations"] == 8 and stats["sessions"] == 217 and stats["turns"] == 4805
    by_cat = stats["questions_by_category"]
    assert sum(by_cat.values()) == 1586 and by_cat["5"] == 360
    assert stats["qa_split"]["questions"] == 1586 - 360 and set(stats["qa_split"]["by_category"]) == {"1", "2", "3", "4"}
    w = stats["weak_labels_by_rule"]
    # each rule's count is the number of routing rows written under that rule (and every rule labelled some)
    from collections import Counter

    written = Counter(json.loads(l)["label_rule"] for l in (out / "jsonl" / "routing.jsonl").open())
    assert written == {r: w[r] for r in ("evidence_group", "observation_subject", "adjacency")} and min(written.values()) > 0
    assert w["evidence_group"] + w["observation_subject"] + w["adjacency"] + w["unlabeled"] == stats["interactions"]
    assert stats["supervision"]["routing"] == stats["interactions"] - w["unlabeled"]
    card = (out / "README.md").read_text()
    for rule in ("evidence_group", "observation_subject", "adjacency"):
        assert f"| {rule} | {w[rule]:,} |" in card
    assert f"| {stats['conversations']} | {stats['sessions']} | {stats['turns']:,} |" in card


def test_supervision_rows_point_at_real_turns(converted):
    out, stats = converted
    convs = {json.loads(l)["conversation_id"]: Conversation.from_json(json.loads(json.loads(l)["document"]))
             for l in (out / "jsonl" / "conversations.jsonl").open()}
    n_inter = {cid: len(interactions(c)) for cid, c in convs.items()}
    for line in (out / "jsonl" / "routing.jsonl").open():
        r = json.loads(line)
        assert 0 <= r["gold_parent"] < r["turn"] < n_inter[r["session_id"]]
        assert r["gold_parent"] in [c["turn"] for c in r["candidates"]]
        assert r["label_rule"] in ("evidence_group", "observation_subject", "adjacency")
    ext = [json.loads(l) for l in (out / "jsonl" / "extraction.jsonl").open()]
    with_facts = [r for r in ext if json.loads(r["target"])["facts"]]
    assert len(ext) == sum(n_inter.values()) and len(with_facts) > len(ext) // 3
    # an observation citing a dia_id lands on the interaction holding that dia_id
    c26 = convs["26"]
    fact, ids = c26.meta["observations"]["S1"]["Caroline"][0]
    inter = interactions(c26)
    i = next(k for k, it in enumerate(inter) if ids[0] in it.turn_ids)
    row = next(r for r in ext if r["session_id"] == "26" and r["turn"] == i)
    assert fact[:100] in row["target"]
    loc = [json.loads(l) for l in (out / "jsonl" / "localization.jsonl").open()]
    assert len(loc) == stats["qa_split"]["questions"] and all(q["question_type"] in {"1", "2", "3", "4"} for q in loc)
    empty = sum(not q["gold_states"] for q in loc)
    assert empty == stats["skipped"]["split_questions_without_evidence"] and empty < len(loc) // 50


def test_reader_rows_are_each_questions_runtime_context_at_each_budget_with_its_scored_gold(converted):
    """The `reader` set: every QA-split question at each of reader_budgets (512, 1,024), the context the runtime
    assembles over the finished memory (within the budget), the gold LoCoMo F1 scores (category 3: its first
    part) as the target, the conversation id as the fingerprint a reader bundle records."""
    from arbor_train.runtime import TokenCounter

    out, stats = converted
    rows = [json.loads(l) for l in (out / "jsonl" / "reader.jsonl").open()]
    qa = [json.loads(l) for l in (out / "jsonl" / "qa.jsonl").open()]
    assert len(rows) == 2 * len(qa) == stats["supervision"]["reader"]
    assert {(r["session_id"], r["input"], r["budget"]) for r in rows} == {
        (q["conversation_id"], q["question"], b) for q in qa for b in (512, 1024)}
    by_q = {(q["conversation_id"], q["question"]): q for q in qa}
    counter = TokenCounter(cfg(f"input={LOCOMO}").runtime.context.tokenizer)
    for r in rows[::40]:
        q = by_q[(r["session_id"], r["input"])]
        gold = str(q["answer"])
        assert r["answer"] == r["gold"] == (gold.split(";")[0].strip() if q["category"] == "3" else gold)
        assert r["session_fingerprint"] == r["session_id"] and r["question_type"] == q["category"]
        assert counter.count(r["context"]) <= r["budget"] + 16  # the read's budget (the header lines aside)
    # a wider read holds the answer at least as often
    held = {b: sum(r["gold_in_context"] for r in rows if r["budget"] == b) for b in (512, 1024)}
    assert held[1024] > held[512] > 50


def test_combined_layout_gives_identical_output(tmp_path):
    files = FILES[:2]
    combined = tmp_path / "locomo10.json"
    combined.write_text(json.dumps(to_combined(files)))
    per_file = [c.to_json() for f in files for c in load_locomo(f)]
    assert [c.to_json() for c in load_locomo(combined)] == per_file
    single = tmp_path / "per"
    single.mkdir()
    for f in files:
        shutil.copy(f, single / f.name)
    a, b = tmp_path / "a", tmp_path / "b"
    run(cfg(f"input={single}", f"out_dir={a}"))
    run(cfg(f"input={combined}", f"out_dir={b}"))
    for name in sorted(p.name for p in (a / "jsonl").iterdir()):
        assert (a / "jsonl" / name).read_bytes() == (b / "jsonl" / name).read_bytes(), name
    assert (a / "stats.json").read_bytes() == (b / "stats.json").read_bytes()


def _mini(tmp_path, mutate):
    d = json.loads(FILES[0].read_text())
    mutate(d)
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(d))
    return p


@pytest.mark.parametrize("mutate, match", [
    (lambda d: d.pop("speaker_a"), r"bad\.json: missing field 'speaker_a'"),
    (lambda d: d["qa"][3].update(category=9), r"bad\.json qa\[3\]: field 'category' is 9"),
    (lambda d: d["qa"][0].pop("question"), r"bad\.json qa\[0\]: missing field 'question'"),
    (lambda d: d["session_1"][2].pop("dia_id"), r"bad\.json session_1\[2\]: missing field 'dia_id'"),
    (lambda d: d.update(session_2="not a list"), r"field 'session_2' must be a list"),
    # strict types (issue #14): a null question is refused (it became the text "None"), a boolean is no
    # category, an integer speaker is not stringified, a repeated dia_id names both turns, text is UTF-8
    (lambda d: d["qa"][2].update(question=None), r"bad\.json qa\[2\]: field 'question' must be a string, got null"),
    (lambda d: d["qa"][1].update(category=True), r"bad\.json qa\[1\]: field 'category' is True"),
    (lambda d: d["session_1"][0].update(speaker=7), r"bad\.json session_1\[0\]: field 'speaker' must be a string, got int"),
    (lambda d: d["session_2"][1].update(dia_id="D1:3"), r"bad\.json: duplicate dia_id 'D1:3' at session_1\[2\] and session_2\[1\]"),
    (lambda d: d["session_1"][4].update(text="caf\ud800"), r"bad\.json session_1\[4\]: field 'text' is not valid UTF-8"),
    (lambda d: d["qa"][0].update(evidence=[None]), r"bad\.json qa\[0\]: field 'evidence\[0\]' must be a dia_id string"),
    (lambda d: d["events_session_1"].update(date=5), r"bad\.json events_session_1: field 'date' must be a string or null"),
])
def test_bad_input_names_file_record_and_field_and_writes_nothing(tmp_path, mutate, match):
    p = _mini(tmp_path, mutate)
    with pytest.raises(BenchmarkFormatError, match=match):
        load_locomo(p)
    out = tmp_path / "out"
    with pytest.raises(BenchmarkFormatError):
        run(cfg(f"input={p}", f"out_dir={out}"))
    assert not out.exists() and not out.with_name("out.tmp").exists()


def test_combined_layout_refuses_a_repeated_sample_id(tmp_path):
    samples = to_combined(FILES[:2])
    samples[1]["sample_id"] = samples[0]["sample_id"]
    combined = tmp_path / "locomo10.json"
    combined.write_text(json.dumps(samples))
    with pytest.raises(BenchmarkFormatError, match=rf"locomo10\.json: duplicate sample_id '{samples[0]['sample_id']}' "
                                                   r"at sample\[0\] and sample\[1\]"):
        load_locomo(combined)
    samples[1]["sample_id"] = None
    combined.write_text(json.dumps(samples))
    with pytest.raises(BenchmarkFormatError, match=r"sample\[1\]: field 'sample_id' must be a string, got null"):
        load_locomo(combined)


def test_malformed_json_and_unknown_evidence(tmp_path):
    bad = tmp_path / "broken.json"
    bad.write_text('{"speaker_a": "A", ')
    with pytest.raises(BenchmarkFormatError, match=r"broken\.json: invalid JSON"):
        load_locomo(bad)
    p = _mini(tmp_path, lambda d: d["qa"][0].update(evidence=["D1:3", "D99:1", "D1:5; D1:7"]))
    conv = load_locomo(p)[0]
    assert conv.questions[0].evidence == ["D1:3", "D1:5", "D1:7"]
    assert conv.meta["skipped"]["evidence_ids_naming_no_turn"] == 1


def test_existing_out_dir_is_kept(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="overwrite=true"):
        run(cfg(f"input={FILES[0]}", f"out_dir={out}"))
    assert (out / "keep.txt").read_text() == "mine"
    with pytest.raises(ValueError, match="option categories"):
        run(cfg(f"input={FILES[0]}", f"out_dir={tmp_path / 'x'}", "categories=[1,7]"))


def test_weak_label_rules_on_a_hand_made_conversation():
    def s(n, turns):
        return Session(f"c:S{n}", f"day {n}", [Turn(t, sp, txt) for t, sp, txt in turns])

    conv = Conversation("c", ["Ann", "Bo"], [
        s(1, [("D1:1", "Ann", "I adopted a dog."), ("D1:2", "Bo", "Nice!"),
              ("D1:3", "Ann", "I started pottery."), ("D1:4", "Bo", "Cool.")]),
        s(2, [("D2:1", "Ann", "The dog chewed my shoe."), ("D2:2", "Bo", "Oh no."),
              ("D2:3", "Ann", "Went to Paris."), ("D2:4", "Bo", "Fun."),
              ("D2:5", "Ann", "Weather is nice."), ("D2:6", "Bo", "Yes.")]),
        s(3, [("D3:1", "Ann", "Hello again."), ("D3:2", "Bo", "Hi.")]),
    ], [Question("q0", "What pet?", "dog", "1", ["D1:1", "D2:1"])],
        {"observations": {"S1": {"Ann": [["Ann loves Paris museums.", ["D1:3"]]]},
                          "S2": {"Ann": [["Ann visited Paris.", ["D2:3"]]]}}})
    inters = interactions(conv)
    assert [it.turn_ids for it in inters][:2] == [["D1:1", "D1:2"], ["D1:3", "D1:4"]]
    labels, counts = weak_labels(conv, inters, ["evidence_group", "observation_subject", "adjacency"])
    assert labels[2] == (0, "evidence_group")          # D2:1 shares q0's evidence with D1:1: temporal return
    assert labels[3] == (1, "observation_subject")      # Paris in both sessions' observations
    assert labels[4] == (3, "adjacency")
    assert 0 not in labels and 5 not in labels          # session starts no rule links stay unlabeled
    assert counts == {"evidence_group": 1, "observation_subject": 1, "adjacency": 2, "unlabeled": 2,
                      "temporal_return": 2}
    labels, _ = weak_labels(conv, inters, ["evidence_group"])
    assert set(labels) == {2}
