"""One conversation schema for every benchmark (LoCoMo, LongMemEval, BEAM) and for generated sets.

    Conversation
      conversation_id   str
      speakers          [str]                 (LoCoMo: the two people; others: ["user", "assistant"])
      sessions          [Session]             in chronological order
      questions         [Question]
      meta              dict                  benchmark-specific extras (JSON-serialisable)

    Session: session_id str, date_time str | None (as the data gives it), turns [Turn]
    Turn:    turn_id str (LoCoMo dia_id "D3:7", LongMemEval "s<session>:<i>", BEAM message id),
             speaker str, text str, image_caption str | None (LoCoMo blip_caption: kept so image
             turns still carry content), has_answer bool (LongMemEval evidence turns)
    Question: question_id, question, answer (str; integers are stringified), category (str: LoCoMo
             "1".."5", LongMemEval question_type, BEAM ability), evidence [turn_id], question_date,
             extra dict (adversarial_answer, rubric, ...)

`interactions(conv)` pairs messages into (user, assistant) interactions, the unit the ArborMem runtime
commits: a message and the reply that follows it from the other speaker.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator

from arbor_train.errors import InputError, unencodable


class BenchmarkFormatError(InputError):
    """Bad benchmark input: the message names the file, the record and the field."""


def utf8(value: str, where: str, field: str) -> str:
    """`value` unchanged if it encodes as UTF-8; a lone surrogate (JSON "\\ud800") is refused."""
    if (e := unencodable(value)) is not None:
        raise BenchmarkFormatError(f"{where}: field {field!r} is not valid UTF-8 text ({e.reason} at "
                                   f"character {e.start})")
    return value


def need_text(value: Any, where: str, field: str, null: bool = False) -> str | None:
    """A string field read strictly: no str(None) -> "None", no numbers, valid UTF-8 (`null`: None allowed)."""
    if value is None and null:
        return None
    if not isinstance(value, str):
        what = "null" if value is None else type(value).__name__
        raise BenchmarkFormatError(f"{where}: field {field!r} must be a string{' or null' if null else ''}, "
                                   f"got {what}")
    return utf8(value, where, field)


def answer_text(value: Any, where: str, field: str) -> str:
    """An answer field: a string, or a number (stringified, as the releases write some answers)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return need_text(value, where, field)


def need_bool(value: Any, where: str, field: str) -> bool:
    """A boolean field: true, false or null/absent (false); a string such as "false" is refused."""
    if value is None:
        return False
    if not isinstance(value, bool):
        raise BenchmarkFormatError(f"{where}: field {field!r} must be true or false, got {value!r}")
    return value


def check_unique(items: list[tuple[Any, str]], what: str, where: str) -> None:
    """`items` are (id, position) pairs; a repeated id is refused, naming it and both positions."""
    seen: dict[Any, str] = {}
    for key, pos in items:
        if key in seen:
            raise BenchmarkFormatError(f"{where}: duplicate {what} {key!r} at {seen[key]} and {pos}")
        seen[key] = pos


@dataclass
class Turn:
    turn_id: str
    speaker: str
    text: str
    image_caption: str | None = None
    has_answer: bool = False

    @property
    def content(self) -> str:
        """Text with the image caption appended, as the memory sees an image turn."""
        if self.image_caption:
            return f"{self.text} [image: {self.image_caption}]".strip()
        return self.text


@dataclass
class Session:
    session_id: str
    date_time: str | None
    turns: list[Turn] = field(default_factory=list)


@dataclass
class Question:
    question_id: str
    question: str
    answer: str | None
    category: str
    evidence: list[str] = field(default_factory=list)
    question_date: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Conversation:
    conversation_id: str
    speakers: list[str]
    sessions: list[Session]
    questions: list[Question] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def turns(self) -> Iterator[tuple[Session, Turn]]:
        for s in self.sessions:
            for t in s.turns:
                yield s, t

    def turn_ids(self) -> set[str]:
        return {t.turn_id for _, t in self.turns()}

    @property
    def end_time(self) -> str | None:
        """The last session's date: when a question asked after the conversation is asked."""
        return self.sessions[-1].date_time if self.sessions else None

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "Conversation":
        return cls(
            conversation_id=d["conversation_id"], speakers=list(d["speakers"]),
            sessions=[Session(s["session_id"], s["date_time"], [Turn(**t) for t in s["turns"]]) for s in d["sessions"]],
            questions=[Question(**q) for q in d["questions"]], meta=dict(d.get("meta") or {}),
        )


@dataclass
class Interaction:
    """One runtime commit: a message, the reply after it, and the turn ids they cover."""

    user: str
    assistant: str
    timestamp: str | None
    turn_ids: list[str]
    session_id: str


def interactions(conv: Conversation) -> list[Interaction]:
    """Pair each message with the next one in its session when the speaker changes.

    A message followed by another from the same speaker (or ending a session) becomes an interaction
    with an empty reply, so no text is ever dropped.
    """
    out: list[Interaction] = []
    for s in conv.sessions:
        i = 0
        turns = s.turns
        while i < len(turns):
            a = turns[i]
            prefix = f"{a.speaker}: " if a.speaker not in ("user",) else ""
            if i + 1 < len(turns) and turns[i + 1].speaker != a.speaker:
                b = turns[i + 1]
                bprefix = f"{b.speaker}: " if b.speaker not in ("assistant",) else ""
                out.append(Interaction(prefix + a.content, bprefix + b.content, s.date_time, [a.turn_id, b.turn_id],
                                       s.session_id))
                i += 2
            else:
                out.append(Interaction(prefix + a.content, "", s.date_time, [a.turn_id], s.session_id))
                i += 1
    return out


def dump_jsonl(convs: list[Conversation], path) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for c in convs:
            f.write(json.dumps(c.to_json(), ensure_ascii=False, sort_keys=True) + "\n")


def load_jsonl(path) -> list[Conversation]:
    return [Conversation.from_json(json.loads(line)) for line in open(path, encoding="utf-8")]
