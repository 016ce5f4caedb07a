"""Memory-commit extractor role: causal-LM SFT on the extraction supervision.

Prompts are the runtime's own (`arbor_train.prompts.extract_messages`, one prompt per extraction kind),
completions the strict JSON the runtime validates; the loss covers completion tokens only (masks are
built with the examples, arbor_train/packing.py) and examples are packed without attention across them.
Validation reports the held-out completion loss, and generates greedily for a fixed held-out sample:
JSON validity, slot key/value F1 (states) and atomic-fact F1 (facts).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from .. import data as D
from ..errors import ConfigError
from ..models import add_lora, build_decoder
from ..packing import (PACKED_ATTENTION, build_sft_example, collate_packed, collate_padded, pack_examples,
                       packed_layout, padding_fraction, real_tokens, use_packed_attention)
from ..prompts import EXTRACT_TEMPLATE, extract_messages, extract_target
from ..wrap import through_root
from .common import Built, Role, RoleModule, load_rows, loaders

def sft_examples(rows, tokenizer, kinds: list[str], max_length: int) -> tuple[list[dict], list[dict], int]:
    """(examples, prompts-with-targets for generation, dropped count) for every row and kind."""
    examples, gen, dropped = [], [], 0
    for r in rows:
        target = json.loads(r["target"])
        for kind in kinds:
            completion = extract_target(kind, target[kind])
            messages = extract_messages(kind, r["input"], r["assistant"], r["timestamp"])
            ex = build_sft_example(tokenizer, messages, completion, max_length)
            if ex is None:
                dropped += 1
                continue
            examples.append(ex)
            gen.append({"kind": kind, "messages": messages, "target": target[kind]})
    return examples, gen, dropped


def build_sft_model(c: dict):
    """(LoRA-wrapped decoder, tokenizer, packed layout or None) for a causal-LM SFT role: the packed
    per-example attention is installed before LoRA wraps the model, gradient checkpointing if configured."""
    t = c["task"]
    model, tok = build_decoder(c["model"], seed=c["seed"])
    layout = None
    if t["packing"]:
        impl = use_packed_attention(model) if t.get("packed_attention", True) else model.config._attn_implementation
        layout = packed_layout(impl)
    if c["model"].get("gradient_checkpointing"):
        model.gradient_checkpointing_enable()
    return add_lora(model, c["peft"], c["model"], "CAUSAL_LM"), tok, layout


def sft_loaders(c: dict, model, tok, layout, tr: list[dict], va: list[dict]):
    """Training and validation loaders of SFT examples: packed (task.packing, task.pack_length) or padded."""
    t = c["task"]
    pad = tok.pad_token_id
    dtype = next(model.parameters()).dtype
    if t["packing"]:
        tr_items, va_items = pack_examples(tr, t["pack_length"]), pack_examples(va, t["pack_length"])

        def collate(b):
            return collate_packed(b, pad, dtype, layout)
    else:
        tr_items, va_items = tr, va

        def collate(b):
            out = collate_padded(b, pad)
            out["position_ids"] = (out["attention_mask"].cumsum(-1) - 1).clamp(min=0)
            return out

    return loaders(c, tr_items, va_items, collate)


class ExtractorModule(RoleModule):
    def __init__(self, model, cfg: dict, tokenizer, gen_examples: list[dict]):
        super().__init__(model, cfg)
        self.tokenizer = tokenizer
        self.gen_examples = gen_examples
        self.padding = []

    def _loss(self, batch: dict) -> torch.Tensor:
        """Mean token NLL over completion tokens; the LM head runs only where a label is predicted
        (`logits_to_keep`), not over every prompt position and its full-vocabulary softmax."""
        labels = batch["labels"]
        target = labels[:, 1:]
        keep = torch.nonzero((target != -100).any(0), as_tuple=False).squeeze(-1)  # positions predicting a label
        extra = {}
        if "attention_mask" not in batch and self.model.config._attn_implementation == PACKED_ATTENTION:
            extra["packed_seq_lens"] = batch["seq_lens"]  # attention within each packed example
        out = self.model(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"),
                         position_ids=batch["position_ids"], use_cache=False, logits_to_keep=keep, **extra)
        logits = out.logits.float()
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 target[:, keep].reshape(-1), ignore_index=-100)

    def step_loss(self, batch: dict) -> tuple[torch.Tensor, int, None]:
        n = sum(len(x) for x in batch["seq_lens"]) if "seq_lens" in batch else batch["input_ids"].shape[0]
        return self._loss(batch), int(n), None

    def count_tokens(self, batch: dict) -> int:
        """Real (non-padding) tokens of a training batch; also records the batch's padding share."""
        self.padding.append(padding_fraction(batch))
        return real_tokens(batch)

    def epoch_metrics(self) -> dict[str, Any]:
        return self.generate_metrics()

    @torch.no_grad()
    def generate_outputs(self, messages: list[list[dict]]) -> list[str]:
        """Greedy completions of the held-out prompts (under FSDP, called through the root: wrap.through_root)."""
        from ..runtime.llm import HFCausalLM

        llm = HFCausalLM.from_parts(self.model, self.tokenizer, batch_size=self.cfg["task"]["gen_batch_size"])
        return llm.chat(messages, max_new_tokens=self.cfg["task"]["max_new_tokens"])

    @torch.no_grad()
    def held_out_outputs(self) -> list[str]:
        """Greedy completions of the fixed held-out sample; the module's train mode is restored after."""
        was_training = self.model.training
        outs = through_root(self, "generate_outputs", [g["messages"] for g in self.gen_examples])
        if was_training:
            self.model.train()
        return outs

    @torch.no_grad()
    def generate_metrics(self) -> dict[str, Any]:
        from ..metrics import fact_f1, json_validity, slot_f1

        if not self.gen_examples:
            return {}
        outs = self.held_out_outputs()
        m: dict[str, Any] = {"json_validity": json_validity(outs), "generated": len(outs)}
        by_kind: dict[str, tuple[list, list]] = {}
        for g, o in zip(self.gen_examples, outs):
            try:
                pred = json.loads(o)
            except json.JSONDecodeError:
                pred = []
            pred = pred if isinstance(pred, list) else []
            by_kind.setdefault(g["kind"], ([], []))
            by_kind[g["kind"]][0].append([p for p in pred if isinstance(p, dict)])
            by_kind[g["kind"]][1].append(g["target"])
        if "states" in by_kind:
            p, t = by_kind["states"]
            m.update({f"slot_{k}": v for k, v in slot_f1([[x for x in s if "key" in x] for s in p], t).items()})
        if "facts" in by_kind:
            p, t = by_kind["facts"]
            r = fact_f1([[str(x.get("text", "")) for x in s] for s in p], [[x["text"] for x in s] for s in t])
            m.update({f"fact_{k}": v for k, v in r.items()})
        m["samples"] = [{"target": g["target"], "output": o} for g, o in list(zip(self.gen_examples, outs))[:3]]
        return m


