"""Role datasets built from the supervision sets (arbor_train/conversations/supervision.py), and a resumable loader.

Everything a batch needs (token ids, loss masks, group labels) is computed when examples are built;
collators only pad. The candidate text is `Candidate.document()`, exactly what the runtime scores.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from arbor_train.runtime.rerank import encode_pairs
from arbor_train.runtime.schema import Candidate


def load_sets(data_dir: str | Path, names: list[str]) -> dict[str, Any]:
    """Load named sets from a generator/converter output folder (hf/ DatasetDict), schema-checked."""
    from datasets import load_from_disk

    from arbor_train.conversations.supervision import check_dataset
    from arbor_train.errors import InputError, MissingInputError

    p = Path(data_dir) / "hf"
    if not p.exists():
        raise MissingInputError(f"data option data_dir={str(data_dir)!r}: no hf/ folder (run python -m "
                                f"data_gen.branchmem, data_gen.locomo or data_gen.irc first)")
    dd = load_from_disk(str(p))
    out = {}
    for n in names:
        mirror = Path(data_dir) / "jsonl" / f"{n}.jsonl"
        if n not in dd and mirror.exists() and mirror.stat().st_size == 0:  # a set written with no rows
            from datasets import Dataset

            from arbor_train.conversations.supervision import SCHEMAS

            out[n] = Dataset.from_list([], features=SCHEMAS[n])
            continue
        if n not in dd:
            raise InputError(f"data option data_dir={str(data_dir)!r}: set {n!r} missing (has {sorted(dd)})")
        check_dataset(n, dd[n])
        out[n] = dd[n]
    return out


def fingerprint(data_dir: str | Path, names: list[str]) -> str:
    h = hashlib.sha256()
    for n in names:
        f = Path(data_dir) / "jsonl" / f"{n}.jsonl"
        h.update(f.read_bytes() if f.exists() else n.encode())
    return "sha256:" + h.hexdigest()[:32]


def candidate_of(c: dict, as_question: bool = False) -> Candidate:
    """A candidate row of the routing / localization sets as the runtime's Candidate (channels included);
    `as_question`: scored as a question's candidate (its own turn, when the row carries it)."""
    ch = c.get("channels") or "{}"
    return Candidate(node_id=c["turn"], topic_key=c["topic_key"], path_summary=c["path_summary"],
                     node_summary=c["node_summary"], entities=list(c["entities"]), seq=c["turn"], root_id=-1,
                     channels=json.loads(ch) if isinstance(ch, str) else dict(ch),
                     speaker=c.get("speaker"), back=c.get("back"), minutes=c.get("minutes"),
                     text=c.get("state_text") or "", timestamp=c.get("state_time"), as_question=as_question)


def candidate_text(c: dict, as_question: bool = False) -> str:
    return candidate_of(c, as_question).document()


def gold_turns(row: dict, source: str) -> set[int]:
    """The turns that count as gold for a routing / localization row: every state of the gold trajectory,
    and for routing the gold parent (when the message continues one rather than starting a new root)."""
    out = set(row["gold_states"])
    if source == "routing" and row["gold_parent"] >= 0:
        out.add(row["gold_parent"])
    return out


@dataclass
class RerankGroup:
    query: str
    docs: list[str]
    gold: int            # index into docs; -1 = new root (the null option)
    source: str          # routing | localization
    cands: list[dict]    # the candidate rows behind docs (same order), for baselines
    secondary: int = -1  # a multi-intent turn: index of its secondary gold (a second positive); -1 = none
    golds: list[int] = field(default_factory=list)  # a multi-positive question: every gold index (gold among them)
    # distilled rows (data_gen.distill): the teacher's score of each doc and of the new-root option (soft targets)
    soft: list[float] | None = None
    soft_root: float | None = None


