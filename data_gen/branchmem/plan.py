"""The programmatic planner: everything about a session is fixed here, before any text exists.

A session is 3 or 4 topical branches owned by named people. Branches come in parallel pairs of the
same kind (two trips, two event agendas, ...) so that every question has a structurally plausible
confounder: the same slot, artifact position or event total in the partner branch. The planner fixes
slot values and updates (old -> new), artifacts (ordered items), events, distractor turns, the
interleaving schedule with delayed resumptions, question positions, gold answers and confounders.
`realize.py` then turns moves into text; `validate.py` checks the result.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from typing import Any

from . import lexicon as L

# slot key -> (attribute tag, value kind)
SLOT_TYPES: dict[str, tuple[str, str]] = {
    "budget": ("money", "money"), "date": ("time", "date"), "deadline": ("time", "date"),
    "start_date": ("time", "date"), "delivery_date": ("time", "date"), "hotel": ("location", "venue"),
    "venue": ("location", "venue"), "gym": ("location", "venue"), "store": ("location", "venue"),
    "companion": ("person", "person"), "client": ("person", "person"), "coach": ("person", "person"),
    "guest_count": ("quantity", "count"), "team_size": ("quantity", "count"),
    "weekly_sessions": ("quantity", "small_count"),
}

# kind -> title template, slots, artifact (name, item pool), events (verb, unit, description pool, tag)
KINDS: dict[str, dict[str, Any]] = {
    "trip": {"title": "trip to {city}", "slots": ["budget", "date", "hotel", "companion"],
             "artifact": ("itinerary", "LANDMARKS"), "event": ("paid", "$", "tickets and fares", "money")},
    "event": {"title": "{occasion} in {city}", "slots": ["budget", "date", "venue", "guest_count"],
              "artifact": ("agenda", "AGENDA_ITEMS"), "event": ("paid", "$", "deposits", "money")},
    "project": {"title": "{codename} project", "slots": ["budget", "deadline", "client", "team_size"],
                "artifact": ("milestone plan", "MILESTONES"), "event": ("logged", "hours", "work sessions", "quantity")},
    "health": {"title": "training plan", "slots": ["gym", "coach", "start_date", "weekly_sessions"],
               "artifact": ("routine", "EXERCISES"), "event": ("ran", "km", "runs", "health")},
    "purchase": {"title": "home office setup", "slots": ["budget", "store", "delivery_date", "companion"],
                 "artifact": ("shopping list", "SHOPPING_ITEMS"), "event": ("spent", "$", "purchases", "money")},
}
OCCASIONS = ("wedding", "conference", "birthday party", "reunion", "workshop", "book launch", "retreat")
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")

QUESTION_TYPES = ("update_current", "update_previous", "delayed_fact", "artifact_order", "event_count",
                  "event_sum", "parallel_fact", "linked_fact")
# linked_fact: a slot set by a multi-intent turn ("Give Erik the same hotel as Amelie's trip to Oslo"); the
# value is stated only in the other branch, so the answer needs the turn's secondary state (presets that
# list it in question_types; formal does not)
DIMENSION = {"delayed_fact": "delayed_resumption", "parallel_fact": "parallel_confusion", "linked_fact": "multi_intent"}
# how much a question names its trajectory: explicit (owner and task: "Amara's trip to Lisbon"), partial
# (the task only: "the trip to Lisbon", lexically close to the partner's "trip to Mombasa"), referential
# (no anchor: "and the budget now?", asked right after a turn of its own branch, so only the resumed
# state tells which trajectory it means)
SPECIFICITY = ("explicit", "partial", "referential")


@dataclass
class Branch:
    id: int
    kind: str
    owner: str          # full name
    title: str          # e.g. "trip to Lisbon"
    partner: int        # the parallel branch of the same kind
    slots: dict[str, list[str]] = field(default_factory=dict)   # key -> values over time (old -> new)
    artifact_name: str = ""
    artifact: list[str] = field(default_factory=list)
    events: list[float] = field(default_factory=list)            # event quantities in order

    @property
    def first(self) -> str:
        return self.owner.split()[0]

    @property
    def label(self) -> str:
        """How the user names this trajectory: "Amara's trip to Lisbon"."""
        return f"{self.first}'s {self.title}"


def allowed_specificity(b: Branch, partner: Branch, qtype: str) -> list[str]:
    """The levels a question about b can take: partial needs a task title that differs from the partner's
    (two "training plan"s cannot be told apart without their owners); referential needs the branch to be
    the current one, which a delayed resumption never is."""
    out = ["explicit"]
    if partner is b or partner.title != b.title:
        out.append("partial")
    if qtype != "delayed_fact":
        out.append("referential")
    return out


def draw_specificity(r: random.Random, weights: dict[str, float], allowed: list[str]) -> str:
    """One level from the preset's distribution, restricted to the allowed ones (explicit if none weighs)."""
    levels = [x for x in SPECIFICITY if x in allowed and weights.get(x, 0) > 0]
    if not levels:
        return "explicit"
    return r.choices(levels, [weights[x] for x in levels])[0]


