"""Ubuntu IRC reply structure (Kummerfeld et al., ACL 2019, "A Large-Scale Corpus for Conversation
Disentanglement"; CC-BY-4.0): loader and the corpus's metrics, written from their definitions.

A file pair `NAME.ascii.txt` (one message per line, 0-based: `[HH:MM] <nick> text`, an action
`[HH:MM]  * nick text`, a relayed `(nick/#chan) text` or notice `-nick:#chan- text`, or a system line
`=== ...`) and `NAME.annotation.txt` (`A B -`: message B replies to A, A <= B; `B B -`: B starts a
conversation; several lines for several parents). Lines 0-999 are context; the annotated lines are the
children of the annotation file. Malformed lines, and links that point forward or outside the file,
fail with the file and line named (BenchmarkFormatError).

The corpus's metrics are in arbor_train/scoring/irc.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from .schema import BenchmarkFormatError

_LINE = re.compile(r"^\[(\d\d):(\d\d)\] (.*)$")
_SPEAKERS = (re.compile(r"^<([^>]*)>(?: (.*))?$"), re.compile(r"^ \* (\S+)(?: (.*))?$"),
             re.compile(r"^\(([^/)]+)/[^)]*\) ?(.*)$"), re.compile(r"^-([^:]+):[^-]*- ?(.*)$"))


@dataclass
class IrcMessage:
    line: int
    time: str | None          # "HH:MM"; None for system lines
    speaker: str | None       # None for system lines
    text: str
    system: bool


@dataclass
class IrcFile:
    name: str
    path: Path
    messages: list[IrcMessage]
    parents: dict[int, set[int]] = field(default_factory=dict)  # annotated child line -> gold parent lines

    @property
    def conversation_id(self) -> str:
        return self.name

    @property
    def annotated(self) -> list[int]:
        return sorted(self.parents)

    @property
    def first_annotated(self) -> int:
        return min(self.parents) if self.parents else len(self.messages)


def parse_message(raw: str, where: str, line: int) -> IrcMessage:
    if raw.startswith("=== "):
        return IrcMessage(line, None, None, raw[4:], True)
    m = _LINE.match(raw)
    if m is None:
        raise BenchmarkFormatError(f"{where}: line {line}: not an IRC message ('[HH:MM] <nick> text' or "
                                   f"'=== ...'): {raw[:80]!r}")
    hh, mm, rest = m.groups()
    if int(hh) > 23 or int(mm) > 59:
        raise BenchmarkFormatError(f"{where}: line {line}: time [{hh}:{mm}] is not a time of day")
    for rx in _SPEAKERS:
        s = rx.match(rest)
        if s is not None:
            return IrcMessage(line, f"{hh}:{mm}", s.group(1), s.group(2) or "", False)
    return IrcMessage(line, f"{hh}:{mm}", None, rest, False)


def load_irc_file(ascii_path: str | Path) -> IrcFile:
    p = Path(ascii_path)
    if not p.name.endswith(".ascii.txt"):
        raise BenchmarkFormatError(f"{p}: expected a NAME.ascii.txt file")
    ann = p.with_name(p.name[: -len(".ascii.txt")] + ".annotation.txt")
    if not ann.exists():
        raise BenchmarkFormatError(f"{p}: its annotation file {ann.name} is missing")
    try:
        lines = p.read_text(encoding="utf-8").split("\n")
    except UnicodeDecodeError as e:
        raise BenchmarkFormatError(f"{p}: not UTF-8 text ({e})") from None
    if lines and lines[-1] == "":
        lines.pop()
    msgs = [parse_message(raw, str(p), i) for i, raw in enumerate(lines)]
    f = IrcFile(p.name[: -len(".ascii.txt")], p, msgs)
    for k, raw in enumerate(ann.read_text(encoding="utf-8").splitlines()):
        if not raw.strip():
            continue
        parts = raw.split()
        if len(parts) != 3 or parts[2] != "-" or not (parts[0].isdigit() and parts[1].isdigit()):
            raise BenchmarkFormatError(f"{ann}: line {k}: expected 'PARENT CHILD -', got {raw[:80]!r}")
        a, b = int(parts[0]), int(parts[1])
        if b >= len(msgs) or a >= len(msgs):
            raise BenchmarkFormatError(f"{ann}: line {k}: link {a} -> {b} points outside {p.name} "
                                       f"({len(msgs)} lines)")
        if a > b:
            raise BenchmarkFormatError(f"{ann}: line {k}: link {a} -> {b} points forward (a message can only "
                                       "reply to an earlier one)")
        f.parents.setdefault(b, set()).add(a)
    if not f.parents:
        raise BenchmarkFormatError(f"{ann}: no links")
    return f


def load_irc(split_dir: str | Path) -> list[IrcFile]:
    d = Path(split_dir)
    if not d.is_dir():
        raise BenchmarkFormatError(f"irc input {d}: not a folder of NAME.ascii.txt / NAME.annotation.txt pairs")
    files = sorted(d.glob("*.ascii.txt"))
    if not files:
        raise BenchmarkFormatError(f"irc input {d}: no *.ascii.txt files")
    return [load_irc_file(p) for p in files]


def message_text(m: IrcMessage) -> str:
    """What the runtime reads of a message: the speaker, then the text ("alice: try sudo apt update")."""
    return f"{m.speaker}: {m.text}" if m.speaker else m.text


def irc_conversations(split_dir: str | Path) -> list:
    """A split's files as conversation-file conversations (arbor_train/conversations/files.py), one per file:
    each non-system line a turn (its text as `message_text` gives it, its speaker and time, its line number
    as its id), without routing labels (data_gen.distill input_format=irc: a teacher labels every message)."""
    from .files import ConversationFile

    return [ConversationFile(f.name, [{"user": message_text(m), "assistant": "", "timestamp": m.time,
                                       "speaker": m.speaker, "id": str(m.line), "parents": None}
                                      for m in f.messages if not m.system]) for f in load_irc(split_dir)]


# ---------------------------------------------------------------------- baseline
def previous_message_links(f: IrcFile) -> dict[int, set[int]]:
    """The "previous message" baseline: a system line links to itself, any other message to the latest
    non-system line before it (itself when there is none)."""
    out, last = {}, None
    for m in f.messages:
        if m.line in f.parents:
            out[m.line] = {m.line if (m.system or last is None) else last}
        if not m.system:
            last = m.line
    return out
