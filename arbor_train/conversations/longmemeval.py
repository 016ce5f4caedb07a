"""LongMemEval loader (Wu et al., ICLR 2025) into the common schema.

The release files (`longmemeval_s(_cleaned).json`, `longmemeval_m(_cleaned).json`,
`longmemeval_oracle.json`) are JSON lists of instances. Every instance has its own haystack, so each
becomes one Conversation (conversation_id = question_id) holding exactly one Question; memory is
rebuilt per question.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from arbor_train.conversations.schema import (
    BenchmarkFormatError,
    Conversation,
    Question,
    Session,
    Turn,
    answer_text,
    check_unique,
    need_bool,
    need_text,
)

QUESTION_TYPES = (
    "single-session-user",
    "single-session-assistant",
    "single-session-preference",
    "multi-session",
    "knowledge-update",
    "temporal-reasoning",
)
REQUIRED = (
    "question_id",
    "question_type",
    "question",
    "answer",
    "question_date",
    "haystack_session_ids",
    "haystack_dates",
    "haystack_sessions",
)
VARIANTS = ("s", "m", "oracle")
_VARIANT_RE = re.compile(r"longmemeval_(s|m|oracle)(?:_|\.|$)", re.IGNORECASE)


def infer_variant(path) -> str | None:
    """'s', 'm' or 'oracle' from a release file name (`longmemeval_s_cleaned.json` -> 's'), else None."""
    m = _VARIANT_RE.search(Path(path).name)
    return m.group(1).lower() if m else None


def load_longmemeval(path, variant: str | None = None) -> list[Conversation]:
    path = Path(path)
    fname = path.name
    if variant is None:
        variant = infer_variant(path)
    elif variant not in VARIANTS:
        from arbor_train.errors import ConfigError

        raise ConfigError(f"option variant must be one of {', '.join(VARIANTS)}; got {variant!r}")
    if not path.is_file():
        raise BenchmarkFormatError(f"{fname}: LongMemEval file not found ({path})")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BenchmarkFormatError(f"{fname}: not valid JSON ({e})") from e
    if not isinstance(data, list):
        raise BenchmarkFormatError(f"{fname}: expected a JSON list of instances, got {type(data).__name__}")
    out = [_instance(fname, idx, inst, variant) for idx, inst in enumerate(data)]
    check_unique([(c.conversation_id, f"instance {k}") for k, c in enumerate(out)], "question_id", fname)
    return out


def _instance(fname: str, idx: int, inst: Any, variant: str | None) -> Conversation:
    if not isinstance(inst, dict):
        raise BenchmarkFormatError(f"{fname}: instance {idx}: expected an object, got {type(inst).__name__}")
    qid = inst.get("question_id")
    where = f"{fname}: instance {idx}" + (f" (question_id={qid!r})" if qid is not None else "")

    for key in REQUIRED:
        if key not in inst:
            raise BenchmarkFormatError(f"{where}: missing required field '{key}'")
    qid = need_text(qid, where, "question_id")
    qtype = inst["question_type"]
    if not isinstance(qtype, str) or qtype not in QUESTION_TYPES:
        raise BenchmarkFormatError(f"{where}: field 'question_type' has unknown value {qtype!r} "
                                   f"(expected one of {', '.join(QUESTION_TYPES)})")

    sids, dates, sessions = inst["haystack_session_ids"], inst["haystack_dates"], inst["haystack_sessions"]
    for key, val in (("haystack_session_ids", sids), ("haystack_dates", dates), ("haystack_sessions", sessions)):
        if not isinstance(val, list):
            raise BenchmarkFormatError(f"{where}: field '{key}' must be a list, got {type(val).__name__}")
    if not (len(sids) == len(dates) == len(sessions)):
        raise BenchmarkFormatError(
            f"{where}: haystack lists differ in length: haystack_session_ids={len(sids)}, "
            f"haystack_dates={len(dates)}, haystack_sessions={len(sessions)}")

    answer_sids = inst.get("answer_session_ids") or []
    if not isinstance(answer_sids, list):
        raise BenchmarkFormatError(f"{where}: field 'answer_session_ids' must be a list")
    answer_sids = [need_text(s, where, f"answer_session_ids[{k}]") for k, s in enumerate(answer_sids)]
    question = need_text(inst["question"], where, "question")
    answer = answer_text(inst["answer"], where, "answer")
    question_date = need_text(inst["question_date"], where, "question_date", null=True)

    out_sessions: list[Session] = []
    evidence: list[str] = []
    for k, (sid, date, sess) in enumerate(zip(sids, dates, sessions)):
        sid = need_text(sid, where, f"haystack_session_ids[{k}]")
        date = need_text(date, where, f"haystack_dates[{k}]", null=True)
        if not isinstance(sess, list):
            raise BenchmarkFormatError(f"{where}: haystack_sessions entry for session {sid!r} must be a list "
                                       f"of messages, got {type(sess).__name__}")
        turns: list[Turn] = []
        for i, msg in enumerate(sess):
            if not isinstance(msg, dict):
                raise BenchmarkFormatError(f"{where}: session {sid!r} message {i}: expected an object")
            for key in ("role", "content"):
                if key not in msg:
                    raise BenchmarkFormatError(f"{where}: session {sid!r} message {i}: missing field '{key}'")
            mw = f"{where}: session {sid!r} message {i}"
            if not isinstance(msg["content"], str):
                raise BenchmarkFormatError(f"{mw}: field 'content' must be a string")
            turn = Turn(turn_id=f"{sid}:{i}", speaker=need_text(msg["role"], mw, "role"),
                        text=need_text(msg["content"], mw, "content"),
                        has_answer=need_bool(msg.get("has_answer"), mw, "has_answer"))
            if turn.has_answer:
                evidence.append(turn.turn_id)
            turns.append(turn)
        out_sessions.append(Session(session_id=sid, date_time=date, turns=turns))

    q = Question(
        question_id=qid,
        question=question,
        answer=answer,
        category=qtype,
        evidence=evidence,
        question_date=question_date,
        extra={"abstention": qid.endswith("_abs"), "answer_session_ids": answer_sids},
    )
    return Conversation(conversation_id=qid, speakers=["user", "assistant"], sessions=out_sessions, questions=[q],
                        meta={"benchmark": "longmemeval", "variant": variant})
