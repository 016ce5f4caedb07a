"""Ubuntu IRC reply structure (Kummerfeld et al., ACL 2019, "A Large-Scale Corpus for Conversation
Disentanglement"; CC-BY-4.0): loader and the corpus's metrics, written from their definitions.

A file pair `NAME.ascii.txt` (one message per line, 0-based: `[HH:MM] <nick> text`, an action
`[HH:MM]  * nick text`, a relayed `(nick/#chan) text` or notice `-nick:#chan- text`, or a system line
`=== ...`) and `NAME.annotation.txt` (`A B -`: message B replies to A, A <= B; `B B -`: B starts a
conversation; several lines for several parents). Lines 0-999 are context; the annotated lines are the
children of the annotation file. Malformed lines, and links that point forward or outside the file,
fail with the file and line named (BenchmarkFormatError).

Metrics (`score`), over the annotated messages:
- link precision / recall / F1: the predicted (parent, child) pairs against the gold pairs, self-links
  included;
- conversations are the connected components of each link graph (links into the context join their
  children; context-only messages are then dropped): 1 - VI / log(n) (variation of information, scaled
  by the log of the number of messages), one-to-one overlap (the best one-to-one matching of predicted
  to gold conversations, by shared messages, as a share of all messages; Hungarian matching), and
  exact-match precision / recall / F1 over conversations of two or more messages.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from .schema import BenchmarkFormatError

_LINE = re.compile(r"^\[(\d\d):(\d\d)\] (.*)$")
_SPEAKERS = (re.compile(r"^<([^>]*)>(?: (.*))?$"), re.compile(r"^ \* (\S+)(?: (.*))?$"),
             re.compile(r"^\(([^/)]+)/[^)]*\) ?(.*)$"), re.compile(r"^-([^:]+):[^-]*- ?(.*)$"))


@dataclass
class IrcMessage:
    line: int
    time: str | None          # "HH:MM"; None for system lines
    speaker: str | None       # None for system lines
    text: str
    system: bool


@dataclass
class IrcFile:
    name: str
    path: Path
    messages: list[IrcMessage]
    parents: dict[int, set[int]] = field(default_factory=dict)  # annotated child line -> gold parent lines

    @property
    def conversation_id(self) -> str:
        return self.name

    @property
    def annotated(self) -> list[int]:
        return sorted(self.parents)

    @property
    def first_annotated(self) -> int:
        return min(self.parents) if self.parents else len(self.messages)


def parse_message(raw: str, where: str, line: int) -> IrcMessage:
    if raw.startswith("=== "):
        return IrcMessage(line, None, None, raw[4:], True)
    m = _LINE.match(raw)
    if m is None:
        raise BenchmarkFormatError(f"{where}: line {line}: not an IRC message ('[HH:MM] <nick> text' or "
                                   f"'=== ...'): {raw[:80]!r}")
    hh, mm, rest = m.groups()
    if int(hh) > 23 or int(mm) > 59:
        raise BenchmarkFormatError(f"{where}: line {line}: time [{hh}:{mm}] is not a time of day")
    for rx in _SPEAKERS:
        s = rx.match(rest)
        if s is not None:
            return IrcMessage(line, f"{hh}:{mm}", s.group(1), s.group(2) or "", False)
    return IrcMessage(line, f"{hh}:{mm}", None, rest, False)


def load_irc_file(ascii_path: str | Path) -> IrcFile:
    p = Path(ascii_path)
    if not p.name.endswith(".ascii.txt"):
        raise BenchmarkFormatError(f"{p}: expected a NAME.ascii.txt file")
    ann = p.with_name(p.name[: -len(".ascii.txt")] + ".annotation.txt")
    if not ann.exists():
        raise BenchmarkFormatError(f"{p}: its annotation file {ann.name} is missing")
    try:
        lines = p.read_text(encoding="utf-8").split("\n")
    except UnicodeDecodeError as e:
        raise BenchmarkFormatError(f"{p}: not UTF-8 text ({e})") from None
    if lines and lines[-1] == "":
        lines.pop()
    msgs = [parse_message(raw, str(p), i) for i, raw in enumerate(lines)]
    f = IrcFile(p.name[: -len(".ascii.txt")], p, msgs)
    for k, raw in enumerate(ann.read_text(encoding="utf-8").splitlines()):
        if not raw.strip():
            continue
        parts = raw.split()
        if len(parts) != 3 or parts[2] != "-" or not (parts[0].isdigit() and parts[1].isdigit()):
            raise BenchmarkFormatError(f"{ann}: line {k}: expected 'PARENT CHILD -', got {raw[:80]!r}")
        a, b = int(parts[0]), int(parts[1])
        if b >= len(msgs) or a >= len(msgs):
            raise BenchmarkFormatError(f"{ann}: line {k}: link {a} -> {b} points outside {p.name} "
                                       f"({len(msgs)} lines)")
        if a > b:
            raise BenchmarkFormatError(f"{ann}: line {k}: link {a} -> {b} points forward (a message can only "
                                       "reply to an earlier one)")
        f.parents.setdefault(b, set()).add(a)
    if not f.parents:
        raise BenchmarkFormatError(f"{ann}: no links")
    return f


def load_irc(split_dir: str | Path) -> list[IrcFile]:
    d = Path(split_dir)
    if not d.is_dir():
        raise BenchmarkFormatError(f"irc input {d}: not a folder of NAME.ascii.txt / NAME.annotation.txt pairs")
    files = sorted(d.glob("*.ascii.txt"))
    if not files:
        raise BenchmarkFormatError(f"irc input {d}: no *.ascii.txt files")
    return [load_irc_file(p) for p in files]


# ---------------------------------------------------------------------- metrics
def previous_message_links(f: IrcFile) -> dict[int, set[int]]:
    """The "previous message" baseline: a system line links to itself, any other message to the latest
    non-system line before it (itself when there is none)."""
    out, last = {}, None
    for m in f.messages:
        if m.line in f.parents:
            out[m.line] = {m.line if (m.system or last is None) else last}
        if not m.system:
            last = m.line
    return out


def _clusters(links: dict[int, set[int]], items: list[int]) -> list[set[int]]:
    """Connected components of the link graph, restricted to `items`."""
    parent: dict[int, int] = {}

    def find(x: int) -> int:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for child, ps in links.items():
        for p in ps:
            ra, rb = find(child), find(p)
            if ra != rb:
                parent[ra] = rb
    groups: dict[int, set[int]] = defaultdict(set)
    for i in items:
        groups[find(i)].add(i)
    return list(groups.values())


def _vi_scaled(gold: list[set[int]], pred: list[set[int]], n: int) -> float:
    g_of = {i: k for k, c in enumerate(gold) for i in c}
    p_of = {i: k for k, c in enumerate(pred) for i in c}
    joint = Counter((g_of[i], p_of[i]) for i in g_of)
    g_n, p_n = Counter(g_of.values()), Counter(p_of.values())
    vi = 0.0
    for (g, p), nij in joint.items():
        pij = nij / n
        vi -= pij * (math.log(pij / (g_n[g] / n)) + math.log(pij / (p_n[p] / n)))
    return 1.0 - vi / math.log(n) if n > 1 else 1.0


def _one_to_one(gold: list[set[int]], pred: list[set[int]], n: int) -> float:
    import numpy as np
    from scipy.optimize import linear_sum_assignment

    overlap = np.array([[len(g & p) for p in pred] for g in gold], dtype=float)
    rows, cols = linear_sum_assignment(-overlap)
    return float(overlap[rows, cols].sum()) / n


def _exact(gold: list[set[int]], pred: list[set[int]]) -> tuple[float, float, float]:
    g = {frozenset(c) for c in gold if len(c) > 1}
    p = {frozenset(c) for c in pred if len(c) > 1}
    hit = len(g & p)
    prec = hit / len(p) if p else 0.0
    rec = hit / len(g) if g else 0.0
    return prec, rec, (2 * prec * rec / (prec + rec) if prec + rec else 0.0)


def score(files: list[IrcFile], predicted: dict[str, dict[int, set[int]]]) -> dict:
    """Link and conversation metrics (in %) over every file's annotated messages; `predicted` maps file
    name -> child line -> predicted parent lines."""
    return score_links([(f.name, f.parents, predicted.get(f.name, {})) for f in files])


def score_links(units: list[tuple[str, dict[int, set[int]], dict[int, set[int]]]]) -> dict:
    """The metrics of (file name, gold links, predicted links) triples, links as child -> parents over
    the annotated children. Link P/R/F pool every file's pairs; conversation metrics average files."""
    tp = n_pred = n_gold = 0
    vi, one, ex_p, ex_r, ex_f = [], [], [], [], []
    for name, gold, pred in units:
        items = sorted(gold)
        missing = [c for c in items if c not in pred]
        if missing:
            raise ValueError(f"{name}: no predicted link for annotated lines {missing[:5]}")
        gold_pairs = {(p, c) for c, ps in gold.items() for p in ps}
        pred_pairs = {(p, c) for c in items for p in pred[c]}
        tp += len(gold_pairs & pred_pairs)
        n_pred += len(pred_pairs)
        n_gold += len(gold_pairs)
        g, p = _clusters(gold, items), _clusters({c: pred[c] for c in items}, items)
        vi.append(_vi_scaled(g, p, len(items)))
        one.append(_one_to_one(g, p, len(items)))
        ep, er, ef = _exact(g, p)
        ex_p.append(ep), ex_r.append(er), ex_f.append(ef)
    prec, rec = tp / n_pred if n_pred else 0.0, tp / n_gold if n_gold else 0.0
    f1 = 2 * prec * rec / (prec + rec) if prec + rec else 0.0

    def pct(x: float) -> float:
        return round(100 * x, 2)

    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    return {"files": len(units), "messages": sum(len(g) for _, g, _ in units),
            "link_precision": pct(prec), "link_recall": pct(rec), "link_f1": pct(f1),
            "one_minus_vi": pct(mean(vi)), "one_to_one": pct(mean(one)),
            "exact_precision": pct(mean(ex_p)), "exact_recall": pct(mean(ex_r)), "exact_f1": pct(mean(ex_f))}
