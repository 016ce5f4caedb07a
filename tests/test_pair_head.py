"""The reranker's pair-feature head: features the runtime computes for group-chat candidates, the same
numbers in training (torch) and at run time (numpy), refusal of a head trained on other features, and a
tiny run whose exported head the runtime applies to every candidate."""

import json
import math

import numpy as np
import pytest
import torch

from arbor_train.runtime.bundle import BundleError
from arbor_train.runtime.rerank import PAIR_FEATURES, QUERY_FEATURES, PairHead, pair_features
from arbor_train.runtime.schema import Candidate


def cand(node_id, summary="x", speaker=None, back=None, minutes=None, **channels):
    return Candidate(node_id, "topic", "path", summary, [], node_id, 1, channels=channels, speaker=speaker,
                     back=back, minutes=minutes)


def test_group_features_bin_distance_minutes_and_who_names_whom():
    f, q = pair_features("alice: bob, thanks!", [
        cand(1, "bob: did that work?", "bob", back=4, minutes=12, addressed=1.0, addresses_input=1.0, speaker_later=0.0,
             semantic=0.5, recent=1.0, fused=0.02),
        cand(2, "carol: hi", "carol", back=60, minutes=None, speaker_later=3.0)])
    a, b = (dict(zip(PAIR_FEATURES, row)) for row in f)
    assert len(f[0]) == len(PAIR_FEATURES) and len(q) == len(QUERY_FEATURES)
    # one bin each: 4 back is in (3, 5]; 12 minutes in (7, 15]; 60 back past the last edge; no time: unknown
    assert [k for k in PAIR_FEATURES if k.startswith("back") and a[k]] == ["back<=5"]
    assert [k for k in PAIR_FEATURES if k.startswith("minutes") and a[k]] == ["minutes<=15"]
    assert [k for k in PAIR_FEATURES if k.startswith("back") and b[k]] == ["back>50"]
    assert [k for k in PAIR_FEATURES if k.startswith("minutes") and b[k]] == ["minutes_unknown"]
    assert a["log_back"] == pytest.approx(math.log(5) / math.log(101))
    assert (a["addressed"], a["addresses_input"], a["speaker_latest"], a["candidate_question"]) == (1, 1, 1, 1)
    assert (b["addressed"], b["speaker_latest"], b["candidate_question"]) == (0, 0, 0)
    assert (a["semantic"], a["recent"], a["keyword"], a["fused"]) == (0.5, 1.0, 0.0, pytest.approx(0.2))
    qd = dict(zip(QUERY_FEATURES, q))
    assert (qd["group"], qd["thanks"], qd["addresses"], qd["question"], qd["words<=3"]) == (1, 1, 1, 0, 1)


def test_one_user_candidates_have_no_group_features():
    f, q = pair_features("What is Ann's budget?", [cand(1, "Ann budget 900", semantic=0.4)])
    row = dict(zip(PAIR_FEATURES, f[0]))
    group = PAIR_FEATURES[: PAIR_FEATURES.index("input_replied") + 1]
    assert all(row[k] == 0.0 for k in group) and row["semantic"] == 0.4
    assert dict(zip(QUERY_FEATURES, q))["group"] == 0.0 and dict(zip(QUERY_FEATURES, q))["question"] == 1.0


def test_runtime_head_computes_what_the_training_head_computes():
    from arbor_train.roles.reranker import PairHead as TorchHead

    head = TorchHead(hidden=5, seed=3)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn_like(p))
    cands = [cand(1, "bob: ok?", "bob", back=2, minutes=1, same_speaker=1.0), cand(2, "x", "carol", back=9, minutes=40)]
    f, q = pair_features("alice: bob try this", cands)
    with torch.no_grad():
        want = (head(torch.tensor(f)) - torch.tensor(q) @ head.query).numpy()
    got = PairHead.load(json.loads(json.dumps(head.to_json(root_bias=0.7))), "m.json").offsets("alice: bob try this", cands)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_head_for_other_features_is_refused_naming_the_field():
    from arbor_train.roles.reranker import PairHead as TorchHead

    d = TorchHead(hidden=2, seed=0).to_json(0.0)
    with pytest.raises(BundleError, match="manifest.json: field 'pair_head' was trained on other features"):
        PairHead.load({**d, "features": d["features"][:-1]}, "b/manifest.json")
    with pytest.raises(BundleError, match="field 'pair_head' has inconsistent shapes"):
        PairHead.load({**d, "wq": d["wq"][:-1]}, "b/manifest.json")


