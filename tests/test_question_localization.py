"""Questions asked after the conversation (issue #40): a wide question recall, the question document, multi-positive
router groups, the localized-states read layer, the hybrid BM25 + dense baseline and the localization metrics."""

import json
import math

import pytest
import torch

from conftest import TURNS


def _memory(cfg):
    from arbor_train.runtime import ArborMemory

    mem = ArborMemory.open(":memory:", "c", cfg)
    ids = []
    for i, (u, a) in enumerate(TURNS):
        node, _ = mem.step(u, a, f"2025-05-0{1 + i}")
        ids.append(node.id)
    return mem, ids


def test_a_question_recalls_wider_than_a_turn_and_the_fact_channel_leads_to_its_sources():
    from arbor_train.runtime import default_config

    cfg = default_config("runtime.recall.max_candidates=2", "runtime.recall.k_semantic=2", "runtime.recall.k_keyword=2")
    mem, ids = _memory(cfg)
    latest = mem.store.latest_node("c")
    q = "What is Alice's budget for the Lisbon trip?"
    narrow = mem._recall(q, mem.embed(q), latest, for_question=True)
    assert len(narrow) == 2  # no question keys set: a question recalls as a turn does
    mem.cfg["context"]["question_recall"] = {"k_semantic": 8, "k_keyword": 8, "k_fact": 4, "max_candidates": 8}
    wide = mem._recall(q, mem.embed(q), latest, for_question=True)
    assert len(wide) > 2 and {c.node_id for c in narrow} <= {c.node_id for c in wide}
    facts = {nid for f, _ in mem.store.search_facts("c", q, 4) for nid in f.sources}
    assert facts and {c.node_id for c in wide if "fact" in c.channels} == facts
    # a turn's recall is untouched by the question keys
    assert len(mem._recall(q, mem.embed(q), latest)) == 2


def test_recall_records_each_ranked_channel_place_whichever_candidates_are_kept():
    from arbor_train.runtime import default_config
    from arbor_train.runtime.rerank import EXTRA_PAIR_FEATURES, feature_names, pair_features
    from arbor_train.runtime.schema import RANKED_CHANNELS

    mem, ids = _memory(default_config())  # every channel hit is kept (max_candidates), so the places run 1, 2, ...
    mem.cfg["context"]["question_recall"] = {"k_semantic": 8, "k_keyword": 8, "k_fact": 4, "max_candidates": 48}
    q = "What is Alice's budget for the Lisbon trip?"
    cands = mem._recall(q, mem.embed(q), mem.store.latest_node("c"), for_question=True)
    for ch in RANKED_CHANNELS:  # a channel's hits carry 1, 2, ... in the order of the channel's own scores
        hits = sorted((c for c in cands if f"{ch}_rank" in c.channels), key=lambda c: c.channels[f"{ch}_rank"])
        assert hits, ch
        assert [c.channels[f"{ch}_rank"] for c in hits] == [float(i + 1) for i in range(len(hits))]
        assert [c.channels[ch] for c in hits] == sorted((c.channels[ch] for c in hits), reverse=True)
    kw = [nid for nid, _ in mem.store.keyword_search("c", q, 8)]
    assert [c.node_id for c in sorted((c for c in cands if "keyword_rank" in c.channels),
                                      key=lambda c: c.channels["keyword_rank"])] == kw
    # the `ranks` pair features read those places: the same for a candidate scored alone or among the others
    names, extra = feature_names(["ranks"]), EXTRA_PAIR_FEATURES["ranks"]
    best = next(c for c in cands if c.node_id == kw[0])
    alone = dict(zip(names, pair_features(q, [best], ["ranks"])[0][0]))
    among = dict(zip(names, pair_features(q, cands, ["ranks"])[0][cands.index(best)]))
    assert alone["keyword_rr"] == 1.0 and [alone[k] for k in extra] == [among[k] for k in extra]
    unranked = next((c for c in cands if "semantic_rank" not in c.channels), None)
    if unranked is not None:  # a candidate the channel did not find reads 0 for it
        assert dict(zip(names, pair_features(q, [unranked], ["ranks"])[0][0]))["semantic_rr"] == 0.0


