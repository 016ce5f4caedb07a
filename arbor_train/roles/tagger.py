"""Attribute-tag predictor role: an encoder + LoRA + multi-label head (BCE) over the runtime ontology's
tags, used to filter query-side atomic facts. Each tag's positives are weighted by its
negative/positive ratio over the training examples (capped at `task.pos_weight_max`), since most tags
are rare and plain BCE would push every logit below 0.5."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from .. import data as D
from ..errors import ConfigError
from ..models import add_lora, build_encoder
from ..prompts import PROMPT_VERSION, TAG_TEMPLATE
from .common import Built, Role, RoleModule, cap, load_rows, loaders


class TaggerModule(RoleModule):
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

    def _logits(self, batch: dict) -> torch.Tensor:
        return self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits

    def step_loss(self, batch: dict) -> tuple[torch.Tensor, int, torch.Tensor]:
        logits = self._logits(batch)
        return self._bce(logits, batch["labels"]), len(batch["labels"]), logits

    def collect_validation(self, batch: dict, logits: torch.Tensor) -> None:
        p = torch.sigmoid(logits.detach().float()) >= 0.5
        for row_p, row_g in zip(p.tolist(), batch["labels"].tolist()):
            self._val_pred.append([l for l, v in zip(self.labels, row_p) if v])
            self._val_gold.append([l for l, v in zip(self.labels, row_g) if v >= 0.5])

    def epoch_metrics(self) -> dict[str, Any]:
        from ..scoring.training import tag_metrics

        if not self._val_gold:
            return {}
        m = tag_metrics(self._val_pred, self._val_gold, self.labels)
        self._val_pred, self._val_gold = [], []
        return m


class Tagger(Role):
    name = "tagger"
    bundle_kinds = {"encoder": "encoder_multilabel"}
    report_columns = {"exact_match": "exact match", "micro_f1": "micro F1", "macro_f1": "macro F1", "loss": "held-out loss"}

    def check(self, c: dict) -> None:
        t, m = c["task"], c["model"]
        if m["family"] != "encoder":
            raise ConfigError(f"task={t['name']} with a classification head needs an encoder model, "
                              f"got model={m['name']} (family {m['family']})")

    def build(self, c: dict) -> Built:
        t, dc = c["task"], c["data"]
        tr_rows, va_rows = load_rows(c, ["tags"])
        labels = list(t["labels"])
        model, tok = build_encoder(c["model"], num_labels=len(labels), multilabel=True, seed=c["seed"])
        model = add_lora(model, c["peft"], c["model"], "SEQ_CLS", modules_to_save=list(c["model"]["head_modules"]))
        pad = tok.pad_token_id

        def collate(b):
            return D.collate_tags(b, pad)

        tr = D.tag_examples(cap(tr_rows["tags"], dc.get("max_train_examples")), tok, labels, t["max_length"])
        va = D.tag_examples(cap(va_rows["tags"], dc.get("max_val_examples")), tok, labels, t["max_length"])
        module = TaggerModule(model, c, labels, D.label_pos_weight(tr, t.get("pos_weight_max")))
        train_loader, val_loader = loaders(c, tr, va, collate)
        return Built(module, tok, train_loader, val_loader, D.fingerprint(dc["train_dir"], ["tags"]),
                     {"labels": labels})

    def extras(self, c: dict, built: Built) -> dict[str, Any]:
        return {"labels": built.extras["labels"]}

    def prompt_template(self, kind: str) -> dict:
        if kind == "encoder_multilabel":
            return {"name": "encoder_multilabel", "version": PROMPT_VERSION}
        return TAG_TEMPLATE.to_json()

    def load_base(self, train_cfg: dict, role_json: dict):
        return build_encoder(train_cfg["model"], num_labels=len(role_json["labels"]), multilabel=True,
                             seed=train_cfg["seed"])[0]

    def plug_overrides(self, bundle: Path | str, task: dict) -> list[str]:
        return [f"runtime.tagger.bundle.path={bundle}"]


ROLE = Tagger()