class Extractor(Role):
    name = "extractor"
    bundle_kinds = {"decoder": "causal_lm"}
    report_columns = {"json_validity": "JSON validity", "slot_key_f1": "slot key F1", "slot_value_f1": "slot value F1", "loss": "held-out loss", "generated": "held-out generations"}

    def check(self, c: dict) -> None:
        if c["model"]["family"] != "decoder":
            raise ConfigError(f"task={c['task']['name']} needs a decoder (causal LM) model, got model={c['model']['name']}")

    def build(self, c: dict) -> Built:
        t, dc = c["task"], c["data"]
        tr_rows, va_rows = load_rows(c, ["extraction"])
        model, tok, layout = build_sft_model(c)
        kinds = list(t["kinds"])
        tr_rows = D.select_rows(tr_rows["extraction"], dc.get("max_train_examples"), t.get("nonempty_share"), kinds)
        va_rows = D.select_rows(va_rows["extraction"], dc.get("max_val_examples"), t.get("nonempty_share"), kinds)
        tr, _, dropped = sft_examples(tr_rows, tok, kinds, t["max_length"])
        va, gen, _ = sft_examples(va_rows, tok, kinds, t["max_length"])
        module = ExtractorModule(model, c, tok, gen[: t["gen_examples"]])
        train_loader, val_loader = sft_loaders(c, model, tok, layout, tr, va)
        return Built(module, tok, train_loader, val_loader, D.fingerprint(dc["train_dir"], ["extraction"]),
                     {"dropped": dropped})

    def extras(self, c: dict, built: Built) -> dict[str, Any]:
        return {"kinds": list(c["task"]["kinds"])}

    def prompt_template(self, kind: str) -> dict:
        return EXTRACT_TEMPLATE.to_json()

    def load_base(self, train_cfg: dict, role_json: dict):
        return build_decoder(train_cfg["model"], seed=train_cfg["seed"])[0]

    def runtime_overrides(self, bundle: Path | str, task: dict) -> list[str]:
        return [f"extractors.{k}.path={bundle}" for k in task["kinds"]]


ROLE = Extractor()