def test_tiny_run_exports_a_head_the_runtime_adds_to_every_candidate(tmp_path, smoke_data):
    from arbor_train.export import export
    from arbor_train.runtime import ArborMemory, default_config, load_bundle
    from arbor_train.train import train
    from tests.test_train import tcfg

    res = train(tcfg(tmp_path / "run", smoke_data, "task.pair_features=true", "task.pair_hidden=4"))
    bundle = export(res["run_dir"], tmp_path / "bundle", log_artifact=False)
    m = load_bundle(bundle, role="reranker").manifest
    assert m["pair_head"]["features"] == PAIR_FEATURES
    assert any(w != 0.0 for w in m["pair_head"]["w2"]), "the head's output layer starts at zero and must train"
    assert m["new_root_threshold"] == pytest.approx(1 / (1 + math.exp(-m["pair_head"]["root_bias"])), abs=1e-6)
    cfg = default_config("runtime/components=tuned", "runtime/domain=group_chat_wide", f"runtime.reranker.bundle.path={bundle}",
                       "runtime.reranker.bundle.quantize=null", "runtime.embedder.kind=hashing")
    mem = ArborMemory.open(tmp_path / "m.sqlite", "c", cfg)
    for who, text in [("alice", "my wifi drops every hour"), ("bob", "alice: which driver?"), ("carol", "anyone on 22.04?")]:
        mem.step(f"{who}: {text}", "", speaker=who)
    loc = mem.localize("alice: bob: iwlwifi", speaker="alice")
    assert loc.candidates and all(c.speaker for c in loc.candidates)
    # the scores are sigmoid(encoder logit + head offset); the encoder alone gives other scores
    mem.reranker.head, head = None, mem.reranker.head
    plain = mem.reranker.score("alice: bob: iwlwifi", loc.candidates)
    offs = head.offsets("alice: bob: iwlwifi", loc.candidates)
    want = [1 / (1 + math.exp(-(math.log(p / (1 - p)) + o))) for p, o in zip(plain, offs)]
    assert [c.score for c in loc.candidates] == pytest.approx(want, abs=1e-5)
    assert any(abs(o) > 1e-4 for o in offs)
    mem.close()


def test_pair_refit_fits_the_head_on_whole_candidate_lists_and_exports_the_refit_head(tmp_path, smoke_data):
    from arbor_train.export import export
    from arbor_train.runtime import load_bundle
    from arbor_train.train import train
    from tests.test_train import tcfg

    res = train(tcfg(tmp_path / "run", smoke_data, "task.pair_features=true", "task.pair_hidden=4",
                     "task.pair_refit.enabled=true", "task.pair_refit.max_rows=60", "task.pair_refit.epochs=30", "task.pair_refit.lr=0.01"))
    r = res["pair_refit"]
    assert r["rows"] == 60 and r["pairs"] > 60  # every candidate of each row, not a group of the hardest
    assert r["loss"] < r["loss_before"]  # the refit lowers the listwise loss over whole lists
    saved = json.loads((tmp_path / "run" / "final" / "metrics.json").read_text())
    assert saved["pair_refit"] == r
    m = load_bundle(export(res["run_dir"], tmp_path / "bundle", log_artifact=False), role="reranker").manifest
    assert m["new_root_threshold"] == pytest.approx(1 / (1 + math.exp(-m["pair_head"]["root_bias"])), abs=1e-6)
    # the encoder logits read in length-sorted batches of pairs equal those read one pair at a time (no padding)
    one = train(tcfg(tmp_path / "one", smoke_data, "task.pair_features=true", "task.pair_hidden=4",
                     "task.pair_refit.enabled=true", "task.pair_refit.max_rows=60", "task.pair_refit.epochs=30",
                     "task.pair_refit.lr=0.01", "task.pair_refit.logit_batch=1"))["pair_refit"]
    assert one["pairs"] == r["pairs"] and one["loss_before"] == pytest.approx(r["loss_before"], rel=1e-4)


