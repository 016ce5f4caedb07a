"""Ubuntu IRC reply structure (issue #16): loader errors, the metrics on hand-worked cases, and the
benchmark's "previous message" row against the corpus paper's dev figure."""

import json
import math
from pathlib import Path

import pytest

from arbor_train.conversations.irc import load_irc, load_irc_file, previous_message_links
from arbor_train.conversations.schema import BenchmarkFormatError
from arbor_train.paths import REPO_ROOT
from arbor_train.scoring.irc import score_links

IRC = REPO_ROOT.parent / "shared" / "data" / "irc"


def write_pair(d: Path, name: str, lines: list[str], links: list[str]) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{name}.ascii.txt").write_text("\n".join(lines) + "\n")
    (d / f"{name}.annotation.txt").write_text("\n".join(links) + "\n")
    return d / f"{name}.ascii.txt"


def test_message_kinds_are_parsed(tmp_path):
    p = write_pair(tmp_path, "a", ["[10:00] <alice> hi all", "=== bob has joined #ubuntu", "[10:01]  * carol waves",
                                   "[10:02] <dave>", "[10:03] (erin/#ubuntu) relayed", "[10:04] -frank:#ubuntu- notice"],
                   ["0 1 -", "1 1 -", "2 2 -", "2 3 -", "4 4 - ", "4 5 -"])
    f = load_irc_file(p)
    assert [(m.speaker, m.system, m.text) for m in f.messages] == [
        ("alice", False, "hi all"), (None, True, "bob has joined #ubuntu"), ("carol", False, "waves"),
        ("dave", False, ""), ("erin", False, "relayed"), ("frank", False, "notice")]
    assert f.parents == {1: {0, 1}, 2: {2}, 3: {2}, 4: {4}, 5: {4}}


@pytest.mark.parametrize("lines, links, msg", [
    (["[10:00] <a> x", "hello there"], ["1 1 -"], r"a\.ascii\.txt: line 1: not an IRC message"),
    (["[10:00] <a> x", "[25:00] <b> y"], ["1 1 -"], r"line 1: time \[25:00\] is not a time of day"),
    (["[10:00] <a> x", "[10:01] <b> y"], ["1 0 -"], r"a\.annotation\.txt: line 0: link 1 -> 0 points forward"),
    (["[10:00] <a> x", "[10:01] <b> y"], ["0 1 -", "1 7 -"], r"line 1: link 1 -> 7 points outside a\.ascii\.txt"),
    (["[10:00] <a> x"], ["0 x -"], r"line 0: expected 'PARENT CHILD -'"),
])
def test_malformed_files_name_the_file_and_line(tmp_path, lines, links, msg):
    with pytest.raises(BenchmarkFormatError, match=msg):
        load_irc_file(write_pair(tmp_path, "a", lines, links))


def test_metrics_on_hand_worked_files():
    # file A: lines 0-1 context, 2-5 annotated. gold 2<-0, 3<-3, 4<-2, 5<-3; predicted 2<-1, 3<-3, 4<-2, 5<-4
    gold_a = {2: {0}, 3: {3}, 4: {2}, 5: {3}}
    pred_a = {2: {1}, 3: {3}, 4: {2}, 5: {4}}
    # file B: predicted exactly: conversations {1, 2} and {3}
    gold_b = {1: {1}, 2: {1}, 3: {3}}
    res = score_links([("A", gold_a, pred_a), ("B", gold_b, dict(gold_b))])
    # links pooled: A 2 of 4 right, B 3 of 3: P = R = 5/7
    assert res["link_precision"] == res["link_recall"] == res["link_f1"] == round(100 * 5 / 7, 2)
    # A: gold conversations {2,4} {3,5}; predicted {2,4,5} {3}. VI by hand, 1 - VI / log 4
    vi = (0.5 * -math.log(0.5 / 0.75) + 0.25 * -(math.log(0.25 / 0.75) + math.log(0.25 / 0.5))
          + 0.25 * -math.log(0.25 / 0.5))
    assert res["one_minus_vi"] == round(100 * ((1 - vi / math.log(4)) + 1.0) / 2, 2)  # B is perfect: 1
    assert res["one_to_one"] == round(100 * (3 / 4 + 1.0) / 2, 2)  # A: {2,4}<->{2,4,5} (2) + {3,5}<->{3} (1)
    # exact match over conversations of 2+: A none, B {1,2} matched exactly
    assert (res["exact_precision"], res["exact_recall"], res["exact_f1"]) == (50.0, 50.0, 50.0)


