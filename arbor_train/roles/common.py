"""What every role shares: the `Role` protocol that train.py, export.py and the pipeline call, the
`Built` bundle of objects a role's builder returns, and `RoleModule`, the LightningModule base
(optimizer and scheduler from config, trainable-only checkpoints with RNG states, FSDP clipping).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch

from .. import data as D
from ..errors import ConfigError
from ..models import param_counts


class RoleModule(L.LightningModule):
    """LightningModule base of every role. The optimizer is `cfg.optim` and the schedule `cfg.scheduler`
    (`_partial_` nodes built with hydra's instantiate, finished here with the trainable parameters and
    the run's total steps), so another optimizer or schedule is a YAML change. Subclasses implement
    `step_loss(batch) -> (loss, n, out)` (n: examples in the batch, out: what `collect_validation`
    reads) and `epoch_metrics() -> dict`; validation reports the mean held-out loss as `loss` beside the
    role's own metrics (`last_metrics`)."""

    def __init__(self, model, cfg: dict):
        super().__init__()
        self.model = model
        self.cfg = cfg
        self.strict_loading = False  # checkpoints carry trainable weights only
        self.save_hyperparameters({"config": cfg})
        self.tokens_seen = 0
        self.last_metrics: dict[str, Any] = {}
        self._val_loss: list[tuple[float, int]] = []

    # --- to implement -------------------------------------------------------------------------------
    def step_loss(self, batch: dict) -> tuple[torch.Tensor, int, Any]:
        raise NotImplementedError

    def count_tokens(self, batch: dict) -> int:
        m = batch.get("attention_mask")
        return int(m.sum()) if m is not None and m.dim() == 2 else int(batch["input_ids"].numel())

    def collect_validation(self, batch: dict, out: Any) -> None:
        """Keep what `epoch_metrics` needs from one validation batch (nothing by default)."""

    def epoch_metrics(self) -> dict[str, Any]:
        return {}

    # --- shared loop --------------------------------------------------------------------------------
    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss, n, _ = self.step_loss(batch)
        self.tokens_seen += self.count_tokens(batch)
        self.log("train/loss", loss, prog_bar=True, batch_size=n)
        if self._trainer is not None and self.trainer.optimizers:
            self.log("train/lr", self.trainer.optimizers[0].param_groups[0]["lr"], batch_size=n)
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        loss, n, out = self.step_loss(batch)
        self._val_loss.append((float(loss.detach()), n))
        self.log("val/loss", loss, prog_bar=True, batch_size=n)
        self.collect_validation(batch, out)

    def on_validation_epoch_end(self) -> None:
        m = self.epoch_metrics()
        if self._val_loss:
            total = sum(n for _, n in self._val_loss)
            m = {"loss": round(sum(l * n for l, n in self._val_loss) / max(1, total), 6), **m}
        self._val_loss = []
        if not m:
            return
        self.last_metrics = m
        for k, v in m.items():
            if isinstance(v, (int, float)) and v is not None and k != "loss":
                self.log(f"val/{k}", float(v))

    def param_groups(self) -> list:
        """What the optimizer trains: every trainable parameter (a role may split them into groups with
        their own learning rates)."""
        return [p for p in self.parameters() if p.requires_grad]

    def configure_optimizers(self):
        from hydra.utils import instantiate

        try:
            opt = instantiate(self.cfg["optim"])(self.param_groups())
        except Exception as e:  # a wrong class or argument in the optim group
            raise ConfigError(f"option optim: cannot build the optimizer ({type(e).__name__}: {e})") from e
        sc = self.cfg.get("scheduler")
        if not sc:
            return opt
        sched = instantiate(sc)(opt, total_steps=int(self.trainer.estimated_stepping_batches))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        """Lightning's FSDP precision plugin refuses norm clipping (it cannot see the sharded gradients):
        there the wrapped FSDP module clips with its own all-reduced norm; elsewhere Lightning clips."""
        from ..wrap import is_fsdp

        if gradient_clip_val and is_fsdp(self.trainer):
            self.trainer.strategy.model.clip_grad_norm_(float(gradient_clip_val))
            return
        self.clip_gradients(optimizer, gradient_clip_val=gradient_clip_val,
                            gradient_clip_algorithm=gradient_clip_algorithm)

    def on_train_epoch_start(self) -> None:
        # from_pretrained returns eval-mode modules and Lightning keeps modes as found: train here
        self.model.train()

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Trainable weights only, and every rank's RNG states: ranks draw different amounts of
        randomness (dropout over batches of different shapes), so each resumes from its own."""
        import torch.distributed as dist

        trainable = {n for n, p in self.named_parameters() if p.requires_grad}
        checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if k in trainable}
        mine = _rng_state()
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            # dump_checkpoint runs on every rank (Trainer.save_checkpoint). Tensors go as lists: torch 2.13's
            # all_gather_object cannot unpickle tensors ("UntypedStorage has no attribute dtype").
            plain = {"torch": mine["torch"].tolist(), "python": mine["python"],
                     "numpy": [mine["numpy"][0], mine["numpy"][1].tolist(), *mine["numpy"][2:]]}
            gathered: list = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, plain)
            ranks = [{"torch": torch.tensor(g["torch"], dtype=torch.uint8), "python": g["python"],
                      "numpy": [g["numpy"][0], torch.tensor(g["numpy"][1], dtype=torch.uint32), *g["numpy"][2:]]}
                     for g in gathered]
        else:
            ranks = [mine]
        checkpoint["rng"] = {"ranks": ranks}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        rng = checkpoint.get("rng")
        if not rng:
            return
        ranks = rng["ranks"]
        rank = self.trainer.global_rank if self._trainer is not None else 0
        # the same world size resumes each rank exactly; another one continues from rank 0's states
        _set_rng_state(ranks[rank] if rank < len(ranks) else ranks[0])


def _rng_state() -> dict:
    """torch, Python and NumPy RNG states as plain containers and tensors (torch.load(weights_only=True) reads them)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {"torch": torch.get_rng_state(), "python": random.getstate(),
            "numpy": [kind, torch.from_numpy(keys.copy()), int(pos), int(has_gauss), float(cached)]}


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy(), pos, has_gauss, cached))


