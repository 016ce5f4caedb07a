"""Causal boundary, revision/supersede, malformed extractor output, context assembly, ablations."""

import copy
import json
import logging

import pytest

from arbor_train.runtime import ArborMemory, ExtractorSet, Localization, TurnInput
from arbor_train.runtime.validate import MAX_CHARS, ValidationReport, validate_items


def build(cfg, tmp_path, turns, conv="c"):
    mem = ArborMemory.open(tmp_path / "m.sqlite", conv, cfg)
    for u, a in turns:
        mem.step(u, a, "2024-05-01")
    return mem


# ---------------------------------------------------------------- causal boundary
def test_reading_at_turn_t_never_sees_what_turn_t_extracts(runtime_cfg, tmp_path, turns):
    mem = build(runtime_cfg, tmp_path, turns)
    t = "Zoltan's budget is $777. Zoltan booked the Quasar Hall."
    loc = mem.localize(t)
    ctx = mem.assemble(t, loc)
    assert "Zoltan" not in ctx.text and "777" not in ctx.text
    counts = mem.stats()
    mem.commit(t, "Noted.", loc, "2024-05-02")
    after = mem.stats()
    assert after["nodes"] == counts["nodes"] + 1 and after["records"] > counts["records"]
    loc2, ctx2 = mem.read("What is Zoltan's budget?")
    assert "$777" in ctx2.text  # first visible at turn t+1
    mem.close()


# ---------------------------------------------------------------- revision
def test_update_supersedes_and_history_stays_traceable(runtime_cfg, tmp_path, turns):
    mem = build(runtime_cfg, tmp_path, turns)
    recs = [r for r in mem.store.records("c") if r.key == "budget"]
    alice = [r for r in recs if r.subject == "Alice"]
    bob = [r for r in recs if r.subject == "Bob"]
    assert [r.value for r in alice] == ["$1200", "$1500"]
    old, new = alice
    assert old.superseded_by == new.id and new.supersedes == old.id and new.current and not old.current
    assert [r.value for r in mem.store.record_history(old.id)] == ["$1200", "$1500"]
    assert len(bob) == 1 and bob[0].current, "a parallel agenda's budget is not superseded"
    _, ctx = mem.read("What was Alice's previous budget?")
    upd = ctx.block("UpdateEvidence")
    assert upd is not None and "previous: $1200" in upd.lines[0] and "current: $1500" in upd.lines[0]
    assert ctx.blocks[0].name == "UpdateEvidence", "update evidence comes first for update questions"
    _, ctx = mem.read("What is Bob's budget?")
    assert "$1500" not in (ctx.block("States") or ctx.block("UpdateEvidence")).render()
    mem.close()


def test_coexisting_keys_do_not_supersede_and_repeats_add_provenance(runtime_cfg, tmp_path):
    mem = build(runtime_cfg, tmp_path, [
        ("My hobby is pottery.", "Nice."),
        ("My hobby is climbing.", "Fun."),
        ("I live in Berlin.", "Ok."),
        ("I live in Berlin.", "Still Berlin."),
        ("I moved to Munich.", "Ok."),
    ])
    recs = mem.store.records("c")
    hobbies = [r for r in recs if r.key == "hobby"]
    assert {r.value for r in hobbies} == {"pottery", "climbing"} and all(r.current for r in hobbies)
    city = [r for r in recs if r.key == "home_city"]
    assert [r.value for r in city] == ["Berlin", "Munich"]
    assert len(city[0].sources) == 2, "a repeated value adds provenance, not a new record"
    assert city[0].superseded_by == city[1].id
    mem.close()


def test_artifact_revision_keeps_old_order_reachable(runtime_cfg, tmp_path):
    mem = build(runtime_cfg, tmp_path, [
        ("Alice's itinerary: Belem Tower, then Alfama, then LX Factory.", "Ok."),
        ("Alice's itinerary: Alfama, then Belem Tower, then Sintra.", "Updated."),
    ])
    arts = mem.store.artifacts("c", include_superseded=True)
    assert [a.items for a in arts] == [["Belem Tower", "Alfama", "LX Factory"], ["Alfama", "Belem Tower", "Sintra"]]
    assert arts[0].superseded_by == arts[1].id
    _, ctx = mem.read("What is the order of stops in Alice's itinerary?")
    art = ctx.block("ArtifactEvidence").render()
    assert "1. Alfama; 2. Belem Tower; 3. Sintra" in art and "LX Factory" not in art
    _, ctx = mem.read("What was the previous order of Alice's itinerary?")
    assert "LX Factory" in ctx.block("ArtifactEvidence").render()
    mem.close()


