"""The front door and the docs: the README stays short and leads to the three tasks, every link and picture
resolves, every published table equals the file its config generated, every table config runs at smoke
size, and every tutorial command runs at smoke size (slow tier)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from arbor_train.paths import CONF_DIR, REPO_ROOT

DOCS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]
GENERATED = REPO_ROOT / "docs" / "results" / "generated"
TABLE_BLOCK = re.compile(r"<!-- table: (\w+) -->\n(.*?)<!-- /table -->", re.S)


def table_names() -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / "table").glob("*.yaml"))


def test_the_readme_is_a_short_front_door():
    lines = (REPO_ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 300, len(lines)
    first = "\n".join(lines[:100])
    # the three tasks, each with the command that does it, within the first 100 lines
    assert "python -m eval.pipeline" in first
    assert "python -m data_gen.conversations input=" in first and "experiment=reranker_minilm_conversations_cpu" in first
    assert "ArborMemory.open(" in first and "runtime.reranker.bundle.path=" in first
    assert "python -m eval.compare table=" in first


def test_every_link_and_picture_in_the_docs_resolves():
    from PIL import Image

    missing = []
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text()):
            if re.match(r"[a-z]+://", target):
                continue
            p = (doc.parent / target).resolve()
            if not p.exists():
                missing.append(f"{doc.relative_to(REPO_ROOT)} -> {target}")
            elif p.suffix == ".png":
                with Image.open(p) as im:
                    im.load()
                    assert im.width > 100 and im.height > 100, target
    assert not missing, missing


def test_every_docs_table_equals_its_generated_file():
    seen = set()
    for doc in DOCS:
        for name, body in TABLE_BLOCK.findall(doc.read_text()):
            gen = GENERATED / name / "table.md"
            assert gen.exists(), f"{doc.relative_to(REPO_ROOT)} includes table {name}, never generated"
            assert body.strip() == gen.read_text().strip(), (
                f"{doc.relative_to(REPO_ROOT)}: table {name} differs from {gen.relative_to(REPO_ROOT)} "
                f"(rerun python -m eval.compare table={name} and copy its table.md)")
            seen.add(name)
    assert seen, "no docs page includes a generated table"


@pytest.mark.parametrize("name", table_names())
def test_every_table_config_was_generated_by_its_command_and_shown_on_its_page(name):
    from eval.tables import load

    t = load(name)
    meta = json.loads((GENERATED / name / "meta.json").read_text())
    assert meta["command"] == f"python -m eval.compare table={name}" and meta["table"] == name
    assert meta["wall_s"] > 0 and meta["commit"] and meta["versions"]["torch"]
    page = (REPO_ROOT / t["page"]).read_text()
    assert f"<!-- table: {name} -->" in page, f"{t['page']} does not include table {name}"


def test_a_table_refuses_to_start_without_its_inputs_and_names_the_commands(tmp_path):
    from arbor_train.errors import MissingInputError, UserError
    from eval.tables import run_table

    with pytest.raises(MissingInputError, match=r"table=formal_methods needs outputs/data/branchmem_formal_seed0; "
                                                 r"make it with: python -m data_gen.branchmem preset=formal seed=0"):
        cwd = os.getcwd()
        os.chdir(tmp_path)  # a fresh folder: the table's input is not there
        try:
            run_table("formal_methods", [], tmp_path / "t")
        finally:
            os.chdir(cwd)
    with pytest.raises(UserError, match=r"option table='nope': no conf/table/nope.yaml \(tables: "):
        run_table("nope", [], tmp_path / "n")


# how each table config is run at smoke size by this suite (a new table config must join one of these)
EVAL_TABLES = ("formal_methods", "formal_ablations", "policies_formal", "policies_locomo")
MODULE_TABLES = ("forgetting", "scale", "bench_runtime", "locomo_card", "bench_train")
BUNDLE_TABLES = ("specificity", "irc_dev", "formal_tuned", "specificity_margin", "specificity_answers",
                 "formal_locomo_router", "multi_intent_threshold", "multi_intent_answers", "multi_intent_linked",
                 "irc_tuned", "irc_router_formal", "distill_irc")
OWN_TESTS = {"main_job": "tests/test_pipeline.py", "locomo_cv": "tests/test_locomo_cv.py",
             "own_conversations": "test_every_tutorial_command_runs_at_smoke_size",
             "reader": "test_the_reader_tables_run_at_smoke_size_on_a_tiny_reader",
             "multi_intent_answers_reader": "test_the_reader_tables_run_at_smoke_size_on_a_tiny_reader",
             "multi_intent_linked_reader": "test_the_reader_tables_run_at_smoke_size_on_a_tiny_reader",
             "bench_extract": "tests/test_extract_levers.py", "bench_tuned_runtime": "tests/test_ingest_ahead.py", "distill_student": "tests/test_distill.py",
             "distill_locomo": "test_the_distill_locomo_table_runs_at_smoke_size",
             "locomo_answers": "test_the_locomo_answers_table_runs_at_smoke_size"}
SLOW_TABLES = ("policies_locomo", "irc_dev", "specificity", "specificity_answers", "multi_intent_answers",
               "multi_intent_linked", "bench_train", "irc_tuned", "distill_irc")


def test_every_table_config_runs_at_smoke_size_somewhere_in_the_suite():
    assert sorted(table_names()) == sorted([*EVAL_TABLES, *MODULE_TABLES, *BUNDLE_TABLES, *OWN_TESTS])


def test_the_reproduce_tutorial_lists_every_table_config():
    text = (REPO_ROOT / "docs" / "tutorials" / "reproduce_a_table.md").read_text()
    listed = re.findall(r"^\| `(\w+)` \|", text, re.M)
    assert sorted(listed) == sorted(table_names())


def smoke_params(names):
    return [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_TABLES else n for n in table_names() if n in names]


SMOKE_TABLES = smoke_params(EVAL_TABLES)


@pytest.mark.parametrize("name", SMOKE_TABLES)
def test_every_eval_table_runs_at_smoke_size(name, smoke_data, tmp_path):
    """The table's own rows at smoke size (BranchMemEval tables on the smoke set, one session; LoCoMo on one
    conversation): the table, results, meta and plots go to --out, never to the published folder."""
    from eval.tables import load, run_table

    t = load(name)
    before = (GENERATED / name / "table.md").read_text()
    extra = [f"data_dir={smoke_data}"] if "benchmark=branchmem" in t["common"] else []
    res = run_table(name, [*t["smoke"], *extra], tmp_path / name)
    table = (tmp_path / name / "table.md").read_text()
    assert len(res["rows"]) == len(t["rows"]) * len(t["budgets"])
    labels = [line.split("|")[1].strip() for line in table.splitlines()[2:]]
    assert labels == [r for r in t["rows"] for _ in t["budgets"]]
    meta = json.loads((tmp_path / name / "meta.json").read_text())
    assert shlex.split(meta["command"]) == ["python", "-m", "eval.compare", f"table={name}", *t["smoke"], *extra]
    assert (GENERATED / name / "table.md").read_text() == before


@pytest.mark.parametrize("name", smoke_params(MODULE_TABLES))
def test_every_module_table_runs_at_smoke_size(name, smoke_data, tmp_path):
    """A table made by one run of another entry point (eval.forgetting, eval.bench), at smoke size: its rows
    come from that run's result, and the published folder is left alone."""
    from eval.tables import load, run_table

    t = load(name)
    before = (GENERATED / name / "table.md").read_text()
    extra = [f"data_dir={smoke_data}"] if any(c.startswith("data_dir=") for c in t["common"]) else []
    extra += [f"{n['option']}={smoke_data}" for n in t["needs"] if n.get("option", "").endswith(".data_dir")]
    res = run_table(name, [*t["smoke"], *extra], tmp_path / name)
    published = [line.split("|")[1].strip() for line in before.splitlines()[2:]]
    assert [r["row"] for r in res["rows"]] == published  # the same rows as the published run
    cells = [v for r in res["rows"] for _, k in t["columns"] if k in r
             for v in (r[k] if isinstance(r[k], list) else [r[k]])]  # a cell may hold several values
    assert any(isinstance(v, (int, float)) for v in cells)
    assert (GENERATED / name / "table.md").read_text() == before


