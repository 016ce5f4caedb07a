"""Multi-intent turns end to end: the generator's link turns and linked_fact questions (and their
validation rule), the runtime's ranked alternatives, secondary links (store, check, forget, export,
render, read), the reranker's multi-positive groups, and the harness's multi-intent and calibration
summaries."""

import copy
import json
import math

import pytest
import torch
from test_branchmem import cfg, first_session

from arbor_train.errors import ConfigError
from arbor_train.runtime import ArborMemory, Localization
from data_gen.branchmem.validate import validate_session


# ---------------------------------------------------------------- generator
@pytest.fixture(scope="module")
def multi(tmp_path_factory):
    from data_gen.branchmem.__main__ import run

    out = tmp_path_factory.mktemp("multi") / "set"
    stats = run(cfg("preset=formal_multi", "seed=0", "mine=false", f"out_dir={out}"))
    return out, stats


def test_formal_multi_keeps_the_composition_and_links_every_linked_question(multi):
    out, stats = multi
    assert stats["sessions"] == 33 and stats["questions"] == 100 and stats["non_question_turns"] == 1442
    assert stats["turns_per_session"] == {"min": 42, "max": 52, "mean": 46.73}
    n_linked = stats["questions_by_type"]["linked_fact"]
    assert n_linked >= 8 and stats["questions_by_dimension"]["multi_intent"] == n_linked
    assert stats["validation"]["failures"]["multi_intent"] == 0
    rows = [json.loads(x) for x in (out / "jsonl" / "sessions.jsonl").read_text().splitlines()]
    seen = 0
    for r in rows:
        turns = r["turns"]
        for q in (q for q in r["questions"] if q["type"] == "linked_fact"):
            seen += 1
            links = [t for t in turns[: q["turn"]] if t["branch"] == q["branch"] and "gold_secondary" in t]
            assert links, "a linked_fact question follows the link turn of its branch"
            link = links[-1]
            sec = turns[link["gold_secondary"]]
            assert sec["branch"] == q["secondary_branch"] != q["branch"]
            # the value is stated in the secondary branch before the link, never in the question's own branch
            assert any(q["gold"] in t["user"] for t in turns[: link["index"]] if t["branch"] == sec["branch"])
            assert not any(q["gold"] in t["user"] + t["assistant"] for t in turns[: q["turn"]] if t["branch"] == q["branch"])
    assert seen == n_linked
    assert all("gold_secondary" not in t for r in rows for t in r["turns"] if t["move"] != "link")


@pytest.fixture(scope="module")
def linked_session():
    """A formal_multi session with a link turn."""
    return first_session("formal_multi", lambda turns: any(t.move == "link" for t in turns))


def _link(turns):
    return next(t for t in turns if t.move == "link")


def test_rule_multi_intent_catches_a_link_that_states_its_value(linked_session):
    p, plan, turns = linked_session
    turns = copy.deepcopy(turns)
    t = _link(turns)
    t.assistant += f" That is {plan.moves[t.index].value}."
    assert "states the copied value" in " ".join(validate_session(plan, turns, p["delay_min"])["multi_intent"])


def test_rule_multi_intent_catches_a_wrong_secondary_gold(linked_session):
    p, plan, turns = linked_session
    turns = copy.deepcopy(turns)
    t = _link(turns)
    t.gold_secondary = t.gold_parent
    assert "is not the secondary branch's latest turn" in " ".join(
        validate_session(plan, turns, p["delay_min"])["multi_intent"])


def test_rule_multi_intent_catches_a_link_before_the_value_is_stated(linked_session):
    p, plan, turns = linked_session
    turns = copy.deepcopy(turns)
    t = _link(turns)
    m = plan.moves[t.index]
    for x in turns[: t.index]:  # the secondary branch never stated the value
        if x.branch == m.link:
            x.extraction = {**x.extraction, "states": [s for s in x.extraction["states"] if s["key"] != m.link_slot]}
    fails = validate_session(plan, turns, p["delay_min"])
    assert "has not stated" in " ".join(fails["multi_intent"]) and fails["support"]


