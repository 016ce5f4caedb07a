"""The read path as evidence layers: one small builder per layer, run in the order `context.layers`
lists them (conf/runtime/default.yaml), each filling its block of the context under its own budget.

An entry of `context.layers` is `{layer: <name>}` plus optional keys:
- `when_intents: [previous, current]`: the entry applies only to a question with one of these intents
  (the method's rule "update evidence first for previous/current questions" is such an entry, listed
  before the primary path, with a plain `update_evidence` entry after it);
- `budget: N`: this entry's token cap instead of the layer's default budget option;
- `share: f`: a cap of that fraction of the read budget (0 < f <= 1) instead of the default budget option
  (with `budget`, the smaller of the two), so one policy keeps its proportions at every read budget.
A layer runs at most once per read: a later entry of a layer that already ran is skipped. Layers (`LAYERS`), their default budget options, and their match rules (also in `context`):

  computed          Computed: count / sum / latest / earliest over matching events (structured_budget)
  update_evidence   UpdateEvidence: old -> new revision chains (update_budget; record_match)
  primary_path      PrimaryPath: the routed trajectory; past the branch budget, raw_recent newest nodes
                    raw and older ones as summaries (branch_budget); a multi-intent turn's line ends with
                    the state it carried across its link (`revision.resolve_links`), here and in
                    secondary_path
  secondary_path    SecondaryPath: the trajectories that secondary links join to the routed path (either
                    way), and a question's close runner-up (`localization.secondary`);
                    their turns most relevant to the question and the linking turn first (secondary_budget)
  atomic_facts      AtomicFacts: facts retrieved independently, filtered by predicted tags (fact_budget)
  states            States: current single-version states that match (update_budget; record_match)
  artifacts         ArtifactEvidence: ordered lists that match (structured_budget; artifact_match)
  events            EventEvidence: the matching events (structured_budget; event_match)
  localized_states  LocalizedStates: for a question asked after the conversation, the top states the
                    reranker localizes it to (as many as hold `localized_mass` of its confidence, softmax
                    over the candidates' logits, at most `localized_k`; `localized_rank: fused` orders
                    them by the reranker's and recall's ranks fused), each with its neighbourhood on
                    its trajectory (`localized_window` parents up, `localized_children` children down);
                    the states first, best first, then their neighbours; rendered in conversation order,
                    each date once (localized_budget)
  supplemental      Supplemental: raw turns by BM25 that no earlier block holds (supplemental_budget,
                    supplemental_k); `supplemental_match: entity` keeps only turns sharing an entity,
                    date or exact value with the question, `keyword` keeps every hit;
                    `supplemental_rank: hybrid` fuses BM25 with the vector index (reciprocal rank);
                    `group_by_time: true` renders the turns in conversation order, each timestamp once

`context.resolve_dates: true` writes a turn's relative dates out against its own time in the turn layers
(localized_states, supplemental): "yesterday (7 May 2023)", "last week (the week before 8 May 2023)".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Callable

from ..errors import ConfigError
from .context import Block, BudgetPacker, fill_by_time, ts_prefix
from .localize import logit
from .text import resolve_dates, stems

if TYPE_CHECKING:
    from .schema import Localization, Node


@dataclass
class Sources:
    """What a read may consult, and nothing else of the memory: the store and the vector index of its
    conversation, the runtime config, the ablation switches, the tagger, and the embedder (with the
    question's embedding when localization computed it already)."""

    store: Any
    conv: str
    cfg: dict
    ablation: dict
    tagger: Any
    index: Any
    embed: Callable[[str], Any]
    last_query_embedding: tuple[str, Any] | None = None


@dataclass
class Read:
    """One read in progress: the question, the routed trajectory, the packer, what layers share."""

    src: Sources
    question: str
    loc: "Localization"
    packer: BudgetPacker
    intents: set[str]
    q_ents: set[str]
    path: list["Node"] = field(default_factory=list)
    shown: set[int] = field(default_factory=set)  # node ids whose raw turn an earlier block holds

    @property
    def cc(self) -> dict:
        return self.src.cfg["context"]

    @property
    def abl(self) -> dict:
        return self.src.ablation

    @property
    def structured(self) -> bool:
        return bool(self.abl["structured_evidence"] and self.abl["structured_extraction"])

    def raw(self, n: "Node") -> str:
        """A node's raw turn as a turn layer shows it: with its relative dates written out against its own
        time when `context.resolve_dates` (text.resolve_dates)."""
        return resolve_dates(n.raw, n.timestamp) if self.cc.get("resolve_dates", False) else n.raw

    @cached_property
    def q_stems(self) -> set[str]:
        return stems(self.question)

    @cached_property
    def query_embedding(self):
        last = self.src.last_query_embedding  # localize embedded the question already
        return last[1] if last is not None and last[0] == self.question else self.src.embed(self.question)

    def relevant(self, text: str, extra: list[str] = ()) -> float:
        """Share of the question's stems found in the text (and extra terms)."""
        s = stems(text + " " + " ".join(extra))
        return len(self.q_stems & s) / max(1, len(self.q_stems))

    def carried(self, nodes: list["Node"]) -> dict[int, str]:
        """What the multi-intent turns among these nodes carried across their links
        (`revision.resolve_links`): the records each wrote that its own text does not state, as a suffix
        its line gains, so the read that shows the turn also shows the value it took (one hop)."""
        st = self.src.store
        linked = sorted({a for a, _, _ in st.links_from([n.id for n in nodes])})
        by_id = {n.id: n for n in nodes}
        out = {}
        for nid, recs in st.records_from(linked).items():
            said = f"{by_id[nid].user_text} {by_id[nid].assistant_text}".lower()
            parts = [f"{x.key.replace('_', ' ')} ({x.subject}): {x.value}" for x in recs if x.value.lower() not in said]
            if parts:
                out[nid] = f" [state carried: {'; '.join(parts)}]"
        return out

    def about_asked(self, subject: str) -> bool:
        """An item about the user, or about someone the question names (or the question names no one)."""
        return subject == "user" or not self.q_ents or subject.lower() in self.q_ents

    @cached_property
    def matched_events(self) -> list:
        if not self.structured:
            return []
        cc, st = self.cc, self.src.store
        return [e for e in st.search_events(self.src.conv, self.question, cc["evidence_k"])
                if self.relevant(f"{e.subject} {e.action} {e.category} {e.text}", e.entities) >= cc["event_match"]
                and self.about_asked(e.subject)]

    @cached_property
    def chains(self) -> tuple[list, list]:
        """(update lines of multi-version chains, state lines of single versions) that match."""
        if not self.abl["structured_extraction"]:
            return [], []
        cc = self.cc
        update_lines, state_lines = [], []
        for chain in self.src.store.search_records(self.src.conv, self.question, cc["evidence_k"], cc["max_versions"]):
            r = chain[-1]
            if self.relevant(f"{r.key.replace('_', ' ')} {r.value} {r.subject}", r.entities) < cc["record_match"]:
                continue
            if not self.about_asked(r.subject):
                continue
            label = f"{chain[0].key} ({chain[0].subject})"
            src = sorted({s for x in chain for s in x.sources})
            if len(chain) > 1:
                hist = " -> ".join(f"{x.value} {ts_prefix(x.timestamps[0]).strip()}".strip() for x in chain)
                update_lines.append((f"{label}: {hist} (previous: {chain[-2].value}; current: {chain[-1].value})", src))
            else:
                state_lines.append((f"{label}: {chain[0].value} {ts_prefix(chain[0].timestamps[0]).strip()}".strip(), src))
        return update_lines, state_lines


def computed(r: Read, cap: int) -> Block | None:
    events = r.matched_events
    if not events or not r.intents & {"count", "sum", "latest", "earliest", "compare"}:
        return None
    lines = []
    by_unit: dict[str | None, float] = {}
    for e in events:
        if e.quantity is not None:
            by_unit[e.unit] = by_unit.get(e.unit, 0.0) + e.quantity
    if "count" in r.intents:
        lines.append(f"count of matching events = {len(events)}")
    if "sum" in r.intents or "compare" in r.intents:
        for unit, tot in by_unit.items():
            amount = f"{unit}{tot:g}" if unit in {"$", "€", "£"} else f"{tot:g} {unit or ''}".strip()
            lines.append(f"sum over matching events = {amount}")
    dated = sorted(events, key=lambda e: (e.date or "", e.seq))
    if "latest" in r.intents:
        lines.append(f"latest matching event: {ts_prefix(dated[-1].date)}{dated[-1].text}")
    if "earliest" in r.intents:
        lines.append(f"earliest matching event: {ts_prefix(dated[0].date)}{dated[0].text}")
    src = sorted({s for e in events for s in e.sources})
    return r.packer.fill(Block("Computed"), [(line, src) for line in lines], cap)


def update_evidence(r: Read, cap: int) -> Block | None:
    lines = r.chains[0]
    return r.packer.fill(Block("UpdateEvidence"), lines, cap) if lines else None


def primary_path(r: Read, cap: int) -> Block | None:
    """The trajectory raw if it fits the branch budget; else the `raw_recent` newest nodes raw and
    older ones as summaries, newest first, each dropped oldest-first when even that does not fit.
    Turns an earlier block already holds raw (a policy that reads supplemental turns first) are not
    repeated."""
    path, packer = [n for n in r.path if n.id not in r.shown], r.packer
    if not path:
        return None
    carried = r.carried(path)
    raw = [(f"{ts_prefix(n.timestamp)}{n.raw}{carried.get(n.id, '')}", [n.id]) for n in path]
    cap = min(cap, packer.remaining())
    if packer.cost("PrimaryPath", raw) <= cap:
        return packer.fill(Block("PrimaryPath"), raw, cap)
    keep = r.cc["raw_recent"]
    summaries = [(f"{ts_prefix(n.timestamp)}(summary) {n.node_summary}{carried.get(n.id, '')}", [n.id])
                 for n in path[:-keep]]
    chosen: list[tuple[int, tuple[str, list[int]]]] = []
    # newest raw first, then newest summaries, while the block still fits
    order = [(i, raw[i]) for i in range(len(path) - 1, len(path) - 1 - min(keep, len(path)), -1)]
    order += [(i, summaries[i]) for i in range(len(summaries) - 1, -1, -1)]
    for i, line in order:
        if packer.cost("PrimaryPath", [l for _, l in chosen] + [line]) > cap:
            break
        chosen.append((i, line))
    chosen.sort(key=lambda x: x[0])
    return packer.fill(Block("PrimaryPath"), [l for _, l in chosen], cap)


def secondary_path(r: Read, cap: int) -> Block | None:
    """The other trajectories this read depends on: a link joins two trajectories both ways, so those
    the routed path's links point to (the state each multi-intent turn on it also continued), those of
    the turns that link into the path (a multi-intent turn attached to the other branch), and the
    question's runner-up (`Localization.runner_up`). Their turns not shown yet are ranked by the
    question's stems and those of the link's turn on the path (the multi-intent turn of an outgoing
    link, the linked state of an incoming one) they hold, each weighted by 1 / the number of that
    trajectory's turns holding it (newest first among equals), and packed in that order, each raw or, when
    that does not fit, its user text alone; the block lists them in conversation order."""
    st = r.src.store
    on_path = {n.id for n in r.path}
    ids = [n.id for n in r.path]
    texts = {n.id: n.user_text for n in r.path}
    # (the other trajectory's end, the words of the path's end of the link, which join the question's)
    targets = [(t, texts[n]) for n, t, _ in st.links_from(ids)]
    targets += [(n, texts[t]) for n, t, _ in st.links_to(ids)]
    targets += [(t, "") for t in r.loc.runner_up]
    if not targets or cap <= 0:
        return None
    scored: dict[int, tuple[float, "Node"]] = {}
    for target, link_text in targets:
        want = stems(r.question + " " + link_text)
        nodes = [n for n in r.src.store.trajectory(target, r.cc["max_path_nodes"]) if n.id not in on_path]
        words = {n.id: stems(n.user_text + " " + n.assistant_text) for n in nodes}
        df: dict[str, int] = {}
        for w in words.values():
            for x in w & want:
                df[x] = df.get(x, 0) + 1
        for n in nodes:  # a stem every turn of the trajectory shares (its owner, its title) tells little
            if n.id in r.shown:
                continue
            share = sum(1.0 / df[x] for x in words[n.id] & want)
            if share > scored.get(n.id, (-1.0, n))[0]:
                scored[n.id] = (share, n)
    order = sorted(scored.values(), key=lambda x: (-x[0], -x[1].seq))
    carried = r.carried([n for _, n in order])
    chosen: list = []
    cap = min(cap, r.packer.remaining())
    used = r.packer.cost("SecondaryPath", [])
    for _, n in order:  # the turn raw, or its user text alone when the raw turn does not fit
        for text in (n.raw, f"User: {n.user_text}"):
            line = (f"{ts_prefix(n.timestamp)}{text}{carried.get(n.id, '')}", [n.id])
            cost = r.packer.cost("SecondaryPath", [line]) - r.packer.cost("SecondaryPath", [])
            if used + cost <= cap:
                chosen.append((n.seq, line))
                used += cost
                break
    chosen.sort(key=lambda x: x[0])
    return r.packer.fill(Block("SecondaryPath"), [l for _, l in chosen], cap) if chosen else None


def atomic_facts(r: Read, cap: int) -> Block | None:
    if not r.abl["atomic_facts"]:
        return None
    cc = r.cc
    q_tags = set(r.src.tagger.predict([r.question])[0]) if cc["filter_facts_by_tag"] else set()
    lines = []
    for f, _ in r.src.store.search_facts(r.src.conv, r.question, cc["fact_k"]):
        if f.superseded_by is not None:
            continue
        if q_tags and f.tags and not (q_tags & set(f.tags)):
            continue
        stamp = next((t for t in reversed(f.timestamps) if t), None)
        lines.append((f"{ts_prefix(stamp)}{f.text}", f.sources))
    return r.packer.fill(Block("AtomicFacts"), lines, cap)


def states(r: Read, cap: int) -> Block | None:
    lines = r.chains[1]
    return r.packer.fill(Block("States"), lines, cap) if lines else None


def artifacts(r: Read, cap: int) -> Block | None:
    if not r.structured:
        return None
    cc = r.cc
    arts = r.src.store.search_artifacts(r.src.conv, r.question, cc["evidence_k"])
    if "previous" not in r.intents:
        arts = [a for a in arts if a.superseded_by is None]
    lines = []
    for a in arts:
        if r.relevant(f"{a.name} {a.subject} {' '.join(a.items)}", a.entities) < cc["artifact_match"]:
            continue
        if not r.about_asked(a.subject):
            continue
        status = "current" if a.superseded_by is None else "superseded"
        items = "; ".join(f"{i + 1}. {it}" for i, it in enumerate(a.items))
        lines.append((f"{a.name} ({a.subject}, {status}) {ts_prefix(a.timestamps[0]).strip()}: {items}", a.sources))
    return r.packer.fill(Block("ArtifactEvidence"), lines, cap)


def events(r: Read, cap: int) -> Block | None:
    if not r.structured:
        return None
    lines = [(f"{ts_prefix(e.date)}{e.text}", e.sources) for e in r.matched_events]
    return r.packer.fill(Block("EventEvidence"), lines, cap)


def localized_order(loc: "Localization", k: int, mass: float, temperature: float = 1.0,
                    rank: str = "router", rrf_k: float = 60.0) -> list[int]:
    """The question's states, best first, as many as hold `mass` of the reranker's confidence (softmax
    over each candidate's logit / temperature), at most `k`, at least one. `rank: fused` orders them by the
    reciprocal-rank fusion of the reranker's rank and recall's own (its channels fused), the count still
    set by the reranker's confidence."""
    cands = sorted(loc.candidates, key=lambda c: -c.score)
    if not cands or k <= 0:
        return []
    if rank == "fused":
        by_recall = sorted(cands, key=lambda c: -c.channels.get("fused", 0.0))
        pos = {c.node_id: i for i, c in enumerate(by_recall)}
        order = sorted(range(len(cands)), key=lambda i: -(1 / (rrf_k + i + 1) + 1 / (rrf_k + pos[cands[i].node_id] + 1)))
        fused = [cands[i] for i in order]
    else:
        fused = cands
    z = [logit(c.score, temperature) for c in cands]
    top = max(z)
    e = [math.exp(x - top) for x in z]
    total = sum(e)
    count, acc = 0, 0.0
    for w in e:  # how many: the reranker's confidence mass, best first
        if count >= k or (count and acc >= mass):
            break
        count += 1
        acc += w / total
    return [c.node_id for c in fused[:count]]


def localized_states(r: Read, cap: int) -> Block | None:
    """The states a question localizes to and their neighbourhoods (see the module docstring)."""
    cc, st = r.cc, r.src.store
    if cap <= 0 or not r.loc.candidates or not r.abl.get("localized_states", True):
        return None
    top = localized_order(r.loc, int(cc["localized_k"]), float(cc["localized_mass"]),
                          float(cc.get("localized_temperature", 1.0)), cc.get("localized_rank", "router"),
                          float(r.src.cfg["recall"]["rrf_k"]))
    top = [i for i in top if i not in r.shown]
    if not top:
        return None
    window, per_child = int(cc["localized_window"]), int(cc["localized_children"])
    nodes = st.get_nodes(top)
    order: list[int] = list(top)
    frontier = list(top)
    for _ in range(window):  # parents up and children down, hop by hop
        ups = [nodes[i].parent_id for i in frontier if i in nodes and nodes[i].parent_id is not None]
        downs = [c for cs in st.children(frontier, per_child).values() for c in cs]
        frontier = [i for i in dict.fromkeys(ups + downs) if i not in order]
        order += frontier
        nodes.update(st.get_nodes([i for i in frontier if i not in nodes]))
    order = [i for i in order if i in nodes and i not in r.shown]
    items = [(nodes[i].timestamp, nodes[i].seq, r.raw(nodes[i]), [i]) for i in order]
    return fill_by_time(r.packer, Block("LocalizedStates"), items, cap)


SUPPLEMENTAL_MATCH = ("entity", "keyword")
SUPPLEMENTAL_RANK = ("keyword", "hybrid")
RAW_BLOCKS = {"PrimaryPath", "SecondaryPath", "LocalizedStates", "Supplemental"}  # blocks whose lines are raw turns (a summary line is not)


def supplemental_hits(r: Read, k: int) -> list[int]:
    """Node ids for the supplemental layer, best first: BM25 (`supplemental_rank: keyword`), or BM25 and
    the vector index fused by reciprocal rank (`hybrid`, recall.rrf_k)."""
    st = r.src.store
    kw = st.keyword_search(r.src.conv, r.question, k)
    if r.cc.get("supplemental_rank", "keyword") == "keyword":
        return [nid for nid, _ in kw]
    rrf_k = float(r.src.cfg["recall"]["rrf_k"])
    fused: dict[int, float] = {}
    for hits in (kw, r.src.index.search(r.query_embedding, k)):
        for rank, (nid, _) in enumerate(hits):
            fused[nid] = fused.get(nid, 0.0) + 1.0 / (rrf_k + rank + 1)
    return sorted(fused, key=lambda n: -fused[n])


def supplemental(r: Read, cap: int) -> Block | None:
    """Raw turns by BM25 that no earlier block holds; filled where the order puts it (last by default,
    so it never displaces the routed history)."""
    if cap <= 0:
        return None
    cc, st = r.cc, r.src.store
    rule = cc.get("supplemental_match", "entity")
    hits = [nid for nid in supplemental_hits(r, int(cc["supplemental_k"])) if nid not in r.shown]
    nodes = st.get_nodes(hits)
    keep = [nodes[nid] for nid in hits
            if rule == "keyword" or r.q_ents & {e.lower() for e in nodes[nid].entities}]  # entity: a direct match
    if cc.get("group_by_time", False):  # in conversation order, each timestamp written once
        return fill_by_time(r.packer, Block("Supplemental"), [(n.timestamp, n.seq, r.raw(n), [n.id]) for n in keep], cap)
    return r.packer.fill(Block("Supplemental"), [(f"{ts_prefix(n.timestamp)}{r.raw(n)}", [n.id]) for n in keep], cap)


# layer -> (builder, the context option holding its default budget)
LAYERS: dict[str, tuple[Callable[[Read, int], Block | None], str]] = {
    "computed": (computed, "structured_budget"),
    "update_evidence": (update_evidence, "update_budget"),
    "primary_path": (primary_path, "branch_budget"),
    "secondary_path": (secondary_path, "secondary_budget"),
    "atomic_facts": (atomic_facts, "fact_budget"),
    "states": (states, "update_budget"),
    "artifacts": (artifacts, "structured_budget"),
    "events": (events, "structured_budget"),
    "localized_states": (localized_states, "localized_budget"),
    "supplemental": (supplemental, "supplemental_budget"),
}


def check_layers(cc: dict) -> list[dict]:
    """`context.layers` as entries {layer, when_intents, budget, share}; a bad entry names the option."""
    from .context import INTENT_CUES

    entries = cc.get("layers")
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"runtime option context.layers must be a non-empty list of layers ({', '.join(LAYERS)}), "
                          f"got {entries!r}")
    out = []
    for k, e in enumerate(entries):
        e = {"layer": e} if isinstance(e, str) else e
        where = f"runtime option context.layers[{k}]"
        if not isinstance(e, dict) or e.get("layer") not in LAYERS:
            raise ConfigError(f"{where} must name a layer ({', '.join(LAYERS)}), got {e!r}")
        if set(e) - {"layer", "when_intents", "budget", "share"}:
            raise ConfigError(f"{where}: unknown keys {sorted(set(e) - {'layer', 'when_intents', 'budget', 'share'})} "
                              "(layer, when_intents, budget, share)")
        when = e.get("when_intents")
        if when is not None and (not isinstance(when, list) or not set(when) <= set(INTENT_CUES)):
            raise ConfigError(f"{where}.when_intents must be a list of intents ({', '.join(INTENT_CUES)}), got {when!r}")
        b = e.get("budget")
        if b is not None and (isinstance(b, bool) or not isinstance(b, int) or b < 0):
            raise ConfigError(f"{where}.budget must be a whole number of tokens >= 0, got {b!r}")
        f = e.get("share")
        if f is not None and (isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 < f <= 1):
            raise ConfigError(f"{where}.share must be a fraction of the read budget in (0, 1], got {f!r}")
        out.append({"layer": e["layer"], "when_intents": when, "budget": b, "share": f})
    if cc.get("supplemental_rank", "keyword") not in SUPPLEMENTAL_RANK:
        raise ConfigError(f"runtime option context.supplemental_rank must be one of {', '.join(SUPPLEMENTAL_RANK)}, "
                          f"got {cc.get('supplemental_rank')!r}")
    if not isinstance(cc.get("group_by_time", False), bool):
        raise ConfigError(f"runtime option context.group_by_time must be true or false, got {cc.get('group_by_time')!r}")
    if cc.get("localized_rank", "router") not in ("router", "fused"):
        raise ConfigError(f"runtime option context.localized_rank must be router or fused, got {cc.get('localized_rank')!r}")
    if cc.get("supplemental_match", "entity") not in SUPPLEMENTAL_MATCH:
        raise ConfigError(f"runtime option context.supplemental_match must be one of {', '.join(SUPPLEMENTAL_MATCH)}, "
                          f"got {cc.get('supplemental_match')!r}")
    return out


def build_blocks(r: Read, entries: list[dict]) -> list[Block]:
    """Run the layers in order, each at most once; the blocks that hold lines, in that order."""
    ran: set[str] = set()
    blocks: list[Block] = []
    for e in entries:
        name = e["layer"]
        if name in ran or (e["when_intents"] is not None and not r.intents & set(e["when_intents"])):
            continue
        ran.add(name)
        builder, budget_key = LAYERS[name]
        caps = [c for c in (e["budget"], None if e["share"] is None else int(e["share"] * r.packer.total)) if c is not None]
        cap = min(caps) if caps else int(r.cc[budget_key])  # the entry's own caps replace the layer's default
        block = builder(r, cap)
        if block is not None and block.lines:
            blocks.append(block)
            if block.name in RAW_BLOCKS:
                r.shown.update(block.node_ids)
    return blocks
