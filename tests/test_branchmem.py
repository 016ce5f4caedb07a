"""BranchMemEval-style generator: composition, determinism, shards, validation rules, schemas."""

import copy
import filecmp
import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from arbor_train.conversations.supervision import SchemaError, check_dataset, validate_rows
from arbor_train.paths import CONF_DIR
from data_gen.branchmem import lexicon
from data_gen.branchmem.__main__ import run
from data_gen.branchmem.generate import build_session, session_targets
from data_gen.branchmem.validate import validate_session


def cfg(*overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="data_gen", overrides=["progress=false", "workers=1", *overrides])


def preset(name="formal"):
    from omegaconf import OmegaConf

    return OmegaConf.to_container(cfg(f"preset={name}").preset, resolve=True)


def all_files(d: Path) -> list[Path]:
    return sorted(p.relative_to(d) for p in d.rglob("*") if p.is_file())


def same_tree(a: Path, b: Path) -> bool:
    fa, fb = all_files(a), all_files(b)
    return fa == fb and all(filecmp.cmp(a / f, b / f, shallow=False) for f in fa)


@pytest.fixture(scope="module")
def formal(tmp_path_factory):
    out = tmp_path_factory.mktemp("formal") / "set"
    stats = run(cfg("preset=formal", "seed=0", f"out_dir={out}"))
    return out, stats


def test_formal_preset_has_the_paper_composition(formal):
    out, _ = formal
    stats = json.loads((out / "stats.json").read_text())
    assert stats["sessions"] == 33 and stats["questions"] == 100 and stats["non_question_turns"] == 1442
    assert stats["turns_per_session"] == {"min": 42, "max": 52, "mean": 46.73}
    assert set(stats["branches_per_session"]) <= {"3", "4"} and sum(stats["branches_per_session"].values()) == 33
    assert set(stats["questions_by_type"]) == {"update_current", "update_previous", "delayed_fact", "artifact_order",
                                              "event_count", "event_sum", "parallel_fact"}
    assert set(stats["questions_by_dimension"]) == {"interleaving", "delayed_resumption", "parallel_confusion"}
    v = stats["validation"]
    assert v["sessions_valid"] == 33 and v["rules"] == ["support", "no_leak", "confounder", "delayed", "distinct",
                                                        "specificity", "multi_intent"]
    assert stats["questions_by_specificity"] == {"explicit": 100}  # the paper's set: every question explicit
    # every rule ran on every realized session: the accepted ones and the regenerated attempts, less the
    # attempts whose plan failed before there was a session to check
    assert v["checks_run"] == len(v["rules"]) * (v["sessions_valid"] + v["regenerated"] - v["plan_errors"])
    card = (out / "README.md").read_text()
    assert "| 33 | 100 | 1,442 | 42 / 52 / 46.73 |" in card and "## Validation" in card


def test_output_formats_load_and_match_the_schemas(formal):
    import pyarrow.parquet as pq
    from datasets import load_from_disk

    out, _ = formal
    dd = load_from_disk(str(out / "hf"))
    assert set(dd) == {"sessions", "routing", "localization", "extraction", "tags", "summaries"}
    for name, ds in dd.items():
        check_dataset(name, ds)
        assert pq.read_table(out / "parquet" / f"{name}.parquet").num_rows == len(ds)
        rows = [json.loads(line) for line in (out / "jsonl" / f"{name}.jsonl").open()]
        assert len(rows) == len(ds)
        validate_rows(name, rows)
    assert len(dd["localization"]) == 100 and len(dd["routing"]) == 1442
    # routing candidates are the runtime's recall and include the gold parent (added when missed)
    for ex in dd["routing"].select(range(200)):
        if ex["gold_parent"] >= 0:
            assert ex["gold_parent"] in [c["turn"] for c in ex["candidates"]]
        assert all(c["turn"] < ex["turn"] for c in ex["candidates"])
    # extraction targets are strict JSON that the runtime's validator accepts unchanged
    from arbor_train.runtime.validate import ValidationReport, validate_items

    for ex in dd["extraction"].select(range(300)):
        target = json.loads(ex["target"])
        for kind in ("states", "facts", "artifacts", "events"):
            rep = ValidationReport()
            assert validate_items(target[kind], kind, rep) and rep.clean or not target[kind]