def test_computed_answers_from_events(runtime_cfg, tmp_path, turns):
    mem = build(runtime_cfg, tmp_path, turns)
    _, ctx = mem.read("How many km did I run in total?")
    comp = ctx.block("Computed")
    assert ctx.blocks[0].name == "Computed"
    assert "count of matching events = 2" in comp.lines and "sum over matching events = 13 km" in comp.lines
    mem.close()


# ---------------------------------------------------------------- malformed extractor output
class ScriptedExtractor:
    name = "scripted"

    def __init__(self, outputs):
        self.outputs = outputs

    def run(self, kind, turns):
        return [self.outputs.get(kind, "[]") for _ in turns]


GOOD = {"key": "home_city", "value": "Lisbon", "tag": "location", "entities": ["Lisbon"], "evidence": "I live in Lisbon"}


@pytest.mark.parametrize("raw, kept, repaired, rejected", [
    (json.dumps([GOOD]), 1, 0, 0),
    ("```json\n" + json.dumps([GOOD]) + "\n```", 1, 1, 0),                         # fences
    (json.dumps([GOOD])[:-1] + ",]", 1, 1, 0),                                      # trailing comma
    ('[{"key": "home_city", "value": ', 0, 0, 1),                                   # invalid JSON
    (json.dumps([{**GOOD, "confidence": 0.9}]), 1, 1, 0),                          # unknown field dropped
    (json.dumps([{**GOOD, "value": "x" * MAX_CHARS}]), 0, 0, 1),                  # over-long string
    (json.dumps([{**GOOD, "key": f"k{i}"} for i in range(9)]), 6, 1, 0),          # more than 6 slots
    (json.dumps([{**GOOD, "key": "Home City"}]), 1, 1, 0),                         # key normalised
    (json.dumps([{**GOOD, "key": "!!!"}]), 0, 0, 1),                               # key unusable
    (json.dumps([{"value": "Lisbon"}]), 0, 0, 1),                                  # missing key
    (json.dumps({"key": "home_city"}), 0, 0, 1),                                   # not a list
    (json.dumps([GOOD, "just text"]), 1, 0, 1),                                    # one bad item
    (json.dumps([{**GOOD, "entities": "Lisbon"}]), 0, 0, 1),                      # wrong field type
])
def test_state_output_is_repaired_or_rejected(raw, kept, repaired, rejected, caplog):
    report = ValidationReport()
    with caplog.at_level(logging.WARNING):
        out = validate_items(raw, "states", report)
    assert len(out) == kept and len(report.repaired) == repaired and len(report.rejected) == rejected
    assert len(caplog.records) == repaired + rejected, "every repair or rejection is logged"
    for slot in out:
        assert set(slot) == {"key", "value", "tag", "entities", "evidence"}
        assert all(len(v) < MAX_CHARS for v in [slot["value"], slot["evidence"], *slot["entities"]])


@pytest.mark.parametrize("kind, raw, kept", [
    ("facts", '[{"text": "Alice lives in Lisbon", "entities": ["Alice"], "tags": ["location"],}]', 1),
    ("facts", '[{"text": ""}]', 0),
    ("artifacts", '[{"name": "itinerary", "items": ["A", "B"], "order": 1}]', 1),
    ("artifacts", '[{"name": "itinerary"}]', 0),
    ("events", '[{"action": "run", "text": "I ran 5 km", "quantity": "5"}]', 1),
    ("events", '[{"action": "run", "text": "I ran", "quantity": "five"}]', 0),
])
def test_other_kinds_are_validated(kind, raw, kept):
    assert len(validate_items(raw, kind, ValidationReport())) == kept


def test_malformed_model_output_never_reaches_the_store(runtime_cfg, tmp_path, caplog):
    mem = ArborMemory.open(tmp_path / "m.sqlite", "c", runtime_cfg)
    bad = ScriptedExtractor({
        "states": "```json\n[{\"key\": \"Home City\", \"value\": \"Lisbon\", \"extra\": 1},"
                  " {\"key\": \"pet_name\", \"value\": \"" + "x" * 300 + "\"},]\n```",
        "facts": "Sure! Here are the facts: not json at all",
        "artifacts": '{"name": "itinerary"}',
        "events": '[{"action": "run", "text": "ran", "quantity": "lots"}]',
        "entities": '["Lisbon", 42]',
        "summary": "A summary " * 40,
    })
    ex = ExtractorSet({}, runtime_cfg["heuristics"])
    ex.by_kind = {k: bad for k in ex.by_kind}
    mem.extractors = ex
    with caplog.at_level(logging.WARNING):
        node, _ = mem.step("I live in Lisbon.", "Nice.")
    recs = mem.store.records("c")
    assert [(r.key, r.value) for r in recs] == [("home_city", "Lisbon")]
    assert mem.store.facts("c") == [] and mem.store.artifacts("c") == [] and mem.store.events("c") == []
    assert len(node.node_summary) < 180 and node.entities == ["Lisbon", "42"]
    assert any("rejected" in r.getMessage() for r in caplog.records)
    mem.close()


