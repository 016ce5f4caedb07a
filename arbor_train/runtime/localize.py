"""Localization: which committed state a new turn (or a question) resumes. The fast paths (a
continuation cue), recall over the semantic, keyword, topic, recency and group-chat channels, the
branch-aware rerank, the temporal-return cue, and the ranked alternatives with their confidences and
secondary links. `Localizer` is mixed into `ArborMemory` (memory.py), whose state it reads."""

from __future__ import annotations

import logging
import math
import re
import time
from typing import Any

import numpy as np

from .schema import RANKED_CHANNELS, Alternative, Candidate, Localization, Node
from .text import entities as find_entities
from .text import find_cue, match_cue, minutes_between

log = logging.getLogger(__name__)


NICK_WORD = re.compile(r"[\w\-\[\]\\^{}|`]+")  # a word that may be an IRC nick


def group_features(n: Node, latest: Node, now: str | None) -> dict[str, Any]:
    """What a group-chat candidate adds to its reranker document: its speaker, how many messages back
    it is, and the minutes since it (when the input has a time). Nothing for one-user conversations."""
    if n.speaker is None:
        return {}
    return {"speaker": n.speaker, "back": latest.seq - n.seq + 1, "minutes": minutes_between(n.timestamp, now)}


def entity_words(items) -> set[str]:
    """The words (three letters or more, possessive 's dropped) of entity strings: what `_named_apart`
    and `linked_states` compare, so "Pooja's" and "Pooja Lopez" share "pooja"."""
    out: set[str] = set()
    for e in items:
        out |= {w for w in re.findall(r"[a-z0-9]+", re.sub(r"['’]s\b", "", e.lower())) if len(w) > 2}
    return out


def logit(p: float, temperature: float = 1.0, eps: float = 1e-6) -> float:
    """log(p / (1 - p)) / temperature, p clipped to [eps, 1 - eps]: a reranker's probability as the logit its
    confidences are a softmax over (trajectories in `_alternatives`, states in the localized read layer)."""
    p = min(1 - eps, max(eps, p))
    return math.log(p / (1 - p)) / temperature


QUESTION_TEXT_CHARS = 700  # a question document holds this much of the state's own turn


def turn_text(n: Node) -> str:
    """A state's own turn as a question document shows it (both sides, cut at QUESTION_TEXT_CHARS)."""
    t = f"{n.user_text}\n{n.assistant_text}".strip()
    return t if len(t) <= QUESTION_TEXT_CHARS else t[: QUESTION_TEXT_CHARS - 1] + "…"


class Localizer:
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
                now: str | None = None, for_question: bool = False) -> list[Candidate]:
        """Candidates by reciprocal-rank fusion of the recall channels. A question (`for_question`) uses
        `context.question_recall` (the read policy's) where it sets a key: wider channels, and the fact channel (the states the best
        matching atomic facts cite), so that a question's evidence is among the candidates."""
        rc = dict(self.cfg["recall"])
        if for_question:
            rc.update({k: v for k, v in (self.cfg["context"].get("question_recall") or {}).items() if v is not None})
        ranks: dict[int, dict[str, float]] = {}
        fused: dict[int, float] = {}

        def add(channel: str, hits: list[tuple[int, float]]) -> None:
            for rank, (nid, s) in enumerate(hits):
                ch = ranks.setdefault(nid, {})
                ch[channel] = round(float(s), 4)
                if channel in RANKED_CHANNELS:  # its place in the channel's own list (the pair features' `ranks`)
                    ch[f"{channel}_rank"] = float(rank + 1)
                fused[nid] = fused.get(nid, 0.0) + 1.0 / (rc["rrf_k"] + rank + 1)

        add("semantic", self.index.search(q_emb, rc["k_semantic"]))
        add("keyword", self.store.keyword_search(self.conv, text, rc["k_keyword"]))
        k_fact = int(rc.get("k_fact", 0))
        if k_fact > 0:  # the states the best matching facts cite, in the facts' order
            cited: dict[int, float] = {}
            for f, s in self.store.search_facts(self.conv, text, k_fact):
                for nid in f.sources:
                    cited.setdefault(nid, s)
            add("fact", list(cited.items()))
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
        as_question = for_question and self.question_document == "text"
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
                                   root_id=n.root_id, channels=ch, **group_features(n, latest, now),
                                   # a question's candidates carry their own turn (a turn's never read it)
                                   **({"text": turn_text(n), "timestamp": n.timestamp, "as_question": as_question}
                                      if for_question else {})))
        return cands

    @property
    def question_document(self) -> str:
        """What the reranker reads of a candidate for a question: `state` (its summary, topic, entities and
        path, as for a turn) or `text` (its date and own turn: Candidate.question_document). A reranker
        bundle trained on one of them says so, and that replaces `localization.question_document`."""
        tuned = getattr(self.reranker, "question_document", None)
        return str(tuned or self.cfg["localization"].get("question_document", "state"))

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
        with self.timings.stage("embed"):
            q_emb = self.embed(text)
        self._last_query_embedding = (text, q_emb)
        if routing and not for_question:
            cue = match_cue(text, loc_cfg["continuation_cues"])
            if cue and self._consistent(text, latest):
                return Localization(self._tip(latest.id), "continuation", 1.0, cue)
        with self.timings.stage("recall"):
            cands = self._recall(text, q_emb, latest, speaker, timestamp, for_question)
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
        with self.timings.stage("rerank"):
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
        with self.timings.stage("trajectories"):
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
        best: dict[int, Candidate] = {}
        for c in loc.candidates:  # sorted best first: the first of a trajectory is its best state
            best.setdefault(c.root_id, c)
        z = [logit(c.score, temp) for c in best.values()] + [logit(self.new_root_threshold, temp)]
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
