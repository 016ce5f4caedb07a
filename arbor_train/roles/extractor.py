"""Memory-commit extractor role: causal-LM SFT on the extraction supervision, or a span-tagging encoder.

Prompts are the runtime's own, in one of two generation layouts (`task.layout`): `kind`, one prompt and one
generation per extraction kind (`arbor_train.prompts.extract_messages`), or `one_pass`, one prompt naming
every kind a row supervises, answered as one JSON object (`extract_all_messages`). Completions are the
strict JSON the runtime validates; the loss covers completion tokens only (masks are built with the
examples, arbor_train/packing.py) and examples are packed without attention across them. Validation reports
the held-out completion loss, and generates greedily for a fixed held-out sample: JSON validity and each
kind's metrics (arbor_train/scoring/training.py extraction_metrics).

The third layout, `spans`, trains an encoder to tag every kind's spans in one forward pass
(arbor_train/runtime/spans.py): token classification, one cross-entropy per channel, the channels a row does
not supervise left out (SpanModule).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import torch

from .. import data as D
from ..errors import ConfigError
from ..models import add_lora, build_decoder, build_token_encoder
from ..packing import (
    PACKED_ATTENTION,
    build_sft_example,
    collate_packed,
    collate_padded,
    pack_examples,
    packed_layout,
    padding_fraction,
    real_tokens,
    use_packed_attention,
)
from ..prompts import (EXTRACT_TEMPLATE, PROMPT_VERSION, extract_all_messages, extract_all_target, extract_messages,
                       extract_target)
from ..wrap import through_root
from .common import Built, Role, RoleModule, load_rows, loaders


def row_target(r: dict, kind: str):
    """A row's supervision for one kind, or None where the row does not supervise it: `summary` comes from
    the row's own field, the other kinds from its JSON target; a row may name the kinds it supervises
    (`_kinds`, set for mixed-in sources such as LoCoMo, whose observations give facts only)."""
    if r.get("_kinds") is not None and kind not in r["_kinds"]:
        return None
    if kind == "summary":
        return r.get("summary") or None
    return json.loads(r["target"]).get(kind)


LAYOUTS = ("kind", "one_pass", "spans")
SPANS = "spans"
ONE_PASS = "one_pass"  # the `kind` of a one-pass generation example (its target maps kinds to targets)


def sft_examples(rows, tokenizer, kinds: list[str], max_length: int, empty_share: float | None = None,
                 layout: str = "kind") -> tuple[list[dict], list[dict], int]:
    """(examples, prompts-with-targets for generation, dropped count): for every row and supervised kind
    (layout `kind`), or one per row holding every kind it supervises (layout `one_pass`).
    empty_share (training only, layout `kind`): per kind, an example whose target is empty ([]) is kept only
    while such examples stay at most this share of the kind's examples; most turns state no event or
    artifact, and a multi-kind adapter fed mostly "[]" learns to write "[]" for every kind. (In one pass
    an empty kind is one key of an object that has others: it is kept.)"""
    if layout not in LAYOUTS:
        raise ConfigError(f"option task.layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    examples, gen, dropped = [], [], 0

    def add(kind: str, messages: list[dict], completion: str, target) -> None:
        nonlocal dropped
        ex = build_sft_example(tokenizer, messages, completion, max_length)
        if ex is None:
            dropped += 1
            return
        examples.append(ex)
        gen.append({"kind": kind, "messages": messages, "target": target})

    if layout == ONE_PASS:
        for r in rows:
            targets = {k: t for k in kinds if (t := row_target(r, k)) is not None}
            if targets:
                add(ONE_PASS, extract_all_messages(list(targets), r["input"], r["assistant"], r["timestamp"]),
                    extract_all_target(targets), targets)
        return examples, gen, dropped
    seen: dict[str, list[int]] = {}  # kind -> [with content, empty]
    for r in rows:
        for kind in kinds:
            target = row_target(r, kind)
            if target is None:
                continue
            n = seen.setdefault(kind, [0, 0])
            if empty_share is not None and not target:
                if n[1] + 1 > empty_share * (n[0] + n[1] + 1):
                    continue
            n[0 if target else 1] += 1
            add(kind, extract_messages(kind, r["input"], r["assistant"], r["timestamp"]),
                extract_target(kind, target), target)
    return examples, gen, dropped


MIX_FORM = ("{dir: PATH, sets: [extraction], kinds: [facts], sessions: null|[ids], exclude_sessions: [ids], "
            "max_rows: N}")


def mix_rows(c: dict) -> tuple[list[dict], list[str], str]:
    """Training rows from `data.mix` (extraction supervision from other sources, e.g. LoCoMo observations
    -> facts), each source limited to its `kinds` and to the sessions (conversations) it names or does not
    exclude; returns (rows, sorted session ids used, fingerprint part). Validation stays on the main data."""
    from ..runtime.extract import KINDS

    t, out, used, fp = c["task"], [], set(), ""
    for k, src in enumerate(c["data"].get("mix") or []):
        if not isinstance(src, dict) or not src.get("dir") or not src.get("sets"):
            raise ConfigError(f"option data.mix[{k}] must be {MIX_FORM}, got {src!r}")
        kinds = list(src.get("kinds") or t["kinds"])
        bad = [x for x in kinds if x not in KINDS]
        if bad:
            raise ConfigError(f"option data.mix[{k}].kinds: unknown extraction kind(s) {bad}; known: {list(KINDS)}")
        sets = D.load_sets(src["dir"], list(src["sets"]))
        rows = [dict(r, _kinds=kinds) for n in src["sets"]
                for r in D.of_sessions(sets[n], src.get("sessions"), src.get("exclude_sessions"), f"data.mix[{k}]")]
        if not rows:
            raise ConfigError(f"option data.mix[{k}]: no rows of {list(src['sets'])} in {src['dir']} are left "
                              f"after sessions={src.get('sessions')!r}, exclude_sessions={src.get('exclude_sessions')!r}")
        # seeded shuffle before the cap: the rows come in file order, so a plain cap would keep the first
        # conversations only (900 of ~1,850 LoCoMo rows were 3 of the 6 training conversations)
        random.Random(c["seed"] + k).shuffle(rows)
        rows = D.select_rows(rows, src.get("max_rows"), t.get("nonempty_share"), kinds)
        used |= {str(r["session_id"]) for r in rows}
        out += rows
        fp += "+" + D.fingerprint(src["dir"], list(src["sets"])) + ":" + json.dumps(
            {"kinds": kinds, "sessions": sorted(map(str, src["sessions"])) if src.get("sessions") is not None else None,
             "exclude": sorted(map(str, src.get("exclude_sessions") or [])),
             "max_rows": src.get("max_rows")}, sort_keys=True)
    return out, sorted(used), fp


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


def spread_kinds(gen: list[dict], n: int) -> list[dict]:
    """n held-out generation prompts, taken round-robin over kinds so that every trained kind is scored
    at validation (rows yield their kinds in order, so a plain prefix favours the first)."""
    by: dict[str, tuple[list[dict], list[dict]]] = {}
    for g in gen:
        by.setdefault(g["kind"], ([], []))[0 if g["target"] else 1].append(g)
    out: list[dict] = []
    # within a kind, targets with content and empty ones alternate (content first): most turns state no
    # event or artifact, and a sample of empty targets would score any model that outputs [] perfectly
    queues = [D.interleave(full, empty) for full, empty in by.values()]
    while len(out) < n and any(queues):
        for q in queues:
            if q and len(out) < n:
                out.append(q.pop(0))
    return out


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
        from ..scoring.training import extraction_metrics, json_validity

        if not self.gen_examples:
            return {}
        outs = self.held_out_outputs()
        m: dict[str, Any] = {"json_validity": json_validity([o for g, o in zip(self.gen_examples, outs)
                                                             if g["kind"] != "summary"] or outs),
                             "generated": len(outs)}
        by_kind: dict[str, tuple[list, list]] = {}
        for g, o in zip(self.gen_examples, outs):
            if g["kind"] == ONE_PASS:  # one object: each kind scored on its key (a missing key predicts nothing)
                try:
                    obj = json.loads(o)
                except json.JSONDecodeError:
                    obj = None
                obj = obj if isinstance(obj, dict) else {}
                for kind, target in g["target"].items():
                    by_kind.setdefault(kind, ([], []))
                    by_kind[kind][0].append(obj.get(kind, "" if kind == "summary" else None))
                    by_kind[kind][1].append(target)
                continue
            if g["kind"] == "summary":
                pred: Any = o
            else:
                try:
                    pred = json.loads(o)
                except json.JSONDecodeError:
                    pred = None
            by_kind.setdefault(g["kind"], ([], []))
            by_kind[g["kind"]][0].append(pred)
            by_kind[g["kind"]][1].append(g["target"])
        for kind, (p, t) in by_kind.items():
            m.update(extraction_metrics(kind, p, t))
        m["samples"] = [{"target": g["target"], "output": o} for g, o in list(zip(self.gen_examples, outs))[:3]]
        return m


def row_targets(r: dict, kinds: list[str]) -> dict[str, Any]:
    """The kinds a row supervises, with their targets."""
    return {k: t for k in kinds if (t := row_target(r, k)) is not None}


def span_examples(rows: list[dict], tok, codec, kinds: list[str], max_length: int) -> list[dict]:
    """One token-classification example per row: ids, and per token and channel the local label (spans.py);
    each keeps its row's index (validation decodes it against the row's targets)."""
    from ..runtime.spans import KIND_CHANNELS, encode, gold_spans

    keys = set(codec.vocab["state_keys"])
    verbs = {w: a for w, (a, _) in codec.vocab["actions"].items()}
    out = []
    for i, r in enumerate(rows):
        targets = row_targets(r, kinds)
        if not targets:
            continue
        pair = (r["input"] or "", r.get("assistant") or "")
        enc = encode(tok, [pair], max_length)
        offs = [tuple(x) for x in enc["offset_mapping"][0].tolist()]
        seq = enc.sequence_ids(0)
        spans = gold_spans(pair[0], pair[1], targets, keys, verbs)
        labels = codec.token_labels(offs, seq, spans, {ch for k in targets for ch in KIND_CHANNELS[k]})
        ex = {k: v[0] for k, v in enc.items() if k != "offset_mapping"}
        out.append({**ex, "labels": torch.tensor(labels), "row": i, "offsets": offs, "seq_ids": seq})
    return out


def collate_spans(batch: list[dict], pad: int) -> dict:
    n = max(len(b["input_ids"]) for b in batch)

    def padded(key: str, fill) -> torch.Tensor:
        x = [b[key] for b in batch]
        return torch.stack([torch.cat([v, torch.full((n - len(v), *v.shape[1:]), fill, dtype=v.dtype)]) for v in x])

    out = {"input_ids": padded("input_ids", pad), "attention_mask": padded("attention_mask", 0),
           "labels": padded("labels", -100), "rows": [b["row"] for b in batch],
           "offsets": [b["offsets"] for b in batch], "seq_ids": [b["seq_ids"] for b in batch]}
    if "token_type_ids" in batch[0]:
        out["token_type_ids"] = padded("token_type_ids", 0)
    return out


class SpanModule(RoleModule):
    """Token classification with one cross-entropy per channel (the mean over channels of the tokens a row
    supervises; `task.o_weight` weighs the `O` tag, which most tokens of every channel carry). Validation
    decodes every held-out row into the runtime's items, through its per-kind validation, and scores each
    kind with the shared metrics (scoring/training.py extraction_metrics)."""

    def __init__(self, model, cfg: dict, codec, val_rows: list[dict], kinds: list[str]):
        super().__init__(model, cfg)
        self.codec, self.val_rows, self.kinds = codec, val_rows, kinds
        self._val: list[tuple[int, dict]] = []

    def _logits(self, batch: dict) -> torch.Tensor:
        kw = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in batch}
        return self.model(**kw).logits.float()

    def step_loss(self, batch: dict) -> tuple[torch.Tensor, int, torch.Tensor]:
        logits = self._logits(batch)
        losses = []
        o_weight = float(self.cfg["task"].get("o_weight", 1.0))
        for c, (off, tags) in enumerate(self.codec.channels.values()):
            y = batch["labels"][..., c].reshape(-1)
            if (y != -100).any():
                w = torch.ones(len(tags), device=logits.device)
                w[0] = o_weight  # `O`: most tokens of every channel
                losses.append(torch.nn.functional.cross_entropy(logits[..., off: off + len(tags)].reshape(-1, len(tags)),
                                                                y, weight=w, ignore_index=-100))
        loss = torch.stack(losses).mean() if losses else logits.sum() * 0
        return loss, len(batch["rows"]), logits

    def collect_validation(self, batch: dict, logits: torch.Tensor) -> None:
        local = self.codec.local_labels(logits)
        for i, row in enumerate(batch["rows"]):
            r = self.val_rows[row]
            spans = self.codec.spans_of(local[i].tolist(), batch["offsets"][i], batch["seq_ids"][i])
            self._val.append((row, self.codec.decode(spans, (r["input"] or "", r.get("assistant") or ""), r.get("timestamp"))))

    def epoch_metrics(self) -> dict[str, Any]:
        from ..runtime.validate import ValidationReport, validate_kind
        from ..scoring.training import extraction_metrics

        if not self._val:
            return {}
        m: dict[str, Any] = {"decoded": len(self._val)}
        by_kind: dict[str, tuple[list, list]] = {}
        for row, out in self._val:
            for kind, target in row_targets(self.val_rows[row], self.kinds).items():
                pred = out[kind] if kind == "summary" else validate_kind(out[kind], kind, ValidationReport())
                by_kind.setdefault(kind, ([], []))
                by_kind[kind][0].append(pred)
                by_kind[kind][1].append(target)
        for kind, (p, t) in by_kind.items():
            m.update(extraction_metrics(kind, p, t))
        self._val = []
        return m


def build_spans(c: dict, tr_rows: list[dict], va_rows: list[dict], kinds: list[str], fp: str, extras: dict) -> Built:
    """The span layout's model, codec and loaders (the vocabulary is learned from the training rows only)."""
    from ..runtime.spans import SpanCodec, learn_vocab

    t = c["task"]
    codec = SpanCodec.build(*learn_vocab([row_targets(r, kinds) for r in tr_rows], int(t.get("vocab_min_count", 2))))
    model, tok = build_token_encoder(c["model"], len(codec.labels), seed=c["seed"])
    model = add_lora(model, c["peft"], c["model"], "TOKEN_CLS", modules_to_save=list(c["model"]["head_modules"]))
    tr = span_examples(tr_rows, tok, codec, kinds, t["max_length"])
    va = span_examples(va_rows, tok, codec, kinds, t["max_length"])
    module = SpanModule(model, c, codec, va_rows, kinds)
    pad = tok.pad_token_id
    train_loader, val_loader = loaders(c, tr, va, lambda b: collate_spans(b, pad))
    return Built(module, tok, train_loader, val_loader, fp, {"codec": codec, "dropped": 0, **extras})


