"""Supervision mining: replay a realized session online through the reference runtime.

Nothing here re-implements runtime logic: candidates are whatever `ArborMemory.localize` recalls at
that moment (so negatives are hard, including states of the confounder branch), and their topic key,
path and node summaries and entities are the runtime's own. The replay is teacher-forced: each turn is
committed under its *gold* parent, so later candidates come from the true forest.
"""

from __future__ import annotations

import json

from arbor_train.prompts import extract_target
from arbor_train.runtime import ArborMemory, Localization

from .realize import Turn

GROUP_FIELDS = ("speaker", "back", "minutes")  # a group-chat candidate's extra document fields (schema.Candidate)


def candidate_row(c, turn_of: dict[int, int], recalled: bool = True, question: bool = False) -> dict:
    """A recalled candidate as a supervision row; a question's (`question`) also carries the state's own
    turn and time, what a question's reranker may read (Candidate.question_document)."""
    row = {"turn": turn_of[c.node_id], "topic_key": c.topic_key, "path_summary": c.path_summary,
           "node_summary": c.node_summary, "entities": list(c.entities),
           "channels": json.dumps(c.channels, sort_keys=True), "runtime_score": round(float(c.score), 6),
           "recalled": recalled}
    if question:
        row.update(state_text=c.text, state_time=c.timestamp)
    if c.speaker is not None:
        row.update({k: getattr(c, k) for k in GROUP_FIELDS})
    return row


def gold_candidate(mem: ArborMemory, node_id: int, turn_of: dict[int, int], now: str | None = None,
                   question: bool = False) -> dict:
    """A gold state recall missed, as a candidate row (with the group-chat fields the runtime would give it,
    and for a question the state's own turn and time)."""
    from arbor_train.runtime.localize import group_features, turn_text

    n = mem.store.get_node(node_id)
    row = {"turn": turn_of[node_id], "topic_key": n.topic_key, "path_summary": n.path_summary,
           "node_summary": n.node_summary, "entities": list(n.entities), "channels": "{}",
           "runtime_score": 0.0, "recalled": False,
           **group_features(n, mem.store.latest_node(mem.conv), now)}
    if question:
        row.update(state_text=turn_text(n), state_time=n.timestamp)
    return row


def mine_session(session_id: str, turns: list[Turn], runtime_cfg: dict, components: dict) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {"routing": [], "localization": [], "extraction": [], "tags": [], "summaries": []}
    mem = ArborMemory.open(":memory:", session_id, runtime_cfg, components=components)
    node_of: dict[int, int] = {}
    turn_of: dict[int, int] = {}
    try:
        for t in turns:
            loc = mem.localize(t.user, for_question=t.is_question)
            cands = [candidate_row(c, turn_of, question=t.is_question) for c in loc.candidates]
            gold_parent, secondary = t.gold_parent, t.gold_secondary
            for gold in (gold_parent, secondary):
                if gold is not None and all(c["turn"] != gold for c in cands):
                    cands.append(gold_candidate(mem, node_of[gold], turn_of, question=t.is_question))
            chosen = turn_of.get(loc.parent_id) if loc.parent_id is not None else None
            base = {"session_id": session_id, "turn": t.index, "input": t.user, "timestamp": t.timestamp}
            if t.is_question:
                q = t.question
                gold_states = [x.index for x in turns[: t.index] if x.branch == t.branch]
                out["localization"].append({
                    **base, "candidates": cands, "gold_states": gold_states, "gold_tip": gold_parent,
                    "runtime_choice": chosen, "question_type": q["type"], "dimension": q["dimension"],
                    "gold": q["gold"], "confounder": q["confounder"],
                    "confounder_states": [x.index for x in turns[: t.index] if x.branch == q["confounder_branch"]]})
            else:
                out["routing"].append({
                    **base, "candidates": cands, "gold_parent": -1 if gold_parent is None else gold_parent,
                    "gold_states": [] if gold_parent is None else [x.index for x in turns[: t.index] if x.branch == t.branch],
                    "runtime_choice": -1 if chosen is None else chosen, "route": loc.route, "label_rule": "plan",
                    "gold_recalled": gold_parent is None or any(c["turn"] == gold_parent and c["recalled"] for c in cands)})
                if secondary is not None:  # a multi-intent turn: the other branch's latest state, and its states
                    sb = turns[secondary].branch
                    out["routing"][-1].update(gold_secondary=secondary, secondary_states=[
                        x.index for x in turns[: t.index] if x.branch == sb and x.branch is not None])
                target = {k: t.extraction[k] for k in ("states", "facts", "entities", "artifacts", "events")}
                out["extraction"].append({**base, "assistant": t.assistant,
                                          "target": extract_target("commit", target), "summary": t.summary})
                out["summaries"].append({**base, "assistant": t.assistant, "summary": t.summary})
            out["tags"].append({**base, "source": "question" if t.is_question else "turn", "tags": t.tags})
            parent = Localization(node_of[gold_parent] if gold_parent is not None else None, "gold", 1.0,
                                  secondary=[node_of[secondary]] if secondary is not None else [])
            node = mem.commit(t.user, t.assistant, parent, t.timestamp)
            node_of[t.index] = node.id
            turn_of[node.id] = t.index
    finally:
        mem.store.close()
    return out
