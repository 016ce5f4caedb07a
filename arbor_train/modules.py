"""LightningModules, one per role, varied by config (not copied scripts).

- RerankerModule: cross-encoder (encoder + LoRA + one-logit head) trained listwise over a group
  (gold + hard negatives) plus a learned "new root" logit, so that the same softmax decides between
  the candidates and starting a new root; sigmoid(new-root logit) is the calibrated threshold the
  bundle hands to the runtime.
- TaggerModule: encoder + LoRA + multi-label head (BCE), the attribute-tag predictor.

Checkpoints hold only trainable weights (LoRA, heads, the new-root logit), the RNG states and the
resolved config; the optimizer, scheduler and loop state come from Lightning.
"""

from __future__ import annotations

import random
from typing import Any

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F


class _Base(L.LightningModule):
    def __init__(self, model, cfg: dict):
        super().__init__()
        self.model = model
        self.cfg = cfg
        self.strict_loading = False  # checkpoints carry trainable weights only
        self.save_hyperparameters({"config": cfg})
        self.tokens_seen = 0

    def configure_optimizers(self):
        o = self.cfg["optim"]
        params = [p for p in self.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=o["lr"], weight_decay=o["weight_decay"])
        total = max(1, int(self.trainer.estimated_stepping_batches))
        warm = int(o["warmup_ratio"] * total)
        def linear(step: int) -> float:  # warm up, then decay linearly to zero
            if step < warm:
                return (step + 1) / warm
            return max(0.0, (total - step) / max(1, total - warm))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, linear)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        """Lightning's FSDP precision plugin refuses norm clipping (it cannot see the sharded gradients):
        there the wrapped FSDP module clips with its own all-reduced norm; elsewhere Lightning clips."""
        from .wrap import is_fsdp

        if gradient_clip_val and is_fsdp(self.trainer):
            self.trainer.strategy.model.clip_grad_norm_(float(gradient_clip_val))
            return
        self.clip_gradients(optimizer, gradient_clip_val=gradient_clip_val,
                            gradient_clip_algorithm=gradient_clip_algorithm)

    def on_train_epoch_start(self) -> None:
        # from_pretrained returns eval-mode modules and Lightning keeps modes as found: train here
        self.model.train()

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        trainable = {n for n, p in self.named_parameters() if p.requires_grad}
        checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if k in trainable}
        kind, keys, pos, has_gauss, cached = np.random.get_state()
        # plain containers and tensors only, so torch.load(weights_only=True) reads it back
        checkpoint["rng"] = {"torch": torch.get_rng_state(), "python": random.getstate(),
                             "numpy": [kind, torch.from_numpy(keys.copy()), int(pos), int(has_gauss), float(cached)]}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        rng = checkpoint.get("rng")
        if rng:
            torch.set_rng_state(rng["torch"])
            random.setstate(rng["python"])
            kind, keys, pos, has_gauss, cached = rng["numpy"]
            np.random.set_state((kind, keys.numpy(), pos, has_gauss, cached))

    def _count_tokens(self, batch: dict) -> None:
        self.tokens_seen += int(batch["attention_mask"].sum()) if batch["attention_mask"].dim() == 2 else 0


