"""Command line of the reference runtime (Hydra; options in conf/runtime_cli.yaml).

    python -m arbor_train.runtime.cli command=ingest input=conv.json memory=outputs/mem.sqlite
    python -m arbor_train.runtime.cli command=ask question='Where is Maria going?' memory=outputs/mem.sqlite
    python -m arbor_train.runtime.cli command=show memory=outputs/mem.sqlite
    python -m arbor_train.runtime.cli command=export out=forest.json memory=outputs/mem.sqlite
    python -m arbor_train.runtime.cli command=render out=forest.png highlight_question='...' memory=...
    python -m arbor_train.runtime.cli command=forget entity=Caroline dry_run=true memory=outputs/mem.sqlite

Conversation files (ingest): the format of arbor_train/conversations/files.py (JSONL, one turn per line,
or JSON {"conversation_id"?: str, "turns": [{"user", "assistant"?, "timestamp"?, "speaker"?}, ...]}). The
whole file is validated before anything is written (`load_conversation`). Ingest is idempotent and resumable: each stored turn records its identity (a
hash chained over the file's turns so far), so rerunning a file, or the file grown by new turns, or
the same file after a killed ingest, stores each turn once and says how many it skipped. One writer
per memory file (a lock; a second one waits `runtime.store.lock_timeout_s`, then is refused).

`run(cfg)` does the work and returns a dict (importable, testable); `main()` is the thin Hydra entry point.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from ..conversations.files import DEFAULT_LIMITS, check_conversation_id, check_text, load_conversation
from ..errors import ConfigError, entry_point, parse_bool, parse_int
from ..paths import CONF_DIR

COMMANDS = ("ingest", "ask", "show", "export", "render", "forget")
PER_TURN_LINES_BELOW = 50  # ingest prints one line per turn below this many turns, else a summary
TOP_CANDIDATES = 8


# ---------------------------------------------------------------------- options
def _opt(cfg: DictConfig, key: str) -> Any:
    """An option's value; None for null or '???'; a clear error when an interpolation cannot resolve."""
    if OmegaConf.is_missing(cfg, key):
        return None
    try:
        return cfg[key]
    except Exception as e:  # interpolation error (e.g. ${hydra:...} outside a Hydra run)
        raise ConfigError(f"option {key} could not be resolved ({e}); pass {key}=... explicitly") from e


def _required(cfg: DictConfig, key: str, command: str, hint: str) -> Any:
    v = _opt(cfg, key)
    if v is None or (isinstance(v, str) and not v.strip()):
        raise ConfigError(f"command={command} needs option {key} ({hint}), e.g. {key}=...")
    return v


def _out_path(cfg: DictConfig, command: str, suffixes: tuple[str, ...]) -> Path:
    out = Path(str(_required(cfg, "out", command, "the output file, " + " or ".join(suffixes))))
    if out.suffix.lower() not in suffixes:
        raise ConfigError(f"out={str(out)!r}: command={command} writes {' or '.join(suffixes)} "
                         f"(got suffix {out.suffix or 'none'!r})")
    return out


def _memory_path(cfg: DictConfig, must_exist: bool) -> Path:
    p = _opt(cfg, "memory")
    if p is None:
        raise ConfigError("option memory (the memory SQLite file) is not set; pass memory=PATH")
    p = Path(str(p))
    if must_exist and not p.exists():
        raise ConfigError(f"memory={str(p)!r} does not exist; build one first with command=ingest")
    return p


# ---------------------------------------------------------------------- commands
def _open(cfg: DictConfig, path: Path, conversation_id: str):
    from .memory import ArborMemory

    return ArborMemory.open(path, conversation_id, cfg.runtime)


def _limits(cfg: DictConfig) -> dict:
    return dict(cfg.runtime.get("limits") or {})


def _conversation(cfg: DictConfig, file_conv: str | None = None) -> str:
    raw = _opt(cfg, "conversation_id")
    if raw is None:
        raise ConfigError("option conversation_id is not set; pass conversation_id=NAME (default: default)")
    conv = check_conversation_id(str(raw), "option conversation_id", _limits(cfg))
    return file_conv if (conv == "default" and file_conv) else conv


