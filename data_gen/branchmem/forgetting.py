"""BranchMemEval-style sessions with a request to forget (issue #19): the session option of the
forgetting evaluation (`python -m eval.forgetting`).

From a generated session, `with_forget_request` picks one stated value to forget:
- `forgotten_update`: the last update of a slot ("the date changed from October 13 to February 20");
  after the forget, the value before it is current again, and the probe's gold is that old value;
- `forgotten_fact`: a slot set once and never updated; after the forget nothing holds it, and the
  probe's gold is "unknown".
A few turns after the target (and after every turn that states the value: a question's canonical
reply may quote it) a request turn is inserted ("Please forget what I told you about Erik's date."; it
names the slot, never the value), with `forget_turns` naming every earlier turn that mentions the value
(the scorer's own matcher, `arbor_train.scoring.answers.mentions`): the harness applies the deletion through each
method's own `forget`, as an application would after its user asked to delete every mention. A value
is only chosen when every other turn that mentions it is a question about the same slot, and no
timestamp does ("5" in an agenda's "5) coffee break", "49" in "15:49"): the deletion then removes
nothing else, and the value's presence in a later context is a leak, not a coincidence. The session
goes on, and a probe question about the forgotten slot closes it. Turn indices after the insertion
point, gold parents and question turns are shifted; nothing else of the session changes, so its other
questions can be compared with the same session without the request.
"""

from __future__ import annotations

import copy
import json
import random

from arbor_train.scoring.answers import mentions

from .realize import SLOT_WORDS

REQUEST = ("Please forget what I told you about {first}'s {slot}.",
           "Delete the {slot} I gave you for {label}; do not keep it.",
           "Scratch that from your memory: {first}'s {slot} for the {title}.",
           "I'd like you to forget the {slot} of {label}.")
REPLY = "Done: I have forgotten it."
PROBE = ("What is {first}'s {slot} for the {title}?", "Remind me, what {slot} do we have for {label}?",
         "Which {slot} is set for {label}?")


def _mentions(turn: dict, value: str) -> bool:
    return mentions(f"{turn['user']}\n{turn['assistant']}", value)


def forget_targets(sess: dict) -> list[dict]:
    """Every value of the session that can be forgotten cleanly (see the module docstring)."""
    plan = json.loads(sess["plan"])
    moves, turns = plan["moves"], sess["turns"]
    out = []
    for i, m in enumerate(moves):
        if m["kind"] not in ("set", "update") or m["slot"] is None:
            continue
        later = [j for j in range(i + 1, len(moves))
                 if moves[j]["branch"] == m["branch"] and moves[j]["slot"] == m["slot"]
                 and moves[j]["kind"] in ("set", "update", "intro")]
        if later:
            continue
        value = m["value"]
        if m["kind"] == "update" and not m["old"]:
            continue
        said = [j for j, t in enumerate(turns) if _mentions(t, value)]
        if i not in said or any(j < i for j in said):  # stated first by this turn
            continue
        about = lambda j: (moves[j]["kind"] == "question" and moves[j]["branch"] == m["branch"]  # noqa: E731
                           and (moves[j]["question"] or {}).get("slot") == m["slot"])
        if any(j != i and not about(j) for j in said):  # "5" in "5) coffee break": deleting would hit other facts
            continue
        if any(mentions(t["timestamp"] or "", value) for t in turns):  # "49" in "15:49": not a clean probe
            continue
        out.append({"turn": i, "mentions": said, "branch": m["branch"], "slot": m["slot"], "value": value,
                    "gold": m["old"] if m["kind"] == "update" else "unknown",
                    "type": "forgotten_update" if m["kind"] == "update" else "forgotten_fact"})
    return out


def with_forget_request(sess: dict, rng: random.Random, gap: tuple[int, int] = (2, 6)) -> dict | None:
    """A copy of the session with one forget request and its probe question; None if nothing can go."""
    targets = forget_targets(sess)
    if not targets:
        return None
    kinds = sorted({t["type"] for t in targets})
    kind = rng.choice(kinds)  # updates are rarer than facts: pick the kind first, so both are well covered
    tgt = rng.choice([t for t in targets if t["type"] == kind])
    plan = json.loads(sess["plan"])
    b = plan["branches"][tgt["branch"]]
    first = b["owner"].split()[0]
    kw = {"first": first, "slot": SLOT_WORDS[tgt["slot"]], "title": b["title"], "label": f"{first}'s {b['title']}"}
    out = copy.deepcopy(sess)
    turns = out["turns"]
    # the request goes in before index pos: a few turns after the target and after every mention
    pos = min(max(tgt["turn"] + rng.randint(*gap), max(tgt["mentions"])), len(turns) - 1) + 1

    def shift(i: int) -> int:
        return i + 1 if i >= pos else i

    for t in turns:
        t["index"] = shift(t["index"])
        if t["gold_parent"] >= 0:
            t["gold_parent"] = shift(t["gold_parent"])
    for q in out["questions"]:
        q["turn"] = shift(q["turn"])
    prev = [t["index"] for t in turns[:pos] if t["branch"] == tgt["branch"]]
    ts = turns[pos - 1]["timestamp"]
    request = {"index": pos, "user": rng.choice(REQUEST).format(**kw), "assistant": REPLY, "timestamp": ts,
               "branch": tgt["branch"], "gold_parent": prev[-1] if prev else -1, "is_question": False,
               "move": "forget", "forget_turns": list(tgt["mentions"])}
    turns.insert(pos, request)
    last = [t["index"] for t in turns if t["branch"] == tgt["branch"]]
    probe_turn = len(turns)
    turns.append({"index": probe_turn, "user": rng.choice(PROBE).format(**kw),
                  "assistant": "I have nothing on that." if tgt["gold"] == "unknown" else f"It is {tgt['gold']}.",
                  "timestamp": turns[-1]["timestamp"], "branch": tgt["branch"], "gold_parent": last[-1],
                  "is_question": True, "move": "question"})
    out["questions"].append({"turn": probe_turn, "branch": tgt["branch"], "type": tgt["type"],
                             "dimension": "forgetting", "gold": tgt["gold"], "confounder": tgt["value"],
                             "confounder_branch": tgt["branch"]})
    out["forget"] = {"request_turn": pos, "turns": list(tgt["mentions"]), "value": tgt["value"], "type": tgt["type"],
                     "branch": tgt["branch"], "slot": tgt["slot"]}
    out["session_id"] = f"{sess['session_id']}-forget"
    return out
