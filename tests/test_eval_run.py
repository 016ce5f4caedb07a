"""The BranchMemEval replay harness: protocol, methods under one budget, answer-independent metrics."""

import json
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from arbor_train.paths import CONF_DIR
from eval.run import run


def ecfg(data, run_dir, *o):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="eval", overrides=[f"data_dir={data}", f"run_dir={run_dir}", "wandb.enabled=false",
                                                      *o])


def spy_methods(monkeypatch) -> dict:
    """Record every method's reads and observations, per session / conversation id, as eval.run calls them."""
    import arbor_train.replay.methods as M

    seen = {"reads": [], "observed": []}
    real = M.build_method

    def build(name, runtime_cfg, components, session_id, *rest):
        m = real(name, runtime_cfg, components, session_id, *rest)
        read, observe = m.read, m.observe

        def spy_read(question, now, budget):
            r = read(question, now, budget)
            seen["reads"].append((session_id, question, r))
            return r

        def spy_observe(turn, *a):
            o = observe(turn, *a)
            seen["observed"].append((session_id, turn, o))
            return o

        m.read, m.observe = spy_read, spy_observe
        return m

    monkeypatch.setattr(M, "build_method", build)
    return seen


def mean4(xs):
    xs = list(xs)
    return round(sum(xs) / len(xs), 4)


@pytest.mark.parametrize("method", ["arbormem", "full_context", "bm25", "dense", "fact_store"])
def test_every_method_replays_under_the_budget(smoke_data, tmp_path, method, monkeypatch):
    from arbor_train.scoring.answers import mentions

    seen = spy_methods(monkeypatch)
    res = run(ecfg(smoke_data, tmp_path, f"method={method}", "budget=512"))
    qs = [json.loads(l) for l in (tmp_path / "questions.jsonl").open()]
    sessions = [json.loads(l) for l in (smoke_data / "jsonl" / "sessions.jsonl").open()]
    assert res["questions"] == len(qs) == sum(len(s["questions"]) for s in sessions)
    assert all(q["context_tokens"] <= 512 for q in qs)
    # gold / confounder in context, recomputed here from each question's own context and the data's answers
    questions = [(s["session_id"], q) for s in sessions for q in sorted(s["questions"], key=lambda q: q["turn"])]
    assert len(seen["reads"]) == len(questions)
    gold_in, conf_in = [], []
    for rec, (sid, q), (read_sid, text, r) in zip(qs, questions, seen["reads"]):
        assert rec["session_id"] == sid == read_sid and rec["turn"] == q["turn"] and rec["gold"] == q["gold"]
        assert rec["context_tokens"] == r.tokens
        lines = r.text.splitlines()
        gold_in.append(any(mentions(line, q["gold"], q["confounder"]) for line in lines))
        conf_in.append(q["confounder"] is not None and any(mentions(line, q["confounder"], q["gold"]) for line in lines))
        assert (rec["gold_in_context"], rec["confounder_in_context"]) == (gold_in[-1], conf_in[-1])
    assert res["gold_in_context"] == mean4(gold_in) and res["confounder_in_context"] == mean4(conf_in)
    if method == "arbormem":
        branch = {s["session_id"]: {t["index"]: t["branch"] for t in s["turns"]} for s in sessions}
        at_q = [branch[sid][r.selected_turn] == q["branch"] if r.selected_turn is not None else False
                for (sid, q), (_, _, r) in zip(questions, seen["reads"])]
        assert res["state_localization_at_questions"] == mean4(at_q)
        # every turn: the chosen parent lies on the turn's gold branch (or none, for a gold new root)
        turns = {(s["session_id"], t["index"]): t for s in sessions for t in s["turns"]}
        assert len(seen["observed"]) == len(turns)
        every = [o.parent_turn is None if turns[sid, i]["gold_parent"] < 0 else
                 o.parent_turn is not None and branch[sid][o.parent_turn] == turns[sid, i]["branch"]
                 for sid, i, o in seen["observed"]]
        assert res["state_localization_every_turn"] == mean4(every)
        # and it beats attaching every turn to the one before (the linear chain a forest-less memory builds)
        linear = [turns[sid, i]["gold_parent"] >= 0 and i > 0 and branch[sid][i - 1] == turns[sid, i]["branch"]
                  for sid, i, _ in seen["observed"]]
        assert res["state_localization_every_turn"] > mean4(linear)
        # the primary-path block alone: recomputed from each read's own block
        prim = []
        for (sid, q), (_, _, r) in zip(questions, seen["reads"]):
            assert r.primary == "" or (r.primary.startswith("[PrimaryPath]") and r.primary in r.text)
            lines = r.primary.splitlines()
            prim.append(any(mentions(x, q["gold"], q["confounder"]) for x in lines)
                        and not (q["confounder"] is not None and any(mentions(x, q["confounder"], q["gold"]) for x in lines)))
        assert res["primary_gold_only"] == mean4(prim) and [r["primary_gold_only"] for r in qs] == prim
    else:
        assert res["state_localization_at_questions"] is None and res["primary_gold_only"] is None
    assert json.loads((tmp_path / "results.json").read_text())["results"]["method"] == method