@pytest.mark.parametrize("name", smoke_params(BUNDLE_TABLES))
def test_every_bundle_table_runs_at_smoke_size_on_a_tiny_router(name, smoke_data, tmp_path):
    """Tables whose rows need a trained router run on a 2-step tiny one (the need is met by the override of
    runtime.reranker.bundle.path), one session or file each."""
    from test_train import tcfg

    from arbor_train.export import export
    from arbor_train.train import train
    from eval.tables import load, run_table

    res = train(tcfg(tmp_path / "run", smoke_data, "trainer.max_steps=2"))
    bundle = export(res["run_dir"], tmp_path / "bundle", log_artifact=False, merged=True)
    t = load(name)
    extra = [f"data_dir={smoke_data}"] if any(c.startswith("data_dir=") for c in t["common"]) else []
    out = run_table(name, [*t["smoke"], *extra, f"runtime.reranker.bundle.path={bundle}"], tmp_path / name)
    assert [r["row"] for r in out["rows"]] == [r for r in t["rows"] for _ in t["budgets"]]


READER_TABLES = ("reader", "multi_intent_answers_reader", "multi_intent_linked_reader")


@pytest.mark.slow
def test_the_reader_tables_run_at_smoke_size_on_a_tiny_reader(smoke_data, tmp_path, monkeypatch):
    """Each table whose rows answer with a tuned reader, at smoke size, in a scratch folder whose reader bundle
    (the table's need under outputs/bundles/) is a 2-step tiny reader trained on another smoke set, and whose
    router need, if any, is met by a 2-step tiny router; the untuned rows read with SmolLM2, one session each."""
    from omegaconf import OmegaConf
    from test_reader import READER, cfg, reader_set
    from test_train import tcfg

    from arbor_train.export import export
    from arbor_train.train import train
    from data_gen.branchmem.__main__ import run as generate
    from eval.tables import load, run_table

    other = tmp_path / "smoke_seed1"
    generate(cfg("data_gen", "preset=smoke", "seed=1", f"out_dir={other}", "progress=false", "workers=1"))
    reader_set(other, tmp_path / "tr")
    reader_set(other, tmp_path / "va")
    res = train(OmegaConf.to_container(cfg("train", *READER, "logger=csv", "trainer=cpu", "trainer.max_steps=2",
                                           "trainer.enable_progress_bar=false", "task.compare_baselines=false",
                                           f"data.train_dir={tmp_path / 'tr'}", f"data.val_dir={tmp_path / 'va'}",
                                           f"run_dir={tmp_path / 'run'}"), resolve=True))
    router = train(tcfg(tmp_path / "router_run", smoke_data, "trainer.max_steps=2"))
    router = export(router["run_dir"], tmp_path / "router", log_artifact=False, merged=True)
    monkeypatch.chdir(tmp_path)  # the rows name outputs/bundles/<reader>, relative to where the table runs
    for name in READER_TABLES:
        t = load(name)
        readers = [n["path"] for n in t["needs"] if n["path"].startswith("outputs/bundles/reader")]
        assert len(readers) == 1, name
        if not (tmp_path / readers[0]).exists():  # two tables may share a reader
            export(res["run_dir"], tmp_path / readers[0], log_artifact=False)
        router_need = any(n.get("option") == "runtime.reranker.bundle.path" for n in t["needs"])
        out = run_table(name, [*t["smoke"], f"data_dir={smoke_data}",
                               *([f"runtime.reranker.bundle.path={router}"] if router_need else [])],
                        tmp_path / "tables" / name)
        assert [r["row"] for r in out["rows"]] == list(t["rows"]), name
        answered = [r for r in out["rows"] if r.get("questions")]
        assert all(isinstance(r["accuracy"], float) for r in answered), name
        # the smoke set asks no linked_fact question: a table of those alone reads none
        assert answered or "branchmem.question_types=[linked_fact]" in t["common"], name


