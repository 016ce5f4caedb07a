"""Data types of the memory forest and the evidence store.

These are plain dataclasses: the SQLite store (store.py) is their only persistence, and JSON export
(`asdict`) is their only serialisation.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

NEW_ROOT = -1  # parent id that means "start a new root"


@dataclass
class Node:
    """One committed interaction state: a user turn and the response to it."""

    id: int
    conversation_id: str
    seq: int  # position in the conversation, 0-based, increasing (a forget leaves gaps)
    timestamp: str | None
    parent_id: int | None
    root_id: int
    depth: int
    user_text: str
    assistant_text: str
    node_summary: str = ""
    path_summary: str = ""
    topic_key: str = ""
    entities: list[str] = field(default_factory=list)
    keywords: list[str] = field(default_factory=list)
    embedding: np.ndarray | None = None
    speaker: str | None = None  # who said the turn (group chats); None in one-user conversations

    def to_json(self, with_embedding: bool = False) -> dict[str, Any]:
        d = asdict(self)
        d["embedding"] = self.embedding.tolist() if (with_embedding and self.embedding is not None) else None
        if not with_embedding:
            d.pop("embedding")
        return d

    @property
    def raw(self) -> str:
        return f"User: {self.user_text}\nAssistant: {self.assistant_text}"


@dataclass
class AtomicFact:
    id: int
    text: str
    entities: list[str]
    tags: list[str]
    sources: list[int]  # node ids
    timestamps: list[str | None]
    seq: int
    root_id: int
    superseded_by: int | None = None


@dataclass
class StateRecord:
    """A mutable state slot (home_city, budget, ...) with revision links."""

    id: int
    key: str
    subject: str
    value: str
    tag: str
    entities: list[str]
    evidence: str
    sources: list[int]
    timestamps: list[str | None]
    seq: int
    root_id: int
    supersedes: int | None = None
    superseded_by: int | None = None
    chain_id: int | None = None  # id of the first version: all revisions of one state share it

    @property
    def current(self) -> bool:
        return self.superseded_by is None


@dataclass
class Artifact:
    """An ordered list (itinerary, agenda, playlist); a new version supersedes the old."""

    id: int
    name: str
    subject: str
    items: list[str]
    entities: list[str]
    sources: list[int]
    timestamps: list[str | None]
    seq: int
    root_id: int
    supersedes: int | None = None
    superseded_by: int | None = None


@dataclass
class Event:
    """Something that happened, with the fields count/sum/latest/earliest/compare questions need."""

    id: int
    subject: str
    action: str
    category: str
    quantity: float | None
    unit: str | None
    date: str | None
    text: str
    entities: list[str]
    sources: list[int]
    timestamps: list[str | None]
    seq: int
    root_id: int


# Recall channels whose candidates also carry their place in the channel's own list (channels["keyword_rank"]:
# 1 = the channel's best hit), so that a reranker can read a channel's ranking, not only whether it found the
# candidate. The rank is the channel's over everything it searched, the same whichever candidates are scored.
RANKED_CHANNELS = ("semantic", "keyword", "fact")


@dataclass
class Candidate:
    """A candidate parent state as the reranker sees it."""

    node_id: int
    topic_key: str
    path_summary: str
    node_summary: str
    entities: list[str]
    seq: int
    root_id: int
    channels: dict[str, float] = field(default_factory=dict)  # recall channel -> channel score
    score: float = 0.0
    speaker: str | None = None   # group chats: who wrote the candidate state
    back: int | None = None      # group chats: messages since the candidate (1 = the latest)
    minutes: int | None = None   # group chats: minutes between the candidate and the input, when both have times
    text: str = ""               # the state's own turn (user and assistant), for question documents
    timestamp: str | None = None  # the state's time, for question documents
    as_question: bool = False    # score this candidate against a question with `question_document()`

    def question_document(self) -> str:
        """What a reranker reads for a question asked after the conversation
        (`localization.question_document: text`): the state's date and its own turn, whole, then its topic.
        The state summary is one sentence of one speaker; a question's evidence is often in the reply."""
        return f"Date: {self.timestamp or 'unknown'}\n{self.text}\nTopic: {self.topic_key}"

    def document(self) -> str:
        """The branch-aware text the rerankers score against the input (a question's own document when
        `as_question` and the state's text is known).

        In a group chat (the candidate has a speaker) a first line says who wrote it, how many messages
        back and how many minutes ago, and the candidate's own message comes before its topic: with many
        speakers, who and when carry much of the reply structure. One-user conversations read as before.
        """
        if self.as_question and self.text:
            return self.question_document()
        ents = ", ".join(self.entities[:12])
        # most truncatable field last: encoders cut the pair at max_length
        if self.speaker is None:
            return (
                f"Topic: {self.topic_key}\nState: {self.node_summary}\nEntities: {ents}\n"
                f"Path: {self.path_summary}"
            )
        when = [f"{self.back} back"] if self.back is not None else []
        when += [f"{self.minutes} min"] if self.minutes is not None else []
        return (f"Speaker: {self.speaker} ({', '.join(when) or 'time unknown'})\nState: {self.node_summary}\n"
                f"Topic: {self.topic_key}\nEntities: {ents}\nPath: {self.path_summary}")