def test_question_types_reads_only_those_questions_and_replays_every_turn(smoke_data, tmp_path, monkeypatch):
    seen = spy_methods(monkeypatch)
    rows = [json.loads(l) for l in (smoke_data / "jsonl" / "sessions.jsonl").open()]
    want = rows[0]["questions"][0]["type"]
    n = sum(q["type"] == want for s in rows for q in s["questions"])
    out = run(ecfg(smoke_data, tmp_path, "method=bm25", f"branchmem.question_types=[{want}]"))
    assert out["questions"] == n < sum(len(s["questions"]) for s in rows)
    asked = {(s["session_id"], t["user"]) for s in rows for t in s["turns"] if t["is_question"]
             and next(q for q in s["questions"] if q["turn"] == t["index"])["type"] == want}
    assert {(sid, q) for sid, q, _ in seen["reads"]} == asked
    assert len(seen["observed"]) == sum(len(s["turns"]) for s in rows)


def test_ablation_removes_the_forest(smoke_data, tmp_path):
    full = run(ecfg(smoke_data, tmp_path / "a"))
    linear = run(ecfg(smoke_data, tmp_path / "b", "ablation=state_localization"))
    assert set(linear["routes"]) == {"linear", "empty"}
    assert full["state_localization_every_turn"] > linear["state_localization_every_turn"]


@pytest.mark.parametrize("overrides, msg", [
    (["benchmark=bfcl"], "option benchmark must be one of branchmem, locomo, longmemeval, beam, irc, conversations; got 'bfcl'"),
    (["method=magic"], "option method"),
    (["budget=10"], "smaller than the fixed prompt"),
    (["budget=lots"], "option budget must be an integer, got 'lots'"),
    (["budget=-5"], "option budget must be at least 1"),
    (["prefilter=abc"], "option prefilter must be a number"),
    (["max_sessions=0"], "option max_sessions must be at least 1"),
    (["wandb.enabled=maybe"], "option wandb.enabled must be true or false"),
    (["+ablation.routing=perhaps"], "option ablation.routing must be true or false"),
    (["answer_model.kind=gpt"], "option answer_model.kind must be one of none, llm"),
    (["answer_model=smollm2", "answer_model.llm.backend=vllm"], "option answer_model.llm.backend must be one of hf, openai"),
    (["judge.kind=human"], "option judge.kind must be one of none, llm"),
    (["benchmark=longmemeval"], "needs option longmemeval.input"),
    (["benchmark=beam", "beam.input=/no/such/dir"], "option beam.input='/no/such/dir': no such file"),
    (["benchmark=locomo", "locomo.categories=[1,9]"], r"option locomo.categories\[1\] must be one of 1, 2, 3, 4, 5"),
    (["branchmem.question_types=[linked_fakt]"], r"option branchmem.question_types=\['linked_fakt'\]: a non-empty list of"),
    (["branchmem.question_types=[]"], r"option branchmem.question_types=\[\]"),
])
def test_bad_options_fail_before_work(smoke_data, tmp_path, overrides, msg, monkeypatch):
    import arbor_train.runtime as R
    from arbor_train.errors import UserError

    def no_work(*a, **k):
        raise AssertionError("components were built before the options were checked")

    monkeypatch.setattr(R, "build_components", no_work)
    with pytest.raises(UserError, match=msg):
        run(ecfg(smoke_data, tmp_path, *overrides))


