"""BEAM loader ("Beyond a Million Tokens", arXiv 2510.27246) into the common schema.

A conversation is a folder with `chat.json` and `probing_questions.json`.

chat.json: a list of batches `{batch_number, time_anchor, turns: [[message, ...], ...]}` (a message is
`{role, id, content}`; user messages may add `question_type`; the first message of a batch may carry
`time_anchor`), or, for the 10M chats, a list of `{"plan-N": batches}`. Each batch becomes one
Session: `batch<batch_number>` (or `plan<N>-batch<batch_number>` in the plan layout); turns are the
messages flattened in order, turn_id = str(message id).

probing_questions.json: ability -> list of items (`question`, `rubric`, `difficulty`, plus
ability-specific fields). The hub copy stores it as a string holding a Python literal; it is parsed
with `ast.literal_eval`, never `eval`. Each item becomes a Question `<ability>:<k>`.
"""

from __future__ import annotations

import ast
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
    check_unique,
    need_text,
    utf8,
)

ABILITIES = (
    "abstention",
    "contradiction_resolution",
    "event_ordering",
    "information_extraction",
    "instruction_following",
    "knowledge_update",
    "multi_session_reasoning",
    "preference_following",
    "summarization",
    "temporal_reasoning",
)
ANSWER_FIELDS = ("answer", "ideal_answer", "ideal_response", "ideal_summary")
_PLAN_RE = re.compile(r"^plan-(\d+)$")


def _read_json(path: Path, what: str) -> Any:
    if not path.is_file():
        raise BenchmarkFormatError(f"{path.name}: BEAM {what} file not found ({path})")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BenchmarkFormatError(f"{path.name}: not valid JSON ({e})") from e


def _msg_id(value: Any, where: str) -> str:
    """A message id: an integer (the running index) or a string; null, booleans and others are refused."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise BenchmarkFormatError(f"{where}: field 'id' must be an integer or a string, got "
                                   f"{'null' if value is None else type(value).__name__}")
    return utf8(str(value), where, "id")


def _literal(fname: str, where: str, text: str) -> Any:
    """Parse the hub's string-held Python literal (JSON text is accepted too)."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        pass
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise BenchmarkFormatError(f"{fname}: {where}: string is neither a Python literal nor JSON ({e})") from e


# ----------------------------------------------------------------------------------------------- chat


def _batches(fname: str, data: Any) -> tuple[list[tuple[str, Any]], str]:
    """[(session_id prefix, batch)] in order, and the layout name ('batches' or 'plans')."""
    if not isinstance(data, list):
        raise BenchmarkFormatError(f"{fname}: expected a JSON list of batches, got {type(data).__name__}")
    is_plan = [isinstance(e, dict) and bool(e) and all(_PLAN_RE.match(str(k)) for k in e) for e in data]
    if data and all(is_plan):
        out = []
        for pi, entry in enumerate(data):
            for key, batches in entry.items():
                n = _PLAN_RE.match(key).group(1)
                if not isinstance(batches, list):
                    raise BenchmarkFormatError(f"{fname}: plan entry {pi} '{key}': expected a list of batches, "
                                               f"got {type(batches).__name__}")
                out.extend((f"plan{n}-", b) for b in batches)
        return out, "plans"
    if any(is_plan):
        bad = is_plan.index(False)
        raise BenchmarkFormatError(f"{fname}: entry {bad}: mixes the plan layout ({{'plan-N': batches}}) with "
                                   f"plain batches")
    return [("", b) for b in data], "batches"