def test_previous_message_skips_system_lines_and_system_lines_link_to_themselves(tmp_path):
    p = write_pair(tmp_path, "a", ["[10:00] <a> x", "=== b joined", "[10:01] <c> y", "=== d left"],
                   ["1 1 -", "0 2 -", "3 3 -"])
    assert previous_message_links(load_irc_file(p)) == {1: {1}, 2: {0}, 3: {3}}


@pytest.mark.skipif(not (IRC / "dev").is_dir(), reason="../shared/data/irc is not beside the repository")
def test_benchmark_previous_message_row_reproduces_the_published_dev_figure(tmp_path):
    """`python -m eval.run benchmark=irc split=dev method=previous_message`: 30.2 link F in the paper."""
    from test_eval_run import ecfg

    from eval.run import run

    res = run(ecfg(tmp_path, tmp_path / "run", "benchmark=irc", "split=dev", "method=previous_message"))
    assert res["files"] == 10 and res["messages"] == 2500
    assert abs(res["link_f1"] - 30.2) <= 0.2
    direct = load_irc(IRC / "dev")  # the scorer on the loader's own baseline agrees with the replay
    from arbor_train.scoring.irc import score

    assert score(direct, {f.name: previous_message_links(f) for f in direct})["link_f1"] == res["link_f1"]


def icfg(src, out, *o):
    from hydra import compose, initialize_config_dir

    from arbor_train.paths import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="irc", overrides=[f"input={src}", f"out_dir={out}", "progress=false", *o])


def test_converter_writes_conversations_and_routing_rows_in_the_reranker_format(tmp_path):
    from arbor_train.conversations.io import read_rows
    from data_gen.irc import run

    lines = ["[10:00] <alice> how do I mount a usb disk?", "=== bob has joined #ubuntu",
             "[10:01] <carol> anyone using pulseaudio on 9.04?", "[10:02] <dave> alice: use the mount command",
             "[10:03] <alice> dave: thanks, mount worked", "[10:04] <erin> carol: yes, pulseaudio is fine"]
    write_pair(tmp_path / "irc" / "dev", "2009-01-01_00", lines,
               ["1 1 -", "2 2 -", "0 3 -", "3 4 -", "2 5 -", "4 5 -"])
    stats = run(icfg(tmp_path / "irc", tmp_path / "out", "splits=[dev]"))
    s = stats["splits"]["dev"]
    assert (s["files"], s["lines"], s["messages"], s["new_conversation"], s["multi_parent"]) == (1, 6, 4, 1, 1)
    rows = read_rows(tmp_path / "out" / "dev" / "jsonl" / "routing.jsonl", "routing")
    assert [(r["turn"], r["gold_parent"], r["gold_states"]) for r in rows] == [
        (2, -1, [-1]), (3, 0, [0]), (4, 3, [3]), (5, 2, [2, 4])]
    assert rows[1]["input"] == "dave: alice: use the mount command"
    for r in rows:  # the gold parent is always among the candidates (recalled or added)
        assert r["gold_parent"] == -1 or r["gold_parent"] in {c["turn"] for c in r["candidates"]}
    (conv,) = read_rows(tmp_path / "out" / "dev" / "jsonl" / "conversations.jsonl", "conversations")
    doc = json.loads(conv["document"])
    assert doc["meta"]["system_lines"] == [1] and doc["meta"]["parents"]["5"] == [2, 4]
    assert "| dev | 1 | 6 | 4 | 1 | 1 |" in (tmp_path / "out" / "README.md").read_text()