def _ingest(cfg: DictConfig) -> dict:
    from tqdm import tqdm

    from .commit import turn_keys
    from .memory import ArborMemory
    from .store import Store

    src = _required(cfg, "input", "ingest", "a conversation JSON/JSONL file")
    reset = parse_bool(_opt(cfg, "reset"), "reset")
    # everything is validated before the memory is opened: a bad file or option writes nothing
    file_conv, turns = load_conversation(str(src), _limits(cfg))
    conv = _conversation(cfg, file_conv)
    path = _memory_path(cfg, must_exist=False)
    keys = turn_keys(turns)
    store = Store(str(path), synchronous=cfg.runtime.store.synchronous)
    try:
        store.lock_for_writing(float(cfg.runtime.store.lock_timeout_s))
        if reset:  # start this memory file over (its vector index too)
            import shutil

            removed = store.reset()
            shutil.rmtree(f"{path}.hnsw", ignore_errors=True)
            what = ", ".join(f"{c!r}: {n} nodes" for c, n in removed.items()) or "it was empty"
            print(f"reset: emptied {path} ({what})")
        mem = ArborMemory(store, conv, cfg.runtime)
    except BaseException:
        store.close()
        raise
    routes: list[dict] = []
    known = store.turn_keys(conv)
    forgotten = store.forgotten_turn_keys(conv)  # forgotten on request: a replay must not restore them
    todo = [(i, t, k) for i, (t, k) in enumerate(zip(turns, keys), 1) if k not in known and k not in forgotten]
    skipped = len(turns) - len(todo)
    if skipped:
        n_forgotten = sum(k in forgotten for k in keys)
        why = f", {n_forgotten} of them forgotten on request" if n_forgotten else ""
        print(f"skipped {skipped} of {len(turns)} turns already in memory {path} (conversation {conv!r}{why}); "
              f"{len(todo)} to ingest")
    verbose = len(todo) < PER_TURN_LINES_BELOW
    try:
        before = mem.stats()["nodes"]
        bar = tqdm(todo, desc=f"ingest {conv}", unit="turn", file=sys.stderr, disable=None)
        for i, t, key in bar:
            node, loc = mem.step(t["user"], t["assistant"], t["timestamp"], turn_key=key, speaker=t["speaker"])
            r = {"turn": i, "node_id": node.id, "parent_id": node.parent_id, "root_id": node.root_id,
                 "route": loc.route, "score": round(float(loc.score), 4), "cue": loc.cue}
            routes.append(r)
            if verbose:
                where = f"parent {node.parent_id}" if node.parent_id is not None else "new root"
                cue = f" cue={loc.cue!r}" if loc.cue else ""
                bar.write(f"turn {i:>3}: node {node.id} <- {where:<10} route={loc.route:<15} "
                          f"score={loc.score:.3f}{cue}  [{node.topic_key}]")
        counts = mem.stats()
    finally:
        mem.close()
    if not verbose:
        by_route = Counter(r["route"] for r in routes)
        new_roots = sum(r["parent_id"] is None for r in routes)
        print(f"ingested {len(todo)} turns: {new_roots} new roots; routes "
              + ", ".join(f"{k}={v}" for k, v in by_route.most_common()))
    print(f"memory {path} conversation {conv!r}: " + ", ".join(f"{k}={v}" for k, v in counts.items()))
    return {"conversation_id": conv, "memory": str(path), "turns": len(turns), "skipped": skipped,
            "nodes_before": before, "counts": counts, "routes": routes}


def _fmt_channels(ch: dict[str, float]) -> str:
    return " ".join(f"{k}={v:.3g}" for k, v in ch.items())


def _ask(cfg: DictConfig) -> dict:
    question = _required(cfg, "question", "ask", "the question text")
    now = _opt(cfg, "now")
    budget = _opt(cfg, "budget")
    if budget is not None:
        budget = parse_int(budget, "budget (the read budget in tokens)", minimum=1)
    path = _memory_path(cfg, must_exist=True)
    mem = _open(cfg, path, _conversation(cfg))
    try:
        loc, ctx = mem.read(str(question), now=None if now is None else str(now), budget=budget)
    finally:
        mem.close()
    if loc.parent_id is None:
        state = "none (the memory holds no node for this conversation)" if loc.route == "empty" else "new root"
    else:
        state = f"node {loc.parent_id}"
    cue = f", cue {loc.cue!r}" if loc.cue else ""
    print(f"state: {state} (route {loc.route}, score {loc.score:.3f}{cue})")
    if loc.candidates:
        print(f"\ntop candidates ({min(len(loc.candidates), TOP_CANDIDATES)} of {len(loc.candidates)}):")
        print(f"  {'node':>6}  {'score':>7}  {'topic':<32}  channels")
        for c in loc.candidates[:TOP_CANDIDATES]:
            topic = c.topic_key if len(c.topic_key) <= 32 else c.topic_key[:31] + "…"
            print(f"  {c.node_id:>6}  {c.score:>7.3f}  {topic:<32}  {_fmt_channels(c.channels)}")
    print(f"\ncontext ({ctx.tokens}/{ctx.budget} tokens):\n{ctx.text}")
    return {"localization": loc.to_json(), "context": ctx.to_json()}