def _session(fname: str, prefix: str, pos: int, batch: Any) -> Session:
    if not isinstance(batch, dict):
        raise BenchmarkFormatError(f"{fname}: {prefix}batch at position {pos}: expected an object, "
                                   f"got {type(batch).__name__}")
    if "batch_number" not in batch:
        raise BenchmarkFormatError(f"{fname}: {prefix}batch at position {pos}: missing field 'batch_number'")
    bn = batch["batch_number"]
    if isinstance(bn, bool) or not isinstance(bn, (int, str)):
        raise BenchmarkFormatError(f"{fname}: {prefix}batch at position {pos}: field 'batch_number' must be an "
                                   f"integer, got {'null' if bn is None else type(bn).__name__}")
    where = f"{fname}: {prefix}batch {bn}"
    if "turns" not in batch:
        raise BenchmarkFormatError(f"{where}: missing field 'turns'")
    if not isinstance(batch["turns"], list):
        raise BenchmarkFormatError(f"{where}: field 'turns' must be a list of turns")

    messages: list[tuple[str, Any]] = []
    for ti, turn in enumerate(batch["turns"]):
        group = [turn] if isinstance(turn, dict) else turn
        if not isinstance(group, list):
            raise BenchmarkFormatError(f"{where}: turns[{ti}]: expected a list of messages")
        messages.extend((f"turns[{ti}][{mi}]", m) for mi, m in enumerate(group))

    turns: list[Turn] = []
    first_anchor = None
    for k, (loc, msg) in enumerate(messages):
        if not isinstance(msg, dict):
            raise BenchmarkFormatError(f"{where}: {loc}: expected a message object")
        for key in ("role", "id", "content"):
            if key not in msg:
                raise BenchmarkFormatError(f"{where}: {loc}: missing field '{key}'")
        if not isinstance(msg["content"], str):
            raise BenchmarkFormatError(f"{where}: {loc} (id {msg['id']}): field 'content' must be a string")
        mid = _msg_id(msg["id"], f"{where}: {loc}")
        mw = f"{where}: {loc} (id {mid})"
        if k == 0:
            first_anchor = need_text(msg.get("time_anchor"), mw, "time_anchor", null=True)
        turns.append(Turn(turn_id=mid, speaker=need_text(msg["role"], mw, "role"),
                          text=need_text(msg["content"], mw, "content")))

    anchor = need_text(batch.get("time_anchor"), where, "time_anchor", null=True) or first_anchor
    return Session(session_id=f"{prefix}batch{bn}", date_time=anchor, turns=turns)


# ------------------------------------------------------------------------------------------ questions


def _flat_ids(value: Any) -> list[Any]:
    """Message ids from `source_chat_ids`: a list, or nested lists / dicts of lists (kept in order)."""
    if isinstance(value, dict):
        return [i for v in value.values() for i in _flat_ids(v)]
    if isinstance(value, (list, tuple)):
        return [i for v in value for i in _flat_ids(v)]
    return [value]


