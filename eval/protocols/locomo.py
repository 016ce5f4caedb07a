"""LoCoMo protocol: the memory is built once per conversation, then each question of the categories in
`locomo.categories` is read against the finished memory. Evidence recall is the share of a question's
evidence turns the context cites; answer-token recall, which credits no provenance, the share of the
gold answer's normalized tokens the context's text holds (both overall and per category); for a method
that localizes, question-localization accuracy at 1 and 5 (an evidence state among the top candidate
states the reranker ranks, which the localized-states layer reads first) and the share of questions
whose evidence recall put among the candidates; F1 (and an optional judge) score the answers."""

from __future__ import annotations

import time
from typing import Any

from arbor_train.errors import ConfigError, parse_choice, parse_int

from .base import Protocol, check_input, evidence_summary, ingest, mean4, percentile


# question localization, for a method that localizes: an evidence state is the top candidate state, among
# the top 5, or among every candidate its recall found
LOCALIZATION = ("localization_at_1", "localization_at_5", "evidence_in_candidates")


def check(c: dict) -> None:
    check_input(c)
    cats = c["locomo"].get("categories")
    if not isinstance(cats, list) or not cats:
        raise ConfigError(f"option locomo.categories must be a non-empty list of LoCoMo categories (1-5), got {cats!r}")
    for k, x in enumerate(cats):
        parse_choice(parse_int(x, f"locomo.categories[{k}]"), f"locomo.categories[{k}]", (1, 2, 3, 4, 5))
    if c["locomo"].get("max_questions") is not None:
        c["locomo"]["max_questions"] = parse_int(c["locomo"]["max_questions"], "locomo.max_questions", minimum=1)


def load(c: dict) -> list:
    from arbor_train.conversations.locomo import load_locomo

    return load_locomo(c["locomo"]["input"])


def replay(conv, method, answers, judge, c: dict) -> tuple[list[dict], list[dict]]:
    from arbor_train.scoring.answers import answer_token_recall, locomo_score

    categories = [int(x) for x in c["locomo"]["categories"]]
    t0 = time.perf_counter()
    inters, idx_of = ingest(conv, method)
    ingest_s = time.perf_counter() - t0
    last_date = conv.end_time
    recs = []
    asked = [q for q in conv.questions if int(q.category) in categories][: c["locomo"].get("max_questions") or None]
    for q in asked:
        t0 = time.perf_counter()
        r = method.read(q.question, last_date, c["budget"])
        read_s = time.perf_counter() - t0
        ev = {idx_of[e] for e in q.evidence if e in idx_of}
        rec = {"session_id": conv.conversation_id, "question_id": q.question_id, "category": q.category,
               "context_tokens": r.tokens, "read_s": read_s, "ingest_s": ingest_s, "ingest_turns": len(inters),
               "evidence_recall": (len(ev & set(r.turn_ids)) / len(ev)) if ev else None,
               "answer_token_recall": answer_token_recall(r.text, q.answer if q.answer is not None else "")}
        if r.route is not None and r.localized and ev:  # question localization: an evidence state in the top k
            rec["localization_at_1"] = float(bool(set(r.localized[:1]) & ev))
            rec["localization_at_5"] = float(bool(set(r.localized[:5]) & ev))
            rec["evidence_in_candidates"] = float(bool(set(r.localized) & ev))
        if answers is not None:
            def done(pred, rec=rec, q=q):
                rec["prediction"] = pred
                rec["score"] = locomo_score(pred, q.answer if q.answer is not None else "", int(q.category))
                if judge is not None:  # Mem0-style J: a lenient CORRECT/WRONG judgement by an LLM
                    rec["judge_correct"] = judge.correct("locomo", q.question, q.answer or "", pred)
            answers.ask(r.text, q.question, done)
        recs.append(rec)
    return recs, []


def summarize(recs: list[dict], _: list[dict]) -> dict[str, Any]:
    from arbor_train.scoring.answers import aggregate

    out: dict[str, Any] = evidence_summary(recs)
    out["answer_token_recall"] = mean4([r["answer_token_recall"] for r in recs if r.get("answer_token_recall") is not None])
    for key in LOCALIZATION:  # a localizing method only
        vals = [r[key] for r in recs if key in r]
        if vals:
            out[key] = mean4(vals)
    for key in ("evidence_recall", "answer_token_recall"):  # per LoCoMo category
        by: dict[str, list[float]] = {}
        for r in recs:
            if r.get(key) is not None:
                by.setdefault(str(r["category"]), []).append(r[key])
        out[f"{key}_by_category"] = {k: mean4(v) for k, v in sorted(by.items())}
    ingest = {r["session_id"]: (r["ingest_s"], r["ingest_turns"]) for r in recs if "ingest_s" in r}
    if ingest:  # memory construction cost: seconds per ingested interaction, over every conversation
        out["ingest_s_per_turn"] = round(sum(s for s, _ in ingest.values()) / max(1, sum(n for _, n in ingest.values())), 4)
    out["read_s_p50"] = percentile([r["read_s"] for r in recs], 0.5)
    out["read_s_p95"] = percentile([r["read_s"] for r in recs], 0.95)
    if recs and "score" in recs[0]:
        agg = aggregate(recs, ["category"])
        out["f1"] = agg["accuracy"]
        out["f1_by_category"] = {k: v["accuracy"] for k, v in agg["by"]["category"]["groups"].items()}
    judged = [r["judge_correct"] for r in recs if "judge_correct" in r]
    if judged:
        out["judge_accuracy"] = mean4(judged)
    return out


# a LoCoMo reader (data_gen.locomo's reader set) lists the conversation ids it trained on
PROTOCOL = Protocol(name="locomo", check=check, load=load, unit_id=lambda conv: conv.conversation_id,
                    replay=replay, summarize=summarize, fingerprint=lambda conv: conv.conversation_id)
