"""Metric functions shared by training-time validation and the evaluation harness.

Everything here is plain Python over plain data (lists, dicts, strings, floats), so the same numbers
come out of a Lightning validation loop and of an offline evaluation script. All returned numbers
are Python ``float``/``int`` (or ``None`` where a metric is undefined, see each function).

Metrics
-------
``rerank_metrics(groups)``
    Router / reranker quality. Each group is one routing decision: a score per candidate node, the
    index of the gold candidate (``None`` when the right answer is "open a new root") and an optional
    new-root threshold.

    * ``acc@1``: over groups whose gold is not ``None``, the share whose top-scoring candidate is
      the gold one. Ties are broken by the lowest index (what ``argmax`` does). The threshold does
      not affect it: it is a pure ranking metric.
    * ``mrr``: over the same groups, mean of ``1 / rank(gold)``, where the rank uses the same tie
      rule: ``rank = 1 + #{j: s_j > s_gold} + #{j < gold: s_j == s_gold}``.
    * ``new_root_precision`` / ``new_root_recall`` / ``new_root_f1``: a group is *predicted* new root
      when it has no candidates, or when its threshold is not ``None`` and ``max(scores) < threshold``
      (a group without a threshold and with candidates is never predicted new root). The positive
      class is "gold is ``None``". Precision is ``TP / #predicted``, recall is ``TP / #gold``, and
      F1 is ``2 TP / (#predicted + #gold)`` (the harmonic mean of the two when both exist, and 0.0
      when one exists and TP is 0). Each is ``None`` when its denominator is zero (F1: when there is
      neither a predicted nor a gold new root).
    * ``groups`` / ``with_gold``: number of groups, and of groups whose gold is not ``None``.
      ``acc@1`` and ``mrr`` are ``None`` when ``with_gold`` is 0.

``json_validity(texts)``
    Share of strings that ``json.loads`` accepts exactly as given: no stripping of Markdown fences,
    no repair. (``json.loads`` itself tolerates surrounding whitespace and the ``NaN``/``Infinity``
    literals; that is kept as-is.) An empty list gives 0.0.

``slot_f1(pred, gold)``
    Slot extraction, micro-averaged over all examples. Each example is a list of ``{"key", "value"}``
    dicts, compared as multisets (a slot repeated twice in gold must be predicted twice to get
    both credits). ``key_*`` compares keys only (exact strings); ``value_*`` compares
    ``(key, normalize_value(value))`` pairs, where normalization lowercases, collapses whitespace,
    and strips surrounding whitespace and the punctuation ``.,;:!?"'`` (inner punctuation stays).
    Conventions for empty sets, applied to the *totals* over all examples: F1 is
    ``2 TP / (#pred + #gold)``; when there are no predicted and no gold slots at all every
    precision/recall/F1 is 1.0 (nothing to find and nothing predicted is a perfect answer). When only
    one side is empty, the undefined ratio is 0.0 (no predictions for existing gold: precision 0.0;
    predictions with no gold: recall 0.0). An example with empty pred and empty gold adds nothing.

``fact_f1(pred, gold, threshold=0.5)``
    Atomic-fact extraction. Per example, facts are matched one-to-one greedily: every
    (pred, gold) pair is scored with ``token_f1``, pairs are visited by decreasing score (ties: lower
    pred index, then lower gold index) and a pair is matched when its score is ``>= threshold`` and
    neither fact is matched yet. So a predicted fact can match at most one gold fact and vice versa.
    Matches are summed over examples into micro precision/recall/F1 with the same empty-set
    conventions as ``slot_f1``.

``token_f1(pred, gold)``
    SQuAD-style token F1: both strings are normalized (lowercased, ASCII punctuation removed, the
    articles a/an/the dropped, split on whitespace) and F1 is computed over the multiset overlap of
    tokens. Two strings with no tokens score 1.0; exactly one without tokens scores 0.0.

``tag_metrics(pred, gold, labels)``
    Multi-label tagging. Each example's tags are treated as a set (duplicates collapse).

    * ``exact_match``: share of examples whose predicted set equals the gold set (``None`` for no
      examples).
    * ``per_label``: F1 of each label in ``labels`` as a binary decision over examples. A label with
      no gold and no predicted positives gets 1.0 (it was correctly never predicted).
    * ``macro_f1``: unweighted mean of ``per_label`` (so rare labels weigh as much as frequent ones,
      and labels absent from the data count as 1.0).
    * ``micro_f1``: ``2 TP / (#pred + #gold)`` summed over all labels and examples, 1.0 when there
      are no positives at all. A predicted tag that is not in ``labels`` counts as a false positive
      here (and breaks exact match) but has no ``per_label`` entry; a gold tag outside ``labels``
      raises ``ValueError`` (the label inventory is wrong).
"""