def test_same_seed_is_byte_identical_and_another_seed_differs(formal, tmp_path):
    out, _ = formal
    again = tmp_path / "again"
    run(cfg("preset=formal", "seed=0", f"out_dir={again}", "workers=2"))
    assert same_tree(out, again)
    other = tmp_path / "other"
    run(cfg("preset=smoke", "seed=1", f"out_dir={other}"))
    s0 = json.loads((out / "jsonl" / "sessions.jsonl").open().readline())
    s1 = json.loads((other / "jsonl" / "sessions.jsonl").open().readline())
    assert s0["turns"][0]["user"] != s1["turns"][0]["user"]


def test_shards_merge_into_the_single_run_output(tmp_path):
    single = tmp_path / "single"
    run(cfg("preset=smoke", "seed=3", f"out_dir={single}"))
    shards = []
    for i in range(2):
        run(cfg("preset=smoke", "seed=3", f"out_dir={tmp_path / 'shards'}", "shard.count=2", f"shard.index={i}"))
        shards.append(tmp_path / "shards" / f"shard-{i:05d}-of-00002")
    merged = tmp_path / "merged"
    run(cfg("command=merge", "preset=smoke", "seed=3", f"out_dir={merged}",
            f"merge_from=[{shards[1]},{shards[0]}]"))
    assert same_tree(single, merged)
    with pytest.raises(ValueError, match="not a complete set"):
        run(cfg("command=merge", "preset=smoke", "seed=3", f"out_dir={tmp_path / 'bad'}", f"merge_from=[{shards[1]}]"))


def test_existing_out_dir_is_never_replaced_silently(formal):
    out, _ = formal
    before = (out / "stats.json").read_bytes()
    with pytest.raises(FileExistsError, match="overwrite=true"):
        run(cfg("preset=smoke", f"out_dir={out}"))
    assert (out / "stats.json").read_bytes() == before


@pytest.mark.parametrize("overrides, msg", [
    (["shard.index=2", "shard.count=2"], "shard.index=2"),
    (["command=shuffle"], "option command"),
    (["preset.turns_min=60"], "preset.turns_min"),
    (["command=merge"], "merge_from"),
    (["preset=smoke", "preset.sessions=0"], r"option preset\.sessions must be at least 1, got 0"),
    (["preset=smoke", "preset.question_types=[bogus]"], r"option preset\.question_types\[0\] must be one of update_current"),
    (["preset=smoke", "preset.question_types=[]"], r"option preset\.question_types must be a non-empty list"),
    (["preset=smoke", "preset.max_attempts=true"], r"option preset\.max_attempts must be an integer, got True"),
    (["preset=smoke", "preset.p_four_branches=1.5"], r"option preset\.p_four_branches must lie in \[0, 1\]"),
    (["preset=smoke", "preset.questions_per_session=[3,x]"], r"option preset\.questions_per_session\[1\] must be an integer"),
    (["workers=0"], "option workers must be at least 1"),
    (["seed=abc"], "option seed must be an integer"),
    (["overwrite=maybe"], "option overwrite must be true or false, got 'maybe'"),
    (["mine=yes please"], "option mine must be true or false"),
    (["verbalizer.enabled=maybe"], "option verbalizer.enabled must be true or false"),
    (["command=benchmark", "bench.sessions=0"], r"option bench\.sessions must be at least 1"),
    (["preset.total_turns=10"], r"option preset\.total_turns=10 cannot be split into preset\.sessions=33 sessions"),
    (["command=merge", "merge_from=[/no/such/shard]"], "option merge_from names '/no/such/shard'"),
    (["+preset.specificity.vague=1.0"], r"option preset\.specificity \(a level\) must be one of explicit, partial, referential"),
    (["preset.specificity.explicit=0"], r"option preset\.specificity: the shares sum to 0"),
    (["preset.specificity.explicit=lots"], r"option preset\.specificity\.explicit must be a number"),
])
def test_bad_options_fail_with_the_option_named(overrides, msg, tmp_path):
    from arbor_train.errors import ConfigError

    with pytest.raises(ConfigError, match=msg):
        run(cfg(f"out_dir={tmp_path / 'x'}", *overrides))
    assert not (tmp_path / "x").exists()


def test_schema_validation_names_set_row_and_field():
    row = {"session_id": "s", "turn": 1, "input": "hi", "timestamp": None, "source": "turn", "tags": ["money"]}
    validate_rows("tags", [row])
    with pytest.raises(SchemaError, match=r"tags\[1\]\.tags\[0\]: expected string"):
        validate_rows("tags", [row, dict(row, tags=[3])])
    with pytest.raises(SchemaError, match=r"missing fields \['source'\]"):
        validate_rows("tags", [{k: v for k, v in row.items() if k != "source"}])
    with pytest.raises(SchemaError, match="unknown supervision set"):
        validate_rows("nope", [])