def _sessions_with(tmp_path, smoke_data, mutate) -> Path:
    """A copy of the smoke set's sessions.jsonl with `mutate(rows)` applied (rows as loaded)."""
    rows = [json.loads(l) for l in (smoke_data / "jsonl" / "sessions.jsonl").open()]
    mutate(rows)
    d = tmp_path / "data"
    (d / "jsonl").mkdir(parents=True)
    (d / "jsonl" / "sessions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


@pytest.mark.parametrize("mutate, msg", [
    (lambda rows: rows[1]["turns"][3].update(is_question="false"),
     r"line 2 \(session_id='smoke-000001'\): sessions\.turns\[3\]\.is_question: expected bool, got str"),
    (lambda rows: rows[0]["turns"][0].update(user=None), r"line 1 .*: sessions\.turns\[0\]\.user: null is not allowed"),
    (lambda rows: rows[2]["questions"][0].update(gold="\ud800"), r"line 3 .*: sessions\.questions\[0\]\.gold: not valid UTF-8"),
    (lambda rows: rows[0]["turns"][1].update(index=0), r"line 1 .*: sessions\.turns: duplicate index 0 at turns\[0\] and turns\[1\]"),
    (lambda rows: rows[3].update(session_id=rows[1]["session_id"]), r"duplicate session_id 'smoke-000001' on lines 2 and 4"),
])
def test_a_bad_sessions_file_is_refused_naming_file_line_and_field(smoke_data, tmp_path, mutate, msg):
    from arbor_train.errors import InputError

    d = _sessions_with(tmp_path, smoke_data, mutate)
    with pytest.raises(InputError, match=msg) as e:
        run(ecfg(d, tmp_path / "run"))
    assert "sessions.jsonl" in str(e.value) and not (tmp_path / "run" / "results.json").exists()


def test_report_merges_runs_into_a_table_and_plots(smoke_data, tmp_path):
    from eval.report import report

    for b in (256, 512):
        for m in ("arbormem", "bm25"):
            run(ecfg(smoke_data, tmp_path / "runs" / f"{m}-{b}", f"method={m}", f"budget={b}"))
    run(ecfg(smoke_data, tmp_path / "runs" / "abl", "ablation=routing", "budget=512"))
    res = report([tmp_path / "runs"], tmp_path / "rep")
    assert len(res["rows"]) == 5 and "| arbormem |" in res["table"] and "no_routing" in res["table"]
    names = {p.split("/")[-1] for p in res["plots"]}
    assert {"budget_curve.png", "ablation_bars.png"} <= names
    for p in res["plots"]:
        assert open(p, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "rep" / "table.md").read_text() == res["table"]
    with pytest.raises(FileNotFoundError, match="no results.json"):
        report([tmp_path / "nothing"], tmp_path / "rep2")


def test_locomo_protocol_builds_memory_once_and_reads_evidence(smoke_data, tmp_path, monkeypatch):
    from arbor_train.conversations.locomo import load_locomo
    from arbor_train.conversations.schema import interactions
    from arbor_train.paths import REPO_ROOT

    locomo = REPO_ROOT.parent / "shared" / "data" / "locomo"
    if not locomo.exists():
        pytest.skip("../shared/data/locomo is not beside the repository")
    seen = spy_methods(monkeypatch)
    res = run(ecfg(smoke_data, tmp_path, "benchmark=locomo", f"locomo.input={locomo}", "max_sessions=1", "method=bm25"))
    qs = [json.loads(l) for l in (tmp_path / "questions.jsonl").open()]
    assert res["sessions"] == 1 and res["questions"] == len(qs) == 152  # conversation 26: 199 questions, 47 of category 5
    assert {q["category"] for q in qs} == {"1", "2", "3", "4"}
    assert all(q["context_tokens"] <= 2048 for q in qs)
    # built once: every interaction of the conversation observed exactly once, in order, before the reads
    conv = load_locomo(locomo)[0]
    inters = interactions(conv)
    assert [i for _, i, _ in seen["observed"]] == list(range(len(inters)))
    # evidence recall, recomputed from the dataset's evidence ids and the turns each read put in context
    idx_of = {tid: i for i, it in enumerate(inters) for tid in it.turn_ids}
    asked = [q for q in conv.questions if q.category != "5"]
    assert [q.question for q in asked] == [question for _, question, _ in seen["reads"]]
    recalls = []
    for rec, q, (_, _, r) in zip(qs, asked, seen["reads"]):
        ev = {idx_of[e] for e in q.evidence if e in idx_of}
        want = len(ev & set(r.turn_ids)) / len(ev) if ev else None
        assert rec["question_id"] == q.question_id and rec["evidence_recall"] == pytest.approx(want)
        recalls += [want] if want is not None else []
    assert res["evidence_recall"] == mean4(recalls) > 0


def test_results_are_logged_to_an_offline_wandb_run(smoke_data, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    run(ecfg(smoke_data, tmp_path, "wandb.enabled=true", "max_sessions=1"))
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].rglob("*.wandb"))
    # the run's results table holds every result of this run, as results.json has them
    tables = list(runs[0].rglob("results_table_*.table.json"))
    assert len(tables) == 1
    table = json.loads(tables[0].read_text())
    results = json.loads((tmp_path / "results.json").read_text())["results"]
    assert table["columns"] == ["key", "value"]
    assert {k: json.loads(v) for k, v in table["data"]} == json.loads(json.dumps(results, default=str))


