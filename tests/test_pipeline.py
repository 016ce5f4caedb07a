"""The main job end to end on tiny models: every stage runs, the report is built from what they wrote,
a rerun skips everything, and a changed option reruns only the stages downstream of it."""

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from arbor_train.paths import CONF_DIR
from eval.pipeline import StageError, plan, run_pipeline

TINY = [
    "echo=false", "wandb.enabled=false",
    "data.formal.preset=smoke", "data.train.preset=smoke", "data.heldout.preset=smoke", "data.workers=1",
    'train.reranker.overrides=["model=tiny_encoder","trainer.max_steps=4","logger=csv"]',
    'train.tagger.overrides=["model=tiny_encoder","trainer.max_steps=4","logger=csv"]',
    'train.extractor.overrides=["model=tiny_decoder","trainer.max_steps=2","task.gen_examples=2","logger=csv"]',
    'train.reader.overrides=["model=tiny_decoder","trainer.max_steps=2","task.gen_examples=2","task.max_length=1000",'
    '"task.pack_length=1000","task.max_new_tokens=4","logger=csv"]',
    "reader_data.budgets=[256]", "data.train.seed=3",  # smoke formal and train sets of one seed are the same sessions
    "eval.sets=[methods]", "eval.answer_model=none", "eval.answer_overrides=[]",
]


def pcfg(out, *extra):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="pipeline", overrides=[f"out={out}", *TINY, *extra])


def test_plan_names_every_stage_with_absolute_paths(tmp_path):
    from omegaconf import OmegaConf

    stages = plan(OmegaConf.to_container(pcfg(tmp_path / "p"), resolve=True))
    names = [s.name for s in stages]
    assert names[:3] == ["data_formal", "data_train", "data_heldout"] and names[-1] == "report"
    assert {"train_reranker", "train_tagger", "train_extractor", "export_extractor", "eval_methods", "eval_full_heuristic",
            *(f"eval_answer_{r}" for r in ("runtime", "heuristic", "bm25", "dense", "untuned"))} <= set(names)
    tuned = next(s for s in stages if s.name == "eval_answer_runtime")
    assert f"runtime.reranker.bundle.path={tmp_path / 'p' / 'bundles' / 'reranker'}" in tuned.command()
    assert "runtime/components=tuned_all" in tuned.command() and "runtime.extractors.states=heuristic" in tuned.command()
    assert set(tuned.deps) >= {"export_reranker", "export_tagger", "export_reader"}
    # every headline row but the untuned one answers with the tuned reader; all read the same budget
    for row in ("runtime", "heuristic", "bm25", "dense"):
        cmd = next(s for s in stages if s.name == f"eval_answer_{row}").command()
        assert f"answer_model.llm.path={tmp_path / 'p' / 'bundles' / 'reader'}" in cmd and "budget=1024" in cmd
    untuned = next(s for s in stages if s.name == "eval_answer_untuned")
    assert "answer_model=none" in untuned.command() and "export_reader" not in untuned.deps
    # the reader trains on contexts the runtime assembles over the training sessions, never the formal ones
    rd = next(s for s in stages if s.name == "data_reader_train")
    assert f"data_dir={tmp_path / 'p' / 'data_train'}" in rd.command() and str(tmp_path / "p" / "data_formal") in rd.command()
    dense = next(s for s in stages if s.name == "eval_answer_dense")
    assert "method=dense" in dense.command() and "runtime/components=minilm" in dense.command()