# ---------------------------------------------------------------- runtime
def _mem(runtime_cfg, tmp_path, **secondary):
    cfg = copy.deepcopy(runtime_cfg)
    cfg["localization"]["secondary"].update(secondary)
    return ArborMemory.open(tmp_path / "m.sqlite", "c", cfg)


TRIP_A = [("I'm helping Amelie Stone with a trip to Lisbon. Amelie's hotel is Casa Azul.", "Noted."),
          ("Also, Amelie's budget is $2,400.", "Noted.")]
TRIP_B = [("New thing to track: Erik Lund's trip to Oslo. To start, Erik's budget is $900.", "Noted.")]
LINK = "For Erik's trip to Oslo, use the same hotel as Amelie's trip to Lisbon."


def _commit_all(mem, turns):
    return [mem.step(u, a)[0] for u, a in turns]


def test_alternatives_are_a_distribution_over_trajectories_and_new_root(runtime_cfg, tmp_path):
    mem = _mem(runtime_cfg, tmp_path)
    _commit_all(mem, TRIP_A + TRIP_B)
    loc = mem.localize(LINK)
    assert loc.alternatives and loc.new_root_confidence is not None
    assert math.isclose(sum(a.confidence for a in loc.alternatives) + loc.new_root_confidence, 1.0, rel_tol=1e-6)
    assert len({a.root_id for a in loc.alternatives}) == len(loc.alternatives)  # one entry per trajectory
    assert [a.confidence for a in loc.alternatives] == sorted((a.confidence for a in loc.alternatives), reverse=True)
    assert loc.secondary == []  # min_score null: never links
    mem.close()


def test_a_confident_runner_up_is_linked_and_read_with_the_question(runtime_cfg, tmp_path):
    mem = _mem(runtime_cfg, tmp_path, min_score=0.05)
    a1, a2, b1 = _commit_all(mem, TRIP_A + TRIP_B)
    node, loc = mem.step(LINK, "Done: the hotel for Erik's trip now matches Amelie's.")
    assert node.root_id == b1.root_id and loc.secondary == [a2.id]
    score = next(a.score for a in loc.alternatives if a.node_id == a2.id)
    assert mem.store.links_from([node.id]) == [(node.id, a2.id, pytest.approx(score))]
    assert mem.store.check() == [] and mem.stats()["links"] == 1
    loc, ctx = mem.read("Which hotel does Erik's trip to Oslo have now?")
    assert loc.parent_id == node.id
    block = ctx.block("SecondaryPath")
    assert block is not None and "Casa Azul" in block.render() and a1.id in block.node_ids
    mem.close()


def test_a_link_needs_a_trajectory_the_turn_names_apart_from_its_parent(runtime_cfg, tmp_path):
    """With `evidence: entity` (the default) a turn about Erik alone gets no link even when every runner-up
    clears the threshold; the multi-intent turn, which names Amelie, does. `evidence: none` links both."""
    single = "For Erik's trip to Oslo, the budget goes up to $1,100."
    mem = _mem(runtime_cfg, tmp_path, min_score=0.0)
    a1, a2, b1 = _commit_all(mem, TRIP_A + TRIP_B)
    node, loc = mem.step(single, "Updated Erik's budget.")
    assert node.root_id == b1.root_id and loc.primary_root == b1.root_id
    assert loc.link_candidate is None and loc.secondary == []
    _, loc = mem.step(LINK, "Done.")
    assert loc.link_candidate is not None and loc.link_candidate.root_id == a1.root_id
    assert loc.secondary == [loc.link_candidate.node_id]
    mem.close()
    mem = _mem(runtime_cfg, tmp_path / "none", min_score=0.0, evidence="none")
    a1, a2, b1 = _commit_all(mem, TRIP_A + TRIP_B)
    _, loc = mem.step(single, "Updated Erik's budget.")
    assert loc.link_candidate is not None and loc.link_candidate.root_id == a1.root_id and loc.secondary
    mem.close()