class FakeChat:
    """A deterministic stand-in for an LLM backend: answers the last line's question from the context."""

    name = "fake"

    def __init__(self, reply):
        self.reply = reply

    def chat(self, conversations, max_new_tokens=32):
        return [self.reply(c) for c in conversations]


def test_longmemeval_protocol_with_a_pluggable_judge(smoke_data, tmp_path, monkeypatch):
    import eval.judge as J
    import eval.run as R
    from arbor_train.conversations.longmemeval import load_longmemeval
    from arbor_train.conversations.schema import interactions
    from arbor_train.paths import REPO_ROOT

    fixture = REPO_ROOT / "tests" / "fixtures" / "benchmarks" / "longmemeval_s_tiny.json"
    with monkeypatch.context() as mp:
        seen = spy_methods(mp)
        res = run(ecfg(smoke_data, tmp_path / "a", "benchmark=longmemeval", f"longmemeval.input={fixture}",
                       "method=bm25"))
    assert res["questions"] == 3 and len(seen["reads"]) == 3
    # turn and session recall of the has_answer evidence, recomputed from each question's own haystack
    want = {k: [] for k in ("turn_recall_any", "turn_recall_all", "session_recall_any", "session_recall_all")}
    for conv, (sid, _, r) in zip(load_longmemeval(fixture), seen["reads"]):
        inters = interactions(conv)
        idx_of = {tid: i for i, it in enumerate(inters) for tid in it.turn_ids}
        q = conv.questions[0]
        ev = {idx_of[e] for e in q.evidence if e in idx_of}
        ev_s, got_s = {inters[i].session_id for i in ev}, {inters[i].session_id for i in r.turn_ids}
        assert sid == conv.conversation_id
        if ev and not q.extra.get("abstention"):
            want["turn_recall_any"].append(bool(ev & set(r.turn_ids)))
            want["turn_recall_all"].append(ev <= set(r.turn_ids))
            want["session_recall_any"].append(bool(ev_s & got_s))
            want["session_recall_all"].append(ev_s <= got_s)
    assert want["turn_recall_any"], "the fixture has answerable questions with evidence"
    for k, v in want.items():
        assert res[k] == mean4(v), k
    assert "accuracy" not in res  # no answer model, no judge: judge-free metrics only
    # an answer model and a judge that says yes exactly when the reference answer is in the response
    monkeypatch.setattr(R, "build_answer_model", lambda cfg: FakeChat(lambda c: c[-1]["content"].split("\n")[-3]))
    monkeypatch.setattr(J, "build_judge", lambda cfg: J.Judge(FakeChat(
        lambda c: "yes" if c[-1]["content"].split("Reference answer: ")[1].split("\n")[0].lower()
        in c[-1]["content"].split("Model response: ")[1].lower() else "no")))
    res = run(ecfg(smoke_data, tmp_path / "b", "benchmark=longmemeval", f"longmemeval.input={fixture}", "method=bm25"))
    qs = [json.loads(l) for l in (tmp_path / "b" / "questions.jsonl").open()]
    assert all("correct" in q for q in qs) and res["accuracy"] == sum(q["correct"] for q in qs) / 3
    assert set(res["accuracy_by_type"]) == {q["question_type"] for q in qs}


def test_judge_prompt_follows_the_type_rules():
    from eval.judge import Judge, judge_messages

    m = judge_messages("temporal-reasoning", "How many days?", "3 days", "4 days", False)[-1]["content"]
    assert "off-by-one" in m
    m = judge_messages("multi-session", "Q?", "x", "I cannot know", True)[-1]["content"]
    assert "unanswerable" in m
    assert Judge(FakeChat(lambda c: "Yes.")).correct("multi-session", "q", "a", "a") is True
    assert Judge(FakeChat(lambda c: "no")).correct("multi-session", "q", "a", "b") is False