def test_schema_refuses_wrong_types_nulls_bad_text_and_duplicate_ids(smoke_data):
    from arbor_train.errors import InputError

    sess = [json.loads(l) for l in (smoke_data / "jsonl" / "sessions.jsonl").open()][:2]
    validate_rows("sessions", sess)
    cases = [
        ([dict(sess[0], n_branches=True), sess[1]], r"sessions\[0\]\.n_branches: expected int32, got bool"),
        ([sess[0], dict(sess[1], session_id=sess[0]["session_id"])],
         rf"duplicate session_id '{sess[0]['session_id']}' at rows 0 and 1"),
    ]
    bad = copy.deepcopy(sess[1])
    bad["turns"][2]["is_question"] = "false"
    cases.append(([sess[0], bad], r"sessions\[1\]\.turns\[2\]\.is_question: expected bool, got str"))
    bad = copy.deepcopy(sess[0])
    bad["questions"][1]["turn"] = bad["questions"][0]["turn"]
    cases.append(([bad], r"sessions\[0\]\.questions: duplicate turn \d+ at questions\[0\] and questions\[1\]"))
    bad = copy.deepcopy(sess[0])
    bad["turns"][5]["assistant"] = "ok \ud800"
    cases.append(([bad], r"sessions\[0\]\.turns\[5\]\.assistant: not valid UTF-8 text"))
    bad = copy.deepcopy(sess[0])
    bad["questions"][0]["gold"] = None
    cases.append(([bad], r"sessions\[0\]\.questions\[0\]\.gold: null is not allowed"))
    for rows, msg in cases:
        with pytest.raises(InputError, match=msg):
            validate_rows("sessions", rows)
    qa = {"conversation_id": "c", "question_id": "c:q0", "question": "q?", "answer": "a", "category": "1",
          "evidence": [], "adversarial_answer": None}
    with pytest.raises(SchemaError, match=r"qa: duplicate question_id 'c:q0' at rows 0 and 2"):
        validate_rows("qa", [qa, dict(qa, question_id="c:q1"), qa])
    with pytest.raises(SchemaError, match=r"qa\[0\]\.question: null is not allowed"):
        validate_rows("qa", [dict(qa, question=None)])


# ---------------------------------------------------------------- each validation rule fails on a hand-made session
@pytest.fixture(scope="module")
def valid_session():
    p = preset("formal")
    plan, turns, _ = build_session(0, p, 0, session_targets(p, 0))
    assert validate_session(plan, turns, p["delay_min"]) == {}
    return p, plan, turns


def _first_question(turns, types=None):
    return next(t for t in turns if t.is_question and (types is None or t.question["type"] in types))


def _find_session_with(p, types):
    targets = session_targets(p, 0)
    for i in range(33):
        plan, turns, _ = build_session(i, p, 0, targets)
        if any(t.is_question and t.question["type"] in types for t in turns):
            return plan, turns
    raise AssertionError(f"no session with {types}")


def test_rule_support_catches_an_unsupported_gold(valid_session):
    p, plan, turns = copy.deepcopy(valid_session)
    q = _first_question(turns)
    q.question["gold"] = "Atlantis"
    assert "support" in validate_session(plan, turns, p["delay_min"])


def test_rule_support_catches_a_question_asked_before_its_support(valid_session):
    p, plan, turns = copy.deepcopy(valid_session)
    q = _first_question(turns)
    support = [t for t in turns[: q.index] if t.branch == q.branch]
    for t in support:  # the prefix no longer states anything about this branch
        t.extraction = {"states": [], "facts": [], "entities": [], "artifacts": [], "events": []}
    assert "support" in validate_session(plan, turns, p["delay_min"])


def test_rule_no_leak_catches_an_answer_in_the_question(valid_session):
    p, plan, turns = copy.deepcopy(valid_session)
    q = _first_question(turns)
    q.user = q.user.rstrip("?") + f" Is it {q.question['gold']}?"
    assert "no_leak" in validate_session(plan, turns, p["delay_min"])
    p, plan, turns = copy.deepcopy(valid_session)
    q = _first_question(turns)
    q.user = q.user + f" (not {q.question['confounder']})"
    assert "no_leak" in validate_session(plan, turns, p["delay_min"])


