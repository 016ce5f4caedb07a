"""Ubuntu IRC disentanglement protocol (Kummerfeld et al. 2019), online: every message (lines 0-999 are
context) is routed from the committed prefix by `observe`, then committed; the chosen state is the
reply-to link (a new root: a self-link). System lines are not committed and link to themselves. One
record per annotated line; link P/R/F and the conversation metrics come from arbor_train/conversations/irc.py."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from .base import Protocol, check_input


def load(c: dict) -> list:
    from arbor_train.conversations.irc import load_irc

    return load_irc(c["irc"]["input"])


def replay(f, method, answers, judge, c: dict) -> tuple[list[dict], list[dict]]:
    from arbor_train.conversations.irc import message_text

    recs = []
    for m in f.messages:
        route, parent, ingest_s = "system", m.line, 0.0
        if not m.system:
            text = message_text(m)
            t0 = time.perf_counter()
            obs = method.observe(m.line, text, "", m.time, False, speaker=m.speaker)
            ingest_s = time.perf_counter() - t0
            route = obs.route
            parent = obs.parent_turn if obs.parent_turn is not None else m.line
        if m.line in f.parents:
            recs.append({"file": f.name, "line": m.line, "gold": sorted(f.parents[m.line]), "pred": [parent],
                         "route": route, "ingest_s": ingest_s})
    return recs, []


def summarize(recs: list[dict], _: list[dict]) -> dict[str, Any]:
    from arbor_train.scoring.irc import score_links

    by_file: dict[str, tuple[dict, dict]] = {}
    for r in recs:
        gold, pred = by_file.setdefault(r["file"], ({}, {}))
        gold[r["line"]], pred[r["line"]] = set(r["gold"]), set(r["pred"])
    out = score_links([(name, g, p) for name, (g, p) in sorted(by_file.items())])
    out["routes"] = dict(Counter(r["route"] for r in recs))
    out["ingest_s_per_turn"] = round(sum(r["ingest_s"] for r in recs) / max(1, len(recs)), 5)
    return out


PROTOCOL = Protocol(name="irc", check=check_input, load=load, unit_id=lambda f: f.conversation_id,
                    replay=replay, summarize=summarize)