def test_an_unknown_link_evidence_is_refused_naming_the_option(runtime_cfg, tmp_path):
    with pytest.raises(ConfigError, match="localization.secondary.evidence.*entity, none"):
        _mem(runtime_cfg, tmp_path, evidence="entities")


def test_a_link_is_read_both_ways(runtime_cfg, tmp_path):
    """A multi-intent turn attached to the other branch (primary and secondary swapped) still joins the two:
    a question on its secondary trajectory reads the turn and the trajectory it was attached to."""
    mem = _mem(runtime_cfg, tmp_path)
    a1, a2, b1 = _commit_all(mem, TRIP_A + TRIP_B)
    node = mem.commit(LINK, "Done.", Localization(a2.id, "gold", 1.0, secondary=[b1.id]))
    ctx = mem.assemble("Which hotel does Erik's trip to Oslo have now?", Localization(b1.id, "gold", 1.0))
    block = ctx.block("SecondaryPath")
    assert block is not None and {node.id, a1.id} <= set(block.node_ids) and "Casa Azul" in block.render()
    mem.close()


def test_without_the_link_the_value_is_not_read(runtime_cfg, tmp_path):
    mem = _mem(runtime_cfg, tmp_path)  # same turns, no secondary links
    _commit_all(mem, TRIP_A + TRIP_B)
    mem.step(LINK, "Done: the hotel for Erik's trip now matches Amelie's.")
    _, ctx = mem.read("Which hotel does Erik's trip to Oslo have now?")
    assert ctx.block("SecondaryPath") is None and mem.stats()["links"] == 0
    mem.close()


def _current(mem, key):
    return [(r.subject, r.value, r.root_id) for r in mem.store.records(mem.conv, include_superseded=False)
            if r.key == key]


def test_a_link_carries_the_state_it_names_onto_the_routed_trajectory(runtime_cfg, tmp_path):
    """"The same hotel as Amelie's" states no value; with the link the commit writes Amelie's hotel as
    Erik's, on Erik's trajectory, so the question reads it as a state (one hop). Without
    `revision.resolve_links` the link is still recorded but no state is written."""
    mem = _mem(runtime_cfg, tmp_path, min_score=0.05)
    a1, a2, b1 = _commit_all(mem, TRIP_A + TRIP_B)
    node, loc = mem.step(LINK, "Done.")
    assert loc.secondary == [a2.id]
    assert sorted(_current(mem, "hotel")) == [("Amelie", "Casa Azul", a1.root_id), ("Erik", "Casa Azul", b1.root_id)]
    rec = next(r for r in mem.store.records(mem.conv) if r.subject == "Erik" and r.key == "hotel")
    assert rec.sources == [node.id] and "hotel (Amelie): Casa Azul" in rec.evidence
    _, ctx = mem.read("Which hotel does Erik's trip to Oslo have now?", budget=256)
    assert "hotel (Erik): Casa Azul" in ctx.text
    # the turn's line shows the value it took
    assert "Assistant: Done. [state carried: hotel (Erik): Casa Azul]" in ctx.block("PrimaryPath").render()
    assert "state carried" not in ctx.block("SecondaryPath").render()  # Amelie's turns state theirs
    assert mem.store.check() == []
    mem.close()
    cfg = copy.deepcopy(runtime_cfg)
    cfg["localization"]["secondary"]["min_score"] = 0.05
    cfg["revision"]["resolve_links"] = False
    mem = ArborMemory.open(tmp_path / "off.sqlite", "c", cfg)
    _commit_all(mem, TRIP_A + TRIP_B)
    _, loc = mem.step(LINK, "Done.")
    assert loc.secondary and _current(mem, "hotel") == [("Amelie", "Casa Azul", mem.store.get_node(loc.secondary[0]).root_id)]
    mem.close()


