"""Commit: writing a completed interaction into the forest and the evidence store in one transaction:
the node, its summaries and topic anchors, its embedding, extracted facts, states, artifacts and
events with provenance, and the state a secondary link carries. `Committer` is mixed into
`ArborMemory` (memory.py). A transcript turn's identity is turnkeys.py's."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator, Sequence

import numpy as np

from ..errors import parse_int
from .extract import Extraction, TurnInput
from .schema import Localization, Node
from .text import snake_case, truncate

log = logging.getLogger(__name__)
from .localize import entity_words


# the target key of a copy ("... over to Oliver's plan as its gym", "set that as the companion of the trip")
_AS_KEY = re.compile(r"\bas (?:its|the|their|his|her) ([a-z]+(?: [a-z]+)?)(?=\s+(?:of|for)\b|\s*[.,;!?]|\s*$)")



def slot_subject(slot: dict) -> str:
    """Whose state a slot is: its first entity that is not part of the value ("Alice" for Alice's
    budget of $1200; "user" for "I live in Berlin", whose only entity is the value)."""
    value = slot["value"].lower()
    for e in slot.get("entities") or []:
        if e.lower() not in value and value not in e.lower():
            return e
    return "user"


class Committer:
    def step(self, user_text: str, assistant_text: str, timestamp: str | None = None,
             turn_key: str | None = None, speaker: str | None = None) -> tuple[Node, Localization]:
        self.lock_for_writing()
        loc = self.localize(user_text, speaker=speaker, timestamp=timestamp)
        return self.commit(user_text, assistant_text, loc, timestamp, turn_key=turn_key, speaker=speaker), loc

    def steps(self, turns: Sequence[dict], ahead: int | None = None) -> Iterator[tuple[Node, Localization]]:
        """`step` over many turns in order (dicts with user and assistant, and optionally timestamp, turn_key and
        speaker), each chunk of `ahead` turns (runtime.ingest.extract_ahead) extracted as one batch before its
        turns are localized and committed one by one: a replay's batched extraction. A turn's extraction reads
        only the turn, so the forest equals the one `step` builds turn by turn. Yields (node, localization)."""
        if ahead is None:
            ahead = self.cfg.get("ingest", {}).get("extract_ahead", 1)
        ahead = parse_int(ahead, "runtime.ingest.extract_ahead", minimum=1)
        for i in range(0, len(turns), ahead):
            chunk = turns[i : i + ahead]
            self.lock_for_writing()
            if ahead > 1:
                with self.timings.stage("extract"):
                    done = self.extractors.extract([TurnInput(t["user"], t["assistant"], t.get("timestamp"))
                                                    for t in chunk])
            else:
                done = [None] * len(chunk)
            for t, extraction in zip(chunk, done):
                ts, speaker = t.get("timestamp"), t.get("speaker")
                loc = self.localize(t["user"], speaker=speaker, timestamp=ts)
                yield self.commit(t["user"], t["assistant"], loc, ts, extraction=extraction,
                                  turn_key=t.get("turn_key"), speaker=speaker), loc

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
        tm = self.timings
        if extraction is None:
            with tm.stage("extract"):
                extraction = self.extractors.extract([turn])[0]
        t1 = time.perf_counter()
        emb_text = user_text if self.cfg["embed_text"] == "user" else f"{user_text}\n{assistant_text}"
        last = getattr(self, "_last_query_embedding", None)
        if last is not None and last[0] == emb_text:
            emb = last[1]
        else:
            with tm.stage("embed"):
                emb = self.embed(emb_text)
        tags_needed = [f["text"] for f in extraction.facts if not f.get("tags")]
        with tm.stage("tag"):
            tag_iter = iter(self.tagger.predict(tags_needed)) if tags_needed else iter(())
        for f in extraction.facts:
            if not f.get("tags"):
                f["tags"] = next(tag_iter)
        with tm.stage("write"), self.store.transaction():
            node = self._write(turn, loc, extraction, emb, turn_key, speaker)
        with tm.stage("index"):  # the vector index, and its file every `save_every` additions
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
        terms = (self.store.root_topic(root_id) or node.topic_key).split(" ; ")
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
        for ents in self.store.branch_entities(root_id):
            if len(terms) >= cap:
                break
            self._extend_anchor(terms, seen, ents)
        self.store.set_root_topic(self.conv, root_id, " ; ".join(terms))