def rerank_groups(rows, source: str, group_size: int, include_new_root: bool = True, multi_positive: bool = False,
                  question_document: str = "state") -> list[RerankGroup]:
    """The latest gold-trajectory state + the hardest negatives (by the runtime's own score).

    Other states of the gold trajectory are left out rather than used as negatives: attaching to any of
    them resumes the right trajectory (the runtime attaches at its tip), so they are not errors.

    A multi-intent routing row (`gold_secondary`) is a multi-positive group: the latest recalled state of
    its secondary trajectory joins as the second positive (`RerankGroup.secondary`), and that
    trajectory's other states are left out of the negatives too.

    With `multi_positive`, a localization row (a question and the states holding its evidence) keeps
    every recalled gold state as a positive (up to half the group, latest first; `RerankGroup.golds`),
    and the loss is the probability mass on all of them. With `question_document: text` a
    localization row's candidates are read as a question's (Candidate.question_document)."""
    out = []
    as_question = source == "localization" and question_document == "text"
    for r in rows:
        cands = list(r["candidates"])
        gold = gold_turns(r, source)
        golds = [c for c in cands if c["turn"] in gold]
        new_root = source == "routing" and r["gold_parent"] < 0
        if not golds and not (new_root and include_new_root):
            continue
        second = set(r.get("secondary_states") or []) - gold
        seconds = [c for c in cands if c["turn"] in second] if golds else []
        negs = sorted((c for c in cands if c["turn"] not in gold and c["turn"] not in second),
                      key=lambda c: -c["runtime_score"])
        extra: list[dict] = []
        if golds and multi_positive and source == "localization":
            extra = sorted(golds, key=lambda c: -c["turn"])[1 : max(1, group_size // 2)]
        if golds:
            lead = [max(golds, key=lambda c: c["turn"])] + ([max(seconds, key=lambda c: c["turn"])] if seconds else [])
            lead += extra
            docs = lead + negs[: group_size - len(lead)]
        else:
            docs = negs[:group_size]
        if not docs:
            continue
        order = sorted(range(len(docs)), key=lambda i: docs[i]["turn"])  # no positional shortcut
        texts = [candidate_text(docs[i], as_question) for i in order]
        g = order.index(0) if golds else -1
        many = [g] + [order.index(1 + bool(seconds) + j) for j in range(len(extra))] if extra else []
        kept = [docs[i] for i in order]
        soft = soft_root = None
        if r.get("teacher_new_root") is not None and all(c.get("teacher_score") is not None for c in kept):
            soft, soft_root = [float(c["teacher_score"]) for c in kept], float(r["teacher_new_root"])
        out.append(RerankGroup(r["input"], texts, g, source, kept, order.index(1) if seconds else -1, many,
                               soft, soft_root))
    return out


def soft_fields(g: RerankGroup) -> dict:
    """A group's teacher scores as example fields (nothing when it has none)."""
    return {} if g.soft is None else {"soft": g.soft, "soft_root": g.soft_root}


def encode_groups(groups: list[RerankGroup], tokenizer, max_length: int, pair_features: bool = False,
                  extra: list | tuple = ()) -> list[dict]:
    """Token ids of every (query, document) pair of each group; with `pair_features`, also the runtime's
    pair and query feature vectors (arbor_train.runtime.rerank.pair_features, with the `extra` groups) the
    bundle's head reads."""
    from arbor_train.runtime.rerank import pair_features as features

    out = []
    for g in groups:
        enc = encode_pairs(tokenizer, [g.query] * len(g.docs), g.docs, max_length)
        ex = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"],
              "token_type_ids": enc.get("token_type_ids"), "gold": g.gold, "secondary": g.secondary,
              "golds": g.golds, **soft_fields(g)}
        if pair_features:
            ex["features"], ex["query_features"] = features(g.query, [candidate_of(c) for c in g.cands], extra)
        out.append(ex)
    return out


def encode_groups_llm(groups: list[RerankGroup], tokenizer, max_length: int) -> list[dict]:
    """Qwen3-Reranker layout prompts (arbor_train.prompts.rerank_prompt), truncated from the left of the
    document so the answer position is always the last token."""
    from arbor_train.prompts import rerank_prompt

    out = []
    for g in groups:
        ids = []
        for d in g.docs:
            enc = tokenizer(rerank_prompt(tokenizer, g.query, d), add_special_tokens=False)["input_ids"]
            ids.append(enc[-max_length:])
        out.append({"input_ids": ids, "attention_mask": [[1] * len(x) for x in ids], "gold": g.gold, "golds": g.golds,
                    "secondary": g.secondary, "left_pad": True, **soft_fields(g)})
    return out


def collate_groups(batch: list[dict], pad_id: int) -> dict[str, torch.Tensor]:
    """Flatten groups into (sum of group sizes) pairs, padded (on the left for decoders, which read the
    last position); `group_sizes` maps pairs back to groups."""
    from .packing import pad_sequences

    left = bool(batch and batch[0].get("left_pad"))
    seqs = [ids for ex in batch for ids in ex["input_ids"]]
    out = {"input_ids": pad_sequences(seqs, pad_id, left),
           "attention_mask": pad_sequences([[1] * len(x) for x in seqs], 0, left),
           "group_sizes": torch.tensor([len(ex["input_ids"]) for ex in batch]),
           "gold": torch.tensor([ex["gold"] for ex in batch]),
           "secondary": torch.tensor([ex.get("secondary", -1) for ex in batch])}
    width = max([len(ex.get("golds") or []) for ex in batch] + [0])
    if width:  # multi-positive groups: every gold index, padded with -1
        out["golds"] = torch.tensor([list(ex.get("golds") or []) + [-1] * (width - len(ex.get("golds") or []))
                                     for ex in batch])
    if any("soft" in ex for ex in batch):  # teacher scores per pair and per group's new-root option (nan: none)
        nan = float("nan")
        out["soft"] = torch.tensor([x for ex in batch for x in (ex.get("soft") or [nan] * len(ex["input_ids"]))])
        out["soft_root"] = torch.tensor([ex.get("soft_root", nan) for ex in batch])
    if batch and batch[0].get("token_type_ids"):
        out["token_type_ids"] = pad_sequences([t for ex in batch for t in ex["token_type_ids"]], 0, left)
    if batch and "features" in batch[0]:
        out["features"] = torch.tensor([f for ex in batch for f in ex["features"]], dtype=torch.float32)
        out["query_features"] = torch.tensor([ex["query_features"] for ex in batch], dtype=torch.float32)
    return out


def tag_examples(rows, tokenizer, labels: list[str], max_length: int) -> list[dict]:
    idx = {l: i for i, l in enumerate(labels)}
    out = []
    for r in rows:
        y = [0.0] * len(labels)
        for t in r["tags"]:
            if t in idx:
                y[idx[t]] = 1.0
        enc = tokenizer(r["input"], truncation=True, max_length=max_length)
        out.append({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"], "labels": y})
    return out


def label_pos_weight(examples: list[dict], cap: float | None) -> list[float] | None:
    """negatives/positives per label over the training examples, capped at `cap` (None: no weighting)."""
    if not cap or not examples:
        return None
    n = len(examples)
    pos = [sum(ex["labels"][j] for ex in examples) for j in range(len(examples[0]["labels"]))]
    return [min(float(cap), (n - p) / p) if p else float(cap) for p in pos]


def collate_tags(batch: list[dict], pad_id: int) -> dict[str, torch.Tensor]:
    from .packing import pad_sequences

    return {"input_ids": pad_sequences([ex["input_ids"] for ex in batch], pad_id),
            "attention_mask": pad_sequences([ex["attention_mask"] for ex in batch], 0),
            "labels": torch.tensor([ex["labels"] for ex in batch])}


def world() -> tuple[int, int]:
    """(rank, world size) of this process: torch.distributed's once a process group is up (Lightning
    sets it up under DDP/FSDP before the first batch), else (0, 1)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class ResumableLoader:
    """A seeded, shuffling batch loader, sharded by rank, with `state_dict`/`load_state_dict`, so a
    checkpoint taken in the middle of an epoch resumes with exactly the next batch on every rank
    (Lightning saves and restores it; it is a plain iterable, so Lightning adds no sampler of its own).

    Sharding (`shard=True`): every rank draws the same seeded order of the epoch and deals it out one
    global batch (world x batch_size examples) at a time; rank r takes the r-th batch_size slice of each.
    So the ranks' shares are disjoint, their union is the whole epoch, and rank r's k-th batch is the
    (k x world + r)-th batch of a one-process run of the same seed. The short last global batch is split
    evenly over the ranks (when it holds fewer examples than ranks, they go one each into the batches
    before it), so every rank makes the same number of steps and no example is repeated or lost
    (`drop_last=True` drops it instead). Rank and world size come from torch.distributed when the
    loader is iterated, unless given.

    The state counts batches handed out in the current epoch (`consumed`) and the epoch; both are the
    same on every rank, so the rank-0 checkpoint resumes every rank.
    """

    def __init__(self, examples: list, batch_size: int, collate: Callable, seed: int, shuffle: bool = True,
                 drop_last: bool = False, shard: bool = True, rank: int | None = None,
                 world_size: int | None = None):
        if batch_size < 1:
            from arbor_train.errors import ConfigError

            raise ConfigError(f"option task.batch_size must be >= 1, got {batch_size}")
        self.examples, self.batch_size, self.collate = examples, batch_size, collate
        self.seed, self.shuffle, self.drop_last, self.shard = seed, shuffle, drop_last, shard
        self.rank, self.world_size = rank, world_size
        self.epoch = 0
        self.consumed = 0        # batches of the current epoch already handed out
        self._resume_at = 0

    def _world(self) -> tuple[int, int]:
        if not self.shard:
            return 0, 1
        if self.rank is not None and self.world_size is not None:
            return self.rank, self.world_size
        return world()

    def __len__(self) -> int:
        return len(self.batches(self.epoch))

    def _order(self, epoch: int) -> list[int]:
        idx = list(range(len(self.examples)))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + epoch).shuffle(idx)
        return idx

    def batches(self, epoch: int) -> list[list[int]]:
        """This rank's batches of `epoch`, as example indices (the same on every call)."""
        r, w = self._world()
        if len(self.examples) < w:
            from arbor_train.errors import ConfigError

            raise ConfigError(f"{len(self.examples)} training item(s) for {w} ranks: every rank needs at least one "
                              f"(more data, or fewer trainer.devices)")
        order, step = self._order(epoch), w * self.batch_size
        n_full, rest = divmod(len(order), step)
        out = [order[k * step + r * self.batch_size : k * step + (r + 1) * self.batch_size] for k in range(n_full)]
        if rest and not self.drop_last:
            tail = order[n_full * step :]
            if rest >= w or not out:   # split evenly: the first rest % w ranks get one more
                q, m = divmod(rest, w)
                lo = r * q + min(r, m)
                out.append(tail[lo : lo + q + (r < m)])
            elif r < rest:             # fewer than one each: into the batches before
                out[-1] = out[-1] + [tail[r]]
        return out

    def __iter__(self):
        batches = self.batches(self.epoch)
        start = self._resume_at
        self._resume_at = 0
        for b in range(start, len(batches)):
            self.consumed = b + 1
            yield self.collate([self.examples[i] for i in batches[b]])
        self.epoch += 1
        self.consumed = 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "consumed": self.consumed}

    def load_state_dict(self, state: dict) -> None:
        self.epoch = int(state["epoch"])
        self._resume_at = int(state["consumed"])


def select_rows(rows, cap: int | None, nonempty_share: float | None, kinds: list[str]) -> list[dict]:
    """Extraction rows, optionally rebalanced so that `nonempty_share` of them have a target for one
    of `kinds` (most turns state nothing, and "[]" is easy), then capped; order is deterministic."""
    rows = list(rows)
    if nonempty_share is None:
        return rows[:cap] if cap else rows
    full = [r for r in rows if any(json.loads(r["target"]).get(k) for k in kinds)]
    empty = [r for r in rows if r not in full] if len(rows) < 5000 else [
        r for r in rows if not any(json.loads(r["target"]).get(k) for k in kinds)]
    n = cap or len(rows)
    n_full = min(len(full), round(n * nonempty_share))
    n_empty = min(len(empty), n - n_full)
    return interleave(full[:n_full], empty[:n_empty])


def interleave(a: list, b: list) -> list:
    """Both lists merged evenly, each in its own order (deterministic)."""
    out, i, j = [], 0, 0
    while i < len(a) or j < len(b):
        if i < len(a) and (j >= len(b) or i * len(b) <= j * len(a)):
            out.append(a[i])
            i += 1
        else:
            out.append(b[j])
            j += 1
    return out


def split(items: list, val_fraction: float, seed: int) -> tuple[list, list]:
    idx = list(range(len(items)))
    random.Random(seed).shuffle(idx)
    n_val = max(1, int(len(items) * val_fraction)) if len(items) > 1 else 0
    val = set(idx[:n_val])
    return [x for i, x in enumerate(items) if i not in val], [x for i, x in enumerate(items) if i in val]


def of_sessions(rows, sessions, exclude, option: str) -> list[dict]:
    """The rows whose `session_id` (a LoCoMo or IRC conversation id, a BranchMemEval session) is among
    `sessions` (None: any) and not among `exclude`: how a source is split by conversation (folds). Both are
    lists of ids (`<option>.sessions`, `<option>.exclude_sessions`); a lone id is refused, never read as
    its characters."""
    from collections.abc import Sequence

    from .errors import ConfigError

    for key, ids in (("sessions", sessions), ("exclude_sessions", exclude)):
        if ids is not None and (isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence)):
            raise ConfigError(f"option {option}.{key} must be a list of conversation ids, got {ids!r}")
    keep = set(map(str, sessions)) if sessions is not None else None
    drop = set(map(str, exclude or []))
    return [r for r in rows if (keep is None or str(r["session_id"]) in keep) and str(r["session_id"]) not in drop]
