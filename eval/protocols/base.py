"""What every benchmark protocol is: how its units are checked and loaded, how one unit is replayed
through a memory method, and how the records are summarized. `eval.run` drives any of them the same
way; the registry is `eval.protocols.PROTOCOLS`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from arbor_train.errors import ConfigError, MissingInputError


@dataclass(frozen=True)
class Protocol:
    name: str
    check: Callable[[dict], None]           # refuse unusable options before anything is loaded
    load: Callable[[dict], list]            # the units replayed: sessions, conversations or files
    unit_id: Callable[[Any], str]           # the conversation id a method's memory is opened under
    replay: Callable[..., tuple[list[dict], list[dict]]]  # (unit, method, answers, judge, c) -> (question, turn records)
    summarize: Callable[[list[dict], list[dict]], dict]
    # a unit's identity by content (None: the benchmark has none): a tuned reader is refused on its own
    # training units (eval/run.py:check_reader_heldout)
    fingerprint: Callable[[Any], str] | None = None


def check_input(c: dict) -> None:
    """The benchmark's `<name>.input` option names an existing file or folder."""
    b = c["benchmark"]
    inp = (c.get(b) or {}).get("input")
    if inp in (None, "", "???"):
        raise ConfigError(f"benchmark={b} needs option {b}.input (the {b} file or folder), e.g. {b}.input=PATH")
    if not Path(str(inp)).exists():
        raise MissingInputError(f"option {b}.input={str(inp)!r}: no such file or folder")


def percentile(values: list[float], q: float) -> float | None:
    """The q-quantile (nearest rank) of values, rounded; None when empty."""
    v = sorted(values)
    return round(v[min(len(v) - 1, int(q * len(v)))], 5) if v else None


def mean4(values: list) -> float | None:
    """The mean rounded to 4 places; None when there is nothing to average."""
    return round(sum(values) / len(values), 4) if values else None


def evidence_summary(recs: list[dict]) -> dict[str, Any]:
    """What every evidence-recall protocol reports first: questions, mean evidence recall (over the
    questions that have evidence), mean context tokens."""
    return {"questions": len(recs), "evidence_recall": mean4([r["evidence_recall"] for r in recs
                                                              if r["evidence_recall"] is not None]),
            "context_tokens_mean": round(sum(r["context_tokens"] for r in recs) / max(1, len(recs)), 1)}


def ingest(conv, method) -> tuple[list, dict[str, int]]:
    """Build a method's memory from a whole conversation (every interaction, in order); returns the
    interactions and the map from turn id to interaction index that evidence ids are resolved with."""
    from arbor_train.conversations.schema import interactions

    inters = interactions(conv)
    method.prefetch([(it.user, it.assistant, it.timestamp) for it in inters])  # the memory is built once
    for i, it in enumerate(inters):
        method.observe(i, it.user, it.assistant, it.timestamp, False)
    return inters, {tid: i for i, it in enumerate(inters) for tid in it.turn_ids}
