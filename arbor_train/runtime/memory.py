"""ArborMemory: the online loop of the method (localize -> assemble -> [generate] -> commit).

    mem = ArborMemory.open("memory.sqlite", conversation_id="alice", cfg=runtime_cfg)
    loc = mem.localize(user_text)                 # reads committed state only
    ctx = mem.assemble(user_text, loc)            # token-budgeted context for the answer model
    reply = answer_model(ctx.text, user_text)
    mem.commit(user_text, reply, loc)             # one SQLite transaction; visible from turn t+1

`mem.step(user, assistant)` is localize + commit, for replaying transcripts.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError
from .context import BudgetPacker, Context, TokenCounter, question_intents
from .embed import build_embedder
from .extract import Extraction, ExtractorSet, TurnInput
from .index import VectorIndex, index_path
from .layers import Read, build_blocks, check_layers
from .rerank import build_reranker
from .schema import Alternative, Candidate, Localization, Node
from .store import Store
from .tags import build_tagger
from .text import entities as find_entities
from .text import find_cue, match_cue, minutes_between, snake_case, truncate

log = logging.getLogger(__name__)


@dataclass
class Timings:
    localize_s: list[float] = field(default_factory=list)
    extract_s: list[float] = field(default_factory=list)
    commit_s: list[float] = field(default_factory=list)
    assemble_s: list[float] = field(default_factory=list)


NICK_WORD = re.compile(r"[\w\-\[\]\\^{}|`]+")  # a word that may be an IRC nick


def group_features(n: Node, latest: Node, now: str | None) -> dict[str, Any]:
    """What a group-chat candidate adds to its reranker document: its speaker, how many messages back
    it is, and the minutes since it (when the input has a time). Nothing for one-user conversations."""
    if n.speaker is None:
        return {}
    return {"speaker": n.speaker, "back": latest.seq - n.seq + 1, "minutes": minutes_between(n.timestamp, now)}


def _cfg(cfg: Any) -> dict:
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(cfg, DictConfig):
            return OmegaConf.to_container(cfg, resolve=True)
    except ImportError:  # pragma: no cover
        pass
    return dict(cfg)


class ArborMemory:
    def __init__(self, store: Store, conversation_id: str, cfg: Any, components: dict | None = None):
        cfg = _cfg(cfg)
        self.cfg = cfg
        self.layers = check_layers(cfg["context"])  # the read path, checked before any model loads
        evidence = (cfg["localization"].get("secondary") or {}).get("evidence", "entity")
        if evidence not in ("entity", "none"):
            raise ConfigError(f"option localization.secondary.evidence: {evidence!r}; valid values: entity, none")
        self._link_evidence = evidence
        resolve = cfg["revision"].get("resolve_links", True)
        if not isinstance(resolve, bool):
            raise ConfigError(f"option revision.resolve_links: {resolve!r}; valid values: true, false")
        self._resolve_links = resolve
        self.store = store
        self.conv = conversation_id
        comp = components or build_components(cfg)
        self.embedder = comp["embedder"]
        self.reranker = comp["reranker"]
        self.extractors: ExtractorSet = comp["extractors"]
        self.tagger = comp["tagger"]
        self.counter: TokenCounter = comp["counter"]
        self.components = comp
        stored_dim = store.get_meta("embedding_dim")
        stored_name = store.get_meta("embedder")
        if stored_dim is None:
            with store.transaction():
                store.set_meta("embedding_dim", str(self.embedder.dim))
                store.set_meta("embedder", self.embedder.name)
        elif int(stored_dim) != self.embedder.dim or stored_name != self.embedder.name:
            raise ConfigError(
                f"{store.path}: memory was built with embedder {stored_name!r} (dim {stored_dim}); runtime option "
                f"embedder is {self.embedder.name!r} (dim {self.embedder.dim}). Use the same embedder or a new file.")
        ix = cfg["index"]
        self.index = VectorIndex(store, conversation_id, self.embedder.dim, index_path(store.path, conversation_id),
                                 ef_search=ix["ef_search"], M=ix["M"], ef_construction=ix["ef_construction"],
                                 save_every=ix["save_every"],
                                 compact_deleted_share=float(ix.get("compact_deleted_share", 0.25)))
        self.ablation = cfg["ablation"]
        self.timings = Timings()

    # ------------------------------------------------------------------ lifecycle
    @classmethod
    def open(cls, path: str | Path, conversation_id: str = "default", cfg: Any = None,
             components: dict | None = None) -> "ArborMemory":
        if cfg is None:
            from .config import default_config

            cfg = default_config()
        c = _cfg(cfg)
        check_layers(c["context"])  # a bad read path is refused before the file is opened or created
        return cls(Store(str(path), synchronous=c["store"]["synchronous"]), conversation_id, c, components)

    def close(self) -> None:
        self.index.save()
        self.store.close()

    def __enter__(self) -> "ArborMemory":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def for_conversation(self, conversation_id: str) -> "ArborMemory":
        """Another conversation in the same database, sharing the loaded models."""
        return ArborMemory(self.store, conversation_id, self.cfg, self.components)

    # ------------------------------------------------------------------ localization
    def embed(self, text: str) -> np.ndarray:
        return self.embedder.encode([text])[0]

    def addressed(self, text: str, names: set[str] | None = None) -> list[str]:
        """Known speakers of this conversation (`names`, else read from the store) that the text names as a
        word ("dave: try this", "thanks dave"), in order of first mention (group chats: the people a
        message addresses)."""
        names = self.store.speakers(self.conv) if names is None else names
        if not names:
            return []
        words = NICK_WORD.findall(text)
        lowered = {n.lower(): n for n in names}
        return list(dict.fromkeys(lowered[w.lower()] for w in words if w.lower() in lowered))

    def _speaker_channels(self, n: Node, speaker: str, ctx: dict) -> dict[str, float]:
        """Group chats: who-talks-to-whom signals of one candidate for the input's speaker. same_speaker:
        the candidate is the input speaker's own message; addresses_input: the candidate names the input's
        speaker; addresses_other: it names someone else; speaker_later: how many messages its speaker
        wrote since it (0: it is that speaker's latest); named_by_input: the input names the candidate's
        speaker; same_thread: the candidate is in the conversation (tree) of the input speaker's latest
        message; replied_input: the candidate replies to a message of the input's speaker; input_replied:
        the input speaker's latest message replies to the candidate's speaker; speaker_prior: how many
        messages the input's speaker wrote before (`ctx`: what `_speaker_context` found once per input)."""
        words = {w.lower() for w in NICK_WORD.findall(n.user_text)} - {n.speaker.lower()}
        named = words & ctx["names"]
        return {"same_speaker": float(n.speaker == speaker),
                "addresses_input": float(speaker.lower() in named),
                "addresses_other": float(bool(named - {speaker.lower()})),
                "speaker_later": float(self.store.count_by_speaker_since(self.conv, n.speaker, n.seq)),
                "named_by_input": float(n.speaker.lower() in ctx["addressed"]),
                "same_thread": float(n.root_id == ctx["root"]),
                "replied_input": float(ctx["parent_speaker"].get(n.parent_id) == speaker),
                "input_replied": float(n.speaker == ctx["replied_to"]),
                "speaker_prior": float(ctx["prior"])}

    def _speaker_context(self, speaker: str, names: set[str], addressed: list[str], nodes: dict[int, Node]) -> dict:
        """Once per group-chat input: the conversation's speakers (`names`, lowered), whom the input names
        (`addressed`), the input speaker's latest message (its conversation and whom it replied to), how
        many messages that speaker wrote before, and the speakers of the candidates' parents."""
        mine = self.store.latest_by_speaker(self.conv, speaker, 1)
        latest = self.store.get_node(mine[0]) if mine else None
        parents = self.store.get_nodes(sorted({n.parent_id for n in nodes.values() if n.parent_id is not None}
                                              | ({latest.parent_id} if latest and latest.parent_id is not None else set())))
        return {"names": {x.lower() for x in names},
                "addressed": {x.lower() for x in addressed} - {speaker.lower()},
                "root": latest.root_id if latest else None,
                "replied_to": parents[latest.parent_id].speaker if latest and latest.parent_id in parents else None,
                "prior": self.store.count_by_speaker_since(self.conv, speaker, -1),
                "parent_speaker": {i: p.speaker for i, p in parents.items()}}

    def _recall(self, text: str, q_emb: np.ndarray, latest: Node, speaker: str | None = None,
                now: str | None = None) -> list[Candidate]:
        rc = self.cfg["recall"]
        ranks: dict[int, dict[str, float]] = {}
        fused: dict[int, float] = {}

        def add(channel: str, hits: list[tuple[int, float]]) -> None:
            for rank, (nid, s) in enumerate(hits):
                ranks.setdefault(nid, {})[channel] = round(float(s), 4)
                fused[nid] = fused.get(nid, 0.0) + 1.0 / (rc["rrf_k"] + rank + 1)

        add("semantic", self.index.search(q_emb, rc["k_semantic"]))
        add("keyword", self.store.keyword_search(self.conv, text, rc["k_keyword"]))
        topic_hits = self.store.topic_search(self.conv, text, rc["k_topic"])
        add("topic", [(self.store.latest_in_root(r), s) for r, s in topic_hits])
        k_recent = int(rc.get("k_recent", 1))
        add("recent", [(i, 1.0) for i in (self.store.recent_ids(self.conv, k_recent) if k_recent > 1 else [latest.id])])
        k_addr = int(rc.get("k_addressed", 0))
        addressed_ids: set[int] = set()
        names = self.store.speakers(self.conv) if speaker is not None or k_addr > 0 else set()
        addressed = self.addressed(text, names) if names else []
        if k_addr > 0:  # group chats: the latest messages of the people this one addresses
            for name in addressed:
                if name != speaker:
                    ids = self.store.latest_by_speaker(self.conv, name, k_addr)
                    addressed_ids.update(ids)
                    add("addressed", [(i, 1.0) for i in ids])
        ids = sorted(fused, key=lambda i: -fused[i])[: rc["max_candidates"]]
        nodes = self.store.get_nodes(ids)
        ctx = self._speaker_context(speaker, names, addressed, nodes) if speaker is not None else {}
        cands = []
        for i in ids:
            n = nodes[i]
            ch = ranks[i]
            if "semantic" not in ch and n.embedding is not None:
                ch["semantic"] = round(float(np.dot(n.embedding, q_emb)), 4)
            ch["recency"] = round(math.exp(-(latest.seq - n.seq) / rc["recency_tau"]), 4)
            if i in addressed_ids:
                ch["addressed"] = 1.0
            if speaker is not None and n.speaker is not None:
                ch.update(self._speaker_channels(n, speaker, ctx))
            ch["fused"] = round(fused[i], 5)
            cands.append(Candidate(node_id=i, topic_key=n.topic_key, path_summary=n.path_summary,
                                   node_summary=n.node_summary, entities=n.entities, seq=n.seq,
                                   root_id=n.root_id, channels=ch, **group_features(n, latest, now)))
        return cands

    def localize(self, text: str, for_question: bool = False, speaker: str | None = None,
                 timestamp: str | None = None) -> Localization:
        """Which committed state does this input resume? Reads only committed memory. `speaker` (group
        chats) keeps a speaker's own name from counting as an address; `timestamp` (the input's time)
        gives the reranker the minutes since each group-chat candidate."""
        t0 = time.perf_counter()
        try:
            return self._localize(text, for_question, speaker, timestamp)
        finally:
            self.timings.localize_s.append(time.perf_counter() - t0)

    def _localize(self, text: str, for_question: bool, speaker: str | None = None,
                  timestamp: str | None = None) -> Localization:
        loc_cfg = self.cfg["localization"]
        latest = self.store.latest_node(self.conv)
        if latest is None:
            return Localization(None, "empty", 1.0)
        if not self.ablation["state_localization"]:
            return Localization(latest.id, "linear", 1.0)
        routing = self.ablation["routing"]
        q_emb = self.embed(text)
        self._last_query_embedding = (text, q_emb)
        if routing and not for_question:
            cue = match_cue(text, loc_cfg["continuation_cues"])
            if cue and self._consistent(text, latest):
                return Localization(self._tip(latest.id), "continuation", 1.0, cue)
        cands = self._recall(text, q_emb, latest, speaker, timestamp)
        if not cands:
            return Localization(None, "recall", 0.0)
        if not routing:
            for c in cands:
                c.score = c.channels["fused"]
            best = max(cands, key=lambda c: c.score)
            sem = max(c.channels.get("semantic", 0.0) for c in cands)
            if not for_question and sem < loc_cfg["no_routing_semantic_threshold"]:
                return Localization(None, "recall", sem, candidates=cands)
            return Localization(self._tip(best.node_id), "recall", best.score, candidates=cands)
        scores = self.reranker.score(text, cands)
        for c, s in zip(cands, scores):
            c.score = float(s)
        cands.sort(key=lambda c: -c.score)
        best = cands[0]
        rcue = find_cue(text, loc_cfg["temporal_return_cues"])
        if rcue:
            loc = Localization(self._tip(best.node_id), "temporal_return", best.score, rcue, cands)
        elif best.score >= self.new_root_threshold or for_question:
            loc = Localization(self._tip(best.node_id), "rerank", best.score, candidates=cands)
        else:
            loc = Localization(None, "rerank", best.score, candidates=cands)
        return self._alternatives(loc, for_question, text)

    def _alternatives(self, loc: Localization, for_question: bool, text: str) -> Localization:
        """Rank the trajectories behind the reranked candidates by confidence, and pick the secondary
        states: for a turn, the best other trajectory when its best state scores `secondary.min_score` or
        more (a link the commit records); for a question, the runner-up when the top two confidences are
        within `secondary.read_margin`.

        A trajectory's confidence is the softmax over each trajectory's best logit and the new-root logit
        (the threshold's), divided by `secondary.temperature`. That is the distribution a tuned reranker is
        trained on (listwise cross-entropy over one state per trajectory and the new-root option), so at
        temperature 1 it is calibrated by training; the heuristic's scores are not logits, and eval.run
        reports the calibration error of either (ECE of the chosen trajectory). Linking reads the
        runner-up's own score instead: the softmax is about which one trajectory a turn resumes, while a
        multi-intent turn resumes two. With `secondary.evidence: entity` only a trajectory the turn names
        apart from its parent's can be linked (`_named_apart`); `link_candidate` is the best such one,
        whether or not it clears the threshold (eval sweeps thresholds from it)."""
        sc = self.cfg["localization"].get("secondary") or {}
        temp = float(sc.get("temperature", 1.0))
        eps = 1e-6

        def logit(p: float) -> float:
            p = min(1 - eps, max(eps, p))
            return math.log(p / (1 - p)) / temp

        best: dict[int, Candidate] = {}
        for c in loc.candidates:  # sorted best first: the first of a trajectory is its best state
            best.setdefault(c.root_id, c)
        z = [logit(c.score) for c in best.values()] + [logit(self.new_root_threshold)]
        top = max(z)
        e = [math.exp(x - top) for x in z]
        total = sum(e)
        loc.new_root_confidence = e[-1] / total
        loc.alternatives = sorted((Alternative(self._tip(c.node_id), r, w / total, c.score)
                                   for (r, c), w in zip(best.items(), e)), key=lambda a: -a.confidence)
        primary = self.store.get_node(loc.parent_id).root_id if loc.parent_id is not None else None
        lead = next((a for a in loc.alternatives if a.root_id == primary), None)
        loc.primary_root = primary
        loc.confidence = loc.new_root_confidence if primary is None else (lead.confidence if lead else None)
        others = [a for a in loc.alternatives if a.root_id != primary]
        if lead is None or not others:
            return loc
        if for_question:
            margin = sc.get("read_margin")
            if margin is not None and lead.confidence - others[0].confidence < float(margin):
                loc.runner_up = [others[0].node_id]
            return loc
        if self._link_evidence == "entity":
            others = self._named_apart(text, loc.candidates, primary, others)
        loc.link_candidate = others[0] if others else None
        floor = sc.get("min_score")
        if floor is not None and loc.link_candidate is not None and loc.link_candidate.score >= float(floor):
            loc.secondary = [loc.link_candidate.node_id]
        return loc

    @staticmethod
    def _named_apart(text: str, candidates: list[Candidate], primary: int,
                     others: list[Alternative]) -> list[Alternative]:
        """The trajectories a turn names apart from its parent's: those whose candidate states' entities
        (or topic) share a word with the turn's entities that the parent trajectory's states do not have.
        A turn continues a second state only with evidence of it; "book Erik the same hotel as Amelie"
        names Amelie, while a turn about Erik alone, or about a destination both trips share, names no
        trajectory apart and gets no link."""
        named = entity_words(find_entities(text))
        if not named:
            return []
        by_root: dict[int, set[str]] = {}
        for c in candidates:
            by_root.setdefault(c.root_id, set()).update(entity_words(c.entities + [c.topic_key]))
        apart = named - by_root.get(primary, set())
        return [a for a in others if apart & by_root.get(a.root_id, set())]

    @property
    def new_root_threshold(self) -> float:
        """The configured threshold, or the one a tuned bundle was calibrated with (when allowed)."""
        loc = self.cfg["localization"]
        tuned = getattr(self.reranker, "new_root_threshold", None)
        return float(tuned) if (tuned is not None and loc["threshold_from_bundle"]) else float(loc["new_root_threshold"])

    def _tip(self, node_id: int) -> int:
        return self.store.tip(node_id) if self.cfg["localization"]["attach"] == "tip" else node_id

    def _consistent(self, text: str, latest: Node) -> bool:
        """A continuation cue counts unless the input names entities the latest state does not know."""
        if not self.cfg["localization"]["continuation_requires_entity_match"]:
            return True
        ents = {e.lower() for e in find_entities(text) if not any(ch.isdigit() for ch in e)}
        if not ents:
            return True
        known = {e.lower() for e in latest.entities} | {w.lower() for w in latest.topic_key.split()}
        return bool(ents & known) or not (ents - known)

    # ------------------------------------------------------------------ commit
    def step(self, user_text: str, assistant_text: str, timestamp: str | None = None,
             turn_key: str | None = None, speaker: str | None = None) -> tuple[Node, Localization]:
        self.lock_for_writing()
        loc = self.localize(user_text, speaker=speaker, timestamp=timestamp)
        return self.commit(user_text, assistant_text, loc, timestamp, turn_key=turn_key, speaker=speaker), loc

    def lock_for_writing(self) -> None:
        """Become this memory file's single writer (waits up to store.lock_timeout_s; MemoryBusy after)."""
        self.store.lock_for_writing(float(self.cfg["store"]["lock_timeout_s"]))

    def commit(self, user_text: str, assistant_text: str, loc: Localization, timestamp: str | None = None,
               extraction: Extraction | None = None, turn_key: str | None = None, speaker: str | None = None) -> Node:
        """Attach the completed interaction below loc.parent_id (or as a new root) and write evidence.

        Model calls (extraction, embedding) run first; the writes are one transaction. The first commit
        takes the file's writer lock. turn_key (optional) records the source turn's identity, unique per
        conversation: `ingest` uses it to skip turns already stored. speaker (optional, group chats) is
        stored with the node; recall's `addressed` channel finds a speaker's latest nodes by it.
        """
        self.lock_for_writing()
        t0 = time.perf_counter()
        turn = TurnInput(user_text, assistant_text, timestamp)
        if extraction is None:
            extraction = self.extractors.extract([turn])[0]
        t1 = time.perf_counter()
        emb_text = user_text if self.cfg["embed_text"] == "user" else f"{user_text}\n{assistant_text}"
        last = getattr(self, "_last_query_embedding", None)
        emb = last[1] if last is not None and last[0] == emb_text else self.embed(emb_text)
        tags_needed = [f["text"] for f in extraction.facts if not f.get("tags")]
        tag_iter = iter(self.tagger.predict(tags_needed)) if tags_needed else iter(())
        for f in extraction.facts:
            if not f.get("tags"):
                f["tags"] = next(tag_iter)
        with self.store.transaction():
            node = self._write(turn, loc, extraction, emb, turn_key, speaker)
        self.index.add([node.id], emb.reshape(1, -1))
        self._last_query_embedding = None
        self.timings.extract_s.append(t1 - t0)
        self.timings.commit_s.append(time.perf_counter() - t1)
        return node

    def _write(self, turn: TurnInput, loc: Localization, ex: Extraction, emb: np.ndarray,
               turn_key: str | None = None, speaker: str | None = None) -> Node:
        st, conv = self.store, self.conv
        seq = st.next_seq(conv)
        parent = st.get_node(loc.parent_id) if loc.parent_id is not None else None
        if loc.parent_id is not None and (parent is None or parent.conversation_id != conv):
            raise ValueError(f"commit: parent node {loc.parent_id} is not in conversation {conv!r}")
        ents = list(dict.fromkeys(ex.entities))
        if parent is None:
            topic = self._topic_key(ex)
            path_summary = f"{topic}: {ex.summary}"
        else:
            topic = parent.topic_key
            path_summary = self.roll_path(parent.path_summary, ex.summary)
        node = Node(id=-1, conversation_id=conv, seq=seq, timestamp=turn.timestamp,
                    parent_id=parent.id if parent else None, root_id=parent.root_id if parent else -1,
                    depth=parent.depth + 1 if parent else 0, user_text=turn.user_text,
                    assistant_text=turn.assistant_text, node_summary=ex.summary, path_summary=path_summary,
                    topic_key=topic, entities=ents, keywords=ex.keywords, embedding=emb, speaker=speaker)
        st.insert_node(node, turn_key)
        linked: list[Node] = []
        for target in loc.secondary:  # a multi-intent turn also continues another trajectory
            other = st.get_node(target) if target != node.parent_id else None
            if other is not None:
                score = next((a.score for a in loc.alternatives if a.node_id == target), 0.0)
                st.add_link(conv, node.id, target, score)
                linked.append(other)
        self._update_anchor(node, parent)
        ts = turn.timestamp
        # facts are always written: the atomic-fact ablation removes their retrieval, not their extraction
        for f in ex.facts:
            st.add_fact(conv, f["text"], f["entities"], f["tags"], node.id, ts, seq, node.root_id)
        if self.ablation["structured_extraction"]:
            self._write_states(node, ex.states)
            for a in ex.artifacts:
                subject = a.get("subject") or "user"
                cur = st.current_artifact(conv, a["name"], subject)
                if cur is not None and cur.items == a["items"]:
                    continue
                st.add_artifact(conv, a["name"], subject, a["items"], a["entities"], node.id, ts, seq, node.root_id,
                                cur.id if cur else None)
            for e in ex.events:
                st.add_event(conv, e, node.id, ts, seq, node.root_id)
            if self._resolve_links and node.parent_id is not None:
                for other in linked:
                    root, slots = self.linked_states(node, other, {s["key"] for s in ex.states})
                    self._write_states(node, slots, root)
        return node

    def linked_states(self, node: Node, other: Node, own_keys: set[str]) -> tuple[int, list[dict]]:
        """The state a multi-intent turn carries across its link (`revision.resolve_links`): the root id of
        the trajectory it is written on, and the slot.

        "For Amelie's trip, use the same companion as Pooja's" states no value: the value is Pooja's
        current companion, in the other trajectory. The commit resolves it so that the trajectory that
        takes the value holds it itself (a one-hop read later). The source is the one state key the turn
        names that one of the two trajectories holds; the target is the other trajectory's record of the
        same key, or of the one other key the turn names ("copy Vinicius's venue over to Oliver's plan as
        its gym"). When both hold the key, the value flows from the linked trajectory to the routed one
        (the turn's parent is where it acts); when only one holds a key the turn names, it flows from that
        one. The value is written as a revision of the target's current record (its subject), or as a new
        record whose subject is the first entity of the turn that the source trajectory does not name.
        Nothing is written when the turn names no such pair, several, or sets the key itself.

        A key is named when the turn (its user text or the assistant's confirmation: "Done: the guest count
        for Ananya's reunion now matches the team size of Minjun's project") names a key some record holds,
        or when the user text names it as the target ("... as its client", "set that as the companion of
        the home office setup"), which need not be held by any record yet."""
        text = f"{node.user_text}\n{node.assistant_text}".lower()
        records = self.store.records(self.conv, include_superseded=False)

        def named(key: str) -> bool:
            return re.search(rf"\b{re.escape(key.replace('_', ' ').lower())}\b", text) is not None

        keys = {r.key for r in records if named(r.key)} | {snake_case(k) for k in _AS_KEY.findall(node.user_text.lower())}

        def held(root: int) -> dict:
            return {r.key: r for r in records if r.root_id == root and r.key in keys}  # newest wins

        sides = [(held(node.root_id), node.root_id), (held(other.root_id), other.root_id)]
        (own, _), (theirs, _) = sides
        same = [k for k in own if k in theirs]
        if len(same) > 1 or (not same and own and theirs and (len(own) > 1 or len(theirs) > 1)):
            return node.root_id, []
        if same or (own and theirs):  # both hold a key the turn names: from the linked one to the routed one
            (to, to_root), (src_side, src_root) = sides
            source, target = (same[0], same[0]) if same else (next(iter(theirs)), next(iter(own)))
        else:  # one holds the keys the turn names: from that one
            (to, to_root), (src_side, src_root) = sides if theirs else sides[::-1]
            if len(src_side) != 1:
                return node.root_id, []
            source = next(iter(src_side))
            targets = sorted(keys - {source})
            if len(targets) > 1:
                return node.root_id, []
            target = targets[0] if targets else source
        if to_root == node.root_id and target in own_keys:
            return node.root_id, []
        src = src_side[source]
        if target in to:
            subject = to[target].subject
        else:
            named_there = entity_words(e for n in self.store.nodes(self.conv)
                                       if n.root_id == src_root and n.id != node.id
                                       for e in n.entities + [n.topic_key])
            subject = next((e for e in node.entities if not entity_words([e]) & named_there
                            and e.lower() not in src.value.lower()), "user")
        return to_root, [{"key": target, "value": src.value, "tag": src.tag, "entities": [subject, src.value],
                          "evidence": f"{node.user_text} [{source} ({src.subject}): {src.value}]"}]

    def _write_states(self, node: Node, slots: list[dict], root_id: int | None = None) -> None:
        """Revision check: same (key, subject) with a new value supersedes, unless the key/tag coexists.
        root_id: the trajectory the records belong to (default the node's own)."""
        rev = self.cfg["revision"]
        st, conv, ts = self.store, self.conv, node.timestamp
        for s in slots:
            subject = slot_subject(s)
            existing = st.current_records(conv, s["key"], subject)
            same = next((r for r in existing if r.value.lower() == s["value"].lower()), None)
            if same is not None:
                st.add_record_source(same, node.id, ts)
                continue
            coexist = s["key"] in rev["coexist_keys"] or (s.get("tag") in rev["coexist_tags"])
            supersedes = existing[-1].id if (existing and not coexist) else None
            st.add_record(conv, s["key"], subject, s["value"], s.get("tag", ""), s.get("entities", []),
                          s.get("evidence", ""), node.id, ts, node.seq,
                          node.root_id if root_id is None else root_id, supersedes)

    def _topic_key(self, ex: Extraction) -> str:
        return self.topic_key_of(ex.entities, ex.keywords, ex.summary)

    @staticmethod
    def topic_key_of(entities: list[str], keywords: list[str], summary: str) -> str:
        """A branch's topic key: its root's first two named entities and three keywords."""
        names = [e for e in entities if not any(ch.isdigit() for ch in e)][:2]
        kws = [k for k in keywords if k.lower() not in {n.lower() for n in names}][:3]
        return truncate(" · ".join(names + kws) or summary, 80)

    def roll_path(self, parent_path: str, summary: str) -> str:
        limit = self.cfg["path_summary_chars"]
        s = f"{parent_path} | {summary}"
        if len(s) <= limit:
            return s
        head, _, rest = s.partition(": ")
        tail = rest[-(limit - len(head) - 6):]
        return f"{head}: …{tail[tail.find(' | ') if ' | ' in tail else 0:]}"

    def _update_anchor(self, node: Node, parent: Node | None) -> None:
        """Topic anchor of the branch root: topic key plus the entities seen along the branch."""
        root_id = node.root_id
        prev = self.store.db.execute("SELECT topic FROM root_fts WHERE rowid=?", (root_id,)).fetchone()
        terms = (prev[0] if prev else node.topic_key).split(" ; ")
        self._extend_anchor(terms, {t.lower() for t in terms}, node.entities)
        self.store.set_root_topic(self.conv, root_id, " ; ".join(terms))

    def _extend_anchor(self, terms: list[str], seen: set[str], entities: list[str]) -> None:
        """Append the entities not yet in the anchor, up to recall.anchor_terms terms."""
        for e in entities:
            if e.lower() not in seen and len(terms) < self.cfg["recall"]["anchor_terms"]:
                terms.append(e)
                seen.add(e.lower())

    def rebuild_anchor(self, root_id: int) -> None:
        """The branch's topic anchor from its stored nodes, as the commits built it (after a forget)."""
        root = self.store.get_node(root_id)
        terms = root.topic_key.split(" ; ")
        seen = {t.lower() for t in terms}
        cap = self.cfg["recall"]["anchor_terms"]
        for (ents,) in self.store.db.execute("SELECT entities FROM nodes WHERE root_id=? ORDER BY seq", (root_id,)):
            if len(terms) >= cap:
                break
            self._extend_anchor(terms, seen, json.loads(ents))
        self.store.set_root_topic(self.conv, root_id, " ; ".join(terms))

    # ------------------------------------------------------------------ forget
    def forget(self, nodes: list[int] | None = None, branch: int | None = None, entity: str | None = None,
               question: str | None = None, dry_run: bool = False):
        """Forget nodes (by id, by branch, by entity, or those a read of `question` cites) and everything
        derived from them, in one transaction; returns a ForgetReport (counts, never text). See forget.py."""
        from .forget import forget

        return forget(self, nodes=nodes, branch=branch, entity=entity, question=question, dry_run=dry_run)

    # ------------------------------------------------------------------ read
    def read(self, question: str, now: str | None = None, budget: int | None = None) -> tuple[Localization, Context]:
        """Localize and assemble from one committed state (a writer in another process may be committing)."""
        with self.store.snapshot():
            loc = self.localize(question, for_question=True)
            return loc, self.assemble(question, loc, now=now, budget=budget)

    def assemble(self, question: str, loc: Localization, now: str | None = None, budget: int | None = None) -> Context:
        t0 = time.perf_counter()
        try:
            return self._assemble(question, loc, now, budget)
        finally:
            self.timings.assemble_s.append(time.perf_counter() - t0)

    def _assemble(self, question: str, loc: Localization, now: str | None, budget: int | None) -> Context:
        """The context: the evidence layers of `context.layers`, in their order (layers.py)."""
        cc = self.cfg["context"]
        budget = int(budget or cc["read_budget"])
        header = f"Current time: {now}" if now else "Current time: unknown"
        fixed = self.counter.count(header) + self.counter.count(question)
        if budget <= fixed:
            raise ConfigError(f"read budget {budget} tokens is smaller than the fixed prompt ({fixed} tokens)")
        packer = BudgetPacker(self.counter, budget - fixed)
        intents = question_intents(question)
        path: list[Node] = []
        if loc.parent_id is not None:
            path = (self.store.trajectory(loc.parent_id, cc["max_path_nodes"]) if self.ablation["state_localization"]
                    else self.store.recent_nodes(self.conv, cc["linear_window"]))
        r = Read(self, question, loc, packer, intents, {e.lower() for e in find_entities(question)}, path)
        blocks = build_blocks(r, self.layers)
        return Context(blocks=blocks, header=header, tokens=fixed + packer.used, budget=budget, intents=intents)

    # ------------------------------------------------------------------ inspection
    def nodes(self) -> list[Node]:
        return self.store.nodes(self.conv)

    def stats(self) -> dict[str, Any]:
        return self.store.counts(self.conv)


TURN_KEY_SEED = "arbormem-turn-v1"


# the target key of a copy ("... over to Oliver's plan as its gym", "set that as the companion of the trip")
_AS_KEY = re.compile(r"\bas (?:its|the|their|his|her) ([a-z]+(?: [a-z]+)?)(?=\s+(?:of|for)\b|\s*[.,;!?]|\s*$)")


def entity_words(items) -> set[str]:
    """The words (three letters or more, possessive 's dropped) of entity strings: what `_named_apart`
    and `linked_states` compare, so "Pooja's" and "Pooja Lopez" share "pooja"."""
    out: set[str] = set()
    for e in items:
        out |= {w for w in re.findall(r"[a-z0-9]+", re.sub(r"['’]s\b", "", e.lower())) if len(w) > 2}
    return out


def turn_keys(turns: list[dict]) -> list[str]:
    """The identity of each turn of a transcript: a SHA-256 chained over the turns up to it.

    Key i depends on turns 1..i (user, assistant, timestamp), so a repeated "ok" turn keeps its own
    identity, a rerun of the same file (or of the file grown by new turns) matches the stored prefix,
    and a file with different earlier turns never matches.
    """
    import hashlib

    prev = hashlib.sha256(TURN_KEY_SEED.encode()).hexdigest()
    out = []
    for t in turns:
        h = hashlib.sha256(prev.encode())
        for part in (t["user"], t["assistant"], t.get("timestamp") or ""):
            h.update(b"\x00" + part.encode("utf-8"))
        prev = h.hexdigest()
        out.append(prev)
    return out


def slot_subject(slot: dict) -> str:
    """Whose state a slot is: its first entity that is not part of the value ("Alice" for Alice's
    budget of $1200; "user" for "I live in Berlin", whose only entity is the value)."""
    value = slot["value"].lower()
    for e in slot.get("entities") or []:
        if e.lower() not in value and value not in e.lower():
            return e
    return "user"


def build_components(cfg: dict) -> dict:
    return {
        "embedder": build_embedder(cfg["embedder"]),
        "reranker": build_reranker(cfg["reranker"]),
        "extractors": ExtractorSet(cfg["extractors"], cfg["heuristics"], enabled=_enabled_kinds(cfg)),
        "tagger": build_tagger(cfg["tagger"], cfg["ontology"]),
        "counter": TokenCounter(cfg["context"]["tokenizer"]),
    }


def _enabled_kinds(cfg: dict) -> list[str]:
    kinds = ["summary", "entities", "facts"]
    if cfg["ablation"]["structured_extraction"]:
        kinds += ["states", "artifacts", "events"]
    return kinds
