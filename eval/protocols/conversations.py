"""Your own conversations (the conversation file format, arbor_train/conversations/files.py): each
conversation's turns are routed online from the committed prefix by `observe`, then committed; the
chosen state is the turn's parent (a new root: a self-link). One record per labelled turn (`parent`) of
the evaluated part: with `conversations.heldout` the part data_gen.conversations held out with the same
share and seed (whole conversations, or a single conversation's last turns), else every labelled turn.
Scored like reply structure: link P/R/F and the conversation metrics (arbor_train/scoring/irc.py), and
routing accuracy, the share of labelled turns routed to a gold parent."""

from __future__ import annotations

import time
from typing import Any

from arbor_train.errors import ConfigError, parse_float, parse_int

from .base import Protocol, check_input


def check(c: dict) -> None:
    check_input(c)
    o = c["conversations"]
    share = parse_float(o["heldout"], "conversations.heldout", minimum=0.0)
    if share >= 1.0:
        raise ConfigError(f"option conversations.heldout is a share in [0, 1), got {o['heldout']!r}")
    parse_int(o["seed"], "conversations.seed")


def load(c: dict) -> list:
    from arbor_train.conversations.files import load_conversations
    from data_gen.conversations import split

    o = c["conversations"]
    convs = load_conversations(o["input"])
    if not any(conv.labelled for conv in convs):
        raise ConfigError(f"conversations.input={o['input']}: no turn has a `parent` label to score routing against")
    parts = split(convs, float(o["heldout"]), int(o["seed"]))
    return parts["heldout"] if float(o["heldout"]) > 0 else parts["train"]


def replay(unit, method, answers, judge, c: dict) -> tuple[list[dict], list[dict]]:
    from data_gen.conversations import numbered

    conv, lo, hi = unit
    recs = []
    for pos, t in enumerate(numbered(conv)[:hi]):
        t0 = time.perf_counter()
        obs = method.observe(t["turn"], t["user"], t["assistant"], t["timestamp"], False, speaker=t["speaker"])
        ingest_s = time.perf_counter() - t0
        if pos >= lo and t["parents"] is not None:
            parent = obs.parent_turn if obs.parent_turn is not None else t["turn"]
            gold = sorted(t["parents"]) or [t["turn"]]
            recs.append({"file": conv.conversation_id, "line": t["turn"], "gold": gold, "pred": [parent],
                         "route": obs.route, "ingest_s": ingest_s})
    return recs, []


def summarize(recs: list[dict], turns: list[dict]) -> dict[str, Any]:
    """The reply-structure metrics of the IRC protocol (the records have its shape), and routing accuracy."""
    from .irc import summarize as link_metrics

    out = link_metrics(recs, turns)
    out["routing_accuracy"] = round(sum(r["pred"][0] in r["gold"] for r in recs) / max(1, len(recs)), 4)
    return out


PROTOCOL = Protocol(name="conversations", check=check, load=load, unit_id=lambda u: u[0].conversation_id,
                    replay=replay, summarize=summarize)
