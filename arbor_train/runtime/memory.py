"""ArborMemory: the online loop of the method (localize -> assemble -> [generate] -> commit), a thin facade
over localization (localize.py), commit (commit.py), the read path (layers.py) and forgetting (forget.py).

    mem = ArborMemory.open("memory.sqlite", conversation_id="alice", cfg=runtime_cfg)
    loc = mem.localize(user_text)                 # reads committed state only
    ctx = mem.assemble(user_text, loc)            # token-budgeted context for the answer model
    reply = answer_model(ctx.text, user_text)
    mem.commit(user_text, reply, loc)             # one SQLite transaction; visible from turn t+1

`mem.step(user, assistant)` is localize + commit, for replaying transcripts.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from ..errors import ConfigError
from .commit import Committer
from .context import BudgetPacker, Context, TokenCounter, question_intents
from .embed import build_embedder
from .extract import ExtractorSet
from .index import VectorIndex, index_path
from .layers import Read, Sources, build_blocks, check_layers
from .localize import Localizer
from .rerank import build_reranker
from .schema import Localization, Node
from .store import Store
from .tags import build_tagger
from .text import entities as find_entities

log = logging.getLogger(__name__)


@dataclass
class Timings:
    """Where a memory's time goes: per call (localize, extract, commit, assemble) and per stage of ingest and
    read (`stages`: total seconds per stage name, summed over calls, as `with timings.stage(name):` measured)."""
    localize_s: list[float] = field(default_factory=list)
    extract_s: list[float] = field(default_factory=list)
    commit_s: list[float] = field(default_factory=list)
    assemble_s: list[float] = field(default_factory=list)
    stages: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.stages[name] = self.stages.get(name, 0.0) + time.perf_counter() - t0


def _cfg(cfg: Any) -> dict:
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(cfg, DictConfig):
            return OmegaConf.to_container(cfg, resolve=True)
    except ImportError:  # pragma: no cover
        pass
    return dict(cfg)


class ArborMemory(Localizer, Committer):
    """The memory of one conversation: the facade over its store, models, localization (localize.py),
    commit (commit.py), read path (layers.py) and forgetting (forget.py)."""

    def __init__(self, store: Store, conversation_id: str, cfg: Any, components: dict | None = None):
        cfg = _cfg(cfg)
        self.cfg = cfg
        self.layers = check_layers(cfg["context"])  # the read path, checked before any model loads
        evidence = (cfg["localization"].get("secondary") or {}).get("evidence", "entity")
        if evidence not in ("entity", "none"):
            raise ConfigError(f"option localization.secondary.evidence: {evidence!r}; valid values: entity, none")
        self._link_evidence = evidence
        if cfg["localization"].get("question_document", "state") not in ("state", "text"):
            raise ConfigError(f"option localization.question_document: {cfg['localization']['question_document']!r}; "
                              "valid values: state, text")
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
        if stored_dim is None and store.read_only:
            pass  # an empty memory read: nothing to check against, nothing written
        elif stored_dim is None:
            with store.transaction():
                store.set_meta("embedding_dim", str(self.embedder.dim))
                store.set_meta("embedder", self.embedder.name)
        elif int(stored_dim) != self.embedder.dim or stored_name != self.embedder.name:
            raise ConfigError(
                f"{store.path}: memory was built with embedder {stored_name!r} (dim {stored_dim}); runtime option "
                f"embedder is {self.embedder.name!r} (dim {self.embedder.dim}). Use the same embedder or a new file.")
        store.max_postings = int(cfg["recall"]["keyword_max_postings"])
        ix = cfg["index"]
        self.index = VectorIndex(store, conversation_id, self.embedder.dim, index_path(store.path, conversation_id),
                                 ef_search=ix["ef_search"], M=ix["M"], ef_construction=ix["ef_construction"],
                                 save_every=ix["save_every"],
                                 compact_deleted_share=float(ix.get("compact_deleted_share", 0.25)),
                                 read_only=store.read_only)
        self.ablation = cfg["ablation"]
        self.timings = Timings()

    # ------------------------------------------------------------------ lifecycle
    @classmethod
    def open(cls, path: str | Path, conversation_id: str = "default", cfg: Any = None,
             components: dict | None = None, read_only: bool = False) -> "ArborMemory":
        """A memory file (created when missing, unless `read_only`: then nothing is ever written, and a
        damaged or stale vector index is rebuilt in memory only)."""
        if cfg is None:
            from .config import default_config

            cfg = default_config()
        c = _cfg(cfg)
        check_layers(c["context"])  # a bad read path is refused before the file is opened or created
        return cls(Store(str(path), synchronous=c["store"]["synchronous"], read_only=read_only), conversation_id, c,
                   components)

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

    # ------------------------------------------------------------------ forget
    def forget(self, nodes: list[int] | None = None, branch: int | None = None, entity: str | None = None,
               question: str | None = None, dry_run: bool = False, force: bool = False):
        """Forget nodes (by id, by branch, by entity, or those a read of `question` cites) and everything
        derived from them, in one transaction; returns a ForgetReport (counts, never text). See forget.py."""
        from .forget import forget

        return forget(self, nodes=nodes, branch=branch, entity=entity, question=question, dry_run=dry_run,
                      force=force)

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
        src = Sources(self.store, self.conv, self.cfg, self.ablation, self.tagger, self.index, self.embed,
                      getattr(self, "_last_query_embedding", None))
        r = Read(src, question, loc, packer, intents, {e.lower() for e in find_entities(question)}, path)
        blocks = build_blocks(r, self.layers)
        return Context(blocks=blocks, header=header, tokens=fixed + packer.used, budget=budget, intents=intents)

    # ------------------------------------------------------------------ inspection
    def nodes(self) -> list[Node]:
        return self.store.nodes(self.conv)

    def stats(self) -> dict[str, Any]:
        return self.store.counts(self.conv)


def build_components(cfg: dict) -> dict:
    return {
        "embedder": build_embedder(cfg["embedder"]),
        "reranker": build_reranker(cfg["reranker"]),
        "extractors": ExtractorSet(cfg["extractors"], cfg["heuristics"], enabled=enabled_kinds(cfg)),
        "tagger": build_tagger(cfg["tagger"], cfg["ontology"]),
        "counter": TokenCounter(cfg["context"]["tokenizer"]),
    }


def enabled_kinds(cfg: dict) -> list[str]:
    kinds = ["summary", "entities", "facts"]
    if cfg["ablation"]["structured_extraction"]:
        kinds += ["states", "artifacts", "events"]
    return kinds