def test_beam_protocol_scores_rubrics_with_the_judge_and_orders_events_without_it(smoke_data, tmp_path, monkeypatch):
    import eval.judge as J
    import eval.run as R
    from arbor_train.paths import REPO_ROOT

    beam = REPO_ROOT / "tests" / "fixtures" / "benchmarks" / "beam"
    res = run(ecfg(smoke_data, tmp_path / "a", "benchmark=beam", f"beam.input={beam}", "method=full_context"))
    assert res["sessions"] == 2 and res["questions"] > 0 and "overall" not in res
    monkeypatch.setattr(R, "build_answer_model", lambda cfg: FakeChat(
        lambda c: "First we chose SQLite, later we switched to PostgreSQL."))
    monkeypatch.setattr(J, "build_judge", lambda cfg: J.Judge(FakeChat(lambda c: "partially")))
    res = run(ecfg(smoke_data, tmp_path / "b", "benchmark=beam", f"beam.input={beam}", "method=full_context"))
    assert res["score_by_ability"]["event_ordering"] == 1.0  # judge-free Kendall tau: the fake answer keeps the order
    others = {k: v for k, v in res["score_by_ability"].items() if k != "event_ordering"}
    assert others and all(v == 0.5 for v in others.values())  # every rubric item "partially"
    assert res["overall"] == round(sum(res["score_by_ability"].values()) / len(res["score_by_ability"]), 4)


def test_kendall_tau_order():
    from arbor_train.scoring.answers import kendall_tau_order

    ref = ["a1", "b2", "c3"]
    assert kendall_tau_order("a1 then b2 then c3", ref) == 1.0
    assert kendall_tau_order("c3, b2, a1", ref) == 0.0
    # a1 before c3 before b2: pairs (a1,b2)+ (a1,c3)+ (b2,c3)- -> tau = 1/3 -> (1/3 + 1) / 2 = 2/3
    assert abs(kendall_tau_order("a1 c3 b2", ref) - 2 / 3) < 1e-9


def test_compare_prints_one_table_per_set(smoke_data, tmp_path):
    from eval.compare import compare

    res = compare("ablations", [f"data_dir={smoke_data}", "wandb.enabled=false"], tmp_path / "abl")
    assert len(res["rows"]) == 6 and res["table"].count("| branchmem |") == 6
    from PIL import Image

    bars = tmp_path / "abl" / "ablation_bars.png"
    assert str(bars) in map(str, res["plots"]) and bars.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(bars) as im:  # a decodable picture, not an empty or truncated file
        im.load()
        assert im.width > 100 and im.height > 100
    with pytest.raises(ValueError, match="compare set"):
        compare("everything", [], tmp_path / "x")


def test_locomo_f1_and_optional_judge_with_an_answer_model(smoke_data, tmp_path, monkeypatch):
    import eval.judge as J
    import eval.run as R
    from arbor_train.paths import REPO_ROOT

    locomo = REPO_ROOT.parent / "shared" / "data" / "locomo"
    if not locomo.exists():
        pytest.skip("../shared/data/locomo is not beside the repository")
    monkeypatch.setattr(R, "build_answer_model", lambda cfg: FakeChat(lambda c: "not mentioned"))
    monkeypatch.setattr(J, "build_judge", lambda cfg: J.Judge(FakeChat(lambda c: "no")))
    res = run(ecfg(smoke_data, tmp_path, "benchmark=locomo", f"locomo.input={locomo}", "max_sessions=1", "method=bm25",
                   "locomo.categories=[4]"))
    assert res["questions"] == 70 and res["judge_accuracy"] == 0.0
    # F1 of the fixed reply against each category-4 reference answer, recomputed from the dataset
    from arbor_train.conversations.locomo import load_locomo
    from arbor_train.scoring.answers import locomo_f1

    qs = [json.loads(l) for l in (tmp_path / "questions.jsonl").open()]
    refs = [q.answer for q in load_locomo(locomo)[0].questions if q.category == "4"]
    assert len(refs) == 70 and all(q["prediction"] == "not mentioned" for q in qs)
    f1s = [locomo_f1("not mentioned", a) for a in refs]
    assert [q["score"] for q in qs] == pytest.approx(f1s)
    assert res["f1"] == pytest.approx(sum(f1s) / 70) and res["f1"] < 0.2


def test_plots_take_the_metric_a_benchmark_reports(tmp_path):
    """A LoCoMo run (evidence recall, no gold_in_context) ended in KeyError when W&B logging drew its plots."""
    from eval.report import plots

    rows = [{"benchmark": "locomo", "method": m, "ablation": "full", "budget": b, "runtime": "heuristic",
             "evidence_recall": r} for m, b, r in [("bm25", 1024, 0.7), ("bm25", 2048, 0.76), ("arbormem", 1024, 0.3),
                                                     ("arbormem", 2048, 0.37)]]
    written = plots(rows, tmp_path)
    assert [p.name for p in written] == ["budget_curve.png"]
    assert plots([{"benchmark": "x", "method": "bm25", "budget": 1, "ablation": "full"}], tmp_path) == []


