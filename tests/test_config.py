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


def mismatches(conf_dir: Path, name: str) -> list[str]:
    """Every key the experiment file sets (its body, and each group its defaults select) whose composed
    value differs from the file's. Values are compared unresolved: an interpolation must survive as written."""
    raw = OmegaConf.to_container(OmegaConf.load(conf_dir / "experiment" / f"{name}.yaml"), resolve=False)
    defaults = raw.pop("defaults", [])
    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
        composed = OmegaConf.to_container(compose(config_name="train", overrides=[f"experiment={name}"]),
                                          resolve=False)
    want = dict(leaves(raw))
    for d in defaults:   # "override /model: qwen3_4b": the group file's keys, unless the body sets them
        (key, option), = d.items()
        group = key.split("/")[-1]
        node = OmegaConf.to_container(OmegaConf.load(conf_dir / group / f"{option}.yaml"), resolve=False)
        node.pop("defaults", None)
        for path, v in leaves(node, (group,)):
            if not any(path[: len(p)] == p or p[: len(path)] == path for p in want):
                want[path] = v
    return [f"{'.'.join(p)}: {name}.yaml sets {v!r}, composed {lookup(composed, p)!r}"
            for p, v in want.items() if lookup(composed, p) != v]


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