class RerankerModule(_Base):
    def __init__(self, model, cfg: dict):
        super().__init__(model, cfg)
        self.new_root_logit = torch.nn.Parameter(torch.tensor(float(cfg["task"]["new_root_init"])))
        self._val: list[dict] = []

    def scores(self, batch: dict) -> torch.Tensor:
        """One logit per (input, candidate) pair: the head's output for a cross-encoder; for an LLM
        scorer, logit(yes) - logit(no) at the answer position (sigmoid of it is the runtime's p(yes))."""
        kwargs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
        if "yes_no" in batch:
            out = self.model(**kwargs, logits_to_keep=1, use_cache=False).logits[:, -1].float()
            yes, no = batch["yes_no"].tolist()
            return out[:, yes] - out[:, no]
        if "token_type_ids" in batch:
            kwargs["token_type_ids"] = batch["token_type_ids"]
        return self.model(**kwargs).logits[:, 0].float()

    def group_logits(self, batch: dict) -> list[torch.Tensor]:
        s = self.scores(batch)
        out, k = [], 0
        for n in batch["group_sizes"].tolist():
            out.append(torch.cat([s[k : k + n], self.new_root_logit.view(1)]))
            k += n
        return out

    def listwise_loss(self, batch: dict) -> torch.Tensor:
        losses = []
        for logits, gold in zip(self.group_logits(batch), batch["gold"].tolist()):
            target = len(logits) - 1 if gold < 0 else gold
            losses.append(F.cross_entropy(logits.unsqueeze(0), torch.tensor([target], device=logits.device)))
        return torch.stack(losses).mean()

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss = self.listwise_loss(batch)
        self._count_tokens(batch)
        self.log("train/loss", loss, prog_bar=True, batch_size=len(batch["gold"]))
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        loss = self.listwise_loss(batch)
        self.log("val/loss", loss, prog_bar=True, batch_size=len(batch["gold"]))
        thr = float(self.new_root_logit.detach())
        for logits, gold in zip(self.group_logits(batch), batch["gold"].tolist()):
            self._val.append({"scores": logits[:-1].tolist(), "gold": None if gold < 0 else gold, "threshold": thr})

    def on_validation_epoch_end(self) -> None:
        from .metrics import rerank_metrics

        if not self._val:
            return
        m = rerank_metrics(self._val)
        self._val = []
        self.last_metrics = m
        for k in ("acc@1", "mrr", "new_root_f1"):
            if m.get(k) is not None:
                self.log(f"val/{k}", float(m[k]), prog_bar=k == "acc@1")

    @property
    def threshold(self) -> float:
        return float(torch.sigmoid(self.new_root_logit.detach()))


class TaggerModule(_Base):
    def __init__(self, model, cfg: dict, labels: list[str], pos_weight: list[float] | None = None):
        super().__init__(model, cfg)
        self.labels = labels
        # per-label weight of positives in the BCE loss (rare tags would otherwise never cross 0.5)
        self.pos_weight = torch.tensor(pos_weight) if pos_weight else None
        self._val_pred: list[list[str]] = []
        self._val_gold: list[list[str]] = []

    def _bce(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        w = self.pos_weight.to(logits.device) if self.pos_weight is not None else None
        return F.binary_cross_entropy_with_logits(logits.float(), labels.float(), pos_weight=w)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        out = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        loss = self._bce(out.logits, batch["labels"])
        self._count_tokens(batch)
        self.log("train/loss", loss, prog_bar=True, batch_size=len(batch["labels"]))
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        out = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        loss = self._bce(out.logits, batch["labels"])
        self.log("val/loss", loss, prog_bar=True, batch_size=len(batch["labels"]))
        p = torch.sigmoid(out.logits.float()) >= 0.5
        for row_p, row_g in zip(p.tolist(), batch["labels"].tolist()):
            self._val_pred.append([l for l, v in zip(self.labels, row_p) if v])
            self._val_gold.append([l for l, v in zip(self.labels, row_g) if v >= 0.5])

    def on_validation_epoch_end(self) -> None:
        from .metrics import tag_metrics

        if not self._val_gold:
            return
        m = tag_metrics(self._val_pred, self._val_gold, self.labels)
        self._val_pred, self._val_gold = [], []
        self.last_metrics = m
        for k in ("exact_match", "micro_f1", "macro_f1"):
            self.log(f"val/{k}", float(m[k]), prog_bar=k == "macro_f1")


def trainable_state(module: L.LightningModule) -> dict[str, Any]:
    return {n: p.detach().clone() for n, p in module.named_parameters() if p.requires_grad}
