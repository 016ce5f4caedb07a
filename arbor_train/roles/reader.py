"""Reader role (the answer model): causal-LM SFT on (runtime context, question) -> answer.

The supervision is the `reader` set of `python -m data_gen.reader`: contexts the runtime assembled over
training sessions at varied read budgets and ablations, with "unknown" as the target where the context
lacks the gold. Prompts are the harness's own (`arbor_train.prompts.answer_messages`, READER_TEMPLATE), the
loss covers the answer tokens only, examples are packed with per-example attention: the extractor's
machinery (roles/extractor.py). An example whose prompt does not fit `task.max_length` is dropped and
counted, never truncated (a reader must not learn from a context cut in half).

Validation reports the held-out answer loss and, on a fixed held-out sample, generated answers scored as
the harness scores them (`arbor_train.scoring.answers.answer_correct`): accuracy where the context holds the gold, the
share of "unknown" where it does not, and error categories. The bundle lists the content fingerprints of
its training sessions (`training_sessions`), which the harness checks against the sessions it evaluates.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import torch

from .. import data as D
from ..errors import ConfigError
from ..packing import build_sft_example
from ..prompts import READER_TEMPLATE, UNKNOWN_ANSWER, answer_messages
from .common import Built, Role, load_rows
from .extractor import ExtractorModule, build_sft_model, sft_loaders


def select_reader_rows(rows: list[dict], cap: int | None, unknown_share: float | None, seed: int) -> list[dict]:
    """A reproducible sample of at most `cap` rows in which at most `unknown_share` have the target
    "unknown" (the rest keep their order of appearance)."""
    rng = random.Random(seed)
    rows = list(rows)
    rng.shuffle(rows)
    if unknown_share is not None:
        known = [r for r in rows if r["answer"] != UNKNOWN_ANSWER]
        unknown = [r for r in rows if r["answer"] == UNKNOWN_ANSWER]
        n = len(known) if cap is None else min(len(known), cap)
        keep_u = int(round(n * unknown_share / max(1e-9, 1 - unknown_share))) if unknown_share < 1 else len(unknown)
        rows = known[:n] + unknown[:keep_u]
        rng.shuffle(rows)
    return rows if not cap else rows[:cap]


def reader_examples(rows: list[dict], tokenizer, max_length: int) -> tuple[list[dict], list[dict], int]:
    """(SFT examples, generation prompts with their rows, dropped count): one example per row."""
    examples, gen, dropped = [], [], 0
    for r in rows:
        messages = answer_messages(r["context"], r["input"])
        ex = build_sft_example(tokenizer, messages, r["answer"], max_length, truncate_prompt=False)
        if ex is None:  # the prompt would be cut: drop, do not truncate
            dropped += 1
            continue
        examples.append(ex)
        gen.append({"messages": messages, "row": r})
    return examples, gen, dropped


def reader_scores(preds: list[str], rows: list[dict], locomo: bool = False) -> dict[str, Any]:
    """Generated answers scored as the harness scores them (`locomo`: LoCoMo rows, whose question_type is the
    LoCoMo category, also get LoCoMo's F1)."""
    from arbor_train.scoring.answers import (
        ERROR_CATEGORIES,
        answer_correct,
        error_category,
        locomo_score,
        normalize_answer,
    )

    known = [(p, r) for p, r in zip(preds, rows) if r["gold_in_context"]]
    missing = [(p, r) for p, r in zip(preds, rows) if not r["gold_in_context"]]
    errors = {k: 0 for k in ERROR_CATEGORIES}
    for p, r in zip(preds, rows):
        errors[error_category(p, r["gold"], r["confounder"], r["context"])] += 1
    unknown = normalize_answer(UNKNOWN_ANSWER)
    extra = {"locomo_f1": round(sum(locomo_score(p, r["gold"], int(r["question_type"])) for p, r in zip(preds, rows))
                                / max(1, len(rows)), 4)} if locomo else {}
    return {**extra,
        "answer_accuracy": round(sum(answer_correct(p, r["gold"], r["confounder"]) for p, r in zip(preds, rows))
                                 / max(1, len(rows)), 4),
        "accuracy_gold_in_context": round(sum(answer_correct(p, r["gold"], r["confounder"]) for p, r in known)
                                          / len(known), 4) if known else None,
        "unknown_when_missing": round(sum(normalize_answer(p) == unknown for p, _ in missing) / len(missing), 4)
        if missing else None,
        "generated": len(rows), "errors": errors,
    }


class ReaderModule(ExtractorModule):
    """The extractor's SFT loop (completion-only loss over packed examples); reader metrics at validation."""

    @torch.no_grad()
    def generate_metrics(self) -> dict[str, Any]:
        if not self.gen_examples:
            return {}
        outs = self.held_out_outputs()
        rows = [g["row"] for g in self.gen_examples]
        m = reader_scores(outs, rows, locomo=bool(self.cfg["task"].get("locomo_f1")))
        m["samples"] = [{"question": r["input"], "target": r["answer"], "output": o} for r, o in list(zip(rows, outs))[:3]]
        return m


class Reader(Role):
    name = "reader"
    supervision = "reader"
    bundle_kinds = {"decoder": "causal_lm"}
    report_columns = {"answer_accuracy": "answer accuracy", "locomo_f1": "LoCoMo F1", "accuracy_gold_in_context": "accuracy, gold in context",
                      "unknown_when_missing": "\"unknown\" when the gold is missing", "loss": "held-out loss",
                      "generated": "held-out generations"}

    def check(self, c: dict) -> None:
        if c["model"]["family"] != "decoder":
            raise ConfigError(f"task={c['task']['name']} needs a decoder (causal LM) model, got model={c['model']['name']}")

    def build(self, c: dict) -> Built:
        t, dc = c["task"], c["data"]
        tr_rows, va_rows = load_rows(c, ["reader"])
        # the conversations a fold trains on (LoCoMo: eval.locomo_cv leaves the held-out fold out)
        for rows in (tr_rows, va_rows):
            rows["reader"] = D.of_sessions(rows["reader"], dc.get("sessions"), dc.get("exclude_sessions"), "data")
        if not tr_rows["reader"]:
            raise ConfigError(f"option data.train_dir={dc['train_dir']!r}: no reader rows are left after "
                              f"data.sessions={dc.get('sessions')!r}, data.exclude_sessions={dc.get('exclude_sessions')!r}")
        if t.get("locomo_f1"):
            odd = sorted({str(r.get("question_type")) for r in (*tr_rows["reader"], *va_rows["reader"])}
                         - {"1", "2", "3", "4", "5"})
            if odd:
                raise ConfigError(f"option task.locomo_f1=true needs LoCoMo reader rows (question_type a LoCoMo category "
                                  f"1-5: python -m data_gen.locomo); data.train_dir={dc['train_dir']!r} has {odd[:3]}")
        model, tok, layout = build_sft_model(c)
        share = t.get("unknown_share")
        tr_sel = select_reader_rows(tr_rows["reader"], dc.get("max_train_examples"), share, c["seed"])
        va_sel = select_reader_rows(va_rows["reader"], dc.get("max_val_examples"), share, c["seed"] + 1)
        tr, _, dropped = reader_examples(tr_sel, tok, t["max_length"])
        va, gen, _ = reader_examples(va_sel, tok, t["max_length"])
        if not tr:
            raise ConfigError(f"option task.max_length={t['max_length']}: no reader example of data.train_dir="
                              f"{dc['train_dir']!r} fits (every prompt is longer); raise it or lower the budgets")
        module = ReaderModule(model, c, tok, gen[: t["gen_examples"]])
        train_loader, val_loader = sft_loaders(c, model, tok, layout, tr, va)
        sessions = sorted({r["session_fingerprint"] for r in tr_rows["reader"]})
        fp = D.fingerprint(dc["train_dir"], ["reader"])
        if dc.get("sessions") is not None or dc.get("exclude_sessions"):  # a fold's share of the set
            fp += ":" + json.dumps({"sessions": dc.get("sessions"), "exclude": sorted(map(str, dc.get("exclude_sessions") or []))},
                                   sort_keys=True)
        return Built(module, tok, train_loader, val_loader, fp, {"dropped": dropped, "training_sessions": sessions})

    def extras(self, c: dict, built: Built) -> dict[str, Any]:
        return {"training_sessions": built.extras["training_sessions"]}

    def prompt_template(self, kind: str) -> dict:
        return READER_TEMPLATE.to_json()

    def load_base(self, train_cfg: dict, role_json: dict):
        from ..models import build_decoder

        return build_decoder(train_cfg["model"], seed=train_cfg["seed"])[0]

    def plug_overrides(self, bundle: Path | str, task: dict) -> list[str]:
        return []  # the reader plugs into the harness as its answer model (answer_model=bundle), not the runtime

    def answer_overrides(self, bundle: Path | str) -> list[str]:
        return ["answer_model=bundle", f"answer_model.llm.path={bundle}"]


ROLE = Reader()