def test_a_swapped_link_carries_the_value_from_the_trajectory_that_holds_the_key(runtime_cfg, tmp_path):
    """Routed onto Amelie's trip with the link to Erik's: only Amelie's trip holds a hotel, so the value
    still flows to Erik (the subject is the entity of the turn that Amelie's trajectory never named)."""
    mem = _mem(runtime_cfg, tmp_path)
    a1, a2, b1 = _commit_all(mem, TRIP_A + TRIP_B)
    mem.commit(LINK, "Done.", Localization(a2.id, "gold", 1.0, secondary=[b1.id]))
    assert sorted(_current(mem, "hotel")) == [("Amelie", "Casa Azul", a1.root_id), ("Erik", "Casa Azul", b1.root_id)]
    assert mem.store.check() == []
    mem.close()


def test_a_link_between_two_keys_revises_the_routed_trajectorys_record(runtime_cfg, tmp_path):
    """"Copy Amelie's hotel over to Erik's trip as its lodge": the source is the key only Amelie's trip
    holds (hotel), the target the other key the turn names (lodge), which Erik's record revises."""
    mem = _mem(runtime_cfg, tmp_path)
    a1, a2, b1 = _commit_all(mem, TRIP_A + TRIP_B)
    b2 = mem.commit("Also, Erik's lodge is Fjord Inn.", "Noted.", Localization(b1.id, "gold", 1.0))
    mem.commit("Copy Amelie's hotel over to Erik's trip to Oslo as its lodge.", "Done.",
               Localization(b2.id, "gold", 1.0, secondary=[a2.id]))
    assert _current(mem, "lodge") == [("Erik", "Casa Azul", b1.root_id)]
    chain = [r.value for r in mem.store.records(mem.conv) if r.key == "lodge"]
    assert chain == ["Fjord Inn", "Casa Azul"]
    mem.close()


def test_a_copy_names_its_target_key_before_any_record_holds_it(runtime_cfg, tmp_path):
    """"... as its lodge" names the target though no trajectory holds a lodge yet: the value is written as
    Erik's lodge, not as a second hotel. Without the phrase the same copy writes the source key."""
    mem = _mem(runtime_cfg, tmp_path)
    a1, a2, b1 = _commit_all(mem, TRIP_A + TRIP_B)
    mem.commit("Copy Amelie's hotel over to Erik's trip to Oslo as its lodge.", "Done.",
               Localization(b1.id, "gold", 1.0, secondary=[a2.id]))
    assert _current(mem, "lodge") == [("Erik", "Casa Azul", b1.root_id)]
    assert ("Erik", "Casa Azul", b1.root_id) not in _current(mem, "hotel")
    mem.close()
    mem = _mem(runtime_cfg, tmp_path / "plain")
    a1, a2, b1 = _commit_all(mem, TRIP_A + TRIP_B)
    mem.commit("Copy Amelie's hotel over to Erik's trip to Oslo.", "Done.",
               Localization(b1.id, "gold", 1.0, secondary=[a2.id]))
    assert _current(mem, "lodge") == [] and ("Erik", "Casa Azul", b1.root_id) in _current(mem, "hotel")
    mem.close()


def test_the_assistants_confirmation_can_name_the_target_key(runtime_cfg, tmp_path):
    """"Use the same budget as Amelie's" for a key the user does not name: the assistant's confirmation
    ("the spending cap for Erik's trip now matches the budget of Amelie's") names it, and a record
    (Erik's spending cap) holds it, so that record is revised rather than a budget written."""
    mem = _mem(runtime_cfg, tmp_path)
    a1, a2, b1 = _commit_all(mem, TRIP_A + [("New thing to track: Erik Lund's trip to Oslo. To start, Erik's "
                                             "spending cap is $900.", "Noted.")])
    mem.commit("For Erik's trip to Oslo, use the same budget as Amelie's trip to Lisbon.",
               "Done: the spending cap for Erik's trip to Oslo now matches the budget of Amelie's trip.",
               Localization(b1.id, "gold", 1.0, secondary=[a2.id]))
    assert _current(mem, "spending_cap") == [("Erik", "$2,400", b1.root_id)]
    assert _current(mem, "budget") == [("Amelie", "$2,400", a1.root_id)]
    mem.close()


