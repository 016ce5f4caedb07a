"""BranchMemEval protocol: replay each session in order; at a question, freeze the committed prefix,
read the context through the method, answer with the shared answer model, score by normalized
rule-based match; the canonical response (not the prediction) continues the replay.

Answer-model-independent metrics are reported for every run: gold-in-context and confounder-in-context
rates, state-localization accuracy (the selected state lies on the gold branch) at questions and, for a
method that routes turns, at every turn, and context tokens.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from arbor_train.errors import ConfigError, MissingInputError
from arbor_train.replay.sessions import load_sessions, replay_session, session_fingerprint

from .base import Protocol, mean4, percentile


def check(c: dict) -> None:
    data = Path(c["data_dir"]) / "jsonl" / "sessions.jsonl"
    if not data.exists():
        raise MissingInputError(f"option data_dir={c['data_dir']!r}: {data} missing (python -m data_gen.branchmem)")
    question_types(c)


def question_types(c: dict) -> set[str] | None:
    """`branchmem.question_types`: only questions of these types are read, scored and answered (every
    turn is still replayed); null: all. A name the generator does not know is refused, naming the option."""
    from data_gen.branchmem.plan import QUESTION_TYPES

    types = (c.get("branchmem") or {}).get("question_types")
    if types is None:
        return None
    if isinstance(types, str) or not types or any(t not in QUESTION_TYPES for t in types):
        raise ConfigError(f"option branchmem.question_types={types!r}: a non-empty list of "
                          f"{', '.join(QUESTION_TYPES)} (or null for all)")
    return set(types)


def context_shares(rs: list[dict]) -> dict[str, float | None]:
    """Of some question records (not empty): gold in context, confounder in context, gold without the
    confounder, and accuracy when they were answered."""
    out = {"gold_in_context": mean4([r["gold_in_context"] for r in rs]),
           "confounder_in_context": mean4([r["confounder_in_context"] for r in rs]),
           "gold_without_confounder": mean4([r["gold_in_context"] and not r["confounder_in_context"] for r in rs])}
    if "correct" in rs[0]:
        out["accuracy"] = mean4([bool(r["correct"]) for r in rs])
    return out


def by_specificity(qrecs: list[dict]) -> dict[str, dict]:
    """Per specificity level (explicit, partial, referential): questions, gold and confounder in context,
    gold without the confounder, state localization at questions, for a method with a primary-path block
    the share whose block holds the gold and not the confounder, and, with answers, accuracy."""
    from data_gen.branchmem.plan import SPECIFICITY

    out = {}
    for level in SPECIFICITY:
        rs = [r for r in qrecs if r.get("specificity", "explicit") == level]
        if not rs:
            continue
        row = {"questions": len(rs), **context_shares(rs),
               "state_localization": mean4([r["localization_correct"] for r in rs
                                            if r["localization_correct"] is not None])}
        if (prim := mean4([r["primary_gold_only"] for r in rs if r.get("primary_gold_only") is not None])) is not None:
            row["primary_gold_only"] = prim
        out[level] = row
    return out


LINK_THRESHOLDS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)  # min_score values multi_intent sweeps


def multi_intent(qrecs: list[dict], routed: list[dict]) -> dict[str, Any] | None:
    """Multi-intent turns and the questions that depend on them (None when the set has none): routing of
    those turns (primary: the parent's trajectory; secondary: a link into the other branch; joined: parent
    and a link cover both branches, either way round, which is what a read needs), the share of
    single-intent turns that got a link anyway, joined and that share at each links threshold in
    LINK_THRESHOLDS (from the runner-up trajectory's score: one run sweeps
    `localization.secondary.min_score` on held-out data), and, for the linked_fact questions, gold and
    confounder in context, gold without the confounder, and accuracy when answered."""
    turns = [r for r in routed if "secondary_correct" in r]
    qs = [r for r in qrecs if r["dimension"] == "multi_intent"]
    if not turns and not qs:
        return None
    single = [r for r in routed if "linked" in r and not r["is_question"]]
    out: dict[str, Any] = {"turns": len(turns), "primary": mean4([r["correct"] for r in turns]),
                           "secondary": mean4([r["secondary_correct"] for r in turns]),
                           "joined": mean4([r["joined"] for r in turns]),
                           "single_intent_linked": mean4([r["linked"] for r in single]), "questions": len(qs)}
    if turns and all("runner_up_joins" in r for r in turns):  # what each links threshold would have done
        out["by_threshold"] = {str(th): {
            "joined": mean4([r["runner_up_joins"] and r["runner_up_score"] >= th for r in turns]),
            "single_intent_linked": mean4([r["runner_up_score"] >= th for r in single])} for th in LINK_THRESHOLDS}
    if qs:
        out.update(context_shares(qs))
    return out


def runner_up_reads(qrecs: list[dict]) -> dict[str, Any] | None:
    """What `localization.secondary.read_margin` did at questions: the share that read a runner-up
    trajectory, overall and per specificity level, and of the questions localized wrong, how many had
    their own branch as that runner-up (the margin read brought in the right trajectory). None when no
    question read one."""
    rs = [r for r in qrecs if r.get("runner_up_read") is not None]
    if not any(r["runner_up_read"] for r in rs):
        return None
    wrong = [r for r in rs if r["localization_correct"] is False]
    levels = {}
    for r in rs:
        levels.setdefault(r.get("specificity", "explicit"), []).append(r["runner_up_read"])
    return {"questions": len(rs), "read": mean4([r["runner_up_read"] for r in rs]),
            "by_specificity": {k: mean4(v) for k, v in levels.items()},
            "localized_wrong": len(wrong),
            "right_runner_up_when_wrong": mean4([r["runner_up_right"] for r in wrong])}


def calibration_error(routed: list[dict], bins: int = 10) -> float | None:
    """Expected calibration error of the chosen trajectory's confidence against routing correctness over
    the turns that have one (equal-width bins): 0 means the confidences are calibrated."""
    rs = [r for r in routed if r.get("confidence") is not None]
    if not rs:
        return None
    err = 0.0
    for k in range(bins):
        b = [r for r in rs if k / bins <= r["confidence"] < (k + 1) / bins or (k == bins - 1 and r["confidence"] == 1.0)]
        if b:
            err += len(b) / len(rs) * abs(sum(r["confidence"] for r in b) / len(b) - sum(r["correct"] for r in b) / len(b))
    return round(err, 4)


def summarize(qrecs: list[dict], trecs: list[dict]) -> dict[str, Any]:
    from arbor_train.scoring.answers import ERROR_CATEGORIES, aggregate

    n = len(qrecs)
    out: dict[str, Any] = {
        "questions": n,
        "gold_in_context": round(sum(r["gold_in_context"] for r in qrecs) / max(1, n), 4),
        "confounder_in_context": round(sum(r["confounder_in_context"] for r in qrecs) / max(1, n), 4),
        "context_tokens_mean": round(sum(r["context_tokens"] for r in qrecs) / max(1, n), 1),
        "read_s_p50": percentile([r["read_s"] for r in qrecs], 0.5),
        "read_s_p95": percentile([r["read_s"] for r in qrecs], 0.95),
        "ingest_s_per_turn": round(sum(r["ingest_s"] for r in trecs) / len(trecs), 5) if trecs else None,
    }
    routed = [r for r in trecs if "correct" in r]
    loc = [r["localization_correct"] for r in qrecs if r["localization_correct"] is not None]
    out["state_localization_at_questions"] = round(sum(loc) / len(loc), 4) if loc else None
    out["primary_gold_only"] = mean4([r["primary_gold_only"] for r in qrecs if r.get("primary_gold_only") is not None])
    if routed:
        out["state_localization_every_turn"] = round(sum(r["correct"] for r in routed) / len(routed), 4)
        out["routes"] = dict(Counter(r["route"] for r in routed))
    out["by_specificity"] = by_specificity(qrecs)
    if multi := multi_intent(qrecs, routed):
        out["multi_intent"] = multi
    if (ru := runner_up_reads(qrecs)) is not None:
        out["runner_up_reads"] = ru
    if (ece := calibration_error(routed)) is not None:
        out["routing_ece"] = ece
    if qrecs and "correct" in qrecs[0]:
        agg = aggregate(qrecs, ["dimension", "question_type"])
        out["accuracy"] = agg["accuracy"]
        out["accuracy_by_dimension"] = {k: v["accuracy"] for k, v in agg["by"]["dimension"]["groups"].items()}
        out["accuracy_by_type"] = {k: v["accuracy"] for k, v in agg["by"]["question_type"]["groups"].items()}
        out["errors"] = {c: agg["errors"].get(c, 0) for c in ERROR_CATEGORIES}  # every class, hedge included
    return out


PROTOCOL = Protocol(
    name="branchmem", check=check, load=lambda c: load_sessions(c["data_dir"]), unit_id=lambda s: s["session_id"],
    replay=lambda s, method, answers, judge, c: replay_session(s, method, answers, c["budget"],
                                                                  extract_ahead=c.get("extract_ahead", False),
                                                                  types=question_types(c)), summarize=summarize,
    fingerprint=session_fingerprint)
