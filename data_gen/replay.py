"""The online replay every miner runs: a conversation's turns, one at a time, through the reference runtime.

Each turn is localized from the memory committed so far (the candidates are whatever
`ArborMemory.localize` recalls at that moment, so negatives are hard), the miner reads that step and
says where the turn goes (`Step.commit_at`: a gold or weak label, teacher forcing; by default where the
runtime routed it), then the turn is committed. A candidate row carries the runtime's own topic key,
path and node summaries and entities; nothing here re-implements runtime logic.

    with Replay(conv_id, runtime_cfg, components) as rp:
        for step in rp.steps(turns):                   # turns: dicts with turn, user, assistant, timestamp, speaker
            row = {..., "candidates": step.candidates}
            step.add_gold([parent_turn])               # a gold state recall missed joins the candidates
            step.commit_at(parent_turn)                # committed below it (None: a new root)
        rp.localize_question(text)                     # after the replay: a question over the finished memory

Users: `replay_routing` below (gold links or the runtime's weak rules: data_gen.conversations for
conversation files, data_gen.irc for Ubuntu IRC), data_gen.branchmem.mine (plans: routing, localization,
extraction and tag rows) and data_gen.locomo (weak labels, then question localization).
"""

from __future__ import annotations

import json
import random
import zlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterator

from arbor_train.runtime import ArborMemory, Localization

GROUP_FIELDS = ("speaker", "back", "minutes")  # a group-chat candidate's extra document fields (schema.Candidate)
RULE_ROUTES = ("temporal_return",)  # routes the weak rules trust whatever the confidence


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


@dataclass
class Step:
    """One turn of the replay, localized and not yet committed."""

    replay: "Replay"
    pos: int                      # position in the replayed turns
    turn: dict[str, Any]
    loc: Localization             # what the runtime decided
    candidates: list[dict]        # the recalled candidates as rows (add_gold appends)
    chosen: int | None            # the turn number the runtime would attach to (None: a new root)
    question: bool = False
    extraction: Any = None        # set by the miner: the turn is committed with it instead of extracting again
    _at: Localization | None = field(default=None, repr=False)

    def add_gold(self, turns) -> None:
        """Append each of these earlier turns that recall missed to the candidates (`recalled: false`)."""
        rp = self.replay
        have = {c["turn"] for c in self.candidates}
        for t in turns:
            if t is not None and t not in have:
                self.candidates.append(gold_candidate(rp.mem, rp.node_of[t], rp.turn_of, self.turn.get("timestamp"),
                                                      question=self.question))
                have.add(t)

    def commit_at(self, parent: int | None, route: str = "gold", secondary=()) -> None:
        """Commit the turn below this earlier turn (None: a new root) instead of where the runtime routed
        it; `secondary`: earlier turns it also links to (a multi-intent turn)."""
        nodes = self.replay.node_of
        self._at = Localization(None if parent is None else nodes[parent], route, 1.0,
                                secondary=[nodes[s] for s in secondary])


class Replay:
    """One conversation's memory (in memory, closed on exit) and the map between its nodes and turn numbers."""

    def __init__(self, conv_id: str, runtime_cfg: dict, components: dict):
        self.conv_id = conv_id
        self.mem = ArborMemory.open(":memory:", conv_id, runtime_cfg, components=components)
        self.node_of: dict[int, int] = {}   # turn number -> node id
        self.turn_of: dict[int, int] = {}   # node id -> turn number

    def __enter__(self) -> "Replay":
        return self

    def __exit__(self, *exc) -> None:
        self.mem.store.close()

    def steps(self, turns: list[dict], question=lambda t: False) -> Iterator[Step]:
        """Localize, yield, commit, for each turn in order. `question(turn)`: the turn is a question
        (localized as one; its candidates carry their own text and time)."""
        for pos, t in enumerate(turns):
            q = bool(question(t))
            loc = self.mem.localize(t["user"], for_question=q, speaker=t.get("speaker"), timestamp=t.get("timestamp"))
            step = Step(self, pos, t, loc, [candidate_row(c, self.turn_of, question=q) for c in loc.candidates],
                        self.turn_of.get(loc.parent_id) if loc.parent_id is not None else None, q)
            yield step
            node = self.mem.commit(t["user"], t.get("assistant") or "", step._at or loc, t.get("timestamp"),
                                   extraction=step.extraction, speaker=t.get("speaker"))
            self.node_of[t["turn"]], self.turn_of[node.id] = node.id, t["turn"]

    def localize_question(self, text: str) -> tuple[Localization, list[dict]]:
        """A question over the memory as replayed so far: the runtime's localization and its candidates as
        rows (with their own text and time)."""
        loc = self.mem.localize(text, for_question=True)
        return loc, [candidate_row(c, self.turn_of, question=True) for c in loc.candidates]