def test_overlap_features_count_the_words_two_messages_share_without_their_nicks():
    from arbor_train.runtime.rerank import EXTRA_PAIR_FEATURES, feature_names

    names = feature_names(["overlap"])
    assert names[: len(PAIR_FEATURES)] == PAIR_FEATURES and names[len(PAIR_FEATURES):] == EXTRA_PAIR_FEATURES["overlap"]
    f, _ = pair_features("alice: my wireless card drops after suspend", [
        cand(1, "bob: alice: does the wireless card come back after a reboot?", "bob", back=1),
        cand(2, "alice: hi all", "alice", back=2), cand(3, "carol: wireless", "carol", back=3)], ["overlap"])
    got = [dict(zip(names, row)) for row in f]
    # "wireless", "card" shared with 1 ("alice" is the candidate's address, not a shared word; "after" is a stop
    # word); nothing with 2 (its own nick "alice" is dropped); one word with 3
    assert [[r[k] for k in EXTRA_PAIR_FEATURES["overlap"][:3]] for r in got] == [[1, 1, 0], [0, 0, 0], [1, 0, 0]]
    assert got[0]["overlap_share"] == pytest.approx(2 / 4) and got[2]["overlap_share"] == pytest.approx(1 / 4)
    assert f[0][: len(PAIR_FEATURES)] == pair_features("alice: my wireless card drops after suspend",
                                                       [cand(1, "bob: alice: does the wireless card come back after a reboot?",
                                                             "bob", back=1)])[0][0]  # the base features are unchanged
    with pytest.raises(ValueError, match="unknown pair feature group 'nope'"):
        pair_features("x", [cand(1)], ["nope"])


def test_a_head_with_extras_and_logit_inputs_computes_the_same_in_torch_and_numpy():
    from arbor_train.roles.reranker import PairHead as TorchHead

    head = TorchHead(hidden=6, seed=1, extra=["overlap"], logit_input=True)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn_like(p))
    cands = [cand(1, "bob: try the nvidia driver", "bob", back=2, minutes=1), cand(2, "carol: nvidia?", "carol", back=9),
             cand(3, "x", "dave", back=30, minutes=40)]
    logits = torch.tensor([1.5, -0.5, 3.0])
    f, q = pair_features("alice: bob: which nvidia driver", cands, ["overlap"])
    with torch.no_grad():
        cols = TorchHead.logit_columns(logits, torch.tensor([3]))
        want = (head(torch.tensor(f), cols) - torch.tensor(q) @ head.query).numpy()
    d = json.loads(json.dumps(head.to_json(root_bias=0.2)))
    rt = PairHead.load(d, "m.json")
    assert rt.extra == ["overlap"] and rt.logit_input
    got = rt.offsets("alice: bob: which nvidia driver", cands, logits.numpy())
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # the gap is to the best candidate: 0 for the best, and the offsets move when the logits do
    assert cols[2, 1] == 0 and cols[0, 1] == pytest.approx(1.5 / 5)
    assert not np.allclose(rt.offsets("alice: bob: which nvidia driver", cands, logits.numpy() + 1.0), got)
    with pytest.raises(ValueError, match="reads the encoder's logits"):
        rt.offsets("alice: bob: which nvidia driver", cands)
    with pytest.raises(BundleError, match="field 'pair_head' was trained on other features"):
        PairHead.load({**d, "features": d["features"] + ["overlap>=9"]}, "b/manifest.json")
    with pytest.raises(BundleError, match="field 'pair_head' was trained on other features"):
        PairHead.load({**d, "logit_inputs": ["something_else"]}, "b/manifest.json")
    with pytest.raises(BundleError, match="inconsistent shapes"):
        PairHead.load({k: v for k, v in d.items() if k != "logit_inputs"}, "b/manifest.json")