def _show(cfg: DictConfig) -> dict:
    from .render import root_summaries

    path = _memory_path(cfg, must_exist=True)
    conv = _conversation(cfg)
    mem = _open(cfg, path, conv)
    try:
        with mem.store.snapshot():  # one committed state, while a writer may be ingesting
            counts = mem.stats()
            roots = root_summaries(mem.nodes())
            others = [c for c in mem.store.conversations() if c != conv]
    finally:
        mem.close()
    print(f"memory {path} conversation {conv!r}: " + ", ".join(f"{k}={v}" for k, v in counts.items()))
    if roots:
        print(f"  {'root':>6}  {'size':>5}  {'seqs':>11}  topic")
        for r in roots:
            seqs = f"{r['first_seq']}-{r['last_seq']}"
            print(f"  {r['id']:>6}  {r['size']:>5}  {seqs:>11}  {r['topic_key']}")
    if others:
        print("other conversations in this file: " + ", ".join(others))
    return {"conversation_id": conv, "counts": counts, "roots": roots, "other_conversations": others}


def _export(cfg: DictConfig) -> dict:
    from .render import forest_json

    out = _out_path(cfg, "export", (".json",))
    path = _memory_path(cfg, must_exist=True)
    mem = _open(cfg, path, _conversation(cfg))
    try:
        with mem.store.snapshot():
            data = forest_json(mem)
    finally:
        mem.close()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, ensure_ascii=False, indent=2), encoding="utf-8")
    print(f"wrote {out}: {len(data['nodes'])} nodes, {len(data['roots'])} roots")
    return {"out": str(out), "counts": data["counts"]}


def _render(cfg: DictConfig) -> dict:
    from .render import RENDER_SUFFIXES, render_forest

    out = _out_path(cfg, "render", RENDER_SUFFIXES)
    hq = _opt(cfg, "highlight_question")
    path = _memory_path(cfg, must_exist=True)
    mem = _open(cfg, path, _conversation(cfg))
    highlight: list[int] = []
    try:
        title = None
        if hq:
            loc = mem.localize(str(hq), for_question=True)
            if loc.parent_id is not None:
                highlight = [n.id for n in mem.store.trajectory(loc.parent_id)]
                title = f"{mem.conv!r}: path for {str(hq)[:60]!r} (node {loc.parent_id}, {loc.route})"
            else:
                print(f"highlight_question: no state selected (route {loc.route}); nothing highlighted")
        written = render_forest(mem, str(out), highlight=highlight, title=title)
    finally:
        mem.close()
    print(f"wrote {written}" + (f" (highlighted {len(highlight)} nodes)" if highlight else ""))
    return {"out": written, "highlight": highlight}


def _forget(cfg: DictConfig) -> dict:
    from omegaconf import ListConfig

    raw_nodes, branch, entity, question = (_opt(cfg, k) for k in ("nodes", "branch", "entity", "question"))
    if raw_nodes is not None and not isinstance(raw_nodes, (list, ListConfig)):
        raw_nodes = [raw_nodes]
    nodes = None if raw_nodes is None else [parse_int(v, f"nodes[{i}] (a node id)", minimum=1)
                                            for i, v in enumerate(raw_nodes)]
    branch = None if branch is None else parse_int(branch, "branch (a node id)", minimum=1)
    if entity is not None:
        entity = check_text(str(entity), "option entity", "entity", DEFAULT_LIMITS["max_id_chars"], empty_ok=False)
    if question is not None:
        question = check_text(str(question), "option question", "question", DEFAULT_LIMITS["max_field_chars"],
                              empty_ok=False)
    if nodes is None and branch is None and entity is None and question is None:
        raise ConfigError("command=forget needs what to forget: nodes=[ids], branch=ID, entity=NAME or "
                          "question='...' (and dry_run=true to see the counts first)")
    dry_run = parse_bool(_opt(cfg, "dry_run"), "dry_run")
    force = parse_bool(_opt(cfg, "force"), "force")
    path = _memory_path(cfg, must_exist=True)
    mem = _open(cfg, path, _conversation(cfg))
    try:
        report = mem.forget(nodes=nodes, branch=branch, entity=entity, question=question, dry_run=dry_run,
                            force=force)
        counts = mem.stats()
    finally:
        mem.close()
    print(report.summary())
    print(f"memory {path} conversation {mem.conv!r}" + (" (unchanged: dry run): " if dry_run else ": ")
          + ", ".join(f"{k}={v}" for k, v in counts.items()))
    return {**report.to_json(), "memory": str(path), "counts_after": counts}


HANDLERS = {"ingest": _ingest, "ask": _ask, "show": _show, "export": _export, "render": _render, "forget": _forget}


def run(cfg: DictConfig) -> dict:
    """Run cfg.command; returns the command's result as a dict (also printed for the user)."""
    command = _opt(cfg, "command")
    if not isinstance(command, str) or command not in HANDLERS:
        got = "not set" if command is None else f"{command!r} is unknown"
        raise ConfigError(f"option command: {got}; valid values: {', '.join(COMMANDS)}")
    from .layers import check_layers

    check_layers(OmegaConf.to_container(cfg.runtime.context, resolve=True))  # before any file is touched
    return HANDLERS[command](cfg)


@hydra.main(config_path=str(CONF_DIR), config_name="runtime_cli", version_base="1.3")
@entry_point
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    main()