# ---------------------------------------------------------------------- tutorials at smoke size
TUTORIALS = ["own_conversations", "plug_a_bundle", "reproduce_a_table", "add_a_benchmark", "add_a_read_layer",
             "add_a_role"]
SMOKE = {  # appended to a tutorial's command by module, so it runs in seconds
    "arbor_train.train": ["trainer.max_steps=2", "data.max_val_examples=16", "task.compare_baselines=false",
                          "logger=csv"],
    "eval.compare": ["max_sessions=1"],
    "eval.run": ["max_sessions=1"],
}


def blocks(name: str, lang: str) -> list[str]:
    text = (REPO_ROOT / "docs" / "tutorials" / f"{name}.md").read_text()
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


def smoke_command(line: str, tmp: Path) -> list[str]:
    argv = shlex.split(line, comments=True)  # as bash reads it: a trailing # comment is not an argument
    assert argv[:2] == ["python", "-m"], line
    module = argv[2]
    extra = list(SMOKE.get(module, []))
    if module == "eval.compare" and argv[3].startswith("table="):
        extra += ["--out", str(tmp / "tables" / argv[3].split("=", 1)[1])]
    if module == "eval.compare" and argv[3] == "grid":
        extra = [e for e in extra if e != "max_sessions=1"]  # a conversations grid reads held-out conversations whole
    return [sys.executable, *argv[1:], *extra]


