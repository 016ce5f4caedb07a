"""Session replay: a BranchMemEval session played through a memory method in order, as evaluation and
reader supervision both need it. At a question, the committed prefix is frozen and read through the method,
the answer model answers (when there is one), and the answer is scored by normalized rule-based match; the
canonical response (not the prediction) continues the replay.
"""

from __future__ import annotations

import time
from pathlib import Path


def load_sessions(data_dir: str | Path) -> list[dict]:
    """BranchMemEval sessions (<data_dir>/jsonl/sessions.jsonl), every row schema-checked; ids unique."""
    from arbor_train.conversations.io import read_rows

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
    from arbor_train.scoring.answers import answer_correct, context_flags, error_category

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
