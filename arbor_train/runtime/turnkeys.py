"""Turn identity: what makes two transcript turns the same turn, so that ingest stores each turn once.

A turn's key is a SHA-256 over its own content: the speaker, the user text and the assistant text, each
normalized (Unicode NFKC, case folded, runs of white space made one space, trimmed), and an occurrence
counter that tells repeats of the same content apart within a file ("ok" three times: occurrences 1, 2
and 3). The timestamp is not part of it, and neither is any other turn: a re-export that reformats the
timestamps, edits one turn, deletes one or inserts one re-keys only the turns that changed, so a
re-ingest matches every unchanged turn, adds the new ones and reports the stored turns the file lacks.

Memories written before schema v5 keyed each turn by a hash chained over all earlier turns
(`chain_keys`, TURN_KEY_SEED_V1); the store migrates their keys on open (store.py `_migrate_v4`), and
ingest still honours forgets recorded under the old keys (their text is gone, so they cannot be re-keyed).
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable

TURN_KEY_SEED = "arbormem-turn-v2"
TURN_KEY_SEED_V1 = "arbormem-turn-v1"
_SPACE = re.compile(r"\s+")


def normalize(text: str | None) -> str:
    return _SPACE.sub(" ", unicodedata.normalize("NFKC", text or "").casefold()).strip()


def content_keys(turns: Iterable[tuple[str | None, str, str]]) -> list[str]:
    """Keys of (speaker, user text, assistant text) turns, in order (the occurrence counter runs in order)."""
    seen: Counter = Counter()
    out = []
    for speaker, user, assistant in turns:
        parts = (normalize(speaker), normalize(user), normalize(assistant))
        seen[parts] += 1
        h = hashlib.sha256(TURN_KEY_SEED.encode())
        for part in (*parts, str(seen[parts])):
            h.update(b"\x00" + part.encode("utf-8"))
        out.append(h.hexdigest())
    return out


def turn_keys(turns: list[dict]) -> list[str]:
    """The identity of each turn of a loaded conversation file (arbor_train/conversations/files.py)."""
    return content_keys((t.get("speaker"), t["user"], t.get("assistant") or "") for t in turns)


def chain_keys(turns: list[dict]) -> list[str]:
    """The identities memories before schema v5 gave turns: a SHA-256 chained over the turns up to each one."""
    prev = hashlib.sha256(TURN_KEY_SEED_V1.encode()).hexdigest()
    out = []
    for t in turns:
        h = hashlib.sha256(prev.encode())
        for part in (t["user"], t.get("assistant") or "", t.get("timestamp") or ""):
            h.update(b"\x00" + part.encode("utf-8"))
        prev = h.hexdigest()
        out.append(prev)
    return out