def test_routing_is_scored_for_any_method_that_routes_not_by_its_name(smoke_data, tmp_path):
    """The harness reads what a method returns (Observation.route, ReadResult.route), never its name:
    the previous-message baseline routes every turn to the one before it and is scored for that."""
    res = run(ecfg(smoke_data, tmp_path, "method=previous_message"))
    sessions = [json.loads(l) for l in (smoke_data / "jsonl" / "sessions.jsonl").open()]
    every = []
    for s in sessions:
        for t in s["turns"]:
            i = t["index"]
            every.append(i == 0 and t["gold_parent"] < 0 or
                         i > 0 and t["gold_parent"] >= 0 and s["turns"][i - 1]["branch"] == t["branch"])
    assert res["state_localization_every_turn"] == mean4(every)
    assert set(res["routes"]) == {"first", "previous"}
    assert res["state_localization_at_questions"] is None  # its reads do not localize


def test_every_benchmark_is_registered_once_with_its_whole_protocol():
    from eval.protocols import BENCHMARKS, PROTOCOLS
    from eval.protocols.base import Protocol

    assert BENCHMARKS == ("branchmem", "locomo", "longmemeval", "beam", "irc", "conversations")
    for name, p in PROTOCOLS.items():
        assert isinstance(p, Protocol) and p.name == name
        assert all(callable(f) for f in (p.check, p.load, p.unit_id, p.replay, p.summarize))


def test_the_report_adds_a_per_category_table_for_locomo_runs():
    from eval.report import category_table, table

    rows = [{"benchmark": "locomo", "method": "bm25", "runtime": "heuristic", "budget": 1024,
             "evidence_recall": 0.7, "answer_token_recall": 0.8, "evidence_recall_by_category": {"1": 0.5, "4": 0.9},
             "answer_token_recall_by_category": {"1": 0.6, "4": 0.95}, "run": "a"},
            {"benchmark": "locomo", "method": "arbormem", "runtime": "heuristic/cross_session", "budget": 1024,
             "evidence_recall": 0.75, "answer_token_recall": 0.82, "evidence_recall_by_category": {"1": 0.55},
             "answer_token_recall_by_category": {"1": 0.61}, "run": "b"}]
    lines = category_table(rows).splitlines()
    assert lines[0] == "| method | budget | cat 1 evidence / tokens | cat 4 evidence / tokens | all |"
    assert lines[2] == "| arbormem (heuristic/cross_session) | 1024 | 0.55 / 0.61 | — / — | 0.75 / 0.82 |"
    assert lines[3] == "| bm25 | 1024 | 0.5 / 0.6 | 0.9 / 0.95 | 0.7 / 0.8 |"
    assert "answer_token_recall" in table(rows).splitlines()[0]
    assert category_table([{"method": "bm25", "budget": 1, "gold_in_context": 0.5}]) == ""


def test_the_report_adds_an_accuracy_table_per_reader():
    from eval.report import accuracy_table, table

    base = {"benchmark": "branchmem", "method": "arbormem", "runtime": "heuristic", "budget": 1024, "run": "a"}
    rows = [dict(base, ablation="full", reader="bundle outputs/bundles/reader", accuracy=0.5,
                 accuracy_by_dimension={"interleaving": 0.4, "parallel_confusion": 0.6},
                 accuracy_by_type={"update_current": 1.0},
                 errors={"correct": 5, "hedge": 0, "retrieval_failure": 2, "trajectory_confusion": 1, "other": 2}),
            dict(base, ablation="no_routing", reader="gguf:x.gguf", accuracy=0.25,
                 accuracy_by_dimension={"interleaving": 0.25}, accuracy_by_type={},
                 errors={"correct": 1, "other": 3})]
    lines = accuracy_table(rows).splitlines()
    assert lines[0] == ("| method | ablation | budget | reader | accuracy | interleaving | parallel confusion | "
                        "update_current | correct / hedge / retrieval failure / trajectory confusion / other |")
    assert lines[2] == "| arbormem | full | 1024 | bundle outputs/bundles/reader | 0.5 | 0.4 | 0.6 | 1 | 5 / 0 / 2 / 1 / 2 |"
    assert lines[3] == "| arbormem | no_routing | 1024 | gguf:x.gguf | 0.25 | 0.25 | — | — | 1 / 0 / 0 / 0 / 3 |"
    assert "| reader |" in table(rows).splitlines()[0]
    assert accuracy_table([dict(base, gold_in_context=0.5)]) == ""