from __future__ import annotations

import json
import math
import operator
import string
from collections import Counter
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any

__all__ = [
    "fact_f1",
    "json_validity",
    "normalize_value",
    "rerank_metrics",
    "slot_f1",
    "tag_metrics",
    "token_f1",
    "tokenize_for_f1",
]

# Characters stripped from both ends of a slot value (together with whitespace).
_VALUE_STRIP_CHARS = ".,;:!?\"' \t\n\r\f\v"
_PUNCT_TABLE = str.maketrans("", "", string.punctuation)
_ARTICLES = frozenset({"a", "an", "the"})


# --------------------------------------------------------------------------------------------------
# helpers


def _check_same_length(pred: Sequence[Any], gold: Sequence[Any]) -> None:
    if len(pred) != len(gold):
        raise ValueError(f"pred has {len(pred)} examples but gold has {len(gold)}")


def _prf(tp: int, n_pred: int, n_gold: int) -> tuple[float, float, float]:
    """Micro precision/recall/F1 with the conventions described in the module docstring."""
    if n_pred == 0 and n_gold == 0:
        return 1.0, 1.0, 1.0
    precision = tp / n_pred if n_pred else 0.0
    recall = tp / n_gold if n_gold else 0.0
    f1 = 2 * tp / (n_pred + n_gold)
    return precision, recall, f1


def multiset_counts(pred: Iterable[Hashable], gold: Iterable[Hashable]) -> tuple[int, int, int]:
    """(overlap, #pred, #gold) of two multisets."""
    p, g = Counter(pred), Counter(gold)
    return sum((p & g).values()), sum(p.values()), sum(g.values())


# --------------------------------------------------------------------------------------------------
# reranking / routing


def _gold_rank(scores: Sequence[float], gold: int) -> int:
    """1-based rank of ``gold``; equal scores are ordered by index (lowest first)."""
    s_gold = scores[gold]
    higher = sum(1 for s in scores if s > s_gold)
    tied_before = sum(1 for s in scores[:gold] if s == s_gold)
    return 1 + higher + tied_before


def rerank_metrics(groups: list[dict]) -> dict:
    """Ranking and new-root detection metrics over routing groups.

    Args:
        groups: one dict per routing decision with ``"scores"`` (a float per candidate),
            ``"gold"`` (index of the gold candidate, or ``None`` when the gold decision is a new
            root) and optionally ``"threshold"`` (``None`` or a float; a group is predicted new root
            when it has no candidates or when ``max(scores) < threshold``).

    Returns:
        ``{"acc@1", "mrr", "new_root_precision", "new_root_recall", "new_root_f1", "groups",
        "with_gold"}``; see the module docstring for definitions and when a value is ``None``.

    Raises:
        ValueError: on a gold index outside the candidate list or a NaN score.
    """
    n_groups = 0
    with_gold = 0
    top1_hits = 0
    rr_sum = 0.0
    pred_new = 0
    gold_new = 0
    tp_new = 0
    for i, group in enumerate(groups):
        n_groups += 1
        scores = [float(s) for s in group["scores"]]
        if any(math.isnan(s) for s in scores):
            raise ValueError(f"group {i}: NaN score")
        gold = group.get("gold")
        threshold = group.get("threshold")

        predicted_new_root = not scores or (threshold is not None and max(scores) < float(threshold))
        pred_new += predicted_new_root

        if gold is None:
            gold_new += 1
            tp_new += predicted_new_root
            continue

        gold_idx = operator.index(gold)
        if not 0 <= gold_idx < len(scores):
            raise ValueError(f"group {i}: gold index {gold_idx} outside {len(scores)} candidates")
        with_gold += 1
        rank = _gold_rank(scores, gold_idx)
        top1_hits += rank == 1
        rr_sum += 1.0 / rank

    return {
        "acc@1": top1_hits / with_gold if with_gold else None,
        "mrr": rr_sum / with_gold if with_gold else None,
        "new_root_precision": tp_new / pred_new if pred_new else None,
        "new_root_recall": tp_new / gold_new if gold_new else None,
        "new_root_f1": 2 * tp_new / (pred_new + gold_new) if pred_new + gold_new else None,
        "groups": n_groups,
        "with_gold": with_gold,
    }


