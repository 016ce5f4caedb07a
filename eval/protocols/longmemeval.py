"""LongMemEval protocol: each question has its own haystack, so the memory is built per question;
retrieval is judged at turn and session level on the evidence (has_answer) turns the context holds,
answers by the pluggable judge when one is configured."""

from __future__ import annotations

import time
from typing import Any

from .base import Protocol, check_input, ingest, percentile


def load(c: dict) -> list:
    from arbor_train.conversations.longmemeval import load_longmemeval

    return load_longmemeval(c["longmemeval"]["input"])


def replay(conv, method, answers, judge, c: dict) -> tuple[list[dict], list[dict]]:
    inters, idx_of = ingest(conv, method)
    q = conv.questions[0]
    t0 = time.perf_counter()
    r = method.read(q.question, q.question_date, c["budget"])
    read_s = time.perf_counter() - t0
    ev = {idx_of[e] for e in q.evidence if e in idx_of}
    got = set(r.turn_ids)
    ev_sessions = {inters[i].session_id for i in ev}
    got_sessions = {inters[i].session_id for i in got if 0 <= i < len(inters)}
    rec = {"session_id": conv.conversation_id, "question_id": q.question_id, "question_type": q.category,
           "abstention": bool(q.extra.get("abstention")), "context_tokens": r.tokens, "read_s": read_s,
           "turn_recall_any": (bool(ev & got) if ev else None), "turn_recall_all": (ev <= got if ev else None),
           "session_recall_any": (bool(ev_sessions & got_sessions) if ev_sessions else None),
           "session_recall_all": (ev_sessions <= got_sessions if ev_sessions else None)}
    if answers is not None:
        def done(pred):
            rec["prediction"] = pred
            if judge is not None:
                rec["correct"] = judge.correct(q.category, q.question, q.answer or "", pred, rec["abstention"])
        answers.ask(r.text, q.question, done)
    return [rec], []


def summarize(recs: list[dict], _: list[dict]) -> dict[str, Any]:
    from arbor_train.scoring.answers import aggregate

    out: dict[str, Any] = {"questions": len(recs),
                           "context_tokens_mean": round(sum(r["context_tokens"] for r in recs) / max(1, len(recs)), 1),
                           "read_s_p50": percentile([r["read_s"] for r in recs], 0.5),
                           "read_s_p95": percentile([r["read_s"] for r in recs], 0.95)}
    for k in ("turn_recall_any", "turn_recall_all", "session_recall_any", "session_recall_all"):
        v = [r[k] for r in recs if r[k] is not None and not r["abstention"]]  # abstention questions skipped
        out[k] = round(sum(v) / len(v), 4) if v else None
    judged = [r for r in recs if "correct" in r]
    if judged:
        agg = aggregate(judged, ["question_type"])
        out["accuracy"] = agg["accuracy"]
        by = {k: v["accuracy"] for k, v in agg["by"]["question_type"]["groups"].items()}
        out["accuracy_by_type"] = by
        out["task_averaged_accuracy"] = round(sum(by.values()) / len(by), 4)
        ab = [r["correct"] for r in judged if r["abstention"]]
        out["abstention_accuracy"] = round(sum(ab) / len(ab), 4) if ab else None
    return out


PROTOCOL = Protocol(name="longmemeval", check=check_input, load=load, unit_id=lambda conv: conv.conversation_id,
                    replay=replay, summarize=summarize)