@pytest.mark.slow
def test_every_tutorial_command_runs_at_smoke_size(tmp_path):
    """Each tutorial's bash and python blocks, in order, in a scratch folder that sees the repository's docs
    and conf: outputs/ lands in the scratch folder. Training is cut to 2 steps."""
    (tmp_path / "docs").symlink_to(REPO_ROOT / "docs")
    env = dict(os.environ, WANDB_MODE="offline", ARBOR_OUTPUT_ROOT=str(tmp_path / "outputs"))
    ran = []
    for name in TUTORIALS:
        for block in blocks(name, "bash"):
            for line in block.strip().splitlines():
                if not line.strip() or line.startswith("#"):
                    continue
                cmd = smoke_command(line, tmp_path)
                p = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
                assert p.returncode == 0, f"{name}: {line}\n{p.stderr[-3000:]}"
                ran.append(line)
        for code in blocks(name, "python"):
            p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                               timeout=600)
            assert p.returncode == 0, f"{name}: python block\n{p.stderr[-3000:]}"
            ran.append(code)
    assert (tmp_path / "outputs" / "bundles" / "my_router" / "manifest.json").exists()
    assert (tmp_path / "outputs" / "memory" / "demo.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(ran) >= 10
    # the tutorial's table config runs on the bundle the tutorial made (smoke size: its 2-step router)
    out = tmp_path / "tables" / "own_conversations"
    p = subprocess.run([sys.executable, "-m", "eval.compare", "table=own_conversations", "--out", str(out)],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = json.loads((out / "results.json").read_text())
    assert [r["row"] for r in rows] == ["tuned router (my_router)", "heuristic router", "previous turn"]
    assert all(r["messages"] == rows[0]["messages"] > 0 for r in rows)


def pipeline_commands() -> list[list[str]]:
    """The main-job commands of the first-run tutorial (bash and text blocks), as override lists."""
    text = (REPO_ROOT / "docs" / "tutorials" / "first_run.md").read_text()
    out = []
    for block in re.findall(r"```(?:bash|text)\n(.*?)```", text, re.S):
        for cmd in block.replace("\\\n", " ").splitlines():
            argv = shlex.split(cmd, comments=True)
            if argv[:3] == ["python", "-m", "eval.pipeline"]:
                out.append(argv[3:])
    return out


def test_every_main_job_command_of_the_tutorial_plans(tmp_path):
    """Each command composes and plans its stages (the default one runs end to end on tiny models in
    tests/test_pipeline.py; these change options of it, and one needs a GPU cluster)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from eval.pipeline import check_options, plan

    cmds = pipeline_commands()
    assert len(cmds) >= 7 and [] in cmds
    for argv in cmds:
        argv = [a for a in argv if not a.startswith("out=")] + [f"out={tmp_path / 'p'}"]
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            c = OmegaConf.to_container(compose(config_name="pipeline", overrides=argv), resolve=True)
        check_options(c)
        stages = {s.name: s for s in plan(c)}
        assert "report" in stages, argv
        if any("launcher=" in a for a in argv):
            assert stages["train_extractor"].argv[0] == "sbatch" and "slurm/train.sbatch" in stages["train_extractor"].argv
            assert "experiment=extractor_qwen3_30b_a3b_fsdp" in stages["train_extractor"].command()
        if "eval.budget=512" in argv:
            assert all("budget=512" in s.command() for n, s in stages.items() if n.startswith("eval_answer_"))


def test_the_main_job_ran_within_its_budget_and_its_headline_says_something():
    """The published main job: its stages took under 30 minutes on this 2-core machine, every headline row
    answered the same questions (all of the formal set), and each comparison carries its paired interval."""
    meta = json.loads((GENERATED / "main_job" / "meta.json").read_text())
    assert 0 < meta["pipeline_stages_wall_s"] < 1800
    rows = json.loads((GENERATED / "main_job" / "results.json").read_text())
    assert [r["row"] for r in rows] == ["runtime", "heuristic", "bm25", "dense", "untuned"]
    assert {r["questions"] for r in rows} == {100}
    for r in rows[1:]:
        lo, hi = r["diff_ci"]
        assert lo <= r["difference"] <= hi and 0 <= r["sign_test_p"] <= 1 and r["vs"] == "runtime"
    # the README's reading: the lead over BM25, dense and the untuned reader is real, over the heuristic it is not
    by = {r["row"]: r for r in rows}
    assert all(by[r]["diff_ci"][0] > 0 for r in ("bm25", "dense", "untuned"))
    assert by["heuristic"]["diff_ci"][0] < 0 < by["heuristic"]["diff_ci"][1]


def test_a_resumed_table_keeps_its_finished_stages_and_only_a_staged_table_resumes(tmp_path, monkeypatch):
    """`--resume` keeps the runs folder of an interrupted run (eval.locomo_cv skips the stages whose fingerprint
    matches), records that the run was resumed, and is refused by name for a table whose runs are not stages."""
    import eval.tables as tables

    def module(t, o, runs):  # as eval.locomo_cv: the kept stage skipped (its time when it ran), one stage run
        seen.append((runs / "fold0" / "stage.json").exists())
        runs.mkdir(parents=True, exist_ok=True)
        (runs / "timings.json").write_text(json.dumps({"stages": [{"stage": "router_f0", "wall_s": 0.0, "ran_s": 900.0},
                                                                  {"stage": "eval_f0", "wall_s": 60.5}]}))
        return [], [], "table\n"

    seen = []
    monkeypatch.setattr(tables, "missing_inputs", lambda t, o: [])
    monkeypatch.setattr(tables, "run_module", module)
    for resume in (True, False):
        (tmp_path / "runs" / "fold0").mkdir(parents=True, exist_ok=True)
        (tmp_path / "runs" / "fold0" / "stage.json").write_text("{}")
        res = tables.run_table("locomo_cv", [], tmp_path, resume=resume)
        assert res["meta"].get("resumed", False) is resume
        assert res["meta"].get("stages_wall_s") == (960.5 if resume else None)
    assert seen == [True, False]  # kept when resuming, afresh otherwise
    p = subprocess.run([sys.executable, "-m", "eval.compare", "table=formal_methods", "--resume"],
                       capture_output=True, text=True, cwd=REPO_ROOT)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "option --resume: table=formal_methods cannot resume" in p.stderr and "locomo_cv" in p.stderr
