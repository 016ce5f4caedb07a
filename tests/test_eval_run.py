"""The BranchMemEval replay harness: protocol, methods under one budget, answer-independent metrics."""

import json

import pytest
from hydra import compose, initialize_config_dir

from arbor_train.paths import CONF_DIR
from eval.run import run


def ecfg(data, run_dir, *o):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="eval", overrides=[f"data_dir={data}", f"run_dir={run_dir}", "wandb.enabled=false",
                                                      *o])


@pytest.mark.parametrize("method", ["arbormem", "full_context", "bm25", "dense", "fact_store"])
def test_every_method_replays_under_the_budget(smoke_data, tmp_path, method):
    res = run(ecfg(smoke_data, tmp_path, f"method={method}", "budget=512"))
    qs = [json.loads(l) for l in (tmp_path / "questions.jsonl").open()]
    sessions = [json.loads(l) for l in (smoke_data / "jsonl" / "sessions.jsonl").open()]
    assert res["questions"] == len(qs) == sum(len(s["questions"]) for s in sessions)
    assert all(q["context_tokens"] <= 512 for q in qs)
    assert 0 <= res["gold_in_context"] <= 1 and 0 <= res["confounder_in_context"] <= 1
    if method == "arbormem":
        assert 0 < res["state_localization_every_turn"] <= 1 and res["state_localization_at_questions"] is not None
    else:
        assert res["state_localization_at_questions"] is None
    assert json.loads((tmp_path / "results.json").read_text())["results"]["method"] == method


def test_ablation_removes_the_forest(smoke_data, tmp_path):
    full = run(ecfg(smoke_data, tmp_path / "a"))
    linear = run(ecfg(smoke_data, tmp_path / "b", "ablation=state_localization"))
    assert set(linear["routes"]) == {"linear", "empty"}
    assert full["state_localization_every_turn"] > linear["state_localization_every_turn"]


@pytest.mark.parametrize("overrides, msg", [
    (["benchmark=bfcl"], "benchmark='bfcl' is unknown"),
    (["method=magic"], "option method"),
    (["budget=10"], "smaller than the fixed prompt"),
])
def test_bad_options_fail_before_work(smoke_data, tmp_path, overrides, msg):
    with pytest.raises(ValueError, match=msg):
        run(ecfg(smoke_data, tmp_path, *overrides))


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


def test_locomo_protocol_builds_memory_once_and_reads_evidence(smoke_data, tmp_path):
    from arbor_train.paths import REPO_ROOT

    locomo = REPO_ROOT.parent / "shared" / "data" / "locomo"
    if not locomo.exists():
        pytest.skip("../shared/data/locomo is not beside the repository")
    res = run(ecfg(smoke_data, tmp_path, "benchmark=locomo", f"locomo.input={locomo}", "max_sessions=1", "method=bm25"))
    qs = [json.loads(l) for l in (tmp_path / "questions.jsonl").open()]
    assert res["sessions"] == 1 and res["questions"] == len(qs) == 152  # conversation 26: 199 questions, 47 of category 5
    assert {q["category"] for q in qs} == {"1", "2", "3", "4"}
    assert 0 < res["evidence_recall"] <= 1 and all(q["context_tokens"] <= 2048 for q in qs)


def test_results_are_logged_to_an_offline_wandb_run(smoke_data, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    run(ecfg(smoke_data, tmp_path, "wandb.enabled=true", "max_sessions=1"))
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].rglob("*.wandb"))


class FakeChat:
    """A deterministic stand-in for an LLM backend: answers the last line's question from the context."""

    name = "fake"

    def __init__(self, reply):
        self.reply = reply

    def chat(self, conversations, max_new_tokens=32):
        return [self.reply(c) for c in conversations]


def test_longmemeval_protocol_with_a_pluggable_judge(smoke_data, tmp_path, monkeypatch):
    from arbor_train.paths import REPO_ROOT
    import eval.judge as J
    import eval.run as R

    fixture = REPO_ROOT / "tests" / "fixtures" / "benchmarks" / "longmemeval_s_tiny.json"
    res = run(ecfg(smoke_data, tmp_path / "a", "benchmark=longmemeval", f"longmemeval.input={fixture}", "method=bm25"))
    assert res["questions"] == 3 and res["turn_recall_any"] is not None and 0 <= res["session_recall_all"] <= 1
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
    from arbor_train.paths import REPO_ROOT
    import eval.judge as J
    import eval.run as R

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
    from eval.scoring import kendall_tau_order

    ref = ["a1", "b2", "c3"]
    assert kendall_tau_order("a1 then b2 then c3", ref) == 1.0
    assert kendall_tau_order("c3, b2, a1", ref) == 0.0
    # a1 before c3 before b2: pairs (a1,b2)+ (a1,c3)+ (b2,c3)- -> tau = 1/3 -> (1/3 + 1) / 2 = 2/3
    assert abs(kendall_tau_order("a1 c3 b2", ref) - 2 / 3) < 1e-9


def test_compare_prints_one_table_per_set(smoke_data, tmp_path):
    from eval.compare import compare

    res = compare("ablations", [f"data_dir={smoke_data}", "wandb.enabled=false"], tmp_path / "abl")
    assert len(res["rows"]) == 6 and res["table"].count("| branchmem |") == 6
    assert (tmp_path / "abl" / "ablation_bars.png").exists()
    with pytest.raises(ValueError, match="compare set"):
        compare("everything", [], tmp_path / "x")


def test_locomo_f1_and_optional_judge_with_an_answer_model(smoke_data, tmp_path, monkeypatch):
    from arbor_train.paths import REPO_ROOT
    import eval.judge as J
    import eval.run as R

    locomo = REPO_ROOT.parent / "shared" / "data" / "locomo"
    if not locomo.exists():
        pytest.skip("../shared/data/locomo is not beside the repository")
    monkeypatch.setattr(R, "build_answer_model", lambda cfg: FakeChat(lambda c: "not mentioned"))
    monkeypatch.setattr(J, "build_judge", lambda cfg: J.Judge(FakeChat(lambda c: "no")))
    res = run(ecfg(smoke_data, tmp_path, "benchmark=locomo", f"locomo.input={locomo}", "max_sessions=1", "method=bm25",
                   "locomo.categories=[4]"))
    assert res["questions"] == 70 and res["judge_accuracy"] == 0.0 and 0.0 <= res["f1"] < 0.2