def replay_routing(conv_id: str, turns: list[dict], runtime_cfg: dict, comps: dict, counts: Counter,
                   teacher_forcing: float = 1.0, seed: int = 0, label_rule: str = "gold_link",
                   weak_min_confidence: float | None = None, rows_from: int = 0,
                   route: str = "gold", finish=None) -> list[dict]:
    """Routing rows of one conversation replayed through the runtime.

    `turns`: dicts with `turn` (the number rows record), user, assistant, timestamp, speaker and `parents`
    (the gold parents' turn numbers, an empty tuple for a new thread, or None: not labelled), and
    optionally `label_rule` (the turn's own, else `label_rule`). Labelled turns are committed at their
    first gold parent (`route` names that placement), except a `1 - teacher_forcing` share drawn per
    conversation, left where the runtime routed them. With `weak_min_confidence` set, turns are labelled
    by the runtime's rules instead (data_gen/conversations.py). Only turns at position `rows_from` or
    later get rows (earlier ones are context). `finish(replay)`, if given, runs on the finished memory."""
    rng = random.Random(zlib.crc32(f"{seed}:{conv_id}".encode()))  # the same draws for a conversation every run
    rows = []
    with Replay(conv_id, runtime_cfg, comps) as rp:
        for step in rp.steps(turns):
            t, loc, cands, chosen = step.turn, step.loc, step.candidates, step.chosen
            n, pos = t["turn"], step.pos
            row = {"session_id": conv_id, "turn": n, "input": t["user"], "timestamp": t.get("timestamp"),
                   "candidates": cands, "runtime_choice": -1 if chosen is None else chosen, "route": loc.route}
            if weak_min_confidence is not None:
                sure = loc.route in RULE_ROUTES or (loc.route == "rerank" and loc.confidence is not None
                                                    and loc.confidence >= weak_min_confidence)
                if sure and pos >= rows_from and (chosen is None or any(c["turn"] == chosen for c in cands)):
                    gold = -1 if chosen is None else chosen
                    rows.append(dict(row, gold_parent=gold, gold_states=[gold], gold_recalled=True,
                                     label_rule=f"runtime_{loc.route}"))
                    counts["messages"] += 1
                    counts["new_conversation"] += gold == -1
                    counts["gold_recalled"] += 1
                elif pos >= rows_from:
                    counts["unsure"] += 1
            elif t.get("parents") is not None and pos >= rows_from:
                parents = sorted(p for p in t["parents"] if p != n and p in rp.node_of)
                gold = parents[0] if parents else -1
                step.add_gold(parents)
                rows.append(dict(row, gold_parent=gold, gold_states=parents or [-1],
                                 label_rule=t.get("label_rule") or label_rule,
                                 gold_recalled=gold == -1 or any(c["turn"] == gold and c["recalled"] for c in cands)))
                counts["messages"] += 1
                counts["new_conversation"] += gold == -1
                counts["multi_parent"] += len(parents) > 1
                counts["gold_recalled"] += rows[-1]["gold_recalled"]
                if teacher_forcing < 1.0 and rng.random() >= teacher_forcing:  # keep the runtime's own route
                    counts["runtime_placed"] += 1
                    counts["runtime_placed_right"] += rows[-1]["runtime_choice"] in rows[-1]["gold_states"]
                else:
                    step.commit_at(None if gold == -1 else gold, route)
        if finish is not None:
            finish(rp)
    return rows