def test_converter_teacher_forcing_keeps_the_runtime_route_for_the_rest(tmp_path):
    from arbor_train.conversations.io import read_rows
    from arbor_train.errors import ConfigError
    from data_gen.irc import run

    lines = [f"[10:{i:02d}] <{'abcd'[i % 4]}> message {i} about {'disk sound'.split()[i % 2]}" for i in range(24)]
    links = [f"{max(0, i - 2)} {i} -" for i in range(24)]
    write_pair(tmp_path / "irc" / "dev", "2009-01-01_00", lines, links)
    forced = run(icfg(tmp_path / "irc", tmp_path / "gold", "splits=[dev]"))["splits"]["dev"]
    assert forced["runtime_placed"] == 0
    s = run(icfg(tmp_path / "irc", tmp_path / "out", "splits=[dev]", "teacher_forcing=0.0"))["splits"]["dev"]
    rows = read_rows(tmp_path / "out" / "dev" / "jsonl" / "routing.jsonl", "routing")
    # every annotated message stays where the runtime routed it; the count of right ones is read off the rows
    assert s["runtime_placed"] == s["messages"] == len(rows) == 24
    assert s["runtime_placed_right"] == sum(r["runtime_choice"] in r["gold_states"] for r in rows) < 24
    gold_rows = read_rows(tmp_path / "gold" / "dev" / "jsonl" / "routing.jsonl", "routing")
    assert [r["gold_states"] for r in rows] == [r["gold_states"] for r in gold_rows]  # labels stay gold
    assert [r["candidates"] for r in rows] != [r["candidates"] for r in gold_rows]  # the forest is the runtime's
    assert "committed where the runtime routed them" in (tmp_path / "out" / "README.md").read_text()
    with pytest.raises(ConfigError, match="option teacher_forcing"):
        run(icfg(tmp_path / "irc", tmp_path / "bad", "splits=[dev]", "teacher_forcing=1.5"))


def test_converter_refuses_a_forward_link_before_writing(tmp_path):
    from data_gen.irc import run

    write_pair(tmp_path / "irc" / "dev", "x", ["[10:00] <a> x", "[10:01] <b> y"], ["1 0 -"])
    with pytest.raises(BenchmarkFormatError, match=r"x\.annotation\.txt: line 0: link 1 -> 0 points forward"):
        run(icfg(tmp_path / "irc", tmp_path / "out", "splits=[dev]"))
    assert not (tmp_path / "out").exists()


def test_group_chat_recall_offers_the_addressed_speakers_latest_message_and_a_recency_window(tmp_path):
    from arbor_train.runtime import ArborMemory, default_config

    cfg = default_config("runtime/domain=group_chat")
    mem = ArborMemory.open(tmp_path / "m.sqlite", "chan", cfg)
    said = {}
    for i, (who, text) in enumerate([("alice", "how do I mount a usb disk"), ("bob", "anyone on 9.04 with sound issues"),
                                     ("carol", "grub asks for a password"), ("bob", "pulseaudio keeps crashing")]
                                    + [(f"user{j}", f"unrelated chatter number {j}") for j in range(25)]):
        said[i] = mem.step(f"{who}: {text}", "", f"10:{i:02d}", speaker=who)[0].id
    assert mem.store.get_node(said[0]).speaker == "alice"
    loc = mem.localize("dave: alice: use the mount command", speaker="dave")
    by_id = {c.node_id: c.channels for c in loc.candidates}
    assert by_id[said[0]].get("addressed") == 1.0  # alice's only message, 28 messages back
    assert mem.addressed("thanks Bob and ALICE, and bobby") == ["bob", "alice"]  # whole words, any case
    assert mem.localize("bob: thanks", speaker="bob").candidates  # a speaker's own name is no address
    assert not any(c.channels.get("addressed") for c in mem.localize("bob: thanks", speaker="bob").candidates)
    recent = mem.store.recent_ids("chan", cfg["recall"]["k_recent"])
    assert len(recent) == 20 and recent[0] == said[28]
    mem.close()