# ---------------------------------------------------------------- context assembly
def test_long_trajectory_keeps_four_recent_raw_and_summaries(runtime_cfg, tmp_path):
    runtime_cfg["context"]["branch_budget"] = 360
    turns = [(f"Alice's trip to Lisbon, step {i}: we discussed option number {i} for the museum day in detail.",
              "Detailed answer " * 12) for i in range(12)]
    mem = ArborMemory.open(tmp_path / "m.sqlite", "c", runtime_cfg)
    prev = None
    for u, a in turns:
        prev = mem.commit(u, a, Localization(prev.id if prev else None, "test", 1.0))
    loc, ctx = mem.read("What did we decide for Alice's Lisbon museum day?")
    prim = ctx.block("PrimaryPath")
    raw = [l for l in prim.lines if l.startswith("User:") or "User:" in l[:30]]
    summ = [l for l in prim.lines if "(summary)" in l]
    assert len(raw) == 4 and "step 11" in raw[-1] and "step 8" in raw[0]
    assert summ and all("Detailed answer" not in s for s in summ)
    assert prim.tokens <= 360 and ctx.tokens <= ctx.budget
    mem.close()


def test_budget_smaller_than_fixed_prompt_is_refused(runtime_cfg, tmp_path, turns):
    mem = build(runtime_cfg, tmp_path, turns)
    with pytest.raises(ValueError, match="smaller than the fixed prompt"):
        mem.read("What is Alice's budget?", budget=5)
    mem.close()


@pytest.mark.parametrize("budget", [64, 128, 256, 512, 1024])
def test_context_never_exceeds_the_read_budget(runtime_cfg, tmp_path, turns, budget):
    mem = build(runtime_cfg, tmp_path, turns)
    for q in ["What is Alice's current budget?", "How many km did I run in total?", "What is Bob's venue?"]:
        _, ctx = mem.read(q, now="2024-06-01", budget=budget)
        assert ctx.tokens <= budget
        assert mem.counter.count(ctx.text) <= budget + 8 * len(ctx.blocks)  # separators only
    mem.close()


def test_supplemental_turns_need_a_strict_match_and_default_to_zero(runtime_cfg, tmp_path, turns):
    mem = build(runtime_cfg, tmp_path, turns)
    _, ctx = mem.read("What is Bob's venue?")
    assert ctx.block("Supplemental") is None
    mem.close()
    runtime_cfg["context"]["supplemental_budget"] = 400
    mem = build(runtime_cfg, tmp_path / "x", turns)
    loc, ctx = mem.read("Is Hotel Infante near Belem Tower?")
    sup = ctx.block("Supplemental")
    primary = set(ctx.block("PrimaryPath").node_ids)
    assert sup is not None and not (set(sup.node_ids) & primary)
    for line in sup.lines:
        assert "Hotel Infante" in line or "Belem Tower" in line
    mem.close()


def test_the_read_path_is_the_layer_list_in_its_configured_order(runtime_cfg, tmp_path, turns):
    """context.layers decides which evidence layers are read and in what order; budgets per entry."""
    import copy

    q = "Is Hotel Infante near Belem Tower?"
    mem = build(runtime_cfg, tmp_path / "a", turns)
    _, base = mem.read(q)
    mem.close()
    names = [b.name for b in base.blocks]
    assert names[0] == "PrimaryPath" and "Supplemental" not in names
    # supplemental first, every BM25 hit, with its own budget: it is read before the routed history
    cfg = copy.deepcopy(runtime_cfg)
    cfg["context"]["layers"] = [{"layer": "supplemental", "budget": 300}, "primary_path", "atomic_facts"]
    cfg["context"]["supplemental_match"] = "keyword"
    mem = build(cfg, tmp_path / "b", turns)
    _, ctx = mem.read(q)
    assert [b.name for b in ctx.blocks][:2] == ["Supplemental", "PrimaryPath"]
    assert set(b.name for b in ctx.blocks) <= {"Supplemental", "PrimaryPath", "AtomicFacts"}
    assert ctx.block("Supplemental").tokens <= 300
    assert not set(ctx.block("Supplemental").node_ids) & set(ctx.block("PrimaryPath").node_ids)
    mem.close()
    # when_intents: the entry applies only to questions with that intent
    cfg = copy.deepcopy(runtime_cfg)
    cfg["context"]["layers"] = [{"layer": "states", "when_intents": ["count"]}, "primary_path"]
    mem = build(cfg, tmp_path / "c", turns)
    assert {b.name for b in mem.read("What is Alice's budget?")[1].blocks} == {"PrimaryPath"}
    mem.close()