@dataclass
class Built:
    """What a role's builder returns: the module, its tokenizer, the two loaders, and role extras."""
    module: RoleModule
    tokenizer: Any
    train_loader: D.ResumableLoader
    val_loader: D.ResumableLoader
    data_fingerprint: str
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def param_counts(self) -> dict[str, int]:
        return param_counts(self.module.model)


def load_rows(c: dict, names: list[str]) -> tuple[dict, dict]:
    """(train rows, validation rows) per set name: `data.val_dir`, or `data.val_fraction` of train_dir."""
    dc = c["data"]
    train_sets = D.load_sets(dc["train_dir"], names)
    if dc.get("val_dir"):
        val_sets = D.load_sets(dc["val_dir"], names)
        return {n: list(train_sets[n]) for n in names}, {n: list(val_sets[n]) for n in names}
    tr, va = {}, {}
    for n in names:
        tr[n], va[n] = D.split(list(train_sets[n]), dc["val_fraction"], c["seed"])
    return tr, va


def cap(items: list, n: int | None) -> list:
    return items if not n else items[:n]


def loaders(c: dict, train_items: list, val_items: list, collate) -> tuple[D.ResumableLoader, D.ResumableLoader]:
    """The training loader (shuffled each epoch, sharded by rank) and the validation loader (in order;
    every rank validates on all of it, so epoch metrics need no gathering)."""
    bs = c["task"]["batch_size"]
    dc = c["data"]
    return (D.ResumableLoader(train_items, bs, collate, c["seed"], shuffle=dc.get("shuffle", True)),
            D.ResumableLoader(val_items, bs, collate, c["seed"], shuffle=False, shard=False))


def fmt(v, digits: int = 3) -> str:
    """A metric for a markdown table: 3 decimals, an em dash when missing."""
    if v is None:
        return "—"
    return f"{v:.{digits}f}" if isinstance(v, float) else str(v)


