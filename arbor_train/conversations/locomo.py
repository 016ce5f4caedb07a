"""LoCoMo loader (Maharana et al., ACL 2024): both public layouts, any number of conversations.

- per-conversation files (`26.json`, ...): speaker_a, speaker_b, session_N_date_time, session_N,
  events_session_N, session_N_observation, session_N_summary, qa; the conversation id is the file stem;
- the combined `locomo10.json`: a list of samples with sample_id, conversation (speakers and sessions),
  qa, event_summary, observation, session_summary; the conversation id is sample_id.

Both produce the same `Conversation` (arbor_train/conversations/schema.py). LoCoMo-specific annotations go into
`conv.meta`: observations (session -> speaker -> [[fact, [dia_ids]]]), events (session -> speaker ->
[events], date) and summaries (session -> text). Category numbering is the LoCoMo data's own:
1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop, 5 adversarial.

Known imperfections of the release are handled and counted, never silently: evidence written as one
string with several ids ("D8:6; D9:17") is split; evidence ids that name no turn are dropped and
counted in `conv.meta["skipped"]`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from .schema import BenchmarkFormatError, Conversation, Question, Session, Turn, answer_text, check_unique, need_text

CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
_SESSION = re.compile(r"^session_(\d+)$")
_DIA = re.compile(r"D\d+:\d+")


def split_dia_ids(value: Any) -> list[str]:
    """'D1:2, D1:4' / 'D8:6; D9:17' / ['D1:3'] -> ['D1:2', 'D1:4'] (order kept, duplicates removed)."""
    items = value if isinstance(value, list) else [value]
    out: list[str] = []
    for it in items:
        for m in _DIA.findall(str(it)):
            if m not in out:
                out.append(m)
    return out


def _need(d: dict, key: str, where: str) -> Any:
    if key not in d:
        raise BenchmarkFormatError(f"{where}: missing field {key!r}")
    return d[key]


def _dia_ids(value: Any, where: str, field: str) -> list[str]:
    """Evidence / observation ids: a string or a list of strings (a null or a number is refused)."""
    items = value if isinstance(value, list) else [value]
    for k, it in enumerate(items):
        if not isinstance(it, str):
            at = f"{field}[{k}]" if isinstance(value, list) else field
            raise BenchmarkFormatError(f"{where}: field {at!r} must be a dia_id string like 'D1:3', got "
                                       f"{'null' if it is None else type(it).__name__}")
    return split_dia_ids(value)


def _observations(obs: Any, where: str) -> dict:
    if not isinstance(obs, dict):
        raise BenchmarkFormatError(f"{where}: must be an object speaker -> [[fact, dia_ids], ...]")
    out = {}
    for sp, facts in obs.items():
        if not isinstance(facts, list):
            raise BenchmarkFormatError(f"{where}: field {sp!r} must be a list of [fact, dia_ids] pairs")
        kept = []
        for j, f in enumerate(facts):
            if not isinstance(f, list):
                raise BenchmarkFormatError(f"{where} {sp}[{j}]: a fact must be a list [fact, dia_ids]")
            if len(f) >= 2:
                kept.append([need_text(f[0], f"{where} {sp}[{j}]", "fact"), _dia_ids(f[1], f"{where} {sp}[{j}]", "dia_ids")])
        out[sp] = kept
    return out


def _events(ev: Any, speakers: list[str], where: str) -> Any:
    if not isinstance(ev, dict):
        raise BenchmarkFormatError(f"{where}: must be an object {{speaker: [events], date}}")
    for sp in speakers:
        items = ev.get(sp)
        if items is None:
            continue
        if not isinstance(items, list):
            raise BenchmarkFormatError(f"{where}: field {sp!r} must be a list of events")
        for j, e in enumerate(items):
            need_text(e, where, f"{sp}[{j}]")
    need_text(ev.get("date"), where, "date", null=True)
    return ev


def conversation_from_record(conv: dict, qa: list, observation: dict, events: dict, summaries: dict,
                             conversation_id: str, where: str) -> Conversation:
    if not isinstance(conv, dict):
        raise BenchmarkFormatError(f"{where}: field 'conversation' must be an object")
    if not isinstance(qa, list):
        raise BenchmarkFormatError(f"{where}: field 'qa' must be a list of questions")
    for name, d in (("observation", observation), ("event_summary", events), ("session_summary", summaries)):
        if not isinstance(d, dict):
            raise BenchmarkFormatError(f"{where}: field {name!r} must be an object")
    speakers = [need_text(_need(conv, "speaker_a", where), where, "speaker_a"),
                need_text(_need(conv, "speaker_b", where), where, "speaker_b")]
    nums = sorted(int(m.group(1)) for k in conv if (m := _SESSION.match(k)))
    sessions: list[Session] = []
    meta: dict[str, Any] = {"observations": {}, "events": {}, "summaries": {}, "skipped": {}}
    positions: list[tuple[str, str]] = []
    for n in nums:
        key = f"session_{n}"
        turns_raw = conv[key]
        if not isinstance(turns_raw, list):
            raise BenchmarkFormatError(f"{where}: field {key!r} must be a list of turns")
        turns = []
        for i, t in enumerate(turns_raw):
            tw = f"{where} {key}[{i}]"
            if not isinstance(t, dict):
                raise BenchmarkFormatError(f"{tw}: a turn must be an object")
            text = need_text(t.get("text"), tw, "text", null=True)
            caption = need_text(t.get("blip_caption"), tw, "blip_caption", null=True)
            if text is None and caption is None:
                raise BenchmarkFormatError(f"{tw}: missing field 'text'")
            dia_id = need_text(_need(t, "dia_id", tw), tw, "dia_id")
            positions.append((dia_id, f"{key}[{i}]"))
            turns.append(Turn(turn_id=dia_id, speaker=need_text(_need(t, "speaker", tw), tw, "speaker"),
                              text=text or "", image_caption=caption))
        date = need_text(conv.get(f"{key}_date_time"), where, f"{key}_date_time", null=True)
        sessions.append(Session(session_id=f"{conversation_id}:S{n}", date_time=date, turns=turns))
        sid = f"S{n}"
        obs = observation.get(f"{key}_observation")
        if obs:
            meta["observations"][sid] = _observations(obs, f"{where} {key}_observation")
        ev = events.get(f"events_{key}")
        if ev:
            meta["events"][sid] = _events(ev, speakers, f"{where} events_{key}")
        sm = summaries.get(f"{key}_summary")
        if sm:
            meta["summaries"][sid] = need_text(sm, where, f"{key}_summary")
    check_unique(positions, "dia_id", where)
    c = Conversation(conversation_id, speakers, sessions, [], meta)
    known = c.turn_ids()
    bad_evidence = 0
    questions = []
    for k, q in enumerate(qa):
        qw = f"{where} qa[{k}]"
        if not isinstance(q, dict):
            raise BenchmarkFormatError(f"{qw}: a question must be an object")
        cat = _need(q, "category", qw)
        if isinstance(cat, bool) or cat not in CATEGORIES:
            raise BenchmarkFormatError(f"{qw}: field 'category' is {cat!r}, expected one of {sorted(CATEGORIES)}")
        text = need_text(_need(q, "question", qw), qw, "question")
        ev_ids = _dia_ids(q.get("evidence", []), qw, "evidence")
        kept = [e for e in ev_ids if e in known]
        bad_evidence += len(ev_ids) - len(kept)
        answer = q.get("answer")
        if answer is None and cat != 5:
            raise BenchmarkFormatError(f"{qw}: missing field 'answer' (category {cat})")
        extra = {"category_name": CATEGORIES[cat], "evidence_raw": q.get("evidence", [])}
        if "adversarial_answer" in q:
            extra["adversarial_answer"] = answer_text(q["adversarial_answer"], qw, "adversarial_answer")
        questions.append(Question(question_id=f"{conversation_id}:q{k}", question=text,
                                  answer=None if answer is None else answer_text(answer, qw, "answer"),
                                  category=str(cat), evidence=kept, question_date=None, extra=extra))
    c.questions = questions
    meta["skipped"] = {"evidence_ids_naming_no_turn": bad_evidence}
    return c


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise BenchmarkFormatError(f"{path}: invalid JSON ({e})") from e
    except UnicodeDecodeError as e:
        raise BenchmarkFormatError(f"{path}: not UTF-8 text ({e})") from e


def load_locomo(path: str | Path) -> list[Conversation]:
    """A per-conversation file, the combined locomo10.json, or a folder of either (sorted by name)."""
    p = Path(path)
    if not p.exists():
        raise BenchmarkFormatError(f"{p}: no such file or folder")
    if p.is_dir():
        files = sorted(f for f in p.glob("*.json"))
        if not files:
            raise BenchmarkFormatError(f"{p}: no .json files")
        out: list[Conversation] = []
        where: list[str] = []
        for f in files:
            got = load_locomo(f)
            out.extend(got)
            where.extend(f.name if len(got) == 1 else f"{f.name} sample[{k}]" for k in range(len(got)))
        check_unique([(c.conversation_id, w) for c, w in zip(out, where)], "conversation id", str(p))
        return out
    data = _read_json(p)
    if isinstance(data, list):  # combined layout
        out = []
        for k, s in enumerate(data):
            where = f"{p} sample[{k}]"
            if not isinstance(s, dict):
                raise BenchmarkFormatError(f"{where}: a sample must be an object")
            sid = need_text(_need(s, "sample_id", where), where, "sample_id")
            where = f"{p} sample[{k}] ({sid})"
            out.append(conversation_from_record(_need(s, "conversation", where), _need(s, "qa", where),
                                                s.get("observation") or {}, s.get("event_summary") or {},
                                                s.get("session_summary") or {}, sid, where))
        check_unique([(c.conversation_id, f"sample[{k}]") for k, c in enumerate(out)], "sample_id", str(p))
        return out
    if isinstance(data, dict):
        where = str(p)
        return [conversation_from_record(data, _need(data, "qa", where), data, data, data, p.stem, where)]
    raise BenchmarkFormatError(f"{p}: expected a conversation object or a list of samples")


def to_combined(files: list[str | Path]) -> list[dict]:
    """Write per-conversation files in the combined locomo10.json layout (sample_id = file stem)."""
    out = []
    for f in files:
        d = _read_json(Path(f))
        conv = {k: v for k, v in d.items() if k in ("speaker_a", "speaker_b") or _SESSION.match(k)
                or re.match(r"^session_\d+_date_time$", k)}
        out.append({
            "sample_id": Path(f).stem, "conversation": conv, "qa": d["qa"],
            "event_summary": {k: v for k, v in d.items() if k.startswith("events_session_")},
            "observation": {k: v for k, v in d.items() if k.endswith("_observation")},
            "session_summary": {k: v for k, v in d.items() if k.endswith("_summary")},
        })
    return out


def interaction_files(path: str | Path) -> list:
    """LoCoMo conversations as conversation-file conversations (arbor_train/conversations/files.py): one turn
    per interaction (`schema.interactions`: a message and the other speaker's reply, each led by its
    speaker's name), the session's date as its timestamp, its first turn's id (`D1:7`) as its id, no
    routing label. It is the unit the runtime commits and eval.extraction scores, so rows made from it
    (data_gen.distill input_format=locomo) read like the prompts the evaluation sends."""
    from .files import ConversationFile
    from .schema import interactions

    return [ConversationFile(c.conversation_id, [
        {"user": it.user, "assistant": it.assistant, "timestamp": it.timestamp, "speaker": None,
         "id": it.turn_ids[0], "parents": None} for it in interactions(c)]) for c in load_locomo(path)]
