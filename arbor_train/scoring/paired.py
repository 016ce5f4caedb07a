"""Is a difference real? Two readers (or memories) answered the same questions; these compare them.

- `wilson`: a 95% interval for one accuracy (Wilson score interval, scipy's binomtest).
- `paired`: a - b on the same questions: each accuracy, the difference with Newcombe's interval for paired
  proportions (Newcombe 1998, "Improved confidence intervals for the difference between binomial
  proportions based on paired data", method 10: Wilson intervals of each margin, corrected by the
  correlation of the pairs), and the exact two-sided sign test on the discordant questions (McNemar's exact
  test: under no difference, a question one gets right and the other wrong goes either way with
  probability 1/2).
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def wilson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval of k successes in n."""
    from scipy.stats import binomtest

    if n == 0:
        return 0.0, 1.0
    ci = binomtest(k, n).proportion_ci(confidence_level=confidence, method="wilson")
    return float(ci.low), float(ci.high)


def sign_test(wins: int, losses: int) -> float:
    """Exact two-sided p-value of `wins` against `losses` discordant pairs under p = 1/2 (1.0 with none)."""
    from scipy.stats import binomtest

    n = wins + losses
    return 1.0 if n == 0 else float(binomtest(wins, n, 0.5).pvalue)


def paired(a: Sequence[bool], b: Sequence[bool], confidence: float = 0.95) -> dict:
    """a against b, question by question (the same questions, in the same order)."""
    if len(a) != len(b):
        raise ValueError(f"paired: {len(a)} answers against {len(b)}; both must answer the same questions")
    n = len(a)
    both = sum(1 for x, y in zip(a, b) if x and y)
    only_a = sum(1 for x, y in zip(a, b) if x and not y)
    only_b = sum(1 for x, y in zip(a, b) if y and not x)
    neither = n - both - only_a - only_b
    if n == 0:
        return {"questions": 0, "a": None, "b": None, "difference": None, "ci": (None, None),
                "a_only": 0, "b_only": 0, "sign_test_p": 1.0}
    p1, p2 = (both + only_a) / n, (both + only_b) / n
    l1, u1 = wilson(both + only_a, n, confidence)
    l2, u2 = wilson(both + only_b, n, confidence)
    den = (both + only_a) * (only_b + neither) * (both + only_b) * (only_a + neither)
    phi = (both * neither - only_a * only_b) / math.sqrt(den) if den else 0.0
    d = p1 - p2
    lo = d - math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    hi = d + math.sqrt(max(0.0, (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2))
    return {"questions": n, "a": p1, "b": p2, "difference": d, "ci": (max(-1.0, lo), min(1.0, hi)),
            "a_only": only_a, "b_only": only_b, "sign_test_p": sign_test(only_a, only_b)}
