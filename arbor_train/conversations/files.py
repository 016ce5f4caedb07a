"""Your own conversations: the one conversation file format every tool here reads (docs/reference/conversation_files.md).

A file is JSONL, one turn per line, or JSON: `{"conversation_id"?: str, "turns": [turn, ...]}` (or a bare list
of turns). A turn is one interaction:

    user            str, required   what was said (in a group chat: the message)
    assistant       str             the reply ("" when there is none, as in a group chat)
    timestamp       str             any time text the runtime can read, e.g. "2024-05-01T09:30"
    speaker         str             who said `user` (group chats: the runtime reads who addresses whom)
    id              str or int      the turn's id, unique within its conversation (default: its 1-based position)
    parent          id, [ids], null the earlier turn(s) this one continues or replies to; null starts a new
                                    thread; left out: not labelled
    conversation_id str             JSONL only: several conversations in one file (default: the file's name)

`parent` is the gold routing label. A file where some turns carry it is mined with those links (turns left
out are committed unlabelled, as context); a file where none do is mined with the runtime's own weak rules
(python -m data_gen.conversations). The runtime's `ingest` reads the same files and ignores the labels.

Everything is checked before any work: types, encodable text, sizes within `runtime.limits`, duplicated
fields, unique ids, and parents that name an earlier turn of the same conversation. An error names the
file, the line (JSONL) or turn, and the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arbor_train.errors import InputError, unencodable

DEFAULT_LIMITS = {"max_field_chars": 200_000, "max_turns": 1_000_000, "max_id_chars": 256}
FIELDS = ("user", "assistant", "timestamp", "speaker", "id", "parent", "conversation_id")
_UNSET = object()


@dataclass
class ConversationFile:
    """One conversation of a file: its id and its checked turns, in order. Each turn is a dict with user,
    assistant, timestamp, speaker, id (str) and parents: None (not labelled), () (starts a new thread) or
    the 0-based positions of its parent turns."""

    conversation_id: str
    turns: list[dict] = field(default_factory=list)

    @property
    def labelled(self) -> bool:
        return any(t["parents"] is not None for t in self.turns)


def json_type(value: Any) -> str:
    """The JSON name of a parsed value's type (what a user sees in their file)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", list: "list", dict: "object"}.get(type(value), type(value).__name__)


def check_text(value: Any, where: str, field: str, limit: int, empty_ok: bool = True) -> str:
    """A text field the store can hold: a str, encodable as UTF-8 (no lone surrogates), no NUL, within limit."""
    if not isinstance(value, str):
        raise InputError(f"{where}: field {field!r} must be a string, got {json_type(value)}")
    if (e := unencodable(value)) is not None:
        raise InputError(f"{where}: field {field!r} holds {value[e.start]!r} at character {e.start}, which is not "
                         "encodable text (a lone UTF-16 surrogate, e.g. a JSON \\ud800 escape without its pair)")
    if "\x00" in value:
        raise InputError(f"{where}: field {field!r} holds a NUL character at character {value.index(chr(0))}")
    if len(value) > limit:
        raise InputError(f"{where}: field {field!r} has {len(value):,} characters, over the limit of {limit:,} "
                         "(runtime.limits)")
    if not empty_ok and not value.strip():
        raise InputError(f"{where}: field {field!r} is empty")
    return value


def check_conversation_id(value: Any, where: str, limits: dict | None = None) -> str:
    lim = {**DEFAULT_LIMITS, **(limits or {})}
    return check_text(value, where, "conversation_id", lim["max_id_chars"], empty_ok=False)


def _check_id(value: Any, where: str, field: str, lim: dict) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise InputError(f"{where}: field {field!r} must be a string or an integer, got {json_type(value)}")
    return check_text(str(value), where, field, lim["max_id_chars"], empty_ok=False)