def test_extract_ahead_hands_every_turn_of_a_session_to_the_method_before_replaying_it(smoke_data, tmp_path, monkeypatch):
    import arbor_train.replay.methods as M

    calls = []
    real = M.build_method

    def build(name, runtime_cfg, components, session_id, *rest):
        m = real(name, runtime_cfg, components, session_id, *rest)
        prefetch, observe = m.prefetch, m.observe
        m.prefetch = lambda turns: (calls.append(("prefetch", session_id, list(turns))), time.sleep(1.0),
                                    prefetch(turns))[2]
        m.observe = lambda turn, *a, **k: (calls.append(("observe", session_id, turn)), observe(turn, *a, **k))[1]
        return m

    monkeypatch.setattr(M, "build_method", build)
    base = run(ecfg(smoke_data, tmp_path / "a", "max_sessions=2"))
    assert not [c for c in calls if c[0] == "prefetch"]  # off by default: commits extract turn by turn
    calls.clear()
    ahead = run(ecfg(smoke_data, tmp_path / "b", "max_sessions=2", "extract_ahead=true"))
    sessions = [json.loads(l) for l in (Path(smoke_data) / "jsonl" / "sessions.jsonl").open()][:2]
    for sess in sessions:
        mine = [c for c in calls if c[1] == sess["session_id"]]
        assert mine[0] == ("prefetch", sess["session_id"], [(t["user"], t["assistant"], t["timestamp"]) for t in sess["turns"]])
        assert [c[2] for c in mine[1:]] == [t["index"] for t in sess["turns"]]  # then every turn, in order
    assert ahead["gold_in_context"] == base["gold_in_context"]
    # the batched extraction counts as ingest: 1 s per session spread over its turns
    turns = sum(len(s["turns"]) for s in sessions)
    assert ahead["ingest_s_per_turn"] >= base["ingest_s_per_turn"] + 0.9 * 2.0 / turns
    with pytest.raises(Exception, match="extract_ahead"):
        run(ecfg(smoke_data, tmp_path / "c", "extract_ahead=maybe"))


def test_branchmem_summary_and_report_split_by_specificity(tmp_path):
    """Per level: the shares worked out by hand from six question records, the table row they make, and the
    per-level budget curve."""
    from eval.protocols.branchmem import by_specificity
    from eval.report import plots, specificity_table

    def rec(level, gold, conf, loc, correct=None):
        r = {"specificity": level, "gold_in_context": gold, "confounder_in_context": conf, "localization_correct": loc}
        if correct is not None:
            r["correct"] = correct
        return r

    recs = [rec("explicit", True, True, True), rec("explicit", True, False, True), rec("explicit", False, False, False),
            rec("referential", True, False, True), rec("referential", False, True, False),
            {"gold_in_context": True, "confounder_in_context": False, "localization_correct": None}]  # before levels: explicit
    got = by_specificity(recs)
    assert list(got) == ["explicit", "referential"]
    assert got["explicit"] == {"questions": 4, "gold_in_context": 0.75, "confounder_in_context": 0.25,
                               "gold_without_confounder": 0.5, "state_localization": round(2 / 3, 4)}
    assert got["referential"] == {"questions": 2, "gold_in_context": 0.5, "confounder_in_context": 0.5,
                                  "gold_without_confounder": 0.5, "state_localization": 0.5}
    answered = by_specificity([rec("partial", True, False, True, True), rec("partial", True, True, True, False)])
    assert answered["partial"]["accuracy"] == 0.5 and "primary_gold_only" not in answered["partial"]
    prim = by_specificity([dict(rec("partial", True, True, True), primary_gold_only=True),
                           dict(rec("partial", True, True, True), primary_gold_only=False),
                           dict(rec("partial", True, True, True), primary_gold_only=False)])
    assert prim["partial"]["primary_gold_only"] == round(1 / 3, 4)

    rows = [{"benchmark": "branchmem", "method": m, "runtime": "heuristic", "ablation": "full", "budget": b,
             "gold_in_context": 0.5, "by_specificity": {"explicit": dict(got["explicit"], gold_without_confounder=e),
                                                        "referential": dict(got["referential"], gold_without_confounder=r)}}
            for m, b, e, r in [("bm25", 512, 0.5, 0.25), ("bm25", 1024, 0.75, 0.5), ("arbormem", 512, 0.5, 0.5),
                               ("arbormem", 1024, 0.75, 1.0)]]
    lines = specificity_table(rows).splitlines()
    assert lines[0].startswith("| method | ablation | budget | explicit (n=4): gold / confounder / gold only / localization |")
    assert lines[2] == "| arbormem | full | 512 | 0.75 / 0.25 / 0.5 / 0.6667 | 0.5 / 0.5 / 0.5 / 0.5 |"
    assert lines[5] == "| bm25 | full | 1024 | 0.75 / 0.25 / 0.75 / 0.6667 | 0.5 / 0.5 / 0.5 / 0.5 |"
    assert "specificity_curve.png" in [p.name for p in plots(rows, tmp_path)]
    one_level = [dict(r, by_specificity={"explicit": got["explicit"]}) for r in rows]
    (tmp_path / "x").mkdir()
    assert specificity_table(one_level) == "" and "specificity_curve.png" not in [p.name for p in plots(one_level, tmp_path / "x")]