class Role:
    """One learned role. Subclasses set `name`, `bundle_kinds` (model family -> bundle kind) and
    `report_columns` (held-out metric -> column label), and implement `build`; the other methods have
    defaults that fit most roles."""

    name: str = ""
    supervision: str = "generated"  # "generated": the BranchMemEval/LoCoMo sets; "reader": data_gen.reader's
    bundle_kinds: dict[str, str] = {}
    report_columns: dict[str, str] = {}

    def check(self, c: dict) -> None:
        """Refuse (ConfigError, naming the option) model/task combinations this role cannot train."""

    def build(self, c: dict) -> Built:
        raise NotImplementedError

    def baselines(self, c: dict, built: Built, trainer) -> dict[str, Any]:
        """Held-out metrics before training, on the same examples: the untuned model, and the role's
        no-model heuristic where it has one."""
        trainer.validate(built.module, built.val_loader, verbose=False)
        return {"untuned": dict(built.module.last_metrics)}

    def after_fit(self, c: dict, built: Built) -> dict[str, Any]:
        """A role's own step after training and before the final validation (the reranker's pair-head
        refit); what it returns goes into final/metrics.json."""
        return {}

    def extras(self, c: dict, built: Built) -> dict[str, Any]:
        """Role facts for role.json and the bundle manifest (labels, thresholds, kinds)."""
        return {}

    def report_table(self, result: dict, model: str) -> list[str]:
        """Markdown rows of a training run's held-out metrics (final/metrics.json): the no-model heuristic
        and the untuned model where `baselines` holds them, then the tuned model."""
        base = result.get("baselines") or {}
        rows = [("heuristic (no model)", base.get("heuristic")), (f"{model}, untuned", base.get("untuned")),
                (f"{model} + LoRA", result.get("metrics"))]
        # a column no row reports (e.g. slot F1 of an extractor trained on facts only) is left out
        cols = {k: v for k, v in self.report_columns.items() if any(m and m.get(k) is not None for _, m in rows)}
        lines = [f"| {self.name} | " + " | ".join(cols.values()) + " |", "|---|" + "---:|" * len(cols)]
        for label, m in rows:
            if m:
                lines.append(f"| {label} | " + " | ".join(fmt(m.get(k)) for k in cols) + " |")
        return lines

    def finalize(self, c: dict, built: Built, run_dir: Path, state_dict: dict | None = None) -> dict[str, Any]:
        """Save the final adapter, tokenizer and role.json where `python -m arbor_train.export` finds them.
        `state_dict`: the model's gathered full weights when its parameters are sharded (FSDP)."""
        final = run_dir / "final"
        final.mkdir(parents=True, exist_ok=True)
        built.module.model.save_pretrained(str(final / "adapter"), state_dict=state_dict)  # None: the module's own
        built.tokenizer.save_pretrained(str(final / "tokenizer"))
        extra = {"role": self.name, "task": c["task"]["name"], **self.extras(c, built)}
        (final / "role.json").write_text(json.dumps(extra, indent=2, sort_keys=True))
        return extra

    def bundle_kind(self, family: str) -> str:
        if family not in self.bundle_kinds:
            raise ConfigError(f"role {self.name} has no bundle kind for a {family} model "
                              f"(it exports {', '.join(f'{k}: {v}' for k, v in self.bundle_kinds.items())})")
        return self.bundle_kinds[family]

    def prompt_template(self, kind: str) -> dict:
        """The prompt template (name, version) a bundle of this kind records in its manifest."""
        raise NotImplementedError

    def load_base(self, train_cfg: dict, role_json: dict):
        """The untrained base model, rebuilt exactly as training built it (same seed: same head init)."""
        raise NotImplementedError

    def plug_overrides(self, bundle: Path | str, task: dict) -> list[str]:
        """The runtime overrides (runtime.<key>=<value>) that plug this role's bundle into ArborMemory
        (`task`: the training task node)."""
        raise NotImplementedError