def test_a_link_writes_nothing_when_the_turn_states_the_value_or_names_no_single_key(runtime_cfg, tmp_path):
    mem = _mem(runtime_cfg, tmp_path)
    a1, a2, b1 = _commit_all(mem, TRIP_A + TRIP_B)
    b2 = mem.commit("Not Amelie's hotel after all: Erik's hotel is Nord Hus.", "Noted.",
                    Localization(b1.id, "gold", 1.0, secondary=[a2.id]))
    assert sorted(_current(mem, "hotel")) == [("Amelie", "Casa Azul", a1.root_id), ("Erik", "Nord Hus", b1.root_id)]
    # both trajectories hold both keys the turn names: which one it copies is not stated
    mem.commit("Erik wants Amelie's hotel and budget.", "Done.", Localization(b2.id, "gold", 1.0, secondary=[a2.id]))
    assert ("Erik", "Casa Azul", b1.root_id) not in _current(mem, "hotel")
    assert ("Erik", "$2,400", b1.root_id) not in _current(mem, "budget")
    mem.close()


def test_a_bad_resolve_links_value_is_refused_naming_the_option(runtime_cfg, tmp_path):
    cfg = copy.deepcopy(runtime_cfg)
    cfg["revision"]["resolve_links"] = "yes"
    with pytest.raises(ConfigError, match="revision.resolve_links"):
        ArborMemory.open(tmp_path / "m.sqlite", "c", cfg)


def test_a_close_runner_up_is_read_for_a_question_within_the_margin(runtime_cfg, tmp_path):
    mem = _mem(runtime_cfg, tmp_path, read_margin=1.0)  # any runner-up is "close"
    _commit_all(mem, TRIP_A + TRIP_B)
    loc = mem.localize("And the budget was?", for_question=True)
    assert loc.runner_up and loc.runner_up[0] != loc.parent_id
    mem.close()
    mem = _mem(runtime_cfg, tmp_path / "b", read_margin=0.0)  # nothing is closer than 0
    _commit_all(mem, TRIP_A + TRIP_B)
    assert mem.localize("And the budget was?", for_question=True).runner_up == []
    mem.close()


def test_links_are_exported_rendered_checked_and_forgotten_with_their_nodes(runtime_cfg, tmp_path):
    from arbor_train.runtime.render import forest_json, render_forest

    mem = _mem(runtime_cfg, tmp_path, min_score=0.05)
    a1, a2, b1 = _commit_all(mem, TRIP_A + TRIP_B)
    node, _ = mem.step(LINK, "Done.")
    assert forest_json(mem)["links"] == [{"node_id": node.id, "target_id": a2.id,
                                          "confidence": round(mem.store.links_from([node.id])[0][2], 4)}]
    assert mem.store.links_to([a2.id]) == mem.store.links_from([node.id])
    assert render_forest(mem, tmp_path / "f.png").endswith("f.png")
    # the consistency check catches a link to the parent and a link forward in time
    with mem.store.transaction():
        mem.store.add_link("c", node.id, b1.id, 0.5)
        mem.store.add_link("c", a1.id, node.id, 0.5)
    bad = " ".join(mem.store.check())
    assert f"link {node.id} -> {b1.id}" in bad and f"link {a1.id} -> {node.id}" in bad
    with mem.store.transaction():
        mem.store.db.execute("DELETE FROM links WHERE target_id IN (?, ?)", (b1.id, node.id))
    assert mem.store.check() == []
    mem.forget(nodes=[a2.id])  # the link's target goes: so does the link
    assert mem.stats()["links"] == 0 and mem.store.check() == []
    mem.close()


def test_a_v3_memory_file_gains_the_links_table(runtime_cfg, tmp_path):
    from arbor_train.runtime.store import SCHEMA_VERSION, Store

    mem = _mem(runtime_cfg, tmp_path)
    _commit_all(mem, TRIP_A)
    mem.close()
    s = Store(tmp_path / "m.sqlite")
    with s.transaction():
        s.db.execute("DROP TABLE links")
        s.db.execute("UPDATE meta SET value='3' WHERE key='schema_version'")
    s.close()
    s = Store(tmp_path / "m.sqlite")
    assert s.get_meta("schema_version") == str(SCHEMA_VERSION) and s.check() == [] and s.links("c") == []
    s.close()