def test_refit_with_a_held_out_share_keeps_the_best_epoch_and_exports_extras(tmp_path, smoke_data):
    from arbor_train.errors import ConfigError
    from arbor_train.export import export
    from arbor_train.runtime import load_bundle
    from arbor_train.runtime.rerank import LOGIT_INPUTS, feature_names
    from arbor_train.train import train
    from tests.test_train import tcfg

    res = train(tcfg(tmp_path / "run", smoke_data, "task.pair_features=true", "task.pair_hidden=4",
                     "task.pair_extra=[overlap]", "task.pair_logit_input=true",
                     "task.pair_refit.enabled=true", "task.pair_refit.max_rows=60", "task.pair_refit.epochs=12", "task.pair_refit.lr=0.01", "task.pair_refit.val_share=0.25"))
    r = res["pair_refit"]
    assert r["rows"] == 60 and r["val_rows"] == 15 and len(r["val_curve"]) == 12
    # the head kept is the best epoch's on the held-out rows, not the last one's
    assert r["val_loss"] == pytest.approx(min(r["val_curve"]), abs=1e-4)
    assert r["best_epoch"] == 1 + r["val_curve"].index(min(r["val_curve"]))
    m = load_bundle(export(res["run_dir"], tmp_path / "bundle", log_artifact=False), role="reranker").manifest
    assert m["pair_head"]["features"] == feature_names(["overlap"]) and m["pair_head"]["logit_inputs"] == LOGIT_INPUTS
    with pytest.raises(ConfigError, match="option task.pair_extra"):
        train(tcfg(tmp_path / "bad", smoke_data, "task.pair_features=true", "task.pair_extra=[nope]"))
    with pytest.raises(ConfigError, match="set task.pair_features=true"):
        train(tcfg(tmp_path / "bad2", smoke_data, "task.pair_logit_input=true"))


def test_refit_on_questions_keeps_the_held_out_sessions_out_and_gives_a_question_no_new_root(tmp_path, smoke_data):
    from arbor_train import data as D
    from arbor_train.errors import ConfigError
    from arbor_train.roles.reranker import refit_rows
    from arbor_train.train import train
    from tests.test_train import tcfg

    loc = list(D.load_sets(smoke_data, ["localization"])["localization"])
    sessions = sorted({str(r["session_id"]) for r in loc})
    held = sessions[: len(sessions) // 2]
    answerable = [r for r in loc if any(x["turn"] in D.gold_turns(r, "localization") for x in r["candidates"])]
    mix = f"data.mix=[{{dir: {smoke_data}, sets: [localization], exclude_sessions: [{','.join(held)}]}}]"
    c = tcfg(tmp_path / "rows", smoke_data, "task.pair_features=true", "task.question_document=text", mix,
             "task.sets=[routing]", "task.pair_refit.sets=[localization]")
    rows = refit_rows(c)
    # the main set holds no localization among its task.sets: only the mix source's questions, its held-out
    # sessions left out as in training, each with every evidence state a gold and read as a question
    assert len(rows) == sum(str(r["session_id"]) not in held for r in answerable) > 0
    assert all(q and not root and pos for _, _, pos, root, q in rows)
    c["task"]["pair_refit"]["sets"] = ["routing", "localization"]
    both = refit_rows(c)
    assert len(both) > len(rows) and sum(not q for *_, q in both) == len(both) - len(rows)
    res = train(tcfg(tmp_path / "run", smoke_data, "task.pair_features=true", "task.pair_hidden=4", "task.pair_extra=[ranks]",
                     "task.question_document=text", mix, "task.sets=[routing]", "task.pair_refit.enabled=true",
                     "task.pair_refit.sets=[localization]", "task.pair_refit.epochs=30", "task.pair_refit.lr=0.01"))
    r = res["pair_refit"]
    assert r["rows"] == len(rows) and r["loss"] < r["loss_before"]
    with pytest.raises(ConfigError, match="option task.pair_refit.sets"):
        train(tcfg(tmp_path / "bad", smoke_data, "task.pair_features=true", "task.pair_refit.enabled=true",
                   "task.pair_refit.sets=[turns]"))