def _questions(fname: str, data: Any, turn_ids: set[str]) -> list[Question]:
    if isinstance(data, str):
        data = _literal(fname, "top-level value", data)
    if not isinstance(data, dict):
        raise BenchmarkFormatError(f"{fname}: expected a mapping ability -> questions, got {type(data).__name__}")
    out: list[Question] = []
    for ability, items in data.items():
        if ability not in ABILITIES:
            raise BenchmarkFormatError(f"{fname}: unknown ability {ability!r} (expected one of "
                                       f"{', '.join(ABILITIES)})")
        if isinstance(items, str):
            items = _literal(fname, f"ability {ability!r}", items)
        if not isinstance(items, list):
            raise BenchmarkFormatError(f"{fname}: ability {ability!r}: expected a list of questions, "
                                       f"got {type(items).__name__}")
        for k, item in enumerate(items):
            qid = f"{ability}:{k}"
            where = f"{fname}: ability {ability!r} item {k} ({qid})"
            if not isinstance(item, dict):
                raise BenchmarkFormatError(f"{where}: expected an object, got {type(item).__name__}")
            if "question" not in item:
                raise BenchmarkFormatError(f"{where}: missing field 'question'")
            if "rubric" not in item:
                raise BenchmarkFormatError(f"{where}: missing field 'rubric'")
            question = need_text(item["question"], where, "question")
            rubric = item["rubric"]
            if not isinstance(rubric, list) or not all(isinstance(r, str) for r in rubric):
                raise BenchmarkFormatError(f"{where}: field 'rubric' must be a list of strings")
            for j, r in enumerate(rubric):
                utf8(r, where, f"rubric[{j}]")

            answer_field = next((f for f in ANSWER_FIELDS if item.get(f) is not None), None)
            answer = None
            if answer_field is not None:
                raw = item[answer_field]
                if isinstance(raw, bool):
                    raise BenchmarkFormatError(f"{where}: field {answer_field!r} must be a string, number or list, "
                                               f"got {raw!r}")
                answer = raw if isinstance(raw, str) else str(raw)
                utf8(answer, where, answer_field)

            evidence: list[str] = []
            if item.get("source_chat_ids") is not None:
                for i in _flat_ids(item["source_chat_ids"]):
                    if isinstance(i, bool) or not isinstance(i, (int, str)):
                        raise BenchmarkFormatError(f"{where}: field 'source_chat_ids' holds {i!r}, not a message id")
                    sid = str(i)
                    if sid not in turn_ids:
                        raise BenchmarkFormatError(f"{where}: field 'source_chat_ids' names id {sid!r}, "
                                                   f"which is no message of the chat")
                    evidence.append(sid)

            extra: dict[str, Any] = {}
            for key, val in item.items():
                if key in ("question", "source_chat_ids") or key == answer_field:
                    continue
                extra[key] = val
            if answer_field is not None and not isinstance(item[answer_field], str):
                # keep structure (e.g. an event_ordering list) next to its stringified form
                extra[answer_field] = item[answer_field]
            if isinstance(item.get("source_chat_ids"), dict):
                extra["source_chat_ids"] = item["source_chat_ids"]
            out.append(Question(question_id=qid, question=question, answer=answer, category=ability,
                                evidence=evidence, question_date=None, extra=extra))
    return out


# ---------------------------------------------------------------------------------------------- public


def load_beam(chat_path, probing_path, conversation_id: str | None = None) -> Conversation:
    """One BEAM conversation. conversation_id defaults to the name of chat.json's folder."""
    chat_path, probing_path = Path(chat_path), Path(probing_path)
    if conversation_id is None:
        conversation_id = chat_path.resolve().parent.name
    chat = _read_json(chat_path, "chat")
    if isinstance(chat, str):
        chat = _literal(chat_path.name, "top-level value", chat)
    batches, layout = _batches(chat_path.name, chat)
    sessions = [_session(chat_path.name, prefix, pos, b) for pos, (prefix, b) in enumerate(batches)]
    check_unique([(s.session_id, f"batch position {pos}") for pos, s in enumerate(sessions)], "batch",
                 chat_path.name)
    check_unique([(t.turn_id, f"{s.session_id} message {k}") for s in sessions for k, t in enumerate(s.turns)],
                 "message id", chat_path.name)
    conv = Conversation(conversation_id=str(conversation_id), speakers=["user", "assistant"], sessions=sessions,
                        meta={"benchmark": "beam", "layout": layout})
    probing = _read_json(probing_path, "probing questions")
    conv.questions = _questions(probing_path.name, probing, conv.turn_ids())
    return conv


def load_beam_dir(root) -> list[Conversation]:
    """Every conversation folder under root (each holding chat.json and probing_questions.json), by name."""
    root = Path(root)
    if not root.is_dir():
        raise BenchmarkFormatError(f"{root.name}: BEAM directory not found ({root})")
    folders = sorted(p for p in root.iterdir() if p.is_dir())
    if not folders:
        raise BenchmarkFormatError(f"{root.name}: no conversation folders in BEAM directory ({root})")
    return [load_beam(d / "chat.json", d / "probing_questions.json", conversation_id=d.name) for d in folders]