# --------------------------------------------------------------------------------------------------
# JSON validity


def json_validity(texts: list[str]) -> float:
    """Share of ``texts`` that ``json.loads`` parses as given (no fence stripping, no repair).

    Returns 0.0 for an empty list.
    """
    if not texts:
        return 0.0
    valid = 0
    for text in texts:
        try:
            json.loads(text)
        except (ValueError, TypeError):  # json.JSONDecodeError is a ValueError
            continue
        valid += 1
    return valid / len(texts)


# --------------------------------------------------------------------------------------------------
# slots


def normalize_value(value: Any) -> str:
    """Normalize a slot value: lowercase, collapse whitespace, strip surrounding ``.,;:!?"'``.

    Non-string values are converted with ``str`` (``None`` becomes the empty string).
    """
    text = "" if value is None else str(value)
    text = " ".join(text.lower().split())
    return text.strip(_VALUE_STRIP_CHARS)


def _slot_key(slot: Mapping[str, Any]) -> str:
    try:
        return str(slot["key"])
    except (KeyError, TypeError) as exc:
        raise ValueError(f"slot without a 'key': {slot!r}") from exc


def slot_f1(pred: list[list[dict]], gold: list[list[dict]]) -> dict:
    """Micro precision/recall/F1 of slot keys and of (key, normalized value) pairs.

    Args:
        pred: per example, the predicted slots (dicts with ``"key"`` and ``"value"``).
        gold: per example, the gold slots, same length as ``pred``.

    Returns:
        ``{"key_precision", "key_recall", "key_f1", "value_precision", "value_recall",
        "value_f1"}``; multiset matching per example, totals summed over examples. With no
        predicted and no gold slots at all, every value is 1.0.

    Raises:
        ValueError: when the lengths differ or a slot has no ``"key"``.
    """
    _check_same_length(pred, gold)
    key_tp = key_np = key_ng = 0
    val_tp = val_np = val_ng = 0
    for p_slots, g_slots in zip(pred, gold):
        p_keys = [_slot_key(s) for s in p_slots]
        g_keys = [_slot_key(s) for s in g_slots]
        tp, n_p, n_g = multiset_counts(p_keys, g_keys)
        key_tp, key_np, key_ng = key_tp + tp, key_np + n_p, key_ng + n_g

        p_pairs = [(k, normalize_value(s.get("value"))) for k, s in zip(p_keys, p_slots)]
        g_pairs = [(k, normalize_value(s.get("value"))) for k, s in zip(g_keys, g_slots)]
        tp, n_p, n_g = multiset_counts(p_pairs, g_pairs)
        val_tp, val_np, val_ng = val_tp + tp, val_np + n_p, val_ng + n_g

    kp, kr, kf = _prf(key_tp, key_np, key_ng)
    vp, vr, vf = _prf(val_tp, val_np, val_ng)
    return {
        "key_precision": kp,
        "key_recall": kr,
        "key_f1": kf,
        "value_precision": vp,
        "value_recall": vr,
        "value_f1": vf,
    }


# --------------------------------------------------------------------------------------------------
# facts


def tokenize_for_f1(text: str) -> list[str]:
    """SQuAD normalization: lowercase, drop ASCII punctuation and the articles a/an/the, split."""
    return [tok for tok in text.lower().translate(_PUNCT_TABLE).split() if tok not in _ARTICLES]


def token_f1(pred: str, gold: str) -> float:
    """SQuAD-style token F1 between two strings (multiset overlap of normalized tokens).

    Two strings without tokens score 1.0; exactly one without tokens scores 0.0.
    """
    p_tokens = tokenize_for_f1(pred)
    g_tokens = tokenize_for_f1(gold)
    if not p_tokens or not g_tokens:
        return float(p_tokens == g_tokens)
    common = sum((Counter(p_tokens) & Counter(g_tokens)).values())
    if common == 0:
        return 0.0
    precision = common / len(p_tokens)
    recall = common / len(g_tokens)
    return 2 * precision * recall / (precision + recall)