@dataclass
class Move:
    """One planned turn: what it does, to which branch, with which values."""

    kind: str                    # intro | set | update | link | artifact | event | filler | distractor | question
    branch: int | None           # None for distractors; for a link, the primary branch (whose slot is set)
    slot: str | None = None
    value: str | None = None
    old: str | None = None
    items: list[str] | None = None
    quantity: float | None = None
    question: dict | None = None  # for kind == question: type, gold, confounder, ...
    variant: int = 0             # which paraphrase realizes it
    cue: str | None = None       # continuation | return | None (how the turn signals its branch)
    link: int | None = None      # a link (multi-intent) move: the secondary branch whose value it copies
    link_slot: str | None = None  # ... and that branch's slot


def _move_json(m: Move) -> dict:
    d = asdict(m)
    if m.link is None:  # plans without multi-intent turns serialise exactly as before links existed
        del d["link"], d["link_slot"]
    return d


@dataclass
class SessionPlan:
    session_id: str
    seed: int
    branches: list[Branch]
    moves: list[Move]

    def to_json(self) -> dict:
        return {"session_id": self.session_id, "seed": self.seed, "branches": [asdict(b) for b in self.branches],
                "moves": [_move_json(m) for m in self.moves]}


class PlanError(RuntimeError):
    pass


def money(r: random.Random) -> str:
    return f"${r.randint(4, 120) * 50:,}"


def date(r: random.Random) -> str:
    return f"{r.choice(MONTHS)} {r.randint(1, 28)}"


def value_for(slot: str, r: random.Random, used: set[str]) -> str:
    kind = SLOT_TYPES[slot][1]
    for _ in range(100):
        if kind == "money":
            v = money(r)
        elif kind == "date":
            v = date(r)
        elif kind == "venue":
            v = r.choice(L.VENUES)
        elif kind == "person":
            v = f"{r.choice(L.FIRST_NAMES)} {r.choice(L.LAST_NAMES)}"
        elif kind == "count":
            v = str(r.randint(6, 240))
        else:
            v = str(r.randint(2, 6))
        if v not in used:
            used.add(v)
            return v
    raise PlanError(f"could not draw a fresh value for slot {slot}")


def make_branches(r: random.Random, n: int) -> list[Branch]:
    """n = 3 or 4 branches: one or two parallel pairs of the same kind (plus a lone branch when n = 3)."""
    kinds = r.sample(list(KINDS), 2)
    plan_kinds = [kinds[0], kinds[0]] + ([kinds[1], kinds[1]] if n == 4 else [kinds[1]])
    firsts = r.sample(L.FIRST_NAMES, n)
    used: set[str] = set()
    cities = r.sample(L.CITIES, n)
    branches = []
    for i, k in enumerate(plan_kinds):
        spec = KINDS[k]
        title = spec["title"].format(city=cities[i], occasion=r.choice(OCCASIONS), codename=r.choice(L.PROJECT_CODENAMES))
        partner = i + 1 if i % 2 == 0 else i - 1
        if partner >= n:
            partner = i  # the lone branch has no parallel partner
        b = Branch(i, k, f"{firsts[i]} {r.choice(L.LAST_NAMES)}", title, partner)
        for s in spec["slots"]:
            b.slots[s] = [value_for(s, r, used)]
        b.artifact_name = spec["artifact"][0]
        b.artifact = r.sample(getattr(L, spec["artifact"][1]), r.randint(3, 5))
        b.events = [float(r.randint(2, 40) * (5 if spec["event"][1] == "$" else 1)) for _ in range(r.randint(2, 4))]
        branches.append(b)
    # parallel partners must differ where questions compare them
    for b in branches:
        p = branches[b.partner]
        if p is b:
            continue
        while len(p.events) == len(b.events) or sum(p.events) == sum(b.events):
            p.events.append(float(r.randint(2, 40) * (5 if KINDS[p.kind]["event"][1] == "$" else 1)))
            if len(p.events) > 6:
                p.events = p.events[:2]
    return branches


