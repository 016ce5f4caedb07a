"""BranchMemEval protocol: replay each session in order; at a question, freeze the committed prefix,
read the context through the method, answer with the shared answer model, score by normalized
rule-based match; the canonical response (not the prediction) continues the replay.

Answer-model-independent metrics are reported for every run: gold-in-context and confounder-in-context
rates, state-localization accuracy (the selected state lies on the gold branch) at questions and, for a
method that routes turns, at every turn, and context tokens.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

from arbor_train.errors import ConfigError, MissingInputError

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


def load_sessions(data_dir: str | Path) -> list[dict]:
    """BranchMemEval sessions (<data_dir>/jsonl/sessions.jsonl), every row schema-checked; ids unique."""
    from data_gen.io import read_rows

    return read_rows(Path(data_dir) / "jsonl" / "sessions.jsonl", "sessions")


def session_fingerprint(sess: dict) -> str:
    """The session's identity by content: a hash of its turns' user and assistant text, in order (ids are
    reused across presets and seeds). Reader supervision records it; a reader bundle lists its own."""
    import hashlib
    import json

    h = hashlib.sha256()
    for t in sess["turns"]:
        h.update(json.dumps([t["user"], t["assistant"]], ensure_ascii=False).encode("utf-8"))
    return h.hexdigest()[:20]


def replay_session(sess: dict, method, answers, budget: int, apply_forget: bool = True,
                   extract_ahead: bool = False, types: set[str] | None = None) -> tuple[list[dict], list[dict]]:
    """Replay one BranchMemEval session online: (question records, turn records).

    A read whose route is None comes from a method that does not localize (its localization is not
    scored); a turn whose observation has a route is scored for routing. A session with a forget request
    (data_gen/branchmem/forgetting.py) has the method `forget` the named turns at the request (unless
    apply_forget is false: the no-deletion control), the answer cache forget the answers built from
    them, and every later read is checked for the forgotten value (`leak`).

    `extract_ahead`: the method's model extractors run over every turn of the session first, in batches
    (`Method.prefetch`). Extraction reads the turn alone, so no read sees a later turn; batched decoding
    may differ from one-at-a-time decoding in the last bits, so it is an option (eval.run extract_ahead).
    `types`: only questions of these types are read (the others are still observed as turns).
    """
    from eval.scoring import answer_correct, context_flags, error_category

    branch = {t["index"]: t["branch"] for t in sess["turns"]}
    qinfo = {q["turn"]: q for q in sess["questions"]}
    forget = sess.get("forget")
    unit = f"{method.name}/{sess['session_id']}"
    qrecs, trecs = [], []
    ahead_s = 0.0  # the batched extraction is ingest work: spread over the session's turns below
    if extract_ahead:
        t0 = time.perf_counter()
        method.prefetch([(t["user"], t["assistant"], t["timestamp"]) for t in sess["turns"]])
        ahead_s = (time.perf_counter() - t0) / max(1, len(sess["turns"]))
    for t in sess["turns"]:
        if t.get("move") == "forget" and apply_forget:
            method.forget(t["forget_turns"])
            if answers is not None:
                answers.forget(unit, t["forget_turns"])
        gold_parent = t["gold_parent"] if t["gold_parent"] >= 0 else None
        if t["is_question"] and (types is None or qinfo[t["index"]]["type"] in types):
            q = qinfo[t["index"]]
            t0 = time.perf_counter()
            r = method.read(t["user"], t["timestamp"], budget)
            read_s = time.perf_counter() - t0
            flags = context_flags(r.text, q["gold"], q["confounder"])
            rec = {"session_id": sess["session_id"], "turn": t["index"], "question_type": q["type"],
                   "dimension": q["dimension"], "specificity": q.get("specificity") or "explicit", "gold": q["gold"], "confounder": q["confounder"],
                   "context_tokens": r.tokens, "read_s": read_s, **flags,
                   "localization_correct": (None if r.route is None
                                            else r.selected_turn is not None and branch.get(r.selected_turn) == q["branch"]),
                   "prediction": None}
            if r.route is not None:  # read_margin: did the read add a runner-up, and was it the question's branch?
                rec["runner_up_read"] = bool(r.runner_up)
                rec["runner_up_right"] = any(branch.get(u) == q["branch"] for u in r.runner_up)
            if r.primary is not None:  # the routed trajectory's own block: the gold, and not the confounder?
                pf = context_flags(r.primary, q["gold"], q["confounder"])
                rec["primary_gold_only"] = pf["gold_in_context"] and not pf["confounder_in_context"]
            if forget is not None:
                rec["after_forget"] = t["index"] > forget["request_turn"]
                rec["leak"] = rec["after_forget"] and context_flags(r.text, forget["value"], None)["gold_in_context"]
            if answers is not None:
                def done(pred, rec=rec, q=q, text=r.text):
                    rec.update(prediction=pred, correct=answer_correct(pred, q["gold"], q["confounder"]),
                               error=error_category(pred, q["gold"], q["confounder"], text))
                answers.ask(r.text, t["user"], done, sources=(unit, r.turn_ids))
            qrecs.append(rec)
        t0 = time.perf_counter()
        obs = method.observe(t["index"], t["user"], t["assistant"], t["timestamp"], t["is_question"])
        ingest_s = time.perf_counter() - t0 + ahead_s
        trecs.append({"ingest_s": ingest_s})
        if obs.route is not None:
            chosen = obs.parent_turn
            ok = (chosen is None) if gold_parent is None else (chosen is not None and branch.get(chosen) == t["branch"])
            trecs[-1].update({"turn": t["index"], "route": obs.route, "correct": ok, "gold_new_root": gold_parent is None,
                              "confidence": obs.confidence, "is_question": t["is_question"]})
            # the runner-up's score, and for a multi-intent turn whether parent and runner-up join its two
            # branches: what any links threshold (localization.secondary.min_score) would have linked
            trecs[-1]["runner_up_score"] = obs.runner_up[1] if obs.runner_up else 0.0
            if t.get("gold_secondary") is not None:  # a multi-intent turn: did it also link the other branch?
                want, pair = branch[t["gold_secondary"]], {t["branch"], branch[t["gold_secondary"]]}
                trecs[-1]["secondary_correct"] = any(branch.get(s) == want for s in obs.secondary)
                trecs[-1]["joined"] = chosen is not None and any({branch.get(chosen), branch.get(s)} == pair
                                                                 for s in obs.secondary)
                trecs[-1]["runner_up_joins"] = (chosen is not None and obs.runner_up is not None
                                                and {branch.get(chosen), branch.get(obs.runner_up[0])} == pair)
            else:
                trecs[-1]["linked"] = bool(obs.secondary)
    return qrecs, trecs


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
    from eval.scoring import ERROR_CATEGORIES, aggregate

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
