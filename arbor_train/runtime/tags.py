"""Attribute-tag predictor: ontology tags of a query or a fact (used to filter query-side facts).

One protocol, three families: `HeuristicTagger` (stemmed cue words per tag, from config), a prompted
causal LM, and a tuned bundle (multi-label encoder head, or a causal LM writing a JSON list).
"""

from __future__ import annotations

from ..errors import ConfigError

from typing import Protocol

from ..prompts import tag_messages
from .text import stems
from .validate import ValidationReport, validate_strings


class Tagger(Protocol):
    name: str
    labels: list[str]

    def predict(self, texts: list[str]) -> list[list[str]]: ...


class HeuristicTagger:
    def __init__(self, ontology: dict[str, list[str]]):
        self.name = "heuristic"
        self.labels = list(ontology)
        self._cues = {tag: set().union(*(stems(c) for c in cues)) if cues else set() for tag, cues in ontology.items()}

    def predict(self, texts: list[str]) -> list[list[str]]:
        out = []
        for t in texts:
            st = stems(t)
            out.append([tag for tag, cues in self._cues.items() if st & cues])
        return out


class LLMTagger:
    def __init__(self, llm, labels: list[str]):
        self.llm, self.labels, self.name = llm, labels, f"prompted:{llm.name}"

    def predict(self, texts: list[str]) -> list[list[str]]:
        return [tags for tags, _, _ in self.predict_checked(texts)]

    def predict_checked(self, texts: list[str]) -> list[tuple[list[str], ValidationReport, str]]:
        """Per text: the tags (ontology labels only), the validation report of the output, and the raw output
        (data_gen.distill keeps a teacher's tags only where its output was valid)."""
        raws = self.llm.chat([tag_messages(t, self.labels) for t in texts], max_new_tokens=48)
        out = []
        for raw in raws:
            report = ValidationReport()
            tags = validate_strings(raw, "tags", report)
            unknown = [t for t in tags if t not in self.labels]
            if unknown:
                report.warn("tags", f"labels outside the ontology dropped: {unknown[:3]}")
            out.append(([t for t in tags if t in self.labels], report, raw))
        return out


class EncoderTagger:
    def __init__(self, model, tokenizer, labels: list[str], threshold: float = 0.5, max_length: int = 128,
                 name: str = "encoder_tagger"):
        self.model, self.tokenizer, self.labels = model.eval(), tokenizer, labels
        self.threshold, self.max_length, self.name = threshold, max_length, name

    def predict(self, texts: list[str]) -> list[list[str]]:
        import torch

        if not texts:
            return []
        enc = self.tokenizer(texts, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt")
        with torch.inference_mode():
            p = torch.sigmoid(self.model(**enc).logits.float())
        return [[self.labels[j] for j in range(len(self.labels)) if row[j] >= self.threshold] for row in p]


def build_tagger(cfg, ontology: dict[str, list[str]]) -> Tagger:
    kind = cfg["kind"]
    opts = dict(cfg.get(kind) or {})
    if kind == "heuristic":
        return HeuristicTagger(ontology)
    if kind == "prompted":
        from .llm import build_llm

        return LLMTagger(build_llm(opts["llm"]), list(ontology))
    if kind == "bundle":
        cfg = opts
        if not cfg.get("path"):
            raise ConfigError("runtime option tagger.bundle.path is required when tagger.kind=bundle")
        from .bundle import load_bundle
        from .llm import HFCausalLM

        b = load_bundle(cfg["path"], role="tagger", base_model=cfg.get("base_model"))
        model, tok = b.load_model(base_override=cfg.get("base_override"))
        if b.kind == "encoder_multilabel":
            return EncoderTagger(model, tok, b.manifest["labels"], cfg.get("threshold", 0.5),
                                 int(b.manifest.get("max_length", 128)), name=f"bundle:{cfg['path']}")
        return LLMTagger(HFCausalLM.from_parts(model, tok, name=f"bundle:{cfg['path']}"),
                         b.manifest.get("labels") or list(ontology))
    raise ConfigError(f"runtime option tagger.kind must be heuristic, prompted or bundle, got {kind!r}")
