"""python -m arbor_train.train experiment=<name> [overrides]

`train(cfg) -> dict` is the importable function (tests call it); `main` is the thin Hydra wrapper.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import hydra
import lightning as L
import torch
from omegaconf import DictConfig, OmegaConf

from .errors import ConfigError
from .paths import CONF_DIR, REPO_ROOT

log = logging.getLogger(__name__)


def strategy_name(t: dict) -> str:
    """The trainer's strategy as a user named it: a Lightning alias ("ddp") or its builder's name."""
    st = t.get("strategy")
    if isinstance(st, dict):
        return str(st.get("_target_", "?")).rsplit(".", 1)[-1]
    return str(st)


def check_combination(cfg: dict) -> None:
    """Refuse, before any work, combinations that cannot work (the role's own checks included)."""
    from . import roles

    t, m = cfg["trainer"], cfg["model"]
    if str(t.get("accelerator")) in ("gpu", "cuda") and not torch.cuda.is_available():
        raise ConfigError(f"trainer.accelerator={t['accelerator']} (strategy {strategy_name(t)}) needs GPUs; this "
                          f"machine has none (use trainer=cpu or ddp)")
    if strategy_name(t).startswith("deepspeed"):
        try:
            import deepspeed  # noqa: F401
        except ImportError as e:
            raise ConfigError(f"trainer.strategy={strategy_name(t)} needs the deepspeed package (pip install deepspeed)") from e
    if str(t["precision"]).startswith("16") and t["accelerator"] == "cpu":
        raise ConfigError("trainer.precision=16-mixed is not supported on CPU; use 32 or bf16-mixed")
    roles.get(cfg["task"]["role"]).check(cfg)
    if cfg["peft"]["enabled"] and m.get("lora_target_parameters") and cfg["peft"]["dropout"]:
        raise ConfigError(f"model={m['name']} puts LoRA on bare parameters (model.lora_target_parameters), which PEFT "
                          f"supports only without dropout; set peft.dropout=0 (got {cfg['peft']['dropout']})")
    if not cfg["peft"]["enabled"] and m.get("params_b", 0) >= 1:
        raise ConfigError(f"full fine-tuning of model={m['name']} ({m['params_b']}B) is not configured; keep peft.enabled=true")


def git_commit() -> str:
    try:
        return subprocess.check_output(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], text=True,
                                       stderr=subprocess.DEVNULL).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _instantiate_group(c: dict, group: str) -> list:
    """The `_target_` nodes of a dict-of-nodes group (callbacks, logger), instantiated; null entries and
    a null group give none."""
    from hydra.utils import instantiate

    nodes = c.get(group) or {}
    if not isinstance(nodes, dict):
        raise ConfigError(f"option {group} must map names to _target_ nodes, got {type(nodes).__name__}")
    out = []
    for name, node in nodes.items():
        if node is None:
            continue
        if not isinstance(node, dict) or "_target_" not in node:
            raise ConfigError(f"option {group}.{name} has no _target_ (got {node!r})")
        try:
            out.append(instantiate(node))
        except Exception as e:  # hydra wraps a missing class or a wrong argument in InstantiationException
            raise ConfigError(f"option {group}.{name}: cannot build {node['_target_']} ({e})") from e
    return out


def build_callbacks(c: dict) -> list:
    return _instantiate_group(c, "callbacks")


def build_loggers(c: dict) -> list:
    return _instantiate_group(c, "logger")


def build_trainer(c: dict, callbacks: list | None = None, loggers: list | None = None) -> L.Trainer:
    """The Lightning Trainer from `cfg.trainer` (a `_target_` node), with the callbacks and loggers."""
    from hydra.utils import instantiate

    return instantiate(c["trainer"], callbacks=callbacks if callbacks is not None else build_callbacks(c),
                       logger=(loggers if loggers is not None else build_loggers(c)) or False)


RESUME_KEYS = ("model", "peft", "task", "data", "optim", "scheduler", "seed")