# ---------------------------------------------------------------- training: multi-positive groups
def _row(secondary: bool):
    cands = [{"turn": t, "topic_key": f"t{t}", "path_summary": "p", "node_summary": f"s{t}", "entities": [],
              "channels": "{}", "runtime_score": 1.0 / (t + 1), "recalled": True} for t in range(6)]
    row = {"input": LINK, "candidates": cands, "gold_parent": 4, "gold_states": [1, 4]}
    if secondary:
        row.update(gold_secondary=3, secondary_states=[0, 3])
    return row


def test_multi_intent_rows_make_multi_positive_groups():
    from arbor_train.data import rerank_groups

    plain, = rerank_groups([_row(False)], "routing", 4)
    multi, = rerank_groups([_row(True)], "routing", 4)
    assert plain.secondary == -1 and plain.cands[plain.gold]["turn"] == 4
    assert multi.cands[multi.gold]["turn"] == 4 and multi.cands[multi.secondary]["turn"] == 3
    # the secondary trajectory's other state (turn 0) is neither a positive nor a negative
    assert 0 not in {c["turn"] for c in multi.cands} and len(multi.cands) == 4


def test_the_soft_target_puts_secondary_weight_on_the_secondary_gold():
    from arbor_train.roles.reranker import RerankerModule

    class M(RerankerModule):
        def __init__(self, w):
            torch.nn.Module.__init__(self)
            self.cfg = {"task": {"secondary_weight": w}}
            self.logits = torch.tensor([0.5, 2.0, 1.0, -1.0])  # three candidates + new root

        def group_logits(self, batch):
            return [self.logits]

    batch = {"gold": torch.tensor([1]), "secondary": torch.tensor([2])}
    logp = torch.log_softmax(torch.tensor([0.5, 2.0, 1.0, -1.0]), 0)
    assert float(M(0.0).step_loss(batch)[0]) == pytest.approx(float(-logp[1]))
    assert float(M(0.3).step_loss(batch)[0]) == pytest.approx(float(-(0.7 * logp[1] + 0.3 * logp[2])))
    assert float(M(0.3).step_loss({"gold": torch.tensor([1]), "secondary": torch.tensor([-1])})[0]) == \
        pytest.approx(float(-logp[1]))


# ---------------------------------------------------------------- harness summaries
def test_calibration_error_is_worked_out_by_hand():
    from eval.protocols.branchmem import calibration_error

    # bin [0.9, 1.0): confidences 0.95, 0.95, right and wrong -> |0.95 - 0.5| = 0.45 for half the turns;
    # bin [0.2, 0.3): 0.25, 0.25, both wrong -> |0.25 - 0| = 0.25 for the other half: ECE = 0.35
    recs = [{"confidence": 0.95, "correct": True}, {"confidence": 0.95, "correct": False},
            {"confidence": 0.25, "correct": False}, {"confidence": 0.25, "correct": False},
            {"confidence": None, "correct": True}]
    assert calibration_error(recs) == pytest.approx(0.35)
    assert calibration_error([{"confidence": None, "correct": True}]) is None


