"""Config composition does what a reader of the YAML expects (an experiment overrides every default),
and the objects named in conf/ (optimizer, scheduler, callbacks, loggers, debug modes) are what trains."""

import shutil
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from arbor_train.paths import CONF_DIR

EXPERIMENTS = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))


def leaves(node, path=()):
    """(path, value) for every non-mapping value of a raw YAML mapping."""
    if isinstance(node, dict) and node:
        for k, v in node.items():
            yield from leaves(v, (*path, str(k)))
    else:
        yield path, node


def lookup(cfg: dict, path: tuple):
    for k in path:
        if not isinstance(cfg, dict) or k not in cfg:
            return "<missing>"
        cfg = cfg[k]
    return cfg


def wanted(conf_dir: Path, name: str) -> dict:
    """path -> value of every key experiment `name` sets: its body, then each group its defaults select
    ("override /model: qwen3_4b") and each experiment it extends, wherever the body does not set the key."""
    raw = OmegaConf.to_container(OmegaConf.load(conf_dir / "experiment" / f"{name}.yaml"), resolve=False)
    defaults = raw.pop("defaults", [])
    want = dict(leaves(raw))
    for d in defaults:
        if d == "_self_":
            continue
        if isinstance(d, str):  # another experiment, extended
            items = wanted(conf_dir, d).items()
        else:
            (key, option), = d.items()
            group = key.split("/")[-1]
            node = OmegaConf.to_container(OmegaConf.load(conf_dir / group / f"{option}.yaml"), resolve=False)
            node.pop("defaults", None)
            items = leaves(node, (group,))
        for path, v in items:
            if not any(path[: len(p)] == p or p[: len(path)] == path for p in want):
                want[path] = v
    return want


def mismatches(conf_dir: Path, name: str) -> list[str]:
    """Every key the experiment file sets (`wanted`) whose composed value differs from the file's. Values
    are compared unresolved: an interpolation must survive as written."""
    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
        composed = OmegaConf.to_container(compose(config_name="train", overrides=[f"experiment={name}"]),
                                          resolve=False)
    return [f"{'.'.join(p)}: {name}.yaml sets {v!r}, composed {lookup(composed, p)!r}"
            for p, v in wanted(conf_dir, name).items() if lookup(composed, p) != v]


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_key_an_experiment_sets_reaches_the_composed_config(name):
    assert mismatches(CONF_DIR, name) == []


def test_the_check_catches_a_primary_config_merged_after_the_experiment(tmp_path):
    """The bug this order fixes: with `_self_` last, train.yaml's own optim block overrode every experiment's
    learning rate (experiment=extractor_smollm2_cpu asked for 1e-3 and trained at 5e-4)."""
    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf)
    text = (conf / "train.yaml").read_text()
    old = text.replace("  - _self_\n", "", 1).replace("  - experiment: null\n", "  - experiment: null\n  - _self_\n")
    (conf / "train.yaml").write_text(old + "optim:\n  lr: 5.0e-4\n")
    found = mismatches(conf, "extractor_smollm2_cpu")
    assert found == ["optim.lr: extractor_smollm2_cpu.yaml sets 0.001, composed 0.0005"]


def test_the_check_follows_an_experiment_that_extends_another(tmp_path):
    """An experiment built on another (`defaults: [reranker_minilm_cpu, _self_]`) must get the parent's keys
    and its own; listing `_self_` first lets the parent override the child, and the check says so."""
    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf)
    body = "optim:\n  lr: 1.0e-3\ntask:\n  pair_features: true\n"
    (conf / "experiment" / "child_ok.yaml").write_text(
        "# @package _global_\ndefaults:\n  - reranker_minilm_cpu\n  - _self_\n" + body)
    (conf / "experiment" / "child_bad.yaml").write_text(
        "# @package _global_\ndefaults:\n  - _self_\n  - reranker_minilm_cpu\n" + body)
    assert mismatches(conf, "child_ok") == []
    assert wanted(conf, "child_ok")[("trainer", "max_steps")] == 400  # the parent's key is checked too
    assert mismatches(conf, "child_bad") == ["optim.lr: child_bad.yaml sets 0.001, composed 0.0005"]


def tiny(tmp_path, smoke_data, *overrides) -> dict:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[
            "model=tiny_encoder", "logger=csv", f"data.train_dir={smoke_data}", f"run_dir={tmp_path / 'run'}",
            "trainer.enable_progress_bar=false", "trainer.max_steps=4", "task.compare_baselines=false", *overrides])
    return OmegaConf.to_container(cfg, resolve=True)