def plan_session(session_id: str, seed: int, n_turns: int, n_questions: int, cfg: dict) -> SessionPlan:
    """Plan one session with exactly n_turns turns of which n_questions are questions."""
    r = random.Random(seed)
    n_branches = 4 if r.random() < cfg["p_four_branches"] else 3
    branches = make_branches(r, n_branches)
    paired = [b for b in branches if b.partner != b.id]
    qtypes = list(cfg["question_types"])
    # question targets and types
    questions: list[dict] = []
    offset = r.randrange(len(qtypes))
    for j in range(n_questions):
        qt = qtypes[(offset + j * cfg["type_stride"]) % len(qtypes)]
        b = paired[(j + r.randrange(2)) % len(paired)]
        questions.append({"type": qt, "branch": b.id})
    # per-branch move queues
    queues: dict[int, list[Move]] = {b.id: [] for b in branches}
    for b in branches:
        slots = list(b.slots)
        r.shuffle(slots)
        queues[b.id].append(Move("intro", b.id, slot=slots[0], value=b.slots[slots[0]][0], variant=r.randrange(4)))
        for s in slots[1:]:
            queues[b.id].append(Move("set", b.id, slot=s, value=b.slots[s][0], variant=r.randrange(4)))
    used_values = {v for b in branches for vs in b.slots.values() for v in vs}
    for q in questions:
        b = branches[q["branch"]]
        if q["type"] in ("update_current", "update_previous"):
            updatable = [s for s in b.slots if len(b.slots[s]) == 1 and SLOT_TYPES[s][1] != "small_count"]
            s = r.choice(updatable or list(b.slots))
            new = value_for(s, r, used_values)
            old = b.slots[s][-1]
            b.slots[s].append(new)
            queues[b.id].append(Move("update", b.id, slot=s, value=new, old=old, variant=r.randrange(4)))
            q["slot"] = s
    after: dict[int, int] = {}  # id(link move) -> id(the secondary branch's move that states the copied value)
    linked: set[tuple[int, str]] = set()  # (branch, slot) that a link sets: no other question asks about them
    for q in questions:
        if q["type"] == "linked_fact":
            _plan_link(r, branches, queues, q, after, linked, questions)
    for b in branches:
        queues[b.id].insert(1 + r.randrange(len(queues[b.id])), Move("artifact", b.id, items=list(b.artifact),
                                                                      variant=r.randrange(3)))
        for qty in b.events:
            queues[b.id].insert(1 + r.randrange(len(queues[b.id])), Move("event", b.id, quantity=qty,
                                                                          variant=r.randrange(4)))
    # questions: bind gold and confounder now that values are final
    spec = cfg.get("specificity") or {"explicit": 1.0}
    rs = random.Random(seed * 7907 + 5)
    for q in questions:
        b, p = branches[q["branch"]], branches[branches[q["branch"]].partner]
        t = q["type"]
        if t in ("update_current", "update_previous"):
            s = q["slot"]
            q["gold"] = b.slots[s][-1] if t == "update_current" else b.slots[s][-2]
            q["confounder"] = p.slots[s][-1] if s in p.slots else None
        elif t == "linked_fact":
            link = q["_link"]
            q["gold"], q["confounder"] = link.value, p.slots[q["slot"]][-1]
            q["secondary_branch"] = link.link
        elif t in ("delayed_fact", "parallel_fact"):
            shared = [s for s in b.slots if s in p.slots and b.slots[s][-1] != p.slots[s][-1]
                      and (b.id, s) not in linked and (p.id, s) not in linked]
            if not shared:
                raise PlanError("no slot left for a fact question beside the linked ones")
            s = r.choice(shared)
            q["slot"], q["gold"], q["confounder"] = s, b.slots[s][-1], p.slots[s][-1]
        elif t == "artifact_order":
            n = min(len(b.artifact), len(p.artifact))
            differing = [k for k in range(n) if b.artifact[k] != p.artifact[k]]
            if not differing:
                raise PlanError("parallel artifacts are identical")
            i = r.choice(differing)
            q["position"], q["gold"], q["confounder"] = i, b.artifact[i], p.artifact[i]
        elif t == "event_count":
            q["gold"], q["confounder"] = str(len(b.events)), str(len(p.events))
        elif t == "event_sum":
            unit = KINDS[b.kind]["event"][1]
            q["unit"] = unit
            q["gold"], q["confounder"] = fmt_qty(sum(b.events), unit), fmt_qty(sum(p.events), unit)
        q["dimension"] = DIMENSION.get(t, "interleaving")
        q["confounder_branch"] = p.id
        # drawn from its own stream, so an explicit-only preset plans exactly what it did before levels existed
        q["specificity"] = draw_specificity(rs, spec, allowed_specificity(b, p, t))
        q["template"] = rs.randrange(1 << 16)  # which partial / referential realization (realize.py)
        q["_support"] = {id(m) for bid in {b.id, p.id} for m in queues[bid] if _supports(m, q)}
        if t == "linked_fact":  # the link itself and the secondary branch's statement of the value
            q["_support"] |= {id(q["_link"]), after[id(q.pop("_link"))]}
    # pad to the exact number of non-question turns with fillers and distractors
    content = sum(len(v) for v in queues.values())
    target = n_turns - n_questions
    if content > target:
        raise PlanError(f"{content} content turns exceed the {target} non-question turns of the session")
    pad = target - content
    n_distract = min(pad, round(pad * cfg["distractor_share"]))
    for _ in range(pad - n_distract):
        b = r.choice(branches)
        queues[b.id].insert(1 + r.randrange(len(queues[b.id])), Move("filler", b.id, variant=r.randrange(6)))
    moves = schedule(r, branches, queues, questions, n_distract, cfg, after)
    if len(moves) != n_turns:
        raise PlanError(f"scheduled {len(moves)} turns, expected {n_turns}")
    return SessionPlan(session_id, seed, branches, moves)


