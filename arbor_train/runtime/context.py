"""Answer-time context assembly under a token read budget: the token counter, the budget packer and
the context's blocks. Which blocks a read holds, and in what order, is `context.layers` (layers.py);
in the main configuration:
  Computed        deterministic answers from events (count / sum / latest / earliest / compare)
  UpdateEvidence  old -> new revision chains (first for update questions: previous / current)
  PrimaryPath     the selected root-to-node trajectory; past the branch budget, the 4 most recent
                  nodes raw and earlier ones as summaries
  AtomicFacts     verified facts retrieved independently (filtered by predicted attribute tags)
  States          current mutable states that match the question
  ArtifactEvidence, EventEvidence   structured blocks
  Supplemental    raw turns from other branches with a strict entity / time / exact-value match
                  (zero budget in the main configuration)
Empty blocks are omitted. Supplemental evidence never displaces the primary path: it is filled last.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache

from .text import count_tokens_approx


class TokenCounter:
    """Counts tokens with the answer model's tokenizer (or a word-piece approximation when none is set)."""

    def __init__(self, tokenizer: str | None = None):
        self.name = tokenizer or "approx"
        self._tok = None
        if tokenizer:
            from transformers import AutoTokenizer

            from ..modelref import resolve

            self._tok = AutoTokenizer.from_pretrained(resolve(tokenizer))
        self.count = lru_cache(maxsize=100_000)(self._count)

    def _count(self, text: str) -> int:
        if self._tok is None:
            return count_tokens_approx(text)
        return len(self._tok.encode(text, add_special_tokens=False))


INTENT_CUES = {
    "previous": r"\b(previous|previously|before (?:the|it|that) (?:change|update)|originally|initially|used to|"
                r"old|earlier|at first|first (?:set|planned|chose))\b",
    "current": r"\b(current|currently|now|latest|updated|final|these days)\b",
    "count": r"\bhow many\b|\bnumber of\b|\bcount\b|\bhow often\b",
    "sum": r"\bin total\b|\btotal\b|\baltogether\b|\bcombined\b|\bsum\b|\bhow much\b.*\b(spent|paid|ran|raised|saved|donated)\b",
    "latest": r"\b(most recent|last time|latest|last)\b",
    "earliest": r"\b(earliest|first time|first)\b",
    "order": r"\b(order|sequence|after|before|first|second|third|fourth|next|stop|item)\b",
    "compare": r"\b(more|less|fewer|higher|lower|larger|smaller|bigger|compare|which of)\b",
}
_INTENTS = {k: re.compile(v, re.I) for k, v in INTENT_CUES.items()}


def question_intents(text: str) -> set[str]:
    return {k for k, rx in _INTENTS.items() if rx.search(text or "")}


@dataclass
class Block:
    name: str
    lines: list[str] = field(default_factory=list)
    node_ids: list[int] = field(default_factory=list)
    tokens: int = 0

    def render(self) -> str:
        return f"[{self.name}]\n" + "\n".join(self.lines)


@dataclass
class Context:
    blocks: list[Block]
    header: str
    tokens: int
    budget: int
    intents: set[str]

    @property
    def text(self) -> str:
        return "\n\n".join([self.header] + [b.render() for b in self.blocks if b.lines])

    def block(self, name: str) -> Block | None:
        return next((b for b in self.blocks if b.name == name), None)

    @property
    def node_ids(self) -> set[int]:
        return {i for b in self.blocks for i in b.node_ids}

    def to_json(self) -> dict:
        return {"tokens": self.tokens, "budget": self.budget, "intents": sorted(self.intents),
                "blocks": [{"name": b.name, "tokens": b.tokens, "node_ids": b.node_ids, "lines": b.lines}
                           for b in self.blocks]}


class BudgetPacker:
    """Greedy packer: each block takes lines in order while both its own cap and the total allow."""

    def __init__(self, counter: TokenCounter, total: int):
        self.counter, self.total, self.used = counter, total, 0

    def remaining(self) -> int:
        return self.total - self.used

    def cost(self, name: str, lines: list[tuple[str, list[int]]]) -> int:
        """Tokens a block would take with exactly these lines."""
        return self.counter.count(f"[{name}]") + 1 + sum(self.counter.count(t) + 1 for t, _ in lines)

    def fill(self, block: Block, lines: list[tuple[str, list[int]]], cap: int) -> Block:
        cap = min(cap, self.remaining())
        used = self.counter.count(f"[{block.name}]") + 1
        if used >= cap:
            return block
        for text, nids in lines:
            n = self.counter.count(text) + 1
            if used + n > cap:
                continue  # a shorter later line may still fit
            block.lines.append(text)
            block.node_ids.extend(nids)
            used += n
        if block.lines:
            block.tokens = used
            self.used += used
        return block


def fill_by_time(packer: BudgetPacker, block: Block, items: list[tuple[str | None, int, str, list[int]]],
                 cap: int) -> Block:
    """Pack (timestamp, order, text, node ids) items, best first, and render them in `order` with each
    timestamp written once per run, as a `[timestamp]` line above the items that share it: a dozen
    turns of one session cost one date instead of twelve. An item is taken when the block, rendered
    with it, still fits the cap."""
    count = packer.counter.count
    cap = min(cap, packer.remaining())
    head = count(f"[{block.name}]") + 1
    if head >= cap:
        return block

    def rendered(chosen: list) -> list[tuple[str, list[int]]]:
        out, last = [], None
        for _, ts, text, nids in sorted(chosen, key=lambda x: x[0]):
            if ts and ts != last:
                out.append((f"[{ts}]", []))
            last = ts
            out.append((text, nids))
        return out

    chosen: list = []
    used = head
    for ts, order, text, nids in items:
        trial = chosen + [(order, ts, text, nids)]
        n = head + sum(count(t) + 1 for t, _ in rendered(trial))
        if n > cap:
            continue
        chosen, used = trial, n
    for text, nids in rendered(chosen):
        block.lines.append(text)
        block.node_ids.extend(nids)
    if block.lines:
        block.tokens = used
        packer.used += used
    return block


def ts_prefix(ts: str | None) -> str:
    return f"[{ts}] " if ts else ""
