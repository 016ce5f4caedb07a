"""BEAM protocol: memory built once per conversation, then its probing questions (10 abilities x 2).
Judge-free: evidence (source_chat_ids) in the context, and Kendall tau for event ordering; rubric items
are scored by the pluggable judge when one is configured."""

from __future__ import annotations

from typing import Any

from .base import Protocol, check_input, evidence_summary, ingest


def load(c: dict) -> list:
    from arbor_train.conversations.beam import load_beam_dir

    return load_beam_dir(c["beam"]["input"])


def replay(conv, method, answers, judge, c: dict) -> tuple[list[dict], list[dict]]:
    import ast

    from arbor_train.scoring.answers import kendall_tau_order
    from eval.judge import rubric_score

    _, idx_of = ingest(conv, method)
    now = conv.end_time
    recs = []
    for q in conv.questions:
        r = method.read(q.question, now, c["budget"])
        ev = {idx_of[e] for e in q.evidence if e in idx_of}
        rec = {"session_id": conv.conversation_id, "question_id": q.question_id, "ability": q.category,
               "context_tokens": r.tokens, "evidence_recall": (len(ev & set(r.turn_ids)) / len(ev)) if ev else None}
        if answers is not None:
            def done(pred, rec=rec, q=q):
                rec["prediction"] = pred
                order = q.extra.get("answer")
                if q.category == "event_ordering" and isinstance(order, str):
                    try:
                        order = ast.literal_eval(order)
                    except (ValueError, SyntaxError):
                        order = None
                if q.category == "event_ordering" and isinstance(order, list):
                    rec["score"] = kendall_tau_order(pred, [str(x) for x in order])
                elif judge is not None:
                    rec["score"] = rubric_score(judge, q.question, pred, list(q.extra.get("rubric") or []))
            answers.ask(r.text, q.question, done)
        recs.append(rec)
    return recs, []


def summarize(recs: list[dict], _: list[dict]) -> dict[str, Any]:
    out: dict[str, Any] = evidence_summary(recs)
    scored = [r for r in recs if r.get("score") is not None]
    if scored:
        by: dict[str, list[float]] = {}
        for r in scored:
            by.setdefault(r["ability"], []).append(r["score"])
        out["score_by_ability"] = {k: round(sum(v) / len(v), 4) for k, v in sorted(by.items())}
        out["overall"] = round(sum(out["score_by_ability"].values()) / len(by), 4)  # mean of ability scores
    return out


PROTOCOL = Protocol(name="beam", check=check_input, load=load, unit_id=lambda conv: conv.conversation_id,
                    replay=replay, summarize=summarize)
