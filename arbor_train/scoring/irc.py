"""The Ubuntu IRC reply-structure metrics (Kummerfeld et al., ACL 2019), written from their definitions.

Metrics (`score`), over the annotated messages:
- link precision / recall / F1: the predicted (parent, child) pairs against the gold pairs, self-links
  included;
- conversations are the connected components of each link graph (links into the context join their
  children; context-only messages are then dropped): 1 - VI / log(n) (variation of information, scaled
  by the log of the number of messages), one-to-one overlap (the best one-to-one matching of predicted
  to gold conversations, by shared messages, as a share of all messages; Hungarian matching), and
  exact-match precision / recall / F1 over conversations of two or more messages.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict

from arbor_train.conversations.irc import IrcFile


def _clusters(links: dict[int, set[int]], items: list[int]) -> list[set[int]]:
    """Connected components of the link graph, restricted to `items`."""
    parent: dict[int, int] = {}

    def find(x: int) -> int:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for child, ps in links.items():
        for p in ps:
            ra, rb = find(child), find(p)
            if ra != rb:
                parent[ra] = rb
    groups: dict[int, set[int]] = defaultdict(set)
    for i in items:
        groups[find(i)].add(i)
    return list(groups.values())


def _vi_scaled(gold: list[set[int]], pred: list[set[int]], n: int) -> float:
    g_of = {i: k for k, c in enumerate(gold) for i in c}
    p_of = {i: k for k, c in enumerate(pred) for i in c}
    joint = Counter((g_of[i], p_of[i]) for i in g_of)
    g_n, p_n = Counter(g_of.values()), Counter(p_of.values())
    vi = 0.0
    for (g, p), nij in joint.items():
        pij = nij / n
        vi -= pij * (math.log(pij / (g_n[g] / n)) + math.log(pij / (p_n[p] / n)))
    return 1.0 - vi / math.log(n) if n > 1 else 1.0


def _one_to_one(gold: list[set[int]], pred: list[set[int]], n: int) -> float:
    import numpy as np
    from scipy.optimize import linear_sum_assignment

    overlap = np.array([[len(g & p) for p in pred] for g in gold], dtype=float)
    rows, cols = linear_sum_assignment(-overlap)
    return float(overlap[rows, cols].sum()) / n


def _exact(gold: list[set[int]], pred: list[set[int]]) -> tuple[float, float, float]:
    g = {frozenset(c) for c in gold if len(c) > 1}
    p = {frozenset(c) for c in pred if len(c) > 1}
    hit = len(g & p)
    prec = hit / len(p) if p else 0.0
    rec = hit / len(g) if g else 0.0
    return prec, rec, (2 * prec * rec / (prec + rec) if prec + rec else 0.0)


def score(files: list[IrcFile], predicted: dict[str, dict[int, set[int]]]) -> dict:
    """Link and conversation metrics (in %) over every file's annotated messages; `predicted` maps file
    name -> child line -> predicted parent lines."""
    return score_links([(f.name, f.parents, predicted.get(f.name, {})) for f in files])


def score_links(units: list[tuple[str, dict[int, set[int]], dict[int, set[int]]]]) -> dict:
    """The metrics of (file name, gold links, predicted links) triples, links as child -> parents over
    the annotated children. Link P/R/F pool every file's pairs; conversation metrics average files."""
    tp = n_pred = n_gold = 0
    vi, one, ex_p, ex_r, ex_f = [], [], [], [], []
    for name, gold, pred in units:
        items = sorted(gold)
        missing = [c for c in items if c not in pred]
        if missing:
            raise ValueError(f"{name}: no predicted link for annotated lines {missing[:5]}")
        gold_pairs = {(p, c) for c, ps in gold.items() for p in ps}
        pred_pairs = {(p, c) for c in items for p in pred[c]}
        tp += len(gold_pairs & pred_pairs)
        n_pred += len(pred_pairs)
        n_gold += len(gold_pairs)
        g, p = _clusters(gold, items), _clusters({c: pred[c] for c in items}, items)
        vi.append(_vi_scaled(g, p, len(items)))
        one.append(_one_to_one(g, p, len(items)))
        ep, er, ef = _exact(g, p)
        ex_p.append(ep), ex_r.append(er), ex_f.append(ef)
    prec, rec = tp / n_pred if n_pred else 0.0, tp / n_gold if n_gold else 0.0
    f1 = 2 * prec * rec / (prec + rec) if prec + rec else 0.0

    def pct(x: float) -> float:
        return round(100 * x, 2)

    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    return {"files": len(units), "messages": sum(len(g) for _, g, _ in units),
            "link_precision": pct(prec), "link_recall": pct(rec), "link_f1": pct(f1),
            "one_minus_vi": pct(mean(vi)), "one_to_one": pct(mean(one)),
            "exact_precision": pct(mean(ex_p)), "exact_recall": pct(mean(ex_r)), "exact_f1": pct(mean(ex_f))}