def test_a_question_document_is_the_state_own_turn_and_date_when_the_config_or_bundle_says_so():
    from arbor_train.runtime import default_config

    mem, ids = _memory(default_config())
    q = "Which hotel is Bob's venue?"
    loc = mem.localize(q, for_question=True)
    assert all(not c.as_question for c in loc.candidates)  # default: the state document, as for a turn
    assert loc.candidates[0].document().startswith("Topic: ")
    mem.cfg["localization"]["question_document"] = "text"
    loc = mem.localize(q, for_question=True)
    venue = next(c for c in loc.candidates if c.node_id == ids[2])
    assert venue.document() == "Date: 2025-05-03\nAlso, Bob's venue is Hotel Infante.\nGot it.\nTopic: " + venue.topic_key
    assert all(not c.as_question for c in mem.localize("Bob's budget rises.").candidates)  # a turn never
    mem.reranker.question_document = "state"  # a bundle trained on state documents wins over the config
    assert all(not c.as_question for c in mem.localize(q, for_question=True).candidates)


def _question_row(gold, n=8):
    cands = [{"turn": t, "topic_key": f"topic {t}", "path_summary": "", "node_summary": f"state {t}",
              "entities": [], "channels": "{}", "runtime_score": 1.0 - t / 10, "recalled": True,
              "state_text": f"turn text {t}", "state_time": "8 May 2023"} for t in range(n)]
    return {"input": "When did Caroline go to the support group?", "candidates": cands, "gold_states": gold}


def test_a_question_with_several_evidence_states_trains_on_all_of_them():
    from arbor_train.data import rerank_groups

    row = _question_row([1, 3, 5])
    one, = rerank_groups([row], "localization", 6)
    assert one.golds == [] and one.cands[one.gold]["turn"] == 5  # the latest evidence state only
    many, = rerank_groups([row], "localization", 6, multi_positive=True, question_document="text")
    assert sorted(many.cands[i]["turn"] for i in many.golds) == [1, 3, 5] and many.gold in many.golds
    assert len(many.docs) == 6 and many.docs[many.golds[0]].startswith("Date: 8 May 2023\nturn text")
    capped, = rerank_groups([_question_row([0, 1, 2, 3, 4, 5])], "localization", 6, multi_positive=True)
    assert len(capped.golds) == 3  # at most half the group are positives
    routing = dict(row, gold_parent=5, gold_states=[5])  # a turn's group is unchanged by the options
    r, = rerank_groups([routing], "routing", 6, multi_positive=True, question_document="text")
    assert r.golds == [] and r.docs[0].startswith("Topic: ")


def test_the_multi_positive_loss_is_the_mass_on_every_evidence_state():
    from arbor_train.data import collate_groups
    from arbor_train.roles.reranker import RerankerModule

    class Fixed(RerankerModule):
        def scores(self, batch):
            return torch.tensor([0.5, 2.0, -1.0, 1.0])

    m = Fixed(torch.nn.Linear(1, 1), {"task": {"new_root_init": 0.0}, "seed": 0, "optim": {}})
    ex = {"input_ids": [[1]] * 4, "attention_mask": [[1]] * 4, "gold": 1, "secondary": -1, "golds": [1, 3]}
    loss, n, _ = m.step_loss(collate_groups([ex], 0))
    logits = torch.tensor([0.5, 2.0, -1.0, 1.0, 0.0])
    want = -torch.logsumexp(torch.log_softmax(logits, 0)[[1, 3]], 0)
    assert n == 1 and loss.item() == pytest.approx(want.item(), abs=1e-6)
    single, _, _ = m.step_loss(collate_groups([dict(ex, golds=[])], 0))
    assert single.item() == pytest.approx(-torch.log_softmax(logits, 0)[1].item(), abs=1e-6)


def test_mixed_question_rows_leave_out_the_excluded_conversations_and_the_bundle_names_the_rest(tmp_path, smoke_data):
    from test_train import tcfg

    from arbor_train import roles
    from arbor_train.roles.reranker import mix_groups

    rows = [json.loads(x) for x in open(smoke_data / "jsonl" / "localization.jsonl")]
    sessions = sorted({r["session_id"] for r in rows})
    drop = sessions[0]
    mix = f"data.mix=[{{dir: {smoke_data}, sets: [localization], exclude_sessions: [{drop}]}}]"
    c = tcfg(tmp_path / "a", smoke_data, mix, "task.multi_positive=true", "task.question_document=text")
    groups, used = mix_groups(c)
    assert groups and drop not in used and set(used) == set(sessions) - {drop}
    built = roles.get("reranker").build(c)
    extras = roles.get("reranker").extras(c, built)
    assert extras["training_sessions"] == used and extras["question_document"] == "text"
    with pytest.raises(Exception, match=r"option task.question_document must be one of state, text"):
        roles.get("reranker").build(tcfg(tmp_path / "b", smoke_data, "task.question_document=raw"))