def _check_turn(turn: Any, where: str, lim: dict, jsonl: bool) -> dict:
    if not isinstance(turn, dict):
        raise InputError(f"{where}: a turn must be an object with 'user' (and 'assistant'), got {json_type(turn)}")
    unknown = sorted(set(turn) - set(FIELDS) if jsonl else set(turn) - set(FIELDS) - {"conversation_id"})
    if unknown:
        raise InputError(f"{where}: unknown field {unknown[0]!r} (a turn has {', '.join(FIELDS)})")
    if not jsonl and "conversation_id" in turn:
        raise InputError(f"{where}: field 'conversation_id' belongs to the file's object in JSON (per turn only in JSONL)")
    if "user" not in turn:
        raise InputError(f"{where} is missing field 'user'")
    out = {"user": check_text(turn["user"], where, "user", lim["max_field_chars"], empty_ok=False),
           "assistant": check_text(turn.get("assistant", ""), where, "assistant", lim["max_field_chars"]),
           "timestamp": None, "speaker": None}
    for key in ("timestamp", "speaker"):
        if turn.get(key) is not None:
            out[key] = check_text(turn[key], where, key, lim["max_id_chars"])
    out["id"] = None if turn.get("id") is None else _check_id(turn["id"], where, "id", lim)
    raw = turn.get("parent", _UNSET)
    if raw is _UNSET:
        out["parent"] = None
    elif raw is None:
        out["parent"] = ()
    else:
        ids = raw if isinstance(raw, list) else [raw]
        if not ids:
            raise InputError(f"{where}: field 'parent' is an empty list (null starts a new thread)")
        out["parent"] = tuple(_check_id(p, where, "parent", lim) for p in ids)
    if jsonl and turn.get("conversation_id") is not None:
        out["conversation_id"] = check_conversation_id(turn["conversation_id"], where, lim)
    return out


def _no_duplicate_keys(where: str):
    def hook(pairs: list[tuple[str, Any]]) -> dict:
        out: dict = {}
        for k, v in pairs:
            if k in out:
                raise InputError(f"{where}: field {k!r} appears twice in one object")
            out[k] = v
        return out

    return hook


def _read(p: Path, lim: dict) -> tuple[str | None, list[tuple[str, dict]]]:
    """(the file's conversation_id, [(where, raw checked turn)]) of a JSON or JSONL file."""
    if not p.exists():
        raise InputError(f"input={str(p)!r}: file does not exist")
    if not p.is_file():
        raise InputError(f"input={str(p)!r}: not a file")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{p}: not UTF-8 text ({e})") from None
    if not text.strip():
        raise InputError(f"{p}: file is empty")
    data: Any = None
    jsonl = p.suffix.lower() == ".jsonl"
    if not jsonl:
        try:
            data = json.loads(text, object_pairs_hook=_no_duplicate_keys(str(p)))
        except json.JSONDecodeError as e:
            if p.suffix.lower() == ".json":
                raise InputError(f"{p}: invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}") from None
            jsonl = True  # no telling suffix: try one object per line
        except RecursionError:
            raise InputError(f"{p}: JSON nested too deeply") from None
    conv_id: str | None = None
    turns: list[tuple[str, dict]] = []
    if jsonl:
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            where = f"{p}: turn {len(turns) + 1} (line {lineno})"
            try:
                obj = json.loads(line, object_pairs_hook=_no_duplicate_keys(where))
            except json.JSONDecodeError as e:
                raise InputError(f"{p}: invalid JSON on line {lineno} (column {e.colno}): {e.msg}") from None
            except RecursionError:
                raise InputError(f"{where}: JSON nested too deeply") from None
            turns.append((where, _check_turn(obj, where, lim, jsonl=True)))
            if len(turns) > lim["max_turns"]:
                raise InputError(f"{p}: more than {lim['max_turns']:,} turns (runtime.limits.max_turns)")
    else:
        if isinstance(data, list):
            raw_turns = data
        elif isinstance(data, dict):
            if "turns" not in data:
                raise InputError(f"{p}: missing field 'turns' (a list of {{'user', 'assistant'}} objects)")
            extra = sorted(set(data) - {"turns", "conversation_id"})
            if extra:
                raise InputError(f"{p}: unknown field {extra[0]!r} (a conversation has conversation_id and turns)")
            raw_turns = data["turns"]
            if data.get("conversation_id") is not None:
                conv_id = check_conversation_id(data["conversation_id"], str(p), lim)
        else:
            raise InputError(f"{p}: expected an object with 'turns' or a list of turns, got {json_type(data)}")
        if not isinstance(raw_turns, list):
            raise InputError(f"{p}: field 'turns' must be a list, got {json_type(raw_turns)}")
        if len(raw_turns) > lim["max_turns"]:
            raise InputError(f"{p}: {len(raw_turns):,} turns, over the limit of {lim['max_turns']:,} "
                             "(runtime.limits.max_turns)")
        turns = [(f"{p}: turn {i}", _check_turn(t, f"{p}: turn {i}", lim, jsonl=False))
                 for i, t in enumerate(raw_turns, 1)]
    if not turns:
        raise InputError(f"{p}: no turns")
    return conv_id, turns


