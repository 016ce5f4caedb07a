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

from .errors import ConfigError, entry_point, parse_bool, parse_float, parse_int
from .paths import CONF_DIR, REPO_ROOT

log = logging.getLogger(__name__)


def strategy_name(t: dict) -> str:
    """The trainer's strategy as a user named it: a Lightning alias ("ddp") or its builder's name."""
    st = t.get("strategy")
    if isinstance(st, dict):
        return str(st.get("_target_", "?")).rsplit(".", 1)[-1]
    return str(st)


def _set(d: dict, key: str, parsed: Any) -> None:
    """A number or boolean the user gave as a string becomes its value; a valid value stays as written
    (the config is saved with the run and compared on resume)."""
    if isinstance(d.get(key), str):
        d[key] = parsed


def _ratio(d: dict, key: str, option: str, below_one: bool) -> None:
    if d.get(key) is None:
        return
    v = parse_float(d[key], option, minimum=0.0)
    if v > 1 or (below_one and v == 1):
        raise ConfigError(f"option {option} must lie in [0, 1{')' if below_one else ']'}, got {v}")
    _set(d, key, v)


def check_optim(cfg: dict) -> None:
    """The optimizer and schedule nodes, read strictly and built once on a dummy parameter (torch.optim), so
    `optim.lr=abc` is refused before any model is loaded or any baseline is measured."""
    from hydra.utils import instantiate

    o = cfg.get("optim")
    if not isinstance(o, dict) or "_target_" not in o:
        raise ConfigError(f"option optim must be a _target_ node (conf/optim/*.yaml), got {o!r}")
    if "lr" not in o:
        raise ConfigError(f"option optim.lr is required (optimizer {o['_target_']})")
    _set(o, "lr", parse_float(o["lr"], "optim.lr", minimum=0.0, exclusive=True))
    for key in ("weight_decay", "momentum", "dampening"):
        if o.get(key) is not None:
            _set(o, key, parse_float(o[key], f"optim.{key}", minimum=0.0))
    if o.get("eps") is not None:
        _set(o, "eps", parse_float(o["eps"], "optim.eps", minimum=0.0, exclusive=True))
    if o.get("betas") is not None:
        betas = o["betas"]
        if not isinstance(betas, list) or len(betas) != 2:
            raise ConfigError(f"option optim.betas must be a list of two numbers in [0, 1), got {betas!r}")
        for k in range(2):
            v = parse_float(betas[k], f"optim.betas[{k}]", minimum=0.0)
            if v >= 1:
                raise ConfigError(f"option optim.betas[{k}] must lie in [0, 1), got {v}")
            if isinstance(betas[k], str):
                betas[k] = v
    if str(o["_target_"]).startswith("torch.optim."):
        try:
            instantiate(o)([torch.nn.Parameter(torch.zeros(1))])
        except Exception as e:  # a wrong class, argument or value
            raise ConfigError(f"option optim: cannot build the optimizer ({type(e).__name__}: {e})") from e
    sc = cfg.get("scheduler")
    if sc:
        if not isinstance(sc, dict) or "_target_" not in sc:
            raise ConfigError(f"option scheduler must be a _target_ node (conf/scheduler/*.yaml) or absent, got {sc!r}")
        _ratio(sc, "warmup_ratio", "scheduler.warmup_ratio", below_one=True)
        _ratio(sc, "min_lr_ratio", "scheduler.min_lr_ratio", below_one=False)