def test_group_chat_candidates_tell_the_reranker_who_wrote_them_and_how_long_ago(tmp_path):
    from arbor_train.data import candidate_text
    from arbor_train.runtime import ArborMemory, default_config
    from data_gen.replay import candidate_row

    mem = ArborMemory.open(tmp_path / "m.sqlite", "chan", default_config("runtime/domain=group_chat"))
    for who, text, ts in [("alice", "how do I mount a usb disk", "23:58"), ("bob", "sound is broken", "23:59"),
                          ("carol", "grub wants a password", "00:03")]:
        mem.step(f"{who}: {text}", "", ts, speaker=who)
    loc = mem.localize("dave: alice: use the mount command", speaker="dave", timestamp="00:05")
    by_speaker = {c.speaker: c for c in loc.candidates}
    alice = by_speaker["alice"]
    assert (alice.back, alice.minutes) == (3, 7)  # three messages back; 23:58 -> 00:05 crosses midnight
    assert (by_speaker["carol"].back, by_speaker["carol"].minutes) == (1, 2)
    doc = alice.document()
    assert doc.splitlines()[0] == "Speaker: alice (3 back, 7 min)" and doc.splitlines()[1].startswith("State: alice:")
    # the training rows carry the same fields, so training scores the same text the runtime scores
    turn_of = {c.node_id: c.node_id for c in loc.candidates}
    assert candidate_text(candidate_row(alice, turn_of)) == doc
    mem.close()
    # one-user conversations (no speaker) read as before: no speaker line, topic first
    mem = ArborMemory.open(tmp_path / "u.sqlite", "u", default_config())
    mem.step("Plan Amelie's trip to Valencia.", "Sure.", "2025-01-01T10:00")
    (c,) = mem.localize("Which hotel in Valencia?", for_question=True, timestamp="2025-01-01T10:30").candidates
    assert c.speaker is None and c.document().startswith("Topic: ") and "Speaker" not in c.document()
    assert "speaker" not in candidate_row(c, {c.node_id: 0})
    mem.close()


def test_minutes_between_reads_clock_times_and_iso_dates():
    from arbor_train.runtime.text import minutes_between

    assert minutes_between("10:00", "10:45") == 45
    assert minutes_between("23:50", "00:10") == 20
    assert minutes_between("2023-05-07T13:56", "2023-05-08T13:56") == 24 * 60
    assert minutes_between(None, "10:00") is None and minutes_between("soon", "10:00") is None


def test_routing_sets_written_before_the_group_chat_fields_still_load(tmp_path, smoke_data):
    """Candidate rows gained speaker/back/minutes; a set written without them reads as one-user rows."""
    from datasets import Dataset, Features, load_from_disk

    from arbor_train.conversations.supervision import OPTIONAL, SchemaError, check_dataset, validate_row
    from arbor_train.data import candidate_text, load_sets

    ds = load_from_disk(str(smoke_data / "hf"))["routing"]
    feats = dict(ds.features)
    feats["candidates"] = [{k: v for k, v in ds.features["candidates"].feature.items() if k not in OPTIONAL}]
    old = Dataset.from_list([dict(r, candidates=[{k: v for k, v in c.items() if k not in OPTIONAL}
                                                 for c in r["candidates"]]) for r in ds], features=Features(feats))
    check_dataset("routing", old)  # accepted
    row = dict(next(r for r in old if r["candidates"]))
    validate_row("routing", row, "routing[0]")
    assert candidate_text(row["candidates"][0]).startswith("Topic: ")
    bad = dict(row, candidates=[dict(row["candidates"][0], back="three")])
    with pytest.raises(SchemaError, match=r"routing\[0\]\.candidates\[0\]\.back: expected int32"):
        validate_row("routing", bad, "routing[0]")
    renamed = old.rename_column("gold_parent", "parent")
    with pytest.raises(SchemaError, match="features differ"):
        check_dataset("routing", renamed)
    assert load_sets(smoke_data, ["routing"])["routing"].num_rows == ds.num_rows