def test_rule_confounder_catches_equal_or_absent_confounders(valid_session):
    p, plan, turns = copy.deepcopy(valid_session)
    q = _first_question(turns)
    q.question["confounder"] = q.question["gold"]
    assert "confounder" in validate_session(plan, turns, p["delay_min"])
    p, plan, turns = copy.deepcopy(valid_session)
    q = _first_question(turns)
    q.question["confounder"] = "Narnia"
    assert "confounder" in validate_session(plan, turns, p["delay_min"])


def test_rule_delayed_catches_a_resumption_that_is_not_delayed():
    p = preset("formal")
    plan, turns = _find_session_with(p, {"delayed_fact"})
    q = _first_question(turns, {"delayed_fact"})
    assert validate_session(plan, turns, p["delay_min"]) == {}
    # move the branch's previous turn right before the question: no longer a delayed resumption
    prev = max(t.index for t in turns[: q.index] if t.branch == q.branch)
    turns[q.index - 1].branch, turns[prev].branch = q.branch, turns[q.index - 1].branch
    assert "delayed" in validate_session(plan, turns, p["delay_min"])


def test_rule_distinct_catches_indistinguishable_parallel_branches(valid_session):
    p, plan, turns = copy.deepcopy(valid_session)
    b = plan.branches[0]
    partner = plan.branches[b.partner]
    partner.owner = b.owner
    assert "distinct" in validate_session(plan, turns, p["delay_min"])


# ---------------------------------------------------------------- specificity levels (preset formal_mixed)
@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    out = tmp_path_factory.mktemp("mixed") / "set"
    stats = run(cfg("preset=formal_mixed", "seed=0", "mine=false", f"out_dir={out}"))
    return out, stats


def test_formal_mixed_keeps_the_composition_and_counts_each_level(mixed, capsys):
    out, stats = mixed
    assert stats["sessions"] == 33 and stats["questions"] == 100 and stats["non_question_turns"] == 1442
    assert stats["turns_per_session"] == {"min": 42, "max": 52, "mean": 46.73}
    levels = stats["questions_by_specificity"]
    assert sum(levels.values()) == 100 and all(levels.get(k, 0) >= 15 for k in ("explicit", "partial", "referential"))
    rows = [json.loads(x) for x in (out / "jsonl" / "sessions.jsonl").read_text().splitlines()]
    got = {}
    for r in rows:
        for q in r["questions"]:
            got[q["specificity"]] = got.get(q["specificity"], 0) + 1
            if q["specificity"] == "referential":  # right after a statement of its own branch
                prev = r["turns"][q["turn"] - 1]
                assert prev["branch"] == q["branch"] and not prev["is_question"]
                assert q["type"] != "delayed_fact"
    assert got == levels
    card = (out / "README.md").read_text()
    assert f"| all | {levels['explicit']} | {levels['partial']} | {levels['referential']} |" in card


def test_question_texts_at_each_level_vary(mixed):
    """No level is one fixed phrasing: its questions open with several different words."""
    out, _ = mixed
    rows = [json.loads(x) for x in (out / "jsonl" / "sessions.jsonl").read_text().splitlines()]
    openings: dict[str, set] = {}
    for r in rows:
        for q in r["questions"]:
            openings.setdefault(q["specificity"], set()).add(r["turns"][q["turn"]]["user"].split()[0])
    assert len(openings["partial"]) >= 4 and len(openings["referential"]) >= 4


def first_session(preset_name: str, want) -> tuple:
    """(preset, plan, turns) of the first formal-composition session of the preset for which want(turns)
    holds, checked valid."""
    p = preset(preset_name)
    targets = session_targets(p, 0)
    for i in range(33):
        plan, turns, _ = build_session(i, p, 0, targets)
        if want(turns):
            assert validate_session(plan, turns, p["delay_min"]) == {}
            return p, plan, turns
    raise AssertionError(f"no {preset_name} session fits")


@pytest.fixture(scope="module")
def mixed_session():
    """A formal_mixed session with questions at every level."""
    return first_session("formal_mixed", lambda turns: {"explicit", "partial", "referential"}
                         <= {t.question["specificity"] for t in turns if t.is_question})


def _level(turns, level):
    return next(t for t in turns if t.is_question and t.question["specificity"] == level)


def test_rule_specificity_explicit_must_name_the_owner(mixed_session):
    p, plan, turns = copy.deepcopy(mixed_session)
    q = _level(turns, "explicit")
    q.user = q.user.replace(f"{plan.branches[q.branch].first}'s ", "the ").replace(plan.branches[q.branch].first, "they")
    assert "specificity" in validate_session(plan, turns, p["delay_min"])