@pytest.mark.slow  # the whole loop on tiny models: 5-6 minutes on 2 cores
def test_pipeline_runs_then_skips_then_reruns_only_downstream(tmp_path):
    out = tmp_path / "p"
    first = run_pipeline(pcfg(out))
    assert not any(s["skipped"] for s in first["stages"])
    report = (out / "report" / "report.md").read_text()
    summary = json.loads((out / "report" / "summary.json").read_text())
    # the whole-set row covers every question of the formal set, as its stage's results.json says
    n_q = sum(len(json.loads(l)["questions"]) for l in (out / "data_formal" / "jsonl" / "sessions.jsonl").open())
    heuristic = json.loads((out / "eval_full_heuristic" / "results.json").read_text())["results"]
    assert summary["routing"]["heuristic"]["questions"] == heuristic["questions"] == n_q > 0
    # the headline: every question answered by each row with the (tiny) tuned reader, paired against the first
    rows = {r["row"]: r for r in summary["headline"]}
    assert set(rows) == {"runtime", "heuristic", "bm25", "dense"}  # answer_model=none: no untuned answers
    assert all(r["questions"] == n_q for r in rows.values())
    for r in ("heuristic", "bm25", "dense"):
        lo, hi = rows[r]["diff_ci"]
        assert lo <= rows[r]["difference"] <= hi and rows[r]["vs"] == "runtime"
        assert rows[r]["ref_only"] + rows[r]["row_only"] <= n_q
    assert "Headline: every question of the formal set" in report and "eval.compare methods" in report
    from PIL import Image

    headline = out / "report" / "headline.png"
    assert headline.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(headline) as im:
        im.load()
        assert im.width > 100 and im.height > 100
    # each exported bundle loads for its role, with the kind of its model family and its training run's facts
    from arbor_train.runtime import load_bundle

    kinds = {"reranker": "cross_encoder", "tagger": "encoder_multilabel", "extractor": "causal_lm", "reader": "causal_lm"}
    for role, kind in kinds.items():
        b = load_bundle(out / "bundles" / role, role=role)
        trained = json.loads((out / f"train_{role}" / "run" / "final" / "metrics.json").read_text())
        assert b.kind == kind, role
        assert b.manifest["data_fingerprint"] == trained["data_fingerprint"], role
        assert b.manifest["metrics"] == trained["metrics"], role
    # every number in the report is backed by a stage command recorded next to its outputs
    st = json.loads((out / "train_reranker" / "stage.json").read_text())
    assert st["returncode"] == 0 and "experiment=reranker_minilm_cpu" in st["command"] and st["command"] in report

    again = run_pipeline(pcfg(out))
    assert all(s["skipped"] for s in again["stages"])

    answers = {f"eval_answer_{r}" for r in ("runtime", "heuristic", "bm25", "dense", "untuned")}
    changed = run_pipeline(pcfg(out, "eval.budget=512"))
    ran = {s["stage"] for s in changed["stages"] if not s["skipped"]}
    assert ran == {"eval_methods", "eval_full_heuristic", *answers, "report"}
    assert json.loads((out / "eval_full_heuristic" / "results.json").read_text())["results"]["budget"] == 512

    redone = run_pipeline(pcfg(out, "eval.budget=512", "force=[export_tagger]"))   # a redone stage makes its users stale
    assert {s["stage"] for s in redone["stages"] if not s["skipped"]} == {
        "export_tagger", "eval_answer_runtime", "eval_answer_untuned", "report"}

    # another learning rate: the old run's checkpoints are cleared, not resumed (resume would refuse them)
    lr = run_pipeline(pcfg(out, "eval.budget=512",
                           'train.tagger.overrides=["model=tiny_encoder","trainer.max_steps=4","logger=csv","optim.lr=1e-3"]'))
    assert {s["stage"] for s in lr["stages"] if not s["skipped"]} == {
        "train_tagger", "export_tagger", "eval_answer_runtime", "eval_answer_untuned", "report"}
    assert json.loads((out / "train_tagger" / "run" / "final" / "metrics.json").read_text())["resumed_from"] is None


def test_bad_stage_names_and_failures_are_reported_and_keep_finished_stages(tmp_path):
    out = tmp_path / "p"
    with pytest.raises(StageError, match=r"force=\[.train_nothing.\]: unknown stage"):
        run_pipeline(pcfg(out, "force=[train_nothing]"))
    with pytest.raises(StageError, match=r"stage data_formal failed .*logs/data_formal.log"):
        run_pipeline(pcfg(out, "data.formal.preset=no_such_preset"))
    assert json.loads((out / "data_formal" / "stage.json").read_text())["returncode"] != 0
    assert Path(out / "logs" / "data_formal.log").read_text().strip()


@pytest.mark.parametrize("extra, msg", [
    (["echo=maybe"], "option echo must be true or false"),
    (["data.workers=0"], "option data.workers must be at least 1"),
    (["eval.budget=lots"], "option eval.budget must be an integer"),
    (["eval.headline=[runtime,oracle]"], r"option eval.headline\[1\] must be one of runtime, heuristic, bm25, dense, untuned"),
    (["eval.sets=[bogus]"], r"option eval.sets\[0\] must be one of ablations, budgets, methods"),
    (["eval.answer_model=gpt9"], "option eval.answer_model must be one of bundle, none, openai, smollm2"),
    (["train.tagger.experiment=nope"], "option train.tagger.experiment must be one of"),
    (['train.tagger.overrides=["no_such_group=x"]'], r"option train.tagger \(experiment=tagger_minilm_cpu"),
])
def test_bad_options_are_config_errors_before_any_stage(tmp_path, extra, msg):
    from arbor_train.errors import ConfigError

    out = tmp_path / "p"
    with pytest.raises(ConfigError, match=msg):
        run_pipeline(pcfg(out, *extra))
    assert not out.exists()


def test_a_stage_that_refuses_its_options_is_a_user_error_and_a_crash_is_not(tmp_path, monkeypatch):
    import sys

    import eval.pipeline as P
    from arbor_train.errors import UserError

    for rc, user in ((2, True), (1, False)):
        stage = P.Stage(f"exit{rc}", [sys.executable, "-c", f"import sys; print('error: option x'); sys.exit({rc})"])
        monkeypatch.setattr(P, "plan", lambda c, stage=stage: [stage])
        with pytest.raises(StageError, match=rf"stage exit{rc} failed \(exit {rc}\)") as e:
            run_pipeline(pcfg(tmp_path / "p"))
        assert isinstance(e.value, UserError) is user