def test_a_router_is_refused_on_the_conversations_it_was_trained_on(monkeypatch):
    import arbor_train.runtime.bundle as B
    from arbor_train.errors import UserError
    from eval.run import check_extractor_heldout

    class Fake:
        manifest = {"training_sessions": ["41", "42"]}

    monkeypatch.setattr(B, "load_bundle", lambda path, role=None: Fake())
    cfg = {"extractors": {}, "reranker": {"kind": "bundle", "bundle": {"path": "/r"}}}
    check_extractor_heldout(cfg, ["26", "30"])
    with pytest.raises(UserError, match=r"reranker.bundle.path='/r': the reranker was trained on 1 of the 2"):
        check_extractor_heldout(cfg, ["26", "41"])


def test_localized_order_reads_as_many_states_as_hold_the_confidence_mass():
    from arbor_train.runtime.layers import localized_order
    from arbor_train.runtime.schema import Candidate, Localization

    def loc(scores):
        cands = [Candidate(i, "", "", "", [], i, 0, score=s) for i, s in enumerate(scores)]
        return Localization(0, "rerank", 1.0, candidates=cands)

    assert localized_order(loc([0.999, 0.01, 0.01, 0.01]), 8, 0.9) == [0]  # a confident router reads one
    flat = localized_order(loc([0.5, 0.5, 0.5, 0.5]), 8, 0.9)
    assert flat == [0, 1, 2, 3]  # an unsure one reads them all
    assert localized_order(loc([0.5, 0.5, 0.5, 0.5]), 2, 0.9) == [0, 1]  # at most k
    assert localized_order(loc([0.2, 0.9, 0.6]), 8, 0.5) == [1]  # best first
    assert localized_order(loc([]), 8, 0.9) == []


def test_the_localized_layer_reads_the_top_states_with_their_neighbourhood():
    from arbor_train.runtime import default_config

    cfg = default_config("runtime/read_policy=cross_session", "runtime.context.localized_mass=0.01")
    mem, ids = _memory(cfg)
    q = "Which hotel is Bob's venue?"
    loc, ctx = mem.read(q, budget=1024)
    block = ctx.block("LocalizedStates")
    top = max(loc.candidates, key=lambda c: c.score).node_id
    assert block is not None and top in block.node_ids
    node = mem.store.get_node(top)
    near = {node.parent_id} - {None} | set(mem.store.children([top], 2)[top])
    assert near and near <= set(block.node_ids)  # its trajectory neighbourhood comes with it
    seqs = [mem.store.get_node(i).seq for i in block.node_ids]
    assert seqs == sorted(seqs)  # rendered in conversation order
    assert ctx.block("Supplemental") is None or not set(ctx.block("Supplemental").node_ids) & set(block.node_ids)
    cfg["ablation"]["localized_states"] = False
    mem2, _ = _memory(cfg)
    assert mem2.read(q, budget=1024)[1].block("LocalizedStates") is None
    # the default read policy lists no localized layer: in-dialogue questions read as before
    mem3, _ = _memory(default_config())
    assert mem3.read(q, budget=1024)[1].block("LocalizedStates") is None


def test_the_hybrid_baseline_fuses_bm25_and_dense_ranks_and_forgets_from_both():
    from arbor_train.replay.methods import BM25Method, DenseMethod, HybridMethod
    from arbor_train.runtime.context import TokenCounter
    from arbor_train.runtime.embed import HashingEmbedder

    counter, emb = TokenCounter(None), HashingEmbedder(64)
    methods = [BM25Method(counter), DenseMethod(counter, emb), HybridMethod(counter, emb)]
    for m in methods:
        for i, (u, a) in enumerate(TURNS):
            m.observe(i, u, a, None, False)
    bm25, dense, hybrid = methods
    assert hybrid.bm25.turns is hybrid.turns is hybrid.dense.turns and len(hybrid.turns) == len(TURNS)  # one copy
    assert len(hybrid.dense.vecs) == len(TURNS) and hybrid.bm25.ranked(q := "Bob's venue hotel") == bm25.ranked(q)
    kw, dn = bm25.ranked(q), dense.ranked(q)
    fused = {}
    for ranks in (kw, dn):
        for r, i in enumerate(ranks):
            fused[i] = fused.get(i, 0) + 1 / (60 + r + 1)
    best = max(fused, key=fused.get)
    res = hybrid.read(q, None, 60)
    assert res.turn_ids and best in res.turn_ids
    hybrid.forget([best])
    assert best not in hybrid.bm25.ranked(q) and best not in hybrid.dense.ranked(q)
    assert best not in hybrid.read(q, None, 400).turn_ids