def test_rule_specificity_partial_names_the_task_and_no_owner(mixed_session):
    p, plan, turns = copy.deepcopy(mixed_session)
    q = _level(turns, "partial")
    b = plan.branches[q.branch]
    q.user = q.user + f" ({b.first} asked)"  # an owner named: no longer partial
    assert "specificity" in validate_session(plan, turns, p["delay_min"])
    p, plan, turns = copy.deepcopy(mixed_session)
    q = _level(turns, "partial")
    b = plan.branches[q.branch]
    q.user = q.user.replace(b.title, "that thing")  # no anchor left: not partial either
    assert "specificity" in validate_session(plan, turns, p["delay_min"])


def test_rule_specificity_referential_has_no_anchor_and_follows_its_branch(mixed_session):
    p, plan, turns = copy.deepcopy(mixed_session)
    q = _level(turns, "referential")
    partner = plan.branches[plan.branches[q.branch].partner]
    q.user = q.user.rstrip("?") + f" for the {partner.title}?"  # names a task
    assert "specificity" in validate_session(plan, turns, p["delay_min"])
    p, plan, turns = copy.deepcopy(mixed_session)
    q = _level(turns, "referential")
    turns[q.index - 1].branch = plan.branches[q.branch].partner  # its branch is no longer the current one
    fails = validate_session(plan, turns, p["delay_min"])
    assert any("does not directly follow" in m for m in fails.get("specificity", []))


def test_levels_draw_from_their_own_random_stream():
    """Drawing levels leaves every other turn as it was: preset formal (all explicit) realizes exactly the
    turns it did before levels existed, and a partial share changes only the question texts."""
    p = preset("formal")
    q = dict(p, specificity={"explicit": 0.5, "partial": 0.5})
    for i in (0, 3):
        _, turns_a, _ = build_session(i, p, 0, session_targets(p, 0))
        _, turns_b, _ = build_session(i, q, 0, session_targets(q, 0))
        assert [(t.user, t.assistant) for t in turns_a if not t.is_question] == \
            [(t.user, t.assistant) for t in turns_b if not t.is_question]
        assert [t.index for t in turns_a if t.is_question] == [t.index for t in turns_b if t.is_question]
    levels = [t.question["specificity"] for i in range(6) for t in build_session(i, q, 0, session_targets(q, 0))[1]
              if t.is_question]
    assert "partial" in levels and "explicit" in levels


def test_lexicons_are_large_and_clean():
    lexicon.check()
    assert len(lexicon.FIRST_NAMES) * len(lexicon.LAST_NAMES) > 100_000


# ---------------------------------------------------------------- verbalizer
class FakeLLM:
    name = "fake"

    def __init__(self, fn):
        self.fn = fn

    def chat(self, conversations, max_new_tokens=96):
        return [self.fn(c[-1]["content"].split("Message: ", 1)[1]) for c in conversations]


def test_verbalizer_keeps_values_and_rejects_drops_and_leaks(valid_session):
    from data_gen.branchmem.verbalize import Verbalizer, VerbalizeReport

    p, plan, turns = copy.deepcopy(valid_session)
    v = Verbalizer(FakeLLM(lambda text: "So, " + text[0].lower() + text[1:]))
    report = VerbalizeReport()
    out = v.rewrite(copy.deepcopy(turns), report)
    # every non-question, non-distractor turn was offered to the LLM; the accepted ones carry its rewrite
    assert report.attempted == sum(not t.is_question and t.move != "distractor" for t in turns)
    assert report.accepted + sum(report.rejected.values()) == report.attempted
    rewritten = [o for o, t in zip(out, turns) if o.user != t.user]
    assert report.accepted == len(rewritten) > 0 and all(o.user.startswith("So, ") for o in rewritten)
    assert validate_session(plan, out, p["delay_min"]) == {}, "accepted rewrites keep the session valid"
    # a rewrite that drops every value is rejected; one that adds an answer is rejected as a leak
    t = next(x for x in turns if x.extraction["states"])
    leak = next(x.question["gold"] for x in turns if x.is_question and x.question["gold"] not in t.user)
    assert v.check(t, "Something happened with the plan.", [leak]) == "dropped_or_altered_value"
    assert v.check(t, t.user + f" Maybe {leak} too.", [leak]) == "leak"
    assert v.check(t, t.user + " Thanks!", [leak]) is None
    assert v.check(t, "", []) == "shape"
