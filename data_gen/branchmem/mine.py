"""Supervision mining: replay a realized session online through the reference runtime.

The replay is the one every miner runs (data_gen/replay.py): candidates are whatever
`ArborMemory.localize` recalls at that moment (so negatives are hard, including states of the confounder
branch), and their topic key, path and node summaries and entities are the runtime's own. The replay is
teacher-forced: each turn is committed under its *gold* parent, so later candidates come from the true forest.
"""

from __future__ import annotations

from arbor_train.prompts import extract_target
from data_gen.replay import Replay

from .realize import Turn


def mine_session(session_id: str, turns: list[Turn], runtime_cfg: dict, components: dict) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {"routing": [], "localization": [], "extraction": [], "tags": [], "summaries": []}
    replayed = [{"turn": t.index, "user": t.user, "assistant": t.assistant, "timestamp": t.timestamp,
                 "question": t.is_question} for t in turns]
    with Replay(session_id, runtime_cfg, components) as rp:
        for step, t in zip(rp.steps(replayed, question=lambda r: r["question"]), turns):
            gold_parent, secondary = t.gold_parent, t.gold_secondary
            step.add_gold([gold_parent, secondary])
            cands, chosen, loc = step.candidates, step.chosen, step.loc
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
            step.commit_at(gold_parent, "gold", secondary=[secondary] if secondary is not None else [])
    return out
