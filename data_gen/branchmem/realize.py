"""Realization: planned moves -> canonical user turns, canonical assistant responses, and the gold
extraction/tag/summary targets of each turn (all derived from the plan, never parsed back from text)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from . import lexicon as L
from .plan import KINDS, SLOT_TYPES, Branch, Move, SessionPlan, fmt_qty

SLOT_WORDS = {
    "budget": "budget", "date": "date", "deadline": "deadline", "start_date": "start date",
    "delivery_date": "delivery date", "hotel": "hotel", "venue": "venue", "gym": "gym", "store": "store",
    "companion": "companion", "client": "client", "coach": "coach", "guest_count": "guest count",
    "team_size": "team size", "weekly_sessions": "number of weekly sessions",
}
EVENT_OBJECTS = {
    "trip": ("the museum tickets", "the train", "a city pass", "the ferry", "the airport transfer", "a guided walk"),
    "event": ("the caterer deposit", "the sound system", "the flowers", "the printed programmes", "the photographer"),
    "project": (), "health": (), "purchase": (),
}
EVENT_NOUN = {"trip": "payments", "event": "payments", "project": "work sessions", "health": "runs",
              "purchase": "purchases"}
ORDINALS = ("first", "second", "third", "fourth", "fifth")

INTRO = (
    "I'm helping {owner} with a {title}. {first}'s {slot} is {value}.",
    "New thing to track: {owner}'s {title}. To start, {first}'s {slot} is {value}.",
    "Let's get {owner}'s {title} organised. The {slot} for {first} is {value}.",
    "{owner} asked me to help with a {title}; {first}'s {slot} is {value}.",
)
SET = {
    "continuation": ("Also, {first}'s {slot} is {value}.", "And the {slot} is {value}.",
                     "One more detail: {first}'s {slot} will be {value}.", "Also set the {slot} to {value}."),
    "return": ("Back to {label}: {first}'s {slot} is {value}.", "Returning to {label}, the {slot} is {value}.",
               "About {label} again: set the {slot} to {value}.", "Going back to {label}. {first}'s {slot} is {value}."),
}
UPDATE = (
    "Change {first}'s {slot} to {value}.",
    "Update for {label}: the {slot} changed from {old} to {value}.",
    "{first}'s {slot} is now {value} instead of {old}.",
    "Actually, move {first}'s {slot} to {value}.",
)
# a multi-intent turn: the primary branch's slot takes the value of another branch's slot, named but not
# stated ({o...}: the secondary branch), so only the secondary trajectory holds the value
LINK = (
    "For {label}, use the same {oslot} as {olabel}.",
    "Make {first}'s {slot} match the {oslot} of {olabel}.",
    "{first} wants the same {oslot} that {ofirst} has for the {otitle}; set that as the {slot} of the {title}.",
    "Copy {ofirst}'s {oslot} over to {label} as its {slot}.",
)
ARTIFACT = (
    "{first}'s {name}: {joined_then}.",
    "Here is the {name} for {label}: first {joined_first}.",
    "Order for {first}'s {name}: {numbered}.",
)
EVENT = {
    "paid": ("{first} paid {qty} for {obj}.", "Today {first} paid {qty} for {obj}.",
             "Quick note: {first} paid {qty} for {obj}.", "{first} just paid {qty} for {obj}."),
    "ran": ("{first} ran {num} km today.", "This morning {first} ran {num} km.", "{first} ran {num} km after work.",
            "Good news: {first} ran {num} km."),
    "logged": ("{first} logged {num} hours on the {title} today.", "Today {first} logged {num} hours of work.",
               "{first} logged {num} hours on it this afternoon.", "{first} logged {num} hours for the {title}."),
    "spent": ("{first} spent {qty} on {obj}.", "Yesterday {first} spent {qty} on {obj}.",
              "{first} just spent {qty} on {obj}.", "Small update: {first} spent {qty} on {obj}."),
}
FILLER = {
    None: ("Can you suggest something fun for {label}?", "Any advice on keeping {label} on track?"),
    "continuation": ("Sounds good. What else should {first} think about?", "Great, what do you think so far?",
                     "Perfect. Any risks I am missing?", "That works. What would you prioritise next?"),
    "return": ("Back to {label}: any tips to keep it on schedule?", "Returning to {label}, what should come next?",
               "About {label} again: anything we forgot?"),
}
FILLER_REPLY = ("Keep a short checklist and review it weekly.", "Confirm the bookings early and keep receipts.",
                "I would lock the essentials first and keep some slack.", "Looks solid; the next step is to confirm.",
                "Consider a small buffer in time and money.", "Share the plan so nobody is surprised.")
SMALLTALK_REPLY = ("Fair enough!", "Good question: small habits help.", "That sounds nice.", "Ha, I know the feeling.",
                   "Glad to hear it.", "Happy to chat about that any time.")
QUESTION = {
    "update_current": ("What is the current {slot} for {label}?", "Remind me, what is {first}'s {slot} now for the {title}?",
                       "What {slot} is {label} using now?"),
    "update_previous": ("Before the change, what was the {slot} for {label}?",
                        "What was {first}'s previous {slot} for the {title}?",
                        "What {slot} did {label} have before we updated it?"),
    "delayed_fact": ("Going back to {label}: what is the {slot}?", "Back to {label}, which {slot} did we settle on?",
                     "Returning to {label}, remind me of the {slot}?"),
    "parallel_fact": ("What {slot} did we settle on for {label}?", "Which {slot} is set for {label}?",
                      "For {label}, what is the {slot}?"),
    "linked_fact": ("Which {slot} does {label} have now?", "What {slot} did we end up with for {label}?",
                    "Remind me, what is {first}'s {slot} for the {title}?"),
    "artifact_order": ("In the {name} for {label}, what is item number {n}?", "What is the {ordinal} item on {first}'s {name}?",
                       "Which entry comes {ordinal} in the {name} for {label}?"),
    "event_count": ("How many {noun} have been recorded for {label} so far?", "So far, how many {noun} did {first} log for the {title}?",
                    "Count the {noun} for {label} so far: how many?"),
    "event_sum": ("What is the total of the {noun} for {label} so far?", "Add up the {noun} for {label}: what is the total?",
                  "In total, how much do the {noun} for {label} come to?"),
}
# the task named without its owner ({task}: "the trip to Lisbon"); with a parallel pair of the same kind
# this is lexically close to the partner on purpose
QUESTION_PARTIAL = {
    "update_current": ("What is the current {slot} for {task}?", "Remind me, what {slot} does {task} have now?",
                       "For {task}, what is the {slot} at the moment?", "What {slot} are we using for {task} now?"),
    "update_previous": ("Before the change, what was the {slot} for {task}?", "What was the old {slot} of {task}?",
                        "For {task}, which {slot} did we have before the update?",
                        "What {slot} did {task} have before we changed it?"),
    "delayed_fact": ("Going back to {task}: what is the {slot}?", "Back to {task}, which {slot} did we settle on?",
                     "Returning to {task}, remind me of the {slot}?", "Picking {task} up again: what was the {slot}?"),
    "parallel_fact": ("What {slot} did we settle on for {task}?", "Which {slot} is set for {task}?",
                      "For {task}, what is the {slot}?", "Can you remind me of the {slot} we chose for {task}?"),
    "linked_fact": ("Which {slot} does {task} have now?", "What {slot} did we end up with for {task}?",
                    "For {task}, which {slot} is it in the end?", "Remind me of the {slot} we chose for {task}?"),
    "artifact_order": ("In the {name} for {task}, what is item number {n}?", "What is the {ordinal} item on the {name} of {task}?",
                       "Which entry comes {ordinal} in the {name} for {task}?", "For {task}, what is {ordinal} on the {name}?"),
    "event_count": ("How many {noun} have been recorded for {task} so far?", "So far, how many {noun} are logged for {task}?",
                    "Count the {noun} for {task} so far: how many?", "For {task}, how many {noun} do we have now?"),
    "event_sum": ("What is the total of the {noun} for {task} so far?", "Add up the {noun} for {task}: what is the total?",
                  "In total, how much do the {noun} for {task} come to?", "For {task}, what do the {noun} add up to?"),
}
# no anchor at all: asked right after a turn of its own branch, so only the resumed state disambiguates
QUESTION_REFERENTIAL = {
    "update_current": ("And the {slot} now?", "What is the {slot} at this point?", "Remind me, what's the current {slot}?",
                       "So what {slot} are we on now?"),
    "update_previous": ("And what was the {slot} before the change?", "What was the old {slot} again?",
                        "Before we updated it, what was the {slot}?", "Which {slot} did we have before?"),
    "parallel_fact": ("And the {slot} was?", "Which {slot} did we settle on again?", "Remind me of the {slot}?",
                      "What is the {slot}, remind me?"),
    "linked_fact": ("And which {slot} does that give us?", "So what is the {slot} now?", "Remind me, which {slot} is that?",
                    "What {slot} did that come to?"),
    "artifact_order": ("What is item number {n} on the {name}?", "And the {ordinal} item on the {name}?",
                       "Which entry comes {ordinal} in the {name} again?", "What's {ordinal} on the {name}?"),
    "event_count": ("How many {noun} so far?", "And how many {noun} is that now?", "Count the {noun} so far for me?",
                    "How many {noun} have we logged by now?"),
    "event_sum": ("What do the {noun} add up to so far?", "And the total of the {noun}?",
                  "In total, how much do the {noun} come to now?", "What is the running total of the {noun}?"),
}
ANSWER = {
    "update_current": "The current {slot} for {label} is {gold}.",
    "update_previous": "Before the update, the {slot} for {label} was {gold}.",
    "delayed_fact": "The {slot} for {label} is {gold}.",
    "parallel_fact": "The {slot} for {label} is {gold}.",
    "linked_fact": "The {slot} for {label} is {gold}.",
    "artifact_order": "Item {n} in the {name} for {label} is {gold}.",
    "event_count": "{gold} {noun} have been recorded for {label}.",
    "event_sum": "The {noun} for {label} total {gold}.",
}
LEMMA = {"paid": "pay", "ran": "run", "logged": "log", "spent": "spend"}


@dataclass
class Turn:
    index: int
    user: str
    assistant: str
    timestamp: str
    branch: int | None
    move: str
    is_question: bool
    gold_parent: int | None            # index of the turn this one continues, None = new root
    extraction: dict = field(default_factory=dict)
    tags: list[str] = field(default_factory=list)
    summary: str = ""
    question: dict | None = None
    gold_secondary: int | None = None  # a multi-intent turn: the latest turn of the other branch it draws on


def _fmt(template: str, **kw) -> str:
    return template.format(**kw)


def realize(plan: SessionPlan, start_day: int = 0) -> list[Turn]:
    r = random.Random(plan.seed * 7919 + 13)
    turns: list[Turn] = []
    tip: dict[int, int] = {}
    for i, m in enumerate(plan.moves):
        ts = f"2025-{1 + (start_day + i // 12) // 28 % 12:02d}-{1 + (start_day + i // 12) % 28:02d}T{8 + i % 12:02d}:{(i * 7) % 60:02d}"
        if m.kind == "distractor":
            user = L.SMALLTALK[m.variant % len(L.SMALLTALK)]
            t = Turn(i, user, r.choice(SMALLTALK_REPLY), ts, None, "distractor", False, None,
                     extraction=_empty(), summary=f"small talk: {user[:60]}")
        else:
            b = plan.branches[m.branch]
            other = plan.branches[m.link] if m.link is not None else None
            user, assistant, extraction, tags, summary = _branch_turn(b, m, r, other)
            t = Turn(i, user, assistant, ts, b.id, m.kind, m.kind == "question", tip.get(b.id),
                     extraction=extraction, tags=tags, summary=summary, question=m.question,
                     gold_secondary=None if other is None else tip[other.id])
            tip[b.id] = i
        turns.append(t)
    return turns


def _empty() -> dict:
    return {"states": [], "facts": [], "entities": [], "artifacts": [], "events": []}


def _branch_turn(b: Branch, m: Move, r: random.Random, other: Branch | None = None):
    kw = {"owner": b.owner, "first": b.first, "title": b.title, "label": b.label}
    ex = _empty()
    tags: list[str] = []
    if m.kind == "link":  # the value is named by reference only: no state, a fact relating the two branches
        slot, oslot, tag = SLOT_WORDS[m.slot], SLOT_WORDS[m.link_slot], SLOT_TYPES[m.slot][0]
        user = _fmt(LINK[m.variant % len(LINK)], slot=slot, oslot=oslot, olabel=other.label, ofirst=other.first,
                    otitle=other.title, **kw)
        if m.cue == "return" and b.label not in user:
            user = f"Back to {b.label}. " + user
        assistant = f"Done: the {slot} for {b.label} now matches the {oslot} of {other.label}."
        ex["facts"] = [{"text": _clip(f"The {slot} for {b.label} is the same as the {oslot} of {other.label}"),
                        "entities": [b.first, other.first], "tags": [tag]}]
        ex["entities"] = _present([b.first, b.owner, other.first, other.owner], user)
        return user, assistant, ex, [tag], f"{b.label}: {slot} same as the {oslot} of {other.label}"
    if m.kind in ("intro", "set", "update"):
        slot = SLOT_WORDS[m.slot]
        tag = SLOT_TYPES[m.slot][0]
        if m.kind == "intro":
            user = _fmt(INTRO[m.variant % len(INTRO)], slot=slot, value=m.value, **kw)
            assistant = f"Got it, I am tracking {b.label}. The {slot} is {m.value}."
            summary = f"{b.label} starts; {slot} {m.value}"
        elif m.kind == "set":
            pool = SET[m.cue or "return"]
            user = _fmt(pool[m.variant % len(pool)], slot=slot, value=m.value, **kw)
            assistant = f"Noted: the {slot} for {b.label} is {m.value}."
            summary = f"{b.label}: {slot} {m.value}"
        else:
            user = _fmt(UPDATE[m.variant % len(UPDATE)], slot=slot, value=m.value, old=m.old, **kw)
            if m.cue == "return" and b.label not in user:
                user = f"Back to {b.label}. " + user
            assistant = f"Updated the {slot} for {b.label} from {m.old} to {m.value}."
            summary = f"{b.label}: {slot} changed from {m.old} to {m.value}"
        ents = _present([b.first, b.owner, m.value, b.title.split(" to ")[-1]], user)
        ex["states"] = [{"key": m.slot, "value": m.value, "tag": tag, "entities": ents, "evidence": _clip(user)}]
        ex["facts"] = [{"text": _clip(f"The {slot} for {b.label} is {m.value}"), "entities": [b.first, m.value],
                        "tags": [tag]}]
        ex["entities"] = ents
        tags = [tag]
    elif m.kind == "artifact":
        items = m.items or []
        name = b.artifact_name
        user = _fmt(ARTIFACT[m.variant % len(ARTIFACT)], name=name,
                    joined_then=", then ".join(items), joined_first=", then ".join(items[:-1]) + ", and finally " + items[-1],
                    numbered=" ".join(f"{k + 1}) {it}" for k, it in enumerate(items)), **kw)
        if m.cue == "return" and b.label not in user:
            user = f"Back to {b.label}. " + user
        assistant = f"Saved the {name} for {b.label}: " + "; ".join(f"{k + 1}. {it}" for k, it in enumerate(items)) + "."
        ex["artifacts"] = [{"name": name, "subject": b.first, "items": items, "entities": [b.first]}]
        ex["facts"] = [{"text": _clip(f"The {name} for {b.label} is: " + ", ".join(items)), "entities": [b.first],
                        "tags": ["item"]}]
        ex["entities"] = _present([b.first, b.owner], user)
        tags = ["item"]
        summary = f"{b.label}: {name} " + ", ".join(items)
    elif m.kind == "event":
        verb, unit, _, tag = KINDS[b.kind]["event"]
        qty = fmt_qty(m.quantity, unit)
        num = qty.split()[0] if unit != "$" else qty
        objs = EVENT_OBJECTS[b.kind] or L.SHOPPING_ITEMS
        pool = EVENT[verb]
        user = _fmt(pool[m.variant % len(pool)], qty=qty, num=num, obj=r.choice(objs), **kw)
        if m.cue == "return":
            user = f"Back to {b.label}. " + user
        assistant = f"Logged it for {b.label}."
        ex["events"] = [{"subject": b.first, "action": LEMMA[verb], "category": EVENT_NOUN[b.kind],
                         "quantity": m.quantity, "unit": unit, "date": None, "text": _clip(user), "entities": [b.first]}]
        ex["facts"] = [{"text": _clip(user), "entities": [b.first, qty], "tags": [tag]}]
        ex["entities"] = _present([b.first, b.owner, qty], user)
        tags = [tag]
        summary = f"{b.label}: {verb} {qty}"
    elif m.kind == "filler":
        pool = FILLER[m.cue]
        user = _fmt(pool[m.variant % len(pool)], **kw)
        assistant = r.choice(FILLER_REPLY)
        ex["entities"] = _present([b.first, b.owner], user)
        summary = f"{b.label}: discussion"
    else:  # question
        q = m.question
        t = q["type"]
        slot = SLOT_WORDS.get(q.get("slot") or "", "")
        pos = q.get("position", 0)
        extra = {"slot": slot, "name": b.artifact_name, "n": pos + 1, "ordinal": ORDINALS[pos],
                 "noun": EVENT_NOUN[b.kind], "gold": q["gold"]}
        level = q.get("specificity", "explicit")
        if level == "explicit":  # the original realizations, drawn as before
            pool = QUESTION[t]
            user = _fmt(pool[m.variant % len(pool)], **extra, **kw)
        else:
            pool = (QUESTION_PARTIAL if level == "partial" else QUESTION_REFERENTIAL)[t]
            user = _fmt(pool[q.get("template", 0) % len(pool)], task=f"the {b.title}", **extra, **kw)
        assistant = _fmt(ANSWER[t], **extra, **kw)
        tags = [SLOT_TYPES[q["slot"]][0]] if q.get("slot") else (["item"] if t == "artifact_order" else
                                                                   [KINDS[b.kind]["event"][3], "quantity"])
        ex["entities"] = _present([b.first, b.owner], user)
        summary = f"{b.label}: question about {slot or extra['name'] if t == 'artifact_order' else slot or extra['noun']}"
    return user, assistant, ex, tags, summary


def _present(cands: list[str], text: str) -> list[str]:
    out = []
    for c in cands:
        if c and c in text and c not in out and not any(c in o for o in out):
            out.append(c)
    return out


def _clip(s: str, n: int = 179) -> str:
    return s if len(s) <= n else s[: n - 1].rsplit(" ", 1)[0]