def _greedy_matches(pred: Sequence[str], gold: Sequence[str], threshold: float) -> int:
    """Number of one-to-one greedy matches with ``token_f1 >= threshold``."""
    pairs = []
    for i, p in enumerate(pred):
        for j, g in enumerate(gold):
            score = token_f1(p, g)
            if score >= threshold:
                pairs.append((-score, i, j))
    pairs.sort()
    used_pred: set[int] = set()
    used_gold: set[int] = set()
    for _, i, j in pairs:
        if i in used_pred or j in used_gold:
            continue
        used_pred.add(i)
        used_gold.add(j)
    return len(used_pred)


def fact_f1(pred: list[list[str]], gold: list[list[str]], threshold: float = 0.5) -> dict:
    """Micro precision/recall/F1 of atomic facts under greedy one-to-one token-F1 matching.

    Args:
        pred: per example, the predicted facts.
        gold: per example, the gold facts, same length as ``pred``.
        threshold: minimum ``token_f1`` for two facts to match, in ``[0, 1]``.

    Returns:
        ``{"precision", "recall", "f1"}``; 1.0 each when there are no facts on either side.

    Raises:
        ValueError: when the lengths differ or the threshold is outside ``[0, 1]``.
    """
    _check_same_length(pred, gold)
    if not 0.0 <= threshold <= 1.0:
        raise ValueError(f"threshold must be in [0, 1], got {threshold}")
    tp = n_pred = n_gold = 0
    for p_facts, g_facts in zip(pred, gold):
        tp += _greedy_matches(p_facts, g_facts, threshold)
        n_pred += len(p_facts)
        n_gold += len(g_facts)
    precision, recall, f1 = _prf(tp, n_pred, n_gold)
    return {"precision": precision, "recall": recall, "f1": f1}


# --------------------------------------------------------------------------------------------------
# every extraction kind


def rouge_l(pred: list[str], gold: list[str]) -> float:
    """Mean ROUGE-L F-measure (the `rouge-score` package, stemmed) of paired strings; 0.0 for no pairs."""
    from rouge_score import rouge_scorer

    _check_same_length(pred, gold)
    if not pred:
        return 0.0
    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    return sum(scorer.score(g, p)["rougeL"].fmeasure for p, g in zip(pred, gold)) / len(pred)


def _items(x: Any) -> list[dict]:
    return [i for i in x if isinstance(i, dict)] if isinstance(x, list) else []


def _strings(x: Any) -> list[str]:
    return [str(i) for i in x if isinstance(i, (str, int, float))] if isinstance(x, list) else []


def _event_key(e: Mapping[str, Any]) -> tuple:
    q = e.get("quantity")
    try:
        q = round(float(q), 4) if q is not None else None
    except (TypeError, ValueError):
        q = normalize_value(q)
    return normalize_value(e.get("subject")), normalize_value(e.get("action")), q


def _artifact_key(a: Mapping[str, Any]) -> tuple:
    return normalize_value(a.get("name")), tuple(normalize_value(i) for i in _strings(a.get("items")))


def _micro(pairs: Iterable[tuple[list, list]]) -> dict:
    tp = n_p = n_g = 0
    for p, g in pairs:
        a, b, c = multiset_counts(p, g)
        tp, n_p, n_g = tp + a, n_p + b, n_g + c
    precision, recall, f1 = _prf(tp, n_p, n_g)
    return {"precision": precision, "recall": recall, "f1": f1}