@dataclass
class Alternative:
    """One trajectory the input may resume: its state to attach to (the tip of the best candidate when
    attaching at tips), its root, its confidence (the reranker's softmax over each trajectory's best
    state and the new-root option: the distribution a tuned reranker is trained on), and the reranker's
    score of its best state."""

    node_id: int
    root_id: int
    confidence: float
    score: float = 0.0


@dataclass
class Localization:
    """Where an input attaches: a parent node, or a new root (parent_id is None).

    `alternatives`: the trajectories ranked by confidence (after a rerank), `new_root_confidence` the
    new-root option's share. `secondary`: states a commit links beside the parent (a multi-intent turn:
    the runner-up trajectory's best state scores `localization.secondary.min_score` or more);
    `runner_up`: for a question whose top two trajectories are within `localization.secondary.read_margin`,
    the second one, which the read adds (`secondary_path` layer). `primary_root`, `confidence` and
    `link_candidate` record the chosen trajectory, its confidence and the best trajectory a link could
    join (after `secondary.evidence`), so callers need not rescan `alternatives`."""

    parent_id: int | None
    route: str  # continuation | temporal_return | rerank | recall | linear | first | empty
    score: float
    cue: str | None = None
    candidates: list[Candidate] = field(default_factory=list)
    alternatives: list[Alternative] = field(default_factory=list)
    new_root_confidence: float | None = None
    secondary: list[int] = field(default_factory=list)
    runner_up: list[int] = field(default_factory=list)
    primary_root: int | None = None          # the chosen trajectory (None: a new root), after a rerank
    confidence: float | None = None          # its confidence (the new-root option's for a new root)
    link_candidate: Alternative | None = None  # a turn's best linkable other trajectory, threshold aside

    @property
    def new_root(self) -> bool:
        return self.parent_id is None

    def to_json(self) -> dict[str, Any]:
        return {
            "parent_id": self.parent_id,
            "route": self.route,
            "score": round(float(self.score), 4),
            "cue": self.cue,
            "alternatives": [{"node_id": a.node_id, "root_id": a.root_id, "confidence": round(a.confidence, 4),
                              "score": round(a.score, 4)} for a in self.alternatives],
            "new_root_confidence": None if self.new_root_confidence is None else round(self.new_root_confidence, 4),
            "secondary": list(self.secondary),
            "runner_up": list(self.runner_up),
            "candidates": [
                {"node_id": c.node_id, "score": round(float(c.score), 4), "channels": c.channels,
                 "topic_key": c.topic_key, "node_summary": c.node_summary}
                for c in self.candidates
            ],
        }
