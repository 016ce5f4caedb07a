"""LoCoMo loader (Maharana et al., ACL 2024): both public layouts, any number of conversations.

- per-conversation files (`26.json`, ...): speaker_a, speaker_b, session_N_date_time, session_N,
  events_session_N, session_N_observation, session_N_summary, qa; the conversation id is the file stem;
- the combined `locomo10.json`: a list of samples with sample_id, conversation (speakers and sessions),
  qa, event_summary, observation, session_summary; the conversation id is sample_id.

Both produce the same `Conversation` (eval/benchmarks/schema.py). LoCoMo-specific annotations go into
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

from .schema import BenchmarkFormatError, Conversation, Question, Session, Turn

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


def conversation_from_record(conv: dict, qa: list, observation: dict, events: dict, summaries: dict,
                             conversation_id: str, where: str) -> Conversation:
    speakers = [_need(conv, "speaker_a", where), _need(conv, "speaker_b", where)]
    nums = sorted(int(m.group(1)) for k in conv if (m := _SESSION.match(k)))
    sessions: list[Session] = []
    meta: dict[str, Any] = {"observations": {}, "events": {}, "summaries": {}, "skipped": {}}
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
            text = t.get("text")
            if text is None and t.get("blip_caption") is None:
                raise BenchmarkFormatError(f"{tw}: missing field 'text'")
            turns.append(Turn(turn_id=str(_need(t, "dia_id", tw)), speaker=str(_need(t, "speaker", tw)),
                              text=str(text or ""), image_caption=t.get("blip_caption")))
        sessions.append(Session(session_id=f"{conversation_id}:S{n}", date_time=conv.get(f"{key}_date_time"),
                                turns=turns))
        sid = f"S{n}"
        obs = observation.get(f"{key}_observation")
        if obs:
            meta["observations"][sid] = {sp: [[f[0], split_dia_ids(f[1])] for f in facts if len(f) >= 2]
                                         for sp, facts in obs.items()}
        ev = events.get(f"events_{key}")
        if ev:
            meta["events"][sid] = ev
        sm = summaries.get(f"{key}_summary")
        if sm:
            meta["summaries"][sid] = sm
    c = Conversation(conversation_id, speakers, sessions, [], meta)
    known = c.turn_ids()
    bad_evidence = 0
    questions = []
    for k, q in enumerate(qa):
        qw = f"{where} qa[{k}]"
        if not isinstance(q, dict):
            raise BenchmarkFormatError(f"{qw}: a question must be an object")
        cat = _need(q, "category", qw)
        if cat not in CATEGORIES:
            raise BenchmarkFormatError(f"{qw}: field 'category' is {cat!r}, expected one of {sorted(CATEGORIES)}")
        text = _need(q, "question", qw)
        ev_ids = split_dia_ids(q.get("evidence", []))
        kept = [e for e in ev_ids if e in known]
        bad_evidence += len(ev_ids) - len(kept)
        answer = q.get("answer")
        if answer is None and cat != 5:
            raise BenchmarkFormatError(f"{qw}: missing field 'answer' (category {cat})")
        extra = {"category_name": CATEGORIES[cat], "evidence_raw": q.get("evidence", [])}
        if "adversarial_answer" in q:
            extra["adversarial_answer"] = str(q["adversarial_answer"])
        questions.append(Question(question_id=f"{conversation_id}:q{k}", question=str(text),
                                  answer=None if answer is None else str(answer), category=str(cat),
                                  evidence=kept, question_date=None, extra=extra))
    c.questions = questions
    meta["skipped"] = {"evidence_ids_naming_no_turn": bad_evidence}
    return c


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise BenchmarkFormatError(f"{path}: invalid JSON ({e})") from e


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
        for f in files:
            out.extend(load_locomo(f))
        ids = [c.conversation_id for c in out]
        if len(set(ids)) != len(ids):
            raise BenchmarkFormatError(f"{p}: conversation ids repeat across files: {ids}")
        return out
    data = _read_json(p)
    if isinstance(data, list):  # combined layout
        out = []
        for k, s in enumerate(data):
            where = f"{p} sample[{k}]"
            if not isinstance(s, dict):
                raise BenchmarkFormatError(f"{where}: a sample must be an object")
            sid = str(_need(s, "sample_id", where))
            where = f"{p} sample[{k}] ({sid})"
            out.append(conversation_from_record(_need(s, "conversation", where), _need(s, "qa", where),
                                                s.get("observation") or {}, s.get("event_summary") or {},
                                                s.get("session_summary") or {}, sid, where))
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