def fitted(c: dict):
    """The module and trainer of a short run built exactly as train() builds them."""
    from arbor_train import roles
    from arbor_train.train import build_trainer

    built = roles.get(c["task"]["role"]).build(c)
    trainer = build_trainer(c)
    trainer.fit(built.module, built.train_loader)
    return built.module, trainer


def test_optimizer_scheduler_and_callbacks_are_swapped_in_yaml_alone(tmp_path, smoke_data):
    _, trainer = fitted(tiny(tmp_path / "a", smoke_data, "optim=sgd", "optim.lr=0.05", "~scheduler",
                             "+callbacks.early_stop._target_=lightning.pytorch.callbacks.EarlyStopping",
                             "+callbacks.early_stop.monitor=train/loss", "~logger"))
    opt = trainer.optimizers[0]
    assert type(opt) is torch.optim.SGD and opt.defaults["momentum"] == 0.9
    assert opt.param_groups[0]["lr"] == 0.05 and not trainer.lr_scheduler_configs   # constant: no schedule
    assert any(type(cb).__name__ == "EarlyStopping" for cb in trainer.callbacks) and not trainer.loggers
    _, trainer = fitted(tiny(tmp_path / "b", smoke_data, "scheduler=cosine_warmup", "trainer.max_steps=10"))
    assert type(trainer.optimizers[0]) is torch.optim.AdamW
    sched = trainer.lr_scheduler_configs[0]
    assert sched.interval == "step" and sched.scheduler.last_epoch == 10
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.0, abs=1e-9)   # cosine reached 0 at the end


def test_a_wrong_optimizer_option_names_the_option(tmp_path, smoke_data):
    from arbor_train.train import ConfigError

    with pytest.raises(ConfigError, match="option optim"):
        fitted(tiny(tmp_path, smoke_data, "+optim.no_such_argument=1"))


def test_debug_fast_dev_run_and_overfit(tmp_path, smoke_data):
    from arbor_train.train import train

    res = train(tiny(tmp_path / "fast", smoke_data, "debug=fast_dev_run"))
    assert res["global_step"] == 1 and not list((tmp_path / "fast" / "run").rglob("*.ckpt"))
    # a random tiny encoder learns slowly under LoRA: overfit it in full, on the simplest head (tags)
    c = tiny(tmp_path / "over", smoke_data, "debug=overfit", "task=tagger", "peft.enabled=false", "optim.lr=1e-2",
             "trainer.max_steps=80")
    assert c["trainer"]["overfit_batches"] == 2 and list(c["logger"]) == ["csv"] and c["data"]["shuffle"] is False
    res = train(c)
    import csv

    rows = list(csv.DictReader(open(next((tmp_path / "over" / "run" / "csv").rglob("metrics.csv")))))
    losses = [float(r["train/loss"]) for r in rows if r.get("train/loss")]
    assert res["global_step"] == 80 and len(losses) == 80 and losses[-1] < 0.5 * losses[0], losses