def test_locomo_records_question_localization_for_a_localizing_method():
    from arbor_train.replay.methods import ReadResult
    from eval.protocols.locomo import summarize

    recs = [{"session_id": "26", "category": 1, "read_s": 0.1, "context_tokens": 10, "evidence_recall": 1.0, "answer_token_recall": 1.0,
             "localization_at_1": 1.0, "localization_at_5": 1.0, "evidence_in_candidates": 1.0},
            {"session_id": "26", "category": 2, "read_s": 0.1, "context_tokens": 10, "evidence_recall": 0.0, "answer_token_recall": 0.5,
             "localization_at_1": 0.0, "localization_at_5": 1.0, "evidence_in_candidates": 1.0}]
    out = summarize(recs, [])
    assert out["localization_at_1"] == 0.5 and out["localization_at_5"] == 1.0
    assert "localization_at_1" not in summarize([{k: v for k, v in r.items() if "local" not in k and "cand" not in k}
                                                 for r in recs], [])
    assert ReadResult("x", 1).localized == ()
    assert not math.isnan(out["answer_token_recall"])


def test_cross_encoder_scores_are_memoised_per_pair_and_per_weights(monkeypatch):
    """A replay read at several budgets scores each (question, document) once; other weights never share."""
    from arbor_train.runtime.rerank import CrossEncoderReranker
    from arbor_train.runtime.schema import Candidate

    calls = []

    def fake(self, cands, query, docs):
        calls.append(len(docs))
        return [len(d) / 100 for d in docs]

    monkeypatch.setattr(CrossEncoderReranker, "_score", fake)
    a = CrossEncoderReranker(torch.nn.Linear(1, 1), None, 64)
    a.cache_ns = "bundle:/x:1"
    cands = [Candidate(i, f"topic {i}", "", "s" * i, [], i, 0) for i in range(3)]
    first = a.score("q?", cands)
    again = a.score("q?", cands + [Candidate(9, "new", "", "", [], 9, 0)])
    assert again[:3] == first and calls == [3, 1]  # only the new pair was scored
    b = CrossEncoderReranker(torch.nn.Linear(1, 1), None, 64)
    b.cache_ns = "bundle:/x:2"  # another export of the same folder: its own memo
    b.score("q?", cands)
    assert calls == [3, 1, 3]


def test_relative_dates_are_written_out_against_the_turn_own_time():
    from arbor_train.runtime.text import parse_date, resolve_dates

    ts = "1:56 pm on 8 May, 2023"  # a Monday
    assert str(parse_date(ts)) == "2023-05-08" and str(parse_date("May 8, 2023")) == "2023-05-08"
    assert str(parse_date("2023-05-08T13:56")) == "2023-05-08" and parse_date("13:56") is None
    got = resolve_dates("I went yesterday. Last week I ran; two days ago, 3 years ago, last Friday, last month.", ts)
    assert got == ("I went yesterday (7 May 2023). Last week (the week before 8 May 2023) I ran; two days ago "
                   "(6 May 2023), 3 years ago (2020), last Friday (5 May 2023), last month (April 2023).")
    assert resolve_dates("yesterday", None) == "yesterday" and resolve_dates("no dates here", ts) == "no dates here"
    assert resolve_dates("last month", "2023-01-15") == "last month (December 2022)"


def test_the_cross_session_policy_writes_the_dates_out_and_the_default_does_not():
    from arbor_train.runtime import ArborMemory, default_config

    for policy, want in (("cross_session", True), ("default", False)):
        cfg = default_config(f"runtime/read_policy={policy}", "runtime.context.supplemental_budget=400",
                             "runtime.context.supplemental_match=keyword")
        mem = ArborMemory.open(":memory:", "c", cfg)
        mem.step("Caroline: I went to the support group yesterday.", "Melanie: Wow!", "1:56 pm on 8 May, 2023")
        mem.step("Caroline: Painting is my hobby.", "Melanie: Nice.", "2:00 pm on 8 May, 2023")
        _, ctx = mem.read("When did Caroline go to the support group?", budget=600)
        assert ("yesterday (7 May 2023)" in ctx.text) is want, ctx.text