def check_options(cfg: dict) -> None:
    """Counts, ratios and switches of the run read strictly (a string where a number or boolean belongs is
    refused, naming the option), before any work."""
    _set(cfg, "seed", parse_int(cfg.get("seed"), "seed"))
    if cfg.get("torch_threads") is not None:
        _set(cfg, "torch_threads", parse_int(cfg["torch_threads"], "torch_threads", minimum=1))
    t = cfg["trainer"]
    for key, lo in (("max_steps", -1), ("max_epochs", -1), ("accumulate_grad_batches", 1), ("num_nodes", 1),
                    ("log_every_n_steps", 1)):
        if t.get(key) is not None:
            _set(t, key, parse_int(t[key], f"trainer.{key}", minimum=lo))
    if t.get("gradient_clip_val") is not None:
        _set(t, "gradient_clip_val", parse_float(t["gradient_clip_val"], "trainer.gradient_clip_val", minimum=0.0))
    task, data, peft = cfg["task"], cfg["data"], cfg["peft"]
    for key in ("batch_size", "max_length", "group_size", "pack_length", "gen_batch_size", "max_new_tokens"):
        if task.get(key) is not None:
            _set(task, key, parse_int(task[key], f"task.{key}", minimum=1))
    if task.get("gen_examples") is not None:
        _set(task, "gen_examples", parse_int(task["gen_examples"], "task.gen_examples", minimum=0))
    for key in ("compare_baselines", "packing", "packed_attention", "include_new_root"):
        if key in task:
            _set(task, key, parse_bool(task[key], f"task.{key}"))
    _ratio(task, "nonempty_share", "task.nonempty_share", below_one=False)
    for key in ("max_train_examples", "max_val_examples"):
        if data.get(key) is not None:
            _set(data, key, parse_int(data[key], f"data.{key}", minimum=1))
    if "shuffle" in data:
        _set(data, "shuffle", parse_bool(data["shuffle"], "data.shuffle"))
    if data.get("val_dir") is None and data.get("val_fraction") is not None:
        v = parse_float(data["val_fraction"], "data.val_fraction", minimum=0.0, exclusive=True)
        if v >= 1:
            raise ConfigError(f"option data.val_fraction must lie in (0, 1) (the held-out share), got {v}")
        _set(data, "val_fraction", v)
    for key in ("train_dir", "val_dir"):
        d = data.get(key)
        if key == "train_dir" or d is not None:
            if not (Path(str(d)) / "hf").is_dir():
                from .errors import MissingInputError

                raise MissingInputError(f"option data.{key}={str(d)!r}: no hf/ folder (run python -m "
                                        f"data_gen.branchmem or data_gen.locomo first)")
    _set(peft, "enabled", parse_bool(peft.get("enabled"), "peft.enabled"))
    if peft["enabled"]:
        for key in ("r", "alpha"):
            if peft.get(key) is not None:
                _set(peft, key, parse_int(peft[key], f"peft.{key}", minimum=1))
        _ratio(peft, "dropout", "peft.dropout", below_one=True)
    check_optim(cfg)


def check_combination(cfg: dict) -> None:
    """Refuse, before any work, options and combinations that cannot work (the role's own checks included)."""
    from . import roles

    check_options(cfg)
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


def load_checkpoint(path: str | Path, option: str = "resume") -> dict:
    """A Lightning checkpoint read with `weights_only=True`: tensors, containers and primitives only, so a
    checkpoint file cannot run code when it is read. One that holds anything else, or is not a checkpoint,
    is refused naming the file. (Lightning's own resume in `trainer.fit` reads it the same way.)"""
    import pickle

    try:
        ck = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"{option}={path}: not a checkpoint this toolkit reads (loaded weights-only, so a file "
                          f"holding code or arbitrary objects is refused, not run): {first}") from None
    if not isinstance(ck, dict) or "global_step" not in ck:
        raise ConfigError(f"{option}={path}: not a Lightning checkpoint (no global_step)")
    return ck


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
        return str(r), load_checkpoint(r)["global_step"]
    # step-*.ckpt rather than last.ckpt (a moving copy of the newest), so the path names what was resumed
    found = list(run_dir.glob("hpc_ckpt_*.ckpt")) + list((run_dir / "checkpoints").glob("step-*.ckpt"))
    if not found:
        return None
    newest = max(found, key=lambda p: p.stat().st_mtime)
    ck = load_checkpoint(newest, f"resume=auto (run_dir {run_dir})")
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
    trainer.fit(module, train_loader, val_loader, ckpt_path=ckpt, weights_only=True)
    elapsed = time.perf_counter() - t0
    results.update(role.after_fit(c, built))
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
@entry_point
def main(cfg: DictConfig) -> None:
    res = train(cfg)  # a user's mistake (ConfigError, InputError) is an `error:` line and exit 2: entry_point
    print(json.dumps({k: res[k] for k in ("run_dir", "metrics", "baselines", "tokens_per_s", "params")
                      if k in res}, default=str, sort_keys=True))


if __name__ == "__main__":
    main()