def extraction_metrics(kind: str, pred: list[Any], gold: list[Any], threshold: float = 0.5) -> dict:
    """Held-out quality of one extraction kind over paired outputs (parsed JSON, or text for summary):

    - summary: ``rouge_l`` (mean ROUGE-L F);
    - entities: micro P/R/F1 of normalized strings (``entity_*``);
    - facts: ``fact_f1`` over fact texts at ``threshold`` (``fact_*``);
    - states: ``slot_f1`` (``slot_*``);
    - events: exact micro F1 of (subject, action, quantity) (``event_exact_f1``) and token-F1-matched F1
      of event texts (``event_text_f1``);
    - artifacts: exact micro F1 of (name, ordered items) (``artifact_exact_f1``) and micro F1 of
      normalized items (``artifact_item_f1``).
    A prediction that is not a list (invalid JSON parsed to None) counts as predicting nothing.
    """
    _check_same_length(pred, gold)
    if kind == "summary":
        return {"rouge_l": rouge_l([str(p or "") for p in pred], [str(g or "") for g in gold])}
    if kind == "entities":
        m = _micro(([normalize_value(x) for x in _strings(p)], [normalize_value(x) for x in _strings(g)])
                   for p, g in zip(pred, gold))
        return {f"entity_{k}": v for k, v in m.items()}
    if kind == "facts":
        r = fact_f1([[str(x.get("text", "")) for x in _items(p)] for p in pred],
                    [[str(x.get("text", "")) for x in _items(g)] for g in gold], threshold)
        return {f"fact_{k}": v for k, v in r.items()}
    if kind == "states":
        r = slot_f1([[x for x in _items(p) if "key" in x] for p in pred], [_items(g) for g in gold])
        return {f"slot_{k}": v for k, v in r.items()}
    if kind == "events":
        exact = _micro(([_event_key(x) for x in _items(p)], [_event_key(x) for x in _items(g)])
                       for p, g in zip(pred, gold))
        text = fact_f1([[str(x.get("text", "")) for x in _items(p)] for p in pred],
                       [[str(x.get("text", "")) for x in _items(g)] for g in gold], threshold)
        return {"event_exact_f1": exact["f1"], "event_text_f1": text["f1"]}
    if kind == "artifacts":
        exact = _micro(([_artifact_key(x) for x in _items(p)], [_artifact_key(x) for x in _items(g)])
                       for p, g in zip(pred, gold))
        items = _micro(([normalize_value(i) for x in _items(p) for i in _strings(x.get("items"))],
                        [normalize_value(i) for x in _items(g) for i in _strings(x.get("items"))])
                       for p, g in zip(pred, gold))
        return {"artifact_exact_f1": exact["f1"], "artifact_item_f1": items["f1"]}
    raise ValueError(f"unknown extraction kind {kind!r}")


# --------------------------------------------------------------------------------------------------
# tags


def tag_metrics(pred: list[list[str]], gold: list[list[str]], labels: list[str]) -> dict:
    """Exact match, micro/macro F1 and per-label F1 of multi-label tagging.

    Args:
        pred: per example, the predicted tags (a duplicate tag counts once).
        gold: per example, the gold tags, same length as ``pred``.
        labels: the label inventory (non-empty; duplicates ignored, order kept in ``per_label``).

    Returns:
        ``{"exact_match", "micro_f1", "macro_f1", "per_label": {label: f1}}``; see the module
        docstring for the conventions (absent labels score 1.0, out-of-inventory predictions are
        false positives for micro F1, ``exact_match`` is ``None`` for no examples).

    Raises:
        ValueError: when the lengths differ, ``labels`` is empty, or a gold tag is not in ``labels``.
    """
    _check_same_length(pred, gold)
    inventory = list(dict.fromkeys(labels))
    if not inventory:
        raise ValueError("labels must not be empty")
    known = set(inventory)
    tp = dict.fromkeys(inventory, 0)
    n_pred = dict.fromkeys(inventory, 0)
    n_gold = dict.fromkeys(inventory, 0)
    unknown_pred = 0
    exact = 0
    for p_tags, g_tags in zip(pred, gold):
        p_set, g_set = set(p_tags), set(g_tags)
        stray = g_set - known
        if stray:
            raise ValueError(f"gold tags not in labels: {sorted(stray)}")
        exact += p_set == g_set
        unknown_pred += len(p_set - known)
        for label in p_set & known:
            n_pred[label] += 1
        for label in g_set:
            n_gold[label] += 1
        for label in p_set & g_set:
            tp[label] += 1

    per_label = {
        label: (2 * tp[label] / (n_pred[label] + n_gold[label]) if n_pred[label] + n_gold[label] else 1.0)
        for label in inventory
    }
    total_tp = sum(tp.values())
    total_pred = sum(n_pred.values()) + unknown_pred
    total_gold = sum(n_gold.values())
    micro = 2 * total_tp / (total_pred + total_gold) if total_pred + total_gold else 1.0
    return {
        "exact_match": exact / len(gold) if gold else None,
        "micro_f1": micro,
        "macro_f1": sum(per_label.values()) / len(per_label),
        "per_label": per_label,
    }