def test_a_layer_share_caps_it_at_that_fraction_of_each_read_budget(runtime_cfg, tmp_path, turns):
    cfg = copy.deepcopy(runtime_cfg)
    cfg["context"]["layers"] = [{"layer": "supplemental", "share": 0.25}, "primary_path"]
    cfg["context"]["supplemental_match"] = "keyword"
    mem = build(cfg, tmp_path, turns)
    q = "Is Hotel Infante near Belem Tower, and what is Alice's budget for Lisbon?"
    sizes = {}
    for budget in (320, 640):
        _, ctx = mem.read(q, budget=budget)
        sizes[budget] = ctx.block("Supplemental").tokens if ctx.block("Supplemental") else 0
    assert 0 < sizes[320] <= 80 and sizes[320] < sizes[640] <= 160  # a quarter of 320, then of 640 tokens
    uncapped = copy.deepcopy(cfg)
    uncapped["context"]["layers"] = [{"layer": "supplemental", "budget": 100000}, "primary_path"]
    mem.close()
    mem = build(uncapped, tmp_path / "u", turns)
    assert mem.read(q, budget=320)[1].block("Supplemental").tokens > sizes[320]  # the share is what held it back
    mem.close()


def test_cross_session_policy_reads_every_matching_turn_before_the_routed_history(tmp_path, turns):
    from arbor_train.runtime import default_config

    cfg = default_config("runtime/read_policy=cross_session")
    mem = build(cfg, tmp_path, turns)
    _, ctx = mem.read("Is Hotel Infante near Belem Tower?", budget=1024)
    names = [b.name for b in ctx.blocks]
    assert "Supplemental" in names and ("PrimaryPath" not in names or names.index("Supplemental") < names.index("PrimaryPath"))
    hits = {nid for nid, _ in mem.store.keyword_search("c", "Is Hotel Infante near Belem Tower?", 96)}
    raw = [nid for name in ("LocalizedStates", "Supplemental", "PrimaryPath") if ctx.block(name)
           for nid in ctx.block(name).node_ids]
    assert hits <= set(raw)  # the budget holds them all here: every BM25 hit is read (the localized states
    assert len(raw) == len(set(raw))  # first, then the rest), none twice
    mem.close()


def test_hybrid_supplemental_rank_adds_what_the_vector_index_finds(tmp_path, turns, monkeypatch):
    from arbor_train.runtime import default_config

    cfg = default_config("runtime/read_policy=cross_session", "runtime.context.supplemental_rank=hybrid")
    mem = build(cfg, tmp_path, turns)
    q = "Is Hotel Infante near Belem Tower?"
    kw = {nid for nid, _ in mem.store.keyword_search("c", q, 96)}
    other = next(n.id for n in mem.nodes() if n.id not in kw)
    monkeypatch.setattr(mem.index, "search", lambda vec, k: [(other, 0.9)])
    _, ctx = mem.read(q, budget=4096)
    assert other in ctx.block("Supplemental").node_ids and kw <= set(ctx.node_ids)
    mem.close()


def test_fill_by_time_writes_each_timestamp_once_and_keeps_the_cap():
    from arbor_train.runtime.context import Block, BudgetPacker, TokenCounter, fill_by_time

    counter = TokenCounter(None)
    items = [("8 May", 5, "turn five about the support group", [5]), ("7 May", 1, "turn one about painting", [1]),
             ("8 May", 4, "turn four about adoption agencies", [4]), ("9 May", 9, "turn nine " + "long " * 200, [9])]
    packer = BudgetPacker(counter, 1000)
    b = fill_by_time(packer, Block("Supplemental"), items, cap=60)
    assert b.lines == ["[7 May]", "turn one about painting", "[8 May]", "turn four about adoption agencies",
                       "turn five about the support group"]  # conversation order; the long turn did not fit
    assert b.node_ids == [1, 4, 5] and b.tokens <= 60 and packer.used == b.tokens
    assert b.tokens == counter.count("[Supplemental]") + 1 + sum(counter.count(l) + 1 for l in b.lines)
    # the same items packed with a timestamp on every line hold fewer turns under the same cap
    flat = BudgetPacker(counter, 1000).fill(Block("Supplemental"), [(f"[{ts}] {t}", n) for ts, _, t, n in items], 40)
    tight = fill_by_time(BudgetPacker(counter, 1000), Block("Supplemental"), items, cap=40)
    assert len(tight.node_ids) >= len(flat.node_ids)