def _group(p: Path, file_conv: str | None, turns: list[tuple[str, dict]]) -> tuple[list[ConversationFile], bool]:
    """The turns grouped by conversation (ids unique, parents earlier), and whether any turn named its own."""
    convs: dict[str, ConversationFile] = {}
    named = file_conv is not None
    for where, t in turns:
        own = t.pop("conversation_id", None)
        named = named or own is not None
        cid = own or file_conv or p.stem
        conv = convs.setdefault(cid, ConversationFile(cid))
        t["id"] = t["id"] if t["id"] is not None else str(len(conv.turns) + 1)
        t["where"] = where
        conv.turns.append(t)
    for conv in convs.values():
        position: dict[str, int] = {}
        for i, t in enumerate(conv.turns):
            if t["id"] in position:
                raise InputError(f"{t['where']}: field 'id' {t['id']!r} is used twice in conversation "
                                 f"{conv.conversation_id!r} (first at turn {position[t['id']] + 1})")
            position[t["id"]] = i
        for i, t in enumerate(conv.turns):
            parent = t.pop("parent")
            if parent is None:
                t["parents"] = None
            else:
                bad = [x for x in parent if position.get(x, i) >= i]
                if bad:
                    raise InputError(f"{t['where']}: field 'parent' {bad[0]!r} names no earlier turn of conversation "
                                     f"{conv.conversation_id!r} (a parent is an id that comes before the turn)")
                t["parents"] = tuple(sorted(position[x] for x in parent))
            t.pop("where")
    return list(convs.values()), named


def load_conversations(path: str | Path, limits: dict | None = None) -> list[ConversationFile]:
    """Every conversation of a conversation file, checked whole (see the module docstring), in the order
    each first appears. Raises InputError naming the file, the turn (and JSONL line) and the field."""
    p = Path(path)
    file_conv, turns = _read(p, {**DEFAULT_LIMITS, **(limits or {})})
    return _group(p, file_conv, turns)[0]


def load_conversation(path: str | Path, limits: dict | None = None) -> tuple[str | None, list[dict]]:
    """(conversation_id or None, checked turns) of a file holding one conversation (the runtime's `ingest`);
    a file with several is refused, naming them."""
    p = Path(path)
    file_conv, turns = _read(p, {**DEFAULT_LIMITS, **(limits or {})})
    convs, named = _group(p, file_conv, turns)
    if len(convs) > 1:
        ids = ", ".join(repr(c.conversation_id) for c in convs[:5])
        raise InputError(f"{p}: holds {len(convs)} conversations ({ids}{', ...' if len(convs) > 5 else ''}); "
                         "ingest takes one per file")
    return (convs[0].conversation_id if named else None), convs[0].turns