class Extractor(Role):
    name = "extractor"
    bundle_kinds = {"decoder": "causal_lm", "encoder": "encoder_spans"}
    report_columns = {"json_validity": "JSON validity", "slot_key_f1": "slot key F1", "slot_value_f1": "slot value F1",
                      "fact_f1": "fact F1", "entity_f1": "entity F1", "rouge_l": "summary ROUGE-L",
                      "event_exact_f1": "event exact F1", "artifact_exact_f1": "artifact exact F1",
                      "loss": "held-out loss", "generated": "held-out generations"}

    def check(self, c: dict) -> None:
        layout = c["task"].get("layout", "kind")
        if layout not in LAYOUTS:  # before any model is built
            raise ConfigError(f"option task.layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
        family = "encoder" if layout == SPANS else "decoder"
        if c["model"]["family"] != family:
            want = "an encoder" if family == "encoder" else "a decoder (causal LM)"
            raise ConfigError(f"task={c['task']['name']} needs {want} model (task.layout={layout}), got "
                              f"model={c['model']['name']} (family {c['model']['family']})")

    def build(self, c: dict) -> Built:
        t, dc = c["task"], c["data"]
        tr_rows, va_rows = load_rows(c, ["extraction"])
        kinds = list(t["kinds"])
        tr_rows = D.select_rows(tr_rows["extraction"], dc.get("max_train_examples"), t.get("nonempty_share"), kinds)
        va_rows = D.select_rows(va_rows["extraction"], dc.get("max_val_examples"), t.get("nonempty_share"), kinds)
        mixed, mixed_sessions, mix_fp = mix_rows(c)
        tr_rows = D.interleave(tr_rows, mixed)  # both sources spread over the epoch's order
        fp = D.fingerprint(dc["train_dir"], ["extraction"]) + mix_fp
        extras = {"mixed_rows": len(mixed), "mixed_sessions": mixed_sessions}
        if t.get("layout", "kind") == SPANS:
            return build_spans(c, tr_rows, va_rows, kinds, fp, extras)
        model, tok, layout = build_sft_model(c)
        prompts = t.get("layout", "kind")  # (`layout` here is the packed-attention layout)
        tr, _, dropped = sft_examples(tr_rows, tok, kinds, t["max_length"], t.get("empty_share"), prompts)
        va, gen, _ = sft_examples(va_rows, tok, kinds, t["max_length"], layout=prompts)
        module = ExtractorModule(model, c, tok, spread_kinds(gen, t["gen_examples"]))
        train_loader, val_loader = sft_loaders(c, model, tok, layout, tr, va)
        return Built(module, tok, train_loader, val_loader, fp, {"dropped": dropped, **extras})

    def extras(self, c: dict, built: Built) -> dict[str, Any]:
        # the mixed-in sessions (e.g. LoCoMo conversation ids) the bundle was trained on, so an evaluation
        # can refuse to score it on them (eval.run's held-out check)
        out = {"kinds": list(c["task"]["kinds"]), "layout": c["task"].get("layout", "kind"),
               "max_new_tokens": int(c["task"]["max_new_tokens"]), "training_sessions": built.extras["mixed_sessions"]}
        if out["layout"] == SPANS:  # the head's label order and what decoding reads besides the text
            codec = built.extras["codec"]
            out.update(labels=list(codec.labels), span_vocab=codec.vocab)
        return out

    def prompt_template(self, kind: str) -> dict:
        if kind == "encoder_spans":
            return {"name": "encoder_spans", "version": PROMPT_VERSION}
        return EXTRACT_TEMPLATE.to_json()

    def load_base(self, train_cfg: dict, role_json: dict):
        if role_json.get("layout") == SPANS:
            return build_token_encoder(train_cfg["model"], len(role_json["labels"]), seed=train_cfg["seed"])[0]
        return build_decoder(train_cfg["model"], seed=train_cfg["seed"])[0]

    def plug_overrides(self, bundle: Path | str, task: dict) -> list[str]:
        return [f"runtime.extractors.{k}.path={bundle}" for k in task["kinds"]]


ROLE = Extractor()