def _plan_link(r: random.Random, branches: list[Branch], queues: dict[int, list[Move]], q: dict,
               after: dict[int, int], linked: set[tuple[int, str]], questions: list[dict]) -> None:
    """A multi-intent turn for a linked_fact question on q's branch b: one of b's slots (set once, not its
    intro, not updated) takes the value of a same-kind slot of a branch of another kind ("the same hotel
    as Amelie's"). The link replaces b's own statement of that slot, so the value is stated only in the
    secondary branch, and it waits in b's queue until that statement was made."""
    b = branches[q["branch"]]
    intro = queues[b.id][0].slot
    # the partner's update questions compare against b's value of their slot: b must state it itself
    asked = {x["slot"] for x in questions if x["branch"] == b.partner and x.get("slot")}
    options = []
    for s in b.slots:
        if s == intro or len(b.slots[s]) != 1 or SLOT_TYPES[s][1] == "small_count" or (b.id, s) in linked or s in asked:
            continue
        if (branches[b.partner].id, s) in linked:
            continue
        for a in branches:
            if a.kind == b.kind:
                continue
            for s2 in a.slots:
                if SLOT_TYPES[s2][1] == SLOT_TYPES[s][1] and len(a.slots[s2]) == 1 and (a.id, s2) not in linked:
                    options.append((s, a, s2))
    if not options:
        raise PlanError(f"branch {b.id} has no slot a multi-intent turn could link")
    same = [o for o in options if o[0] == o[2]]  # "the same hotel as ..." reads best
    s, a, s2 = r.choice(same or options)
    value = a.slots[s2][0]
    b.slots[s] = [value]
    source = next(m for m in queues[a.id] if m.kind in ("intro", "set") and m.slot == s2)
    k = next(i for i, m in enumerate(queues[b.id]) if m.kind == "set" and m.slot == s)
    link = Move("link", b.id, slot=s, value=value, variant=r.randrange(4), link=a.id, link_slot=s2)
    queues[b.id][k] = link
    after[id(link)] = id(source)
    linked.update({(b.id, s), (a.id, s2)})
    q["slot"], q["_link"] = s, link


def _supports(m: Move, q: dict) -> bool:
    """Does move m state something question q needs in the prefix (gold or confounder)?"""
    t = q["type"]
    if t == "artifact_order":
        return m.kind == "artifact"
    if t in ("event_count", "event_sum"):
        return m.kind == "event"
    return m.kind in ("intro", "set", "update", "link") and m.slot == q["slot"]


def fmt_qty(x: float, unit: str) -> str:
    n = f"{x:,.0f}" if float(x).is_integer() else f"{x:,.1f}"
    return f"${n}" if unit == "$" else f"{n} {unit}"