def test_multi_intent_summary_counts_links_and_questions():
    from eval.protocols.branchmem import multi_intent

    routed = [{"correct": True, "secondary_correct": True, "joined": True, "is_question": False},
              {"correct": False, "secondary_correct": False, "joined": True, "is_question": False},  # swapped
              {"correct": True, "linked": True, "is_question": False},
              {"correct": True, "linked": False, "is_question": False},
              {"correct": True, "linked": False, "is_question": False},
              {"correct": True, "linked": True, "is_question": True}]  # questions never count as single-intent
    qrecs = [{"dimension": "multi_intent", "gold_in_context": True, "confounder_in_context": False, "correct": True},
             {"dimension": "multi_intent", "gold_in_context": True, "confounder_in_context": True, "correct": False},
             {"dimension": "interleaving", "gold_in_context": False, "confounder_in_context": False, "correct": False}]
    got = multi_intent(qrecs, routed)
    assert got == {"turns": 2, "primary": 0.5, "secondary": 0.5, "joined": 1.0, "single_intent_linked": round(1 / 3, 4),
                   "questions": 2, "gold_in_context": 1.0, "confounder_in_context": 0.5,
                   "gold_without_confounder": 0.5, "accuracy": 0.5}
    assert multi_intent(qrecs[2:], routed[2:]) is None


def test_runner_up_reads_are_counted_per_level_and_when_localization_was_wrong():
    from eval.protocols.branchmem import runner_up_reads

    def q(level, read, right, loc):
        return {"specificity": level, "runner_up_read": read, "runner_up_right": right, "localization_correct": loc}

    qrecs = [q("referential", True, True, False),    # localized wrong, the margin read brought the right branch
             q("referential", False, False, False),  # localized wrong, nothing read
             q("referential", True, False, True),
             q("explicit", False, False, True),
             {"specificity": "explicit", "localization_correct": None}]  # a method that does not localize
    assert runner_up_reads(qrecs) == {"questions": 4, "read": 0.5,
                                      "by_specificity": {"referential": round(2 / 3, 4), "explicit": 0.0},
                                      "localized_wrong": 2, "right_runner_up_when_wrong": 0.5}
    assert runner_up_reads([q("explicit", False, False, True)]) is None


def test_one_run_sweeps_the_links_threshold():
    from eval.protocols.branchmem import LINK_THRESHOLDS, multi_intent

    routed = [{"correct": True, "secondary_correct": False, "joined": False, "is_question": False,
               "runner_up_joins": True, "runner_up_score": 0.35},
              {"correct": True, "secondary_correct": False, "joined": False, "is_question": False,
               "runner_up_joins": False, "runner_up_score": 0.6},
              {"correct": True, "linked": False, "is_question": False, "runner_up_score": 0.15},
              {"correct": True, "linked": False, "is_question": False, "runner_up_score": 0.0}]
    sweep = multi_intent([], routed)["by_threshold"]
    assert list(sweep) == [str(t) for t in LINK_THRESHOLDS]
    # 0.1: the joining runner-up (0.35) is linked, the wrong one (0.6) too; one of two single-intent turns
    assert sweep["0.1"] == {"joined": 0.5, "single_intent_linked": 0.5}
    assert sweep["0.2"] == {"joined": 0.5, "single_intent_linked": 0.0}
    assert sweep["0.4"] == {"joined": 0.0, "single_intent_linked": 0.0}


def test_report_tables_the_multi_intent_rows():
    from eval.report import multi_intent_table

    row = {"method": "arbormem", "runtime": "heuristic", "runtime_settings": ["runtime.localization.secondary.min_score=0.2"],
           "budget": 256, "routing_ece": 0.207,
           "multi_intent": {"turns": 13, "primary": 0.7692, "secondary": 0.2308, "joined": 0.4615,
                            "single_intent_linked": 0.1099, "questions": 13, "gold_in_context": 0.3077,
                            "confounder_in_context": 0.1538, "gold_without_confounder": 0.3077}}
    lines = multi_intent_table([row, {"method": "bm25", "budget": 256}]).splitlines()
    assert len(lines) == 3  # header, rule, the one run with multi-intent turns
    assert lines[0].count("|") == lines[1].count("|") == lines[2].count("|")  # the rule has one cell per column
    assert lines[2] == ("| arbormem (min_score=0.2) | full | 256 | 13 | 0.7692 | 0.2308 | 0.4615 | 0.1099 | 0.207 | 13 "
                        "| 0.3077 | 0.1538 | 0.3077 | — |")
    assert multi_intent_table([{"method": "bm25", "budget": 256}]) == ""
