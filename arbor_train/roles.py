"""Per-role wiring: data -> examples -> loaders, model + LoRA -> module, baselines, final adapter.

One function per step, dispatched on cfg.task.role, so train.py stays role-agnostic.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from . import data as D
from .models import add_lora, build_encoder, param_counts
from .modules import RerankerModule, TaggerModule


def _rows(c: dict, names: list[str]):
    dc = c["data"]
    train_sets = D.load_sets(dc["train_dir"], names)
    if dc.get("val_dir"):
        val_sets = D.load_sets(dc["val_dir"], names)
        return {n: list(train_sets[n]) for n in names}, {n: list(val_sets[n]) for n in names}
    tr, va = {}, {}
    for n in names:
        tr[n], va[n] = D.split(list(train_sets[n]), dc["val_fraction"], c["seed"])
    return tr, va


def _cap(items: list, n: int | None) -> list:
    return items if not n else items[:n]


def build(c: dict) -> dict[str, Any]:
    role = c["task"]["role"]
    if role == "reranker":
        return _build_reranker(c)
    if role == "tagger":
        return _build_tagger(c)
    if role == "extractor":
        from .extractor import build_extractor

        return build_extractor(c)
    raise ValueError(f"task.role must be reranker, tagger or extractor, got {role!r}")


def _build_reranker(c: dict) -> dict[str, Any]:
    t, dc = c["task"], c["data"]
    names = list(t["sets"])
    tr_rows, va_rows = _rows(c, names)
    groups = {"train": [], "val": []}
    for split, rows in (("train", tr_rows), ("val", va_rows)):
        for n in names:
            groups[split] += D.rerank_groups(rows[n], n, t["group_size"], t["include_new_root"])
    groups["train"] = _cap(groups["train"], dc.get("max_train_examples"))
    groups["val"] = _cap(groups["val"], dc.get("max_val_examples"))
    llm = c["model"]["family"] == "decoder"
    if llm:  # LLM scorer: p(yes) at the answer position, Qwen3-Reranker layout
        from arbor_train.runtime.llm import _yes_no_ids

        from .models import build_decoder

        model, tok = build_decoder(c["model"], seed=c["seed"])
        model = add_lora(model, c["peft"], c["model"], "CAUSAL_LM")
        yes_no = torch.tensor(_yes_no_ids(tok))
        encode = D.encode_groups_llm
    else:
        model, tok = build_encoder(c["model"], num_labels=1, seed=c["seed"])
        model = add_lora(model, c["peft"], c["model"], "SEQ_CLS", modules_to_save=list(c["model"]["head_modules"]))
        yes_no = None
        encode = D.encode_groups
    module = RerankerModule(model, c)
    pad = tok.pad_token_id

    def collate(b):
        out = D.collate_groups(b, pad)
        if yes_no is not None:
            out["yes_no"] = yes_no
            out.pop("token_type_ids", None)
        return out

    bs = c["task"]["batch_size"]
    train_loader = D.ResumableLoader(encode(groups["train"], tok, t["max_length"]), bs, collate, c["seed"])
    val_loader = D.ResumableLoader(encode(groups["val"], tok, t["max_length"]), bs, collate, c["seed"], shuffle=False)
    return {"module": module, "tokenizer": tok, "train_loader": train_loader, "val_loader": val_loader,
            "groups": groups, "param_counts": param_counts(model),
            "data_fingerprint": D.fingerprint(dc["train_dir"], names)}


def _build_tagger(c: dict) -> dict[str, Any]:
    t, dc = c["task"], c["data"]
    tr_rows, va_rows = _rows(c, ["tags"])
    labels = list(t["labels"])
    model, tok = build_encoder(c["model"], num_labels=len(labels), multilabel=True, seed=c["seed"])
    model = add_lora(model, c["peft"], c["model"], "SEQ_CLS", modules_to_save=list(c["model"]["head_modules"]))
    pad = tok.pad_token_id

    def collate(b):
        return D.collate_tags(b, pad)

    tr = D.tag_examples(_cap(tr_rows["tags"], dc.get("max_train_examples")), tok, labels, t["max_length"])
    va = D.tag_examples(_cap(va_rows["tags"], dc.get("max_val_examples")), tok, labels, t["max_length"])
    module = TaggerModule(model, c, labels, D.label_pos_weight(tr, t.get("pos_weight_max")))
    return {"module": module, "tokenizer": tok, "labels": labels, "param_counts": param_counts(model),
            "train_loader": D.ResumableLoader(tr, t["batch_size"], collate, c["seed"]),
            "val_loader": D.ResumableLoader(va, t["batch_size"], collate, c["seed"], shuffle=False),
            "data_fingerprint": D.fingerprint(dc["train_dir"], ["tags"])}


def baselines(c: dict, built: dict, trainer, val_loader) -> dict[str, Any]:
    """Held-out metrics of the no-model heuristic and of the untuned model, on the same examples."""
    out: dict[str, Any] = {}
    trainer.validate(built["module"], val_loader, verbose=False)
    out["untuned"] = getattr(built["module"], "last_metrics", {})
    if c["task"]["role"] == "reranker":
        from arbor_train.runtime import default_config
        from arbor_train.runtime.rerank import HeuristicReranker
        from arbor_train.runtime.schema import Candidate

        from .metrics import rerank_metrics

        rcfg = default_config()
        h = HeuristicReranker(**rcfg["reranker"]["heuristic"])
        groups = []
        for g in built["groups"]["val"]:
            cands = [Candidate(node_id=x["turn"], topic_key=x["topic_key"], path_summary=x["path_summary"],
                               node_summary=x["node_summary"], entities=list(x["entities"]), seq=x["turn"], root_id=-1,
                               channels=json.loads(x["channels"])) for x in g.cands]
            groups.append({"scores": h.score(g.query, cands), "gold": None if g.gold < 0 else g.gold,
                           "threshold": rcfg["localization"]["new_root_threshold"]})
        out["heuristic"] = rerank_metrics(groups)
    return out


def finalize(c: dict, built: dict, module, run_dir: Path, state_dict: dict | None = None) -> dict[str, Any]:
    """Save the final adapter, tokenizer and role extras where `python -m arbor_train.export` finds them.
    `state_dict`: the model's gathered full weights when its parameters are sharded (FSDP)."""
    final = run_dir / "final"
    final.mkdir(parents=True, exist_ok=True)
    module.model.save_pretrained(str(final / "adapter"), state_dict=state_dict)  # None: the module's own
    built["tokenizer"].save_pretrained(str(final / "tokenizer"))
    extra: dict[str, Any] = {"role": c["task"]["role"], "task": c["task"]["name"]}
    if c["task"]["role"] == "reranker":
        extra["new_root_threshold"] = round(module.threshold, 6)
    if c["task"]["role"] == "tagger":
        extra["labels"] = built["labels"]
    if c["task"]["role"] == "extractor":
        extra["kinds"] = list(c["task"]["kinds"])
    (final / "role.json").write_text(json.dumps(extra, indent=2, sort_keys=True))
    return extra