@pytest.mark.parametrize("layers, msg", [
    (["primary_path", "gossip"], r"context\.layers\[1\] must name a layer"),
    ([{"layer": "states", "when_intents": ["someday"]}], r"context\.layers\[0\]\.when_intents"),
    ([{"layer": "states", "budget": -5}], r"context\.layers\[0\]\.budget"),
    ([{"layer": "states", "order": 1}], r"context\.layers\[0\]: unknown keys \['order'\]"),
    ([{"layer": "states", "share": 1.5}], r"context\.layers\[0\]\.share must be a fraction"),
    ([{"layer": "states", "share": 0}], r"context\.layers\[0\]\.share must be a fraction"),
    ([], r"context\.layers must be a non-empty list"),
])
def test_a_bad_layer_list_is_refused_naming_the_entry(runtime_cfg, tmp_path, layers, msg):
    from arbor_train.errors import ConfigError

    runtime_cfg["context"]["layers"] = layers
    with pytest.raises(ConfigError, match=msg):
        ArborMemory.open(tmp_path / "m.sqlite", "c", runtime_cfg)
    assert not list(tmp_path.iterdir())  # refused before any file was created


def test_branch_localization_separates_parallel_agendas(runtime_cfg, tmp_path, turns):
    mem = build(runtime_cfg, tmp_path, turns)
    nodes = mem.nodes()
    alice_root, bob_root = nodes[0].root_id, nodes[1].root_id
    assert alice_root != bob_root
    by_seq = {n.seq: n for n in nodes}
    assert by_seq[3].root_id == alice_root and by_seq[3].parent_id == by_seq[0].id  # temporal return
    assert by_seq[2].root_id == bob_root and by_seq[7].root_id == bob_root
    assert by_seq[5].root_id == alice_root
    loc, ctx = mem.read("What is Bob's venue?")
    assert mem.store.get_node(loc.parent_id).root_id == bob_root
    assert "Lisbon" not in ctx.block("PrimaryPath").render()
    mem.close()


# ---------------------------------------------------------------- ablations
def test_ablation_switches(runtime_cfg, tmp_path, turns):
    def run(**abl):
        cfg = json.loads(json.dumps(runtime_cfg))
        cfg["ablation"].update(abl)
        mem = build(cfg, tmp_path / "_".join(f"{k}{v}" for k, v in abl.items()), turns)
        return mem

    mem = run(state_localization=False)
    assert mem.stats()["roots"] == 1 and max(n.depth for n in mem.nodes()) == len(turns) - 1
    loc, ctx = mem.read("What is Bob's venue?")
    assert loc.route == "linear"
    mem.close()
    mem = run(routing=False)
    loc = mem.localize("Also, what about Bob's hotel?")
    assert loc.route == "recall"
    mem.close()
    mem = run(atomic_facts=False)
    _, ctx = mem.read("What is Alice's current budget?")
    assert ctx.block("AtomicFacts") is None and mem.store.facts("c")
    mem.close()
    mem = run(structured_extraction=False)
    assert mem.store.records("c") == [] and mem.store.events("c") == []
    mem.close()
    mem = run(structured_evidence=False)
    _, ctx = mem.read("How many km did I run in total?")
    assert ctx.block("Computed") is None and ctx.block("EventEvidence") is None and mem.store.events("c")
    mem.close()


def test_extractor_set_heuristic_outputs_are_schema_valid(runtime_cfg):
    ex = ExtractorSet({}, runtime_cfg["heuristics"])
    out = ex.extract([TurnInput("I grew up in Porto. My dog is named Rex. Alice's playlist: Song A, Song B, then Song C.")])[0]
    keys = {s["key"]: s["value"] for s in out.states}
    assert keys["hometown"] == "Porto" and keys["pet_name"] == "Rex"
    assert out.artifacts[0]["items"] == ["Song A", "Song B", "Song C"] and out.artifacts[0]["subject"] == "Alice"
    assert out.report.clean