def test_an_unknown_role_or_impossible_combination_is_an_error_line_not_a_traceback(tmp_path, smoke_data):
    import subprocess
    import sys

    from arbor_train.paths import REPO_ROOT

    for override, msg in (("task.role=nope", "error: option task.role='nope': no such role"),
                          ("task=extractor_states", "error: task=extractor_states needs a decoder")):
        p = subprocess.run([sys.executable, "-m", "arbor_train.train", "model=tiny_encoder", "logger=csv",
                            f"data.train_dir={smoke_data}", f"run_dir={tmp_path / 'r'}", override],
                           cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
        assert p.returncode == 2 and msg in p.stderr and "Traceback" not in p.stderr, p.stderr[-2000:]


# Every Hydra entry point: a user's mistake is one `error:` line naming the option, exit 2, no traceback
# (issue #14: each printed its own error as the last line of a traceback, exit 1; some never named it).
ENTRY_POINT_MISTAKES = [
    ("data_gen.branchmem", ["preset=smoke", "preset.sessions=0"], "option preset.sessions must be at least 1"),
    ("data_gen.branchmem", ["preset=smoke", "preset.question_types=[bogus]"],
     "option preset.question_types[0] must be one of update_current"),
    ("data_gen.locomo", ["input=../shared/data/locomo", "overwrite=maybe"], "option overwrite must be true or false"),
    ("eval.run", ["budget=lots"], "option budget must be an integer, got 'lots'"),
    ("eval.bench", ["target=gpu"], "option target must be one of extract, runtime, scale, train"),
    ("eval.locomo_cv", ["folds=one"], "option folds must be an integer"),
    ("arbor_train.train", ["optim.lr=abc"], "option optim.lr must be a number, got 'abc'"),
    ("arbor_train.export", ["out=x"], "option run_dir is required"),
    ("eval.pipeline", ["echo=maybe"], "option echo must be true or false"),
]


@pytest.mark.parametrize("module, args, msg", ENTRY_POINT_MISTAKES, ids=[f"{m}:{a[-1]}" for m, a, _ in ENTRY_POINT_MISTAKES])
def test_every_entry_point_reports_a_user_mistake_as_one_error_line_and_exit_2(module, args, msg, tmp_path, smoke_data):
    import os
    import subprocess
    import sys
    import time

    from arbor_train.paths import REPO_ROOT

    run_dir = tmp_path / "run"
    extra = {"arbor_train.train": ["model=tiny_encoder", "logger=csv", f"data.train_dir={smoke_data}",
                                   f"run_dir={run_dir}"],
             "eval.pipeline": [f"out={tmp_path / 'p'}"],
             "data_gen.locomo": [f"out_dir={tmp_path / 'out'}"],
             "data_gen.branchmem": [f"out_dir={tmp_path / 'out'}"],
             "eval.run": [f"data_dir={smoke_data}", "wandb.enabled=false"]}.get(module, [])
    env = dict(os.environ, ARBOR_OUTPUT_ROOT=str(tmp_path / "outputs"), WANDB_MODE="offline")
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", module, *extra, *args], cwd=REPO_ROOT, env=env, capture_output=True,
                       text=True, timeout=300)
    elapsed = time.perf_counter() - t0
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    assert p.stderr.strip().splitlines()[-1].startswith(f"error: {msg}"), p.stderr[-2000:]
    assert "Traceback" not in p.stderr + p.stdout
    if module == "arbor_train.train":
        # refused in check_combination: before the run directory, any model or the baseline validation
        assert not run_dir.exists() and "baseline" not in p.stdout + p.stderr and elapsed < 120
    assert not (tmp_path / "out").exists() and not (tmp_path / "p").exists()


@pytest.mark.parametrize("override, msg", [
    ("optim.lr=abc", "option optim.lr must be a number, got 'abc'"),
    ("optim.lr=0", "option optim.lr must be above 0.0"),
    ("optim.weight_decay=-0.1", "option optim.weight_decay must be at least 0.0"),
    ("+optim.betas=[0.9,1.5]", r"option optim.betas\[1\] must lie in \[0, 1\)"),
    ("+optim.no_such_argument=1", "option optim: cannot build the optimizer"),
    ("scheduler.warmup_ratio=1.0", r"option scheduler.warmup_ratio must lie in \[0, 1\)"),
    ("trainer.max_steps=lots", "option trainer.max_steps must be an integer"),
    ("task.batch_size=0", "option task.batch_size must be at least 1"),
    ("peft.enabled=perhaps", "option peft.enabled must be true or false"),
    ("data.shuffle=sometimes", "option data.shuffle must be true or false"),
    ("data.val_fraction=1.5", r"option data.val_fraction must lie in \(0, 1\)"),
    ("seed=abc", "option seed must be an integer"),
])
def test_numeric_and_boolean_options_are_refused_in_check_combination(tmp_path, smoke_data, override, msg, monkeypatch):
    """Before any model: check_combination (train() calls it first) reads the optimizer node strictly."""
    from arbor_train import roles
    from arbor_train.train import ConfigError, train

    def no_build(*a, **k):
        raise AssertionError("the role was built before the options were checked")

    monkeypatch.setattr(type(roles.get("reranker")), "build", no_build)
    with pytest.raises(ConfigError, match=msg):
        train(tiny(tmp_path, smoke_data, override))
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("module", ["eval.run", "data_gen.branchmem", "arbor_train.runtime.cli"])
def test_a_runtime_choice_that_is_not_shipped_is_refused_naming_the_axis_and_its_options(module, tmp_path):
    """Hydra refuses the choice while composing (exit 1, its own message, no traceback) and names the options."""
    import os
    import subprocess
    import sys

    from arbor_train.paths import REPO_ROOT

    env = dict(os.environ, ARBOR_OUTPUT_ROOT=str(tmp_path / "outputs"), WANDB_MODE="offline")
    p = subprocess.run([sys.executable, "-m", module, "runtime/components=nope", f"out_dir={tmp_path / 'o'}"],
                       cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "Traceback" not in p.stderr + p.stdout
    assert "Could not find 'runtime/components/nope'" in p.stderr
    assert "Available options in 'runtime/components'" in p.stderr and "tuned_every_kind" in p.stderr
    assert not (tmp_path / "o").exists()