def test_the_default_profile_keeps_one_recency_candidate_and_no_address_channel(tmp_path):
    from arbor_train.runtime import ArborMemory, default_config

    mem = ArborMemory.open(tmp_path / "m.sqlite", "chan", default_config())
    for i, who in enumerate(["alice", "bob", "carol"]):
        mem.step(f"{who}: message {i}", "", None, speaker=who)
    loc = mem.localize("dave: alice: hello", speaker="dave")
    assert not any("addressed" in c.channels for c in loc.candidates)
    assert sum("recent" in c.channels for c in loc.candidates) <= 1
    mem.close()


def test_the_reranker_trains_on_a_mixture_of_branchmem_and_irc_routing(tmp_path, smoke_data):
    """`data.mix` adds IRC routing groups to the BranchMemEval training groups (validation unchanged)."""
    from test_train import tcfg

    from arbor_train import roles
    from data_gen.irc import run as convert

    lines = [f"[10:{i:02d}] <{w}> message {i} about {t}" for i, (w, t) in enumerate(
        [("alice", "usb"), ("bob", "sound"), ("alice", "usb mount"), ("carol", "grub"), ("bob", "pulseaudio"),
         ("dave", "alice: usb mount"), ("carol", "grub password")])]
    write_pair(tmp_path / "irc" / "train", "t", lines, ["0 2 -", "2 5 -", "3 6 -", "4 4 -"])
    convert(icfg(tmp_path / "irc", tmp_path / "data", "splits=[train]"))
    base = roles.get("reranker").build(tcfg(tmp_path / "a", smoke_data))
    mixed = roles.get("reranker").build(tcfg(tmp_path / "b", smoke_data, f"data.mix=[{{dir: {tmp_path / 'data' / 'train'},"
                                                                      " sets: [routing], max_groups: 3}]"))
    assert mixed.extras["mixed"] == 3
    assert len(mixed.extras["groups"]["train"]) == len(base.extras["groups"]["train"]) + 3
    assert len(mixed.extras["groups"]["val"]) == len(base.extras["groups"]["val"])
    assert mixed.data_fingerprint != base.data_fingerprint and mixed.data_fingerprint.startswith(base.data_fingerprint)


def test_group_chat_candidates_carry_the_reply_structure_around_the_input_speaker(tmp_path):
    from arbor_train.runtime import ArborMemory, Localization, default_config
    from arbor_train.runtime.rerank import QUERY_FEATURES, pair_features

    mem = ArborMemory.open(tmp_path / "m.sqlite", "chan", default_config("runtime/domain=group_chat"))
    ids = {}
    for key, who, text, parent in [("a1", "alice", "how do I mount a usb disk", None),
                                   ("b1", "bob", "alice: use the mount command", "a1"),
                                   ("c1", "carol", "grub wants a password", None),
                                   ("a2", "alice", "bob: it says permission denied", "b1")]:
        loc = Localization(ids[parent] if parent else None, "gold", 1.0)
        ids[key] = mem.commit(f"{who}: {text}", "", loc, "10:00", speaker=who).id
    by_id = {c.node_id: c.channels for c in mem.localize("bob: alice: try sudo", speaker="bob").candidates}
    a2, c1 = by_id[ids["a2"]], by_id[ids["c1"]]
    # alice's answer to bob: in bob's conversation, a reply to bob, by the one bob last answered, named by him
    assert (a2["same_thread"], a2["replied_input"], a2["input_replied"], a2["named_by_input"]) == (1, 1, 1, 1)
    assert (c1["same_thread"], c1["replied_input"], c1["input_replied"], c1["named_by_input"]) == (0, 0, 0, 0)
    assert a2["speaker_prior"] == 1.0  # bob wrote one message before
    cands = mem.localize("dave: hi all, sound is broken", speaker="dave").candidates
    assert all(c.channels["speaker_prior"] == 0 and c.channels["same_thread"] == 0 for c in cands)
    q = dict(zip(QUERY_FEATURES, pair_features("dave: hi all, sound is broken", cands)[1]))
    assert (q["speaker_new"], q["log_speaker_prior"]) == (1.0, 0.0)
    mem.close()