def schedule(r: random.Random, branches: list[Branch], queues: dict[int, list[Move]], questions: list[dict],
             n_distract: int, cfg: dict, after: dict[int, int] | None = None) -> list[Move]:
    """Interleave the branch queues with distractors; ask each question once its support is in the
    prefix, a delayed one only after its branch has rested more than `delay_min` turns. A branch whose
    next move is a link waits until the move it copies from (`after`) was emitted."""
    after = after or {}
    delay = cfg["delay_min"]
    out: list[Move] = []
    emitted: set[int] = set()
    last_seen: dict[int, int] = {}
    pending = list(questions)
    distract_left = n_distract
    stick = cfg["p_stay_on_branch"]

    def cue_for(bid: int, pos: int) -> str | None:
        if bid not in last_seen:
            return None
        return "continuation" if pos - last_seen[bid] == 1 else "return"

    def current(q: dict) -> bool:
        """A referential question is asked only right after a statement of its own branch."""
        return bool(out) and out[-1].branch == q["branch"] and out[-1].kind != "question"

    def rested(q: dict) -> bool:
        """A delayed resumption waits until its branch has rested more than `delay_min` turns."""
        return q["type"] != "delayed_fact" or len(out) - last_seen.get(q["branch"], len(out)) > delay

    while pending or distract_left or any(queues.values()):
        pos = len(out)
        supported = [q for q in pending if q["_support"] <= emitted]
        ready = [q for q in supported if rested(q) and (q.get("specificity") != "referential" or current(q))]
        content_left = sum(len(v) for v in queues.values()) + distract_left
        if not ready and content_left == 0:
            # a referential question whose branch never came back: asked with its task named instead
            for q in supported:
                if q.get("specificity") == "referential":
                    b = branches[q["branch"]]
                    q["specificity"] = ("partial" if "partial" in allowed_specificity(b, branches[b.partner], q["type"])
                                        else "explicit")
                    q["demoted"] = True
            ready = [q for q in supported if q.get("specificity") != "referential" and rested(q)]
        now = [q for q in ready if q.get("specificity") == "referential"]  # its moment passes with the next turn
        if ready and (content_left == 0 or now or r.random() < cfg["p_ask_when_ready"]):
            q = (now or ready)[0]
            pending.remove(q)
            out.append(Move("question", q["branch"], question={k: v for k, v in q.items() if k != "_support"},
                            variant=r.randrange(3), cue=cue_for(q["branch"], pos)))
            last_seen[q["branch"]] = pos
            continue
        if content_left == 0:
            raise PlanError(f"{len(pending)} question(s) could not be placed: their branch never rested long enough")
        resting = {q["branch"] for q in supported if q["type"] == "delayed_fact"}
        free = [b.id for b in branches if queues[b.id] and after.get(id(queues[b.id][0]), -1) in emitted | {-1}]
        choices = [bid for bid in free if bid not in resting]
        if distract_left and (not choices or r.random() < distract_left / (content_left + 1)):
            out.append(Move("distractor", None, variant=r.randrange(len(L.SMALLTALK))))
            distract_left -= 1
            continue
        if not choices:
            choices = free
        if not choices:
            raise PlanError("every branch waits on a link whose source was not stated")
        prev = out[-1].branch if out else None
        # a supported referential question waits for its branch: steer there half of the time
        waiting = [q["branch"] for q in supported if q.get("specificity") == "referential" and q["branch"] in choices]
        if waiting and prev not in waiting and r.random() < 0.5:
            bid = waiting[0]
        else:
            bid = prev if (prev in choices and r.random() < stick) else r.choice(choices)
        m = queues[bid].pop(0)
        m.cue = cue_for(bid, pos)
        emitted.add(id(m))
        last_seen[bid] = pos
        out.append(m)
    return out


def allocate(n_sessions: int, total_turns: int, total_questions: int, lo: int, hi: int,
             r: random.Random) -> list[tuple[int, int]]:
    """Per-session (turns, questions) with exact totals, turns within [lo, hi], both extremes present."""
    if not lo * n_sessions <= total_turns <= hi * n_sessions:
        raise ValueError(f"{total_turns} turns cannot be split into {n_sessions} sessions of {lo}-{hi} turns")
    turns = [r.randint(lo, hi) for _ in range(n_sessions)]
    if n_sessions >= 2:
        turns[0], turns[1] = lo, hi
    diff = total_turns - sum(turns)
    idx = list(range(2 if n_sessions >= 2 else 0, n_sessions))
    while diff != 0:
        i = r.choice(idx)
        if diff > 0 and turns[i] < hi:
            turns[i] += 1
            diff -= 1
        elif diff < 0 and turns[i] > lo:
            turns[i] -= 1
            diff += 1
    r.shuffle(turns)
    base, extra = divmod(total_questions, n_sessions)
    qs = [base + (1 if i < extra else 0) for i in range(n_sessions)]
    r.shuffle(qs)
    return list(zip(turns, qs))