def test_report_labels_keep_rows_of_one_profile_with_different_bundles_or_options_apart():
    from eval.report import label

    base = {"method": "arbormem", "runtime": "tuned"}
    assert label(dict(base, runtime_settings=["runtime.reranker.bundle.path=outputs/bundles/reranker_mixed",
                                              "runtime.tagger.bundle.path=outputs/bundles/tagger",
                                              "runtime.extractors.summary=heuristic"])) \
        == "arbormem (tuned; reranker=reranker_mixed, tagger=tagger; summary=heuristic)"
    # rows that differ only in an option (links on and off) stay apart too
    assert label({"method": "arbormem", "runtime": "heuristic",
                  "runtime_settings": ["runtime.localization.secondary.min_score=0.2"]}) == "arbormem (min_score=0.2)"
    assert label(dict(base, runtime_settings=["runtime.reranker.bundle.path=outputs/bundles/reranker"])) \
        == "arbormem (tuned; reranker=reranker)"
    assert label({"method": "bm25", "runtime": "heuristic", "runtime_settings": []}) == "bm25"
    assert label({"method": "arbormem", "runtime": "heuristic",
                  "runtime_settings": ["runtime.extractors.facts.path=outputs/x/bundle"]}) == "arbormem (extractors.facts=bundle)"
    assert label({"method": "arbormem", "runtime": "tuned_every_kind/cross_session"}) \
        == "arbormem (tuned_every_kind/cross_session)"


def test_the_report_shows_irc_link_columns_and_draws_their_bars(tmp_path):
    from PIL import Image

    from eval.report import irc_plot, plots, table

    base = {"benchmark": "irc", "ablation": "full", "budget": 2048, "messages": 2500, "run": "r"}
    rows = [dict(base, method="previous_message", link_precision=30.84, link_recall=29.57, link_f1=30.19,
                 one_minus_vi=52.11, one_to_one=23.92, exact_f1=0.0),
            dict(base, method="arbormem", runtime="tuned/group_chat_wide", link_precision=71.88,
                 link_recall=68.93, link_f1=70.37, one_minus_vi=88.86, one_to_one=79.48, exact_f1=34.45,
                 runtime_settings=["runtime.reranker.bundle.path=outputs/bundles/reranker_irc_replay"])]
    head, _, *lines = table(rows).splitlines()
    cols = [c.strip() for c in head.strip("|").split("|")]
    assert {"link_precision", "link_recall", "link_f1", "one_minus_vi", "one_to_one", "exact_f1"} <= set(cols)
    cells = [dict(zip(cols, (c.strip() for c in ln.strip("|").split("|")))) for ln in lines]
    by_method = {c["method"]: c for c in cells}
    assert (by_method["arbormem"]["link_f1"], by_method["arbormem"]["one_to_one"]) == ("70.37", "79.48")
    assert by_method["previous_message"]["link_f1"] == "30.19"
    # a BranchMemEval row has none of them, so its table gains no columns
    assert "link_f1" not in table([{"benchmark": "branchmem", "method": "bm25", "budget": 512, "gold_in_context": 0.5,
                                     "run": "r"}])
    png = irc_plot(rows, tmp_path)
    assert png == tmp_path / "irc_bars.png" and png in plots(rows, tmp_path)
    with Image.open(png) as im:
        assert im.width > 400 and im.height > 200
    assert irc_plot([{"benchmark": "branchmem", "method": "bm25"}], tmp_path / "none") is None