def resume_path(c: dict, run_dir: Path) -> tuple[str, int] | None:
    """The checkpoint to resume from and its global step: `resume=auto` takes the newest one in this run
    directory.

    That is what a requeued SLURM job finds (same job id, same run directory): Lightning's `hpc_ckpt_*.ckpt`
    written on the requeue signal, or the last periodic checkpoint after a plain `scontrol requeue` or a
    crash. A checkpoint of a different configuration is refused rather than resumed.
    """
    r = c.get("resume")
    if r in (None, "none", "null", False):
        return None
    if r != "auto":
        if not Path(r).exists():
            raise ConfigError(f"resume={r}: no such checkpoint")
        return str(r), torch.load(r, map_location="cpu", weights_only=False, mmap=True)["global_step"]
    # step-*.ckpt rather than last.ckpt (a moving copy of the newest), so the path names what was resumed
    found = list(run_dir.glob("hpc_ckpt_*.ckpt")) + list((run_dir / "checkpoints").glob("step-*.ckpt"))
    if not found:
        return None
    newest = max(found, key=lambda p: p.stat().st_mtime)
    ck = torch.load(newest, map_location="cpu", weights_only=False, mmap=True)
    saved = ck["hyper_parameters"]["config"]
    diff = [k for k in RESUME_KEYS if saved.get(k) != c.get(k)]
    if diff:
        raise ConfigError(f"run_dir {run_dir} holds checkpoint {newest.name} of a different configuration "
                          f"(differs in {', '.join(diff)}); choose another run_dir or set resume=null")
    return str(newest), ck["global_step"]


def train(cfg: DictConfig | dict) -> dict:
    from . import roles
    from .wrap import gathered_state_dict

    c = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else cfg
    check_combination(c)
    role = roles.get(c["task"]["role"])
    L.seed_everything(c["seed"], workers=True)
    torch.set_num_threads(c.get("torch_threads") or torch.get_num_threads())
    run_dir = Path(c["run_dir"])
    run_dir.mkdir(parents=True, exist_ok=True)
    resume = resume_path(c, run_dir)
    ckpt = resume[0] if resume else None
    if ckpt:
        log.info("resuming from %s (restart %s)", ckpt, os.environ.get("SLURM_RESTART_COUNT", "-"))
    built = role.build(c)
    module, train_loader, val_loader = built.module, built.train_loader, built.val_loader
    trainer = build_trainer(c)
    meta = {"git_commit": git_commit(), "data_fingerprint": built.data_fingerprint, "params": built.param_counts,
            "examples": {"train": len(train_loader.examples), "val": len(val_loader.examples)}}
    for lg in trainer.loggers:
        lg.log_hyperparams({"config": c, **meta})
    results: dict[str, Any] = {"run_dir": str(run_dir), **meta, "resumed_from": ckpt,
                               "slurm": {k: os.environ[f"SLURM_{k.upper()}"] for k in ("job_id", "restart_count")
                                         if f"SLURM_{k.upper()}" in os.environ}}
    if resume:
        results["resumed_at_step"] = resume[1]
    if c["task"].get("compare_baselines") and not ckpt:
        results["baselines"] = role.baselines(c, built, trainer)
    t0 = time.perf_counter()
    trainer.fit(module, train_loader, val_loader, ckpt_path=ckpt)
    elapsed = time.perf_counter() - t0
    trainer.validate(module, val_loader, verbose=False)
    results["metrics"] = module.last_metrics
    results["train_seconds"] = round(elapsed, 2)
    results["tokens_per_s"] = round(module.tokens_seen / max(elapsed, 1e-9), 1)
    results["global_step"] = trainer.global_step
    results["world_size"] = trainer.world_size
    state_dict = gathered_state_dict(trainer)  # FSDP: every rank takes part, rank 0 gets the full weights
    if trainer.is_global_zero:
        results.update(role.finalize(c, built, run_dir, state_dict))
        final = run_dir / "final"
        (final / "metrics.json").write_text(json.dumps(results, indent=2, sort_keys=True, default=str))
        (final / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(c)))
        for lg in trainer.loggers:
            lg.log_metrics({f"final/{k}": v for k, v in _flat(results["metrics"]).items()})
            lg.log_metrics({"final/tokens_per_s": results["tokens_per_s"]})
    return results


def _flat(d: dict, prefix: str = "") -> dict[str, float]:
    out = {}
    for k, v in (d or {}).items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}/"))
        elif isinstance(v, (int, float)) and v is not None:
            out[f"{prefix}{k}"] = float(v)
    return out


@hydra.main(config_path=str(CONF_DIR), config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> None:
    try:
        res = train(cfg)
    except ConfigError as e:  # a user's mistake: the message names the option; no traceback
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    print(json.dumps({k: res[k] for k in ("run_dir", "metrics", "baselines", "tokens_per_s", "params")
                      if k in res}, default=str, sort_keys=True))


if __name__ == "__main__":
    main()
