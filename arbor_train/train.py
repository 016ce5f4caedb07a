"""python -m arbor_train.train experiment=<name> [overrides]

`train(cfg) -> dict` is the importable function (tests call it); `main` is the thin Hydra wrapper.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import hydra
import lightning as L
import torch
from omegaconf import DictConfig, OmegaConf

from .paths import CONF_DIR, REPO_ROOT

log = logging.getLogger(__name__)


class ConfigError(ValueError):
    pass


def check_combination(cfg: dict) -> None:
    """Refuse, before any work, combinations that cannot work."""
    t, m = cfg["trainer"], cfg["model"]
    gpu = torch.cuda.is_available()
    if t["strategy_name"] in ("fsdp", "deepspeed_zero3") and not gpu:
        raise ConfigError(f"trainer={t['strategy_name']} needs GPUs; this machine has none (use trainer=cpu or ddp)")
    if t["strategy_name"] == "deepspeed_zero3":
        try:
            import deepspeed  # noqa: F401
        except ImportError as e:
            raise ConfigError("trainer=deepspeed_zero3 needs the deepspeed package (pip install deepspeed)") from e
    if "mixed" in str(t["precision"]) and t["accelerator"] == "cpu" and str(t["precision"]).startswith("16"):
        raise ConfigError("trainer.precision=16-mixed is not supported on CPU; use 32 or bf16-mixed")
    if cfg["task"]["head"] == "yes_no" and m["family"] != "decoder":
        raise ConfigError(f"task={cfg['task']['name']} scores p(yes) with a causal LM; model={m['name']} is an encoder")
    if cfg["task"]["role"] in ("reranker", "tagger") and m["family"] != "encoder" and cfg["task"]["head"] == "classifier":
        raise ConfigError(f"task={cfg['task']['name']} with a classification head needs an encoder model, "
                          f"got model={m['name']} (family {m['family']})")
    if cfg["task"]["role"] == "extractor" and m["family"] != "decoder":
        raise ConfigError(f"task={cfg['task']['name']} needs a decoder (causal LM) model, got model={m['name']}")
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


def build_logger(cfg: dict, run_dir: Path):
    lc = cfg["logger"]
    if lc["kind"] == "wandb":
        from lightning.pytorch.loggers import WandbLogger

        online = os.environ.get("WANDB_MODE", lc["mode"]) == "online"
        return WandbLogger(project=lc["project"], name=lc.get("name") or run_dir.name, save_dir=str(run_dir),
                           offline=not online, log_model=False)
    if lc["kind"] == "csv":
        from lightning.pytorch.loggers import CSVLogger

        return CSVLogger(save_dir=str(run_dir), name="csv")
    if lc["kind"] in (None, "none"):
        return False
    raise ConfigError(f"logger.kind must be wandb, csv or none, got {lc['kind']!r}")


def build_trainer(cfg: dict, run_dir: Path, logger) -> L.Trainer:
    from lightning.pytorch.callbacks import ModelCheckpoint

    t = cfg["trainer"]
    callbacks = [ModelCheckpoint(dirpath=str(run_dir / "checkpoints"), filename="step-{step:06d}",
                                 every_n_train_steps=cfg["callbacks"]["checkpoint_every_n_steps"], save_top_k=-1,
                                 save_last=True, auto_insert_metric_name=False)]
    plugins = []
    if t["slurm_auto_requeue"] and "SLURM_JOB_ID" in os.environ:
        import signal

        from lightning.pytorch.plugins.environments import SLURMEnvironment

        plugins.append(SLURMEnvironment(auto_requeue=True, requeue_signal=signal.SIGUSR1))
    strategy: Any = t["strategy"]
    if t["strategy_name"] == "fsdp":
        from .wrap import fsdp_strategy

        strategy = fsdp_strategy(cfg["model"])
    return L.Trainer(
        accelerator=t["accelerator"], devices=t["devices"], num_nodes=t["num_nodes"], strategy=strategy,
        precision=t["precision"], max_steps=t["max_steps"], max_epochs=t["max_epochs"],
        accumulate_grad_batches=t["accumulate_grad_batches"], gradient_clip_val=t["gradient_clip_val"],
        val_check_interval=t["val_check_interval"], check_val_every_n_epoch=t["check_val_every_n_epoch"],
        log_every_n_steps=t["log_every_n_steps"], enable_progress_bar=t["progress_bar"], logger=logger,
        callbacks=callbacks, plugins=plugins or None, default_root_dir=str(run_dir), deterministic=t["deterministic"],
        num_sanity_val_steps=0, enable_model_summary=False,
    )


RESUME_KEYS = ("model", "peft", "task", "data", "optim", "seed")


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

    c = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else cfg
    check_combination(c)
    L.seed_everything(c["seed"], workers=True)
    torch.set_num_threads(c["trainer"]["torch_threads"] or torch.get_num_threads())
    run_dir = Path(c["run_dir"])
    run_dir.mkdir(parents=True, exist_ok=True)
    resume = resume_path(c, run_dir)
    ckpt = resume[0] if resume else None
    if ckpt:
        log.info("resuming from %s (restart %s)", ckpt, os.environ.get("SLURM_RESTART_COUNT", "-"))
    built = roles.build(c)
    module, train_loader, val_loader = built["module"], built["train_loader"], built["val_loader"]
    logger = build_logger(c, run_dir)
    trainer = build_trainer(c, run_dir, logger)
    counts = built["param_counts"]
    meta = {"git_commit": git_commit(), "data_fingerprint": built["data_fingerprint"], "params": counts,
            "examples": {"train": len(train_loader.examples), "val": len(val_loader.examples)}}
    if logger:
        logger.log_hyperparams({"config": c, **meta})
    results: dict[str, Any] = {"run_dir": str(run_dir), **meta, "resumed_from": ckpt,
                               "slurm": {k: os.environ[f"SLURM_{k.upper()}"] for k in ("job_id", "restart_count")
                                         if f"SLURM_{k.upper()}" in os.environ}}
    if resume:
        results["resumed_at_step"] = resume[1]
    if c["task"].get("compare_baselines") and not ckpt:
        results["baselines"] = roles.baselines(c, built, trainer, val_loader)
    t0 = time.perf_counter()
    trainer.fit(module, train_loader, val_loader, ckpt_path=ckpt)
    elapsed = time.perf_counter() - t0
    trainer.validate(module, val_loader, verbose=False)
    results["metrics"] = getattr(module, "last_metrics", {})
    results["train_seconds"] = round(elapsed, 2)
    results["tokens_per_s"] = round(module.tokens_seen / max(elapsed, 1e-9), 1)
    results["global_step"] = trainer.global_step
    results["world_size"] = trainer.world_size
    from .wrap import gathered_state_dict

    state_dict = gathered_state_dict(trainer)  # FSDP: every rank takes part, rank 0 gets the full weights
    if trainer.is_global_zero:
        results.update(roles.finalize(c, built, module, run_dir, state_dict))
        final = run_dir / "final"
        (final).mkdir(parents=True, exist_ok=True)
        (final / "metrics.json").write_text(json.dumps(results, indent=2, sort_keys=True, default=str))
        (final / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(c)))
        if logger:
            logger.log_metrics({f"final/{k}": v for k, v in _flat(results["metrics"]).items()})
            logger.log_metrics({"final/tokens_per_s": results["tokens_per_s"]})
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
    res = train(cfg)
    print(json.dumps({k: res[k] for k in ("run_dir", "metrics", "baselines", "tokens_per_s", "params")
                      if k in res}, default=str, sort_keys=True))


if __name__ == "__main__":
    main()
