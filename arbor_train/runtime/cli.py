"""Command line of the reference runtime (Hydra; options in conf/runtime_cli.yaml).

    python -m arbor_train.runtime.cli command=ingest input=conv.json memory=outputs/mem.sqlite
    python -m arbor_train.runtime.cli command=ask question='Where is Maria going?' memory=outputs/mem.sqlite
    python -m arbor_train.runtime.cli command=show memory=outputs/mem.sqlite
    python -m arbor_train.runtime.cli command=export out=forest.json memory=outputs/mem.sqlite
    python -m arbor_train.runtime.cli command=import input=forest.json memory=outputs/copy.sqlite
    python -m arbor_train.runtime.cli command=check memory=outputs/mem.sqlite     # verify; writes nothing
    python -m arbor_train.runtime.cli command=repair memory=outputs/mem.sqlite    # rebuild derived indexes
    python -m arbor_train.runtime.cli command=render out=forest.png highlight_question='...' memory=...
    python -m arbor_train.runtime.cli command=forget entity=Caroline dry_run=true memory=outputs/mem.sqlite

Conversation files (ingest): the format of arbor_train/conversations/files.py (JSONL, one turn per line,
or JSON {"conversation_id"?: str, "turns": [{"user", "assistant"?, "timestamp"?, "speaker"?}, ...]}). The
whole file is validated before anything is written (`load_conversation`). Ingest is idempotent and resumable: each stored turn records its identity (a
hash of its own normalized content and occurrence, turnkeys.py), so rerunning a file, the file grown,
edited, re-ordered or re-formatted at the source, or the same file after a killed ingest, stores each
distinct turn once; it reports what it matched, skipped and added, and warns about stored turns the
file lacks. One writer
per memory file (a lock; a second one waits `runtime.store.lock_timeout_s`, then is refused).

`run(cfg)` does the work and returns a dict (importable, testable); `main()` is the thin Hydra entry point.
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from ..conversations.files import DEFAULT_LIMITS, check_conversation_id, check_text, load_conversation
from ..errors import ConfigError, InputError, entry_point, parse_bool, parse_int
from ..paths import CONF_DIR

COMMANDS = ("ingest", "ask", "show", "export", "import", "render", "forget", "check", "repair")
PER_TURN_LINES_BELOW = 50  # ingest prints one line per turn below this many turns, else a summary
TOP_CANDIDATES = 8


# ---------------------------------------------------------------------- printing stored text
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def safe(text: str, newlines: bool = True) -> str:
    """Stored text as printed: control characters (terminal escapes), and bidi overrides and isolates
    (which can make a line read other than it is), shown as \\xNN / \\uNNNN. Newlines and tabs stay
    where `newlines` (a context block); elsewhere they are escaped too (one line per item)."""
    out = _UNSAFE.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100 else f"\\u{ord(m.group()):04x}",
                      str(text))
    return out if newlines else out.replace("\n", "\\n").replace("\t", "\\t")


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
    if must_exist and p.is_file() and p.stat().st_size == 0:
        raise ConfigError(f"memory={str(p)!r} is an empty file, not a memory; build one with command=ingest")
    return p


# ---------------------------------------------------------------------- commands
def _open(cfg: DictConfig, path: Path, conversation_id: str, read_only: bool = False):
    """The memory; read commands (ask, show, export, render) open it read-only and never write to it."""
    from .memory import ArborMemory

    return ArborMemory.open(path, conversation_id, cfg.runtime, read_only=read_only)


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

    from .memory import ArborMemory
    from .store import Store
    from .turnkeys import chain_keys, turn_keys

    src = _required(cfg, "input", "ingest", "a conversation JSON/JSONL file")
    reset = parse_bool(_opt(cfg, "reset"), "reset")
    # everything is validated before the memory is opened: a bad file or option writes nothing
    file_conv, turns = load_conversation(str(src), _limits(cfg))
    ahead = parse_int(cfg.runtime.ingest.extract_ahead, "runtime.ingest.extract_ahead", minimum=1)
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
    # a forget recorded before schema v5 holds the old chained key (its text is gone, so it was not re-keyed)
    olds = chain_keys(turns) if forgotten else [None] * len(turns)
    gone = [k in forgotten or o in forgotten for k, o in zip(keys, olds)]
    todo = [(i, t, k) for i, (t, k, g) in enumerate(zip(turns, keys, gone), 1) if k not in known and not g]
    matched = sum(k in known for k in keys)
    n_forgotten = sum(g and k not in known for k, g in zip(keys, gone))
    absent = store.nodes_with_turn_keys(conv, known - set(keys))  # stored turns this file does not hold
    print(f"{path} conversation {conv!r}: {len(turns)} turns in the file: {matched} already stored, "
          f"{n_forgotten} forgotten on request (skipped), {len(todo)} to add")
    if absent:
        shown = ", ".join(map(str, absent[:10])) + (", ..." if len(absent) > 10 else "")
        print(f"warning: {len(absent)} stored turns of this conversation are not in the file (edited or deleted "
              f"at the source?): nodes {shown}. They are kept; command=forget nodes=[...] removes them",
              file=sys.stderr)
    skipped = len(turns) - len(todo)
    verbose = len(todo) < PER_TURN_LINES_BELOW
    try:
        before = mem.stats()["nodes"]
        bar = tqdm(total=len(todo), desc=f"ingest {conv}", unit="turn", file=sys.stderr, disable=None)
        # extraction runs runtime.ingest.extract_ahead turns at a time, ahead of their commits
        stepped = mem.steps([dict(t, turn_key=key) for _, t, key in todo], ahead)
        for (i, t, key), (node, loc) in zip(todo, stepped):
            bar.update(1)
            r = {"turn": i, "node_id": node.id, "parent_id": node.parent_id, "root_id": node.root_id,
                 "route": loc.route, "score": round(float(loc.score), 4), "cue": loc.cue}
            routes.append(r)
            if verbose:
                where = f"parent {node.parent_id}" if node.parent_id is not None else "new root"
                cue = f" cue={loc.cue!r}" if loc.cue else ""
                bar.write(f"turn {i:>3}: node {node.id} <- {where:<10} route={loc.route:<15} "
                          f"score={loc.score:.3f}{safe(cue, False)}  [{safe(node.topic_key, False)}]")
        bar.close()
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
            "matched": matched, "forgotten": n_forgotten, "added": len(todo), "missing_from_file": absent,
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
    mem = _open(cfg, path, _conversation(cfg), read_only=True)
    try:
        loc, ctx = mem.read(str(question), now=None if now is None else str(now), budget=budget)
    finally:
        mem.close()
    if loc.parent_id is None:
        state = "none (the memory holds no node for this conversation)" if loc.route == "empty" else "new root"
    else:
        state = f"node {loc.parent_id}"
    cue = f", cue {loc.cue!r}" if loc.cue else ""
    print(f"state: {state} (route {loc.route}, score {loc.score:.3f}{safe(cue, False)})")
    if loc.candidates:
        print(f"\ntop candidates ({min(len(loc.candidates), TOP_CANDIDATES)} of {len(loc.candidates)}):")
        print(f"  {'node':>6}  {'score':>7}  {'topic':<32}  channels")
        for c in loc.candidates[:TOP_CANDIDATES]:
            topic = c.topic_key if len(c.topic_key) <= 32 else c.topic_key[:31] + "…"
            print(f"  {c.node_id:>6}  {c.score:>7.3f}  {safe(topic, False):<32}  {_fmt_channels(c.channels)}")
    print(f"\ncontext ({ctx.tokens}/{ctx.budget} tokens):\n{safe(ctx.text)}")
    return {"localization": loc.to_json(), "context": ctx.to_json()}


def _show(cfg: DictConfig) -> dict:
    from .render import root_summaries

    path = _memory_path(cfg, must_exist=True)
    conv = _conversation(cfg)
    mem = _open(cfg, path, conv, read_only=True)
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
            print(f"  {r['id']:>6}  {r['size']:>5}  {seqs:>11}  {safe(r['topic_key'], False)}")
    if others:
        print("other conversations in this file: " + ", ".join(safe(o, False) for o in others))
    return {"conversation_id": conv, "counts": counts, "roots": roots, "other_conversations": others}


def _export(cfg: DictConfig) -> dict:
    from .render import forest_json

    out = _out_path(cfg, "export", (".json",))
    path = _memory_path(cfg, must_exist=True)
    mem = _open(cfg, path, _conversation(cfg), read_only=True)
    try:
        with mem.store.snapshot():
            data = forest_json(mem)
            data["memory"] = mem.store.dump(mem.conv)  # every row: command=import restores the memory from it
    finally:
        mem.close()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, ensure_ascii=False, indent=2), encoding="utf-8")
    print(f"wrote {out}: {len(data['nodes'])} nodes, {len(data['roots'])} roots")
    return {"out": str(out), "counts": data["counts"]}


def _import(cfg: DictConfig) -> dict:
    """Restore a conversation from a `command=export` file into a memory (a new file, or one without it)."""
    from .store import Store

    src = Path(str(_required(cfg, "input", "import", "a file written by command=export")))
    if not src.is_file():
        raise ConfigError(f"input={str(src)!r}: no such file")
    try:
        data = json.loads(src.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"{src}: not a JSON export ({e}); nothing was imported") from None
    if not isinstance(data, dict) or "memory" not in data:
        raise InputError(f"{src}: field 'memory' missing (write the file with command=export); nothing was imported")
    path = _memory_path(cfg, must_exist=False)
    store = Store(str(path), synchronous=cfg.runtime.store.synchronous)
    try:
        store.lock_for_writing(float(cfg.runtime.store.lock_timeout_s))
        conv, n = store.load_dump(data["memory"], str(src))
        counts = store.counts(conv)
    finally:
        store.close()
    print(f"imported conversation {safe(conv, False)!r} into {path}: " + ", ".join(f"{k}={v}" for k, v in counts.items()))
    return {"conversation_id": conv, "memory": str(path), "nodes": n, "counts": counts}


def _derived_problems(path: Path, convs: list[str]) -> list[str]:
    from .index import index_file_problem, index_path

    out = []
    for conv in convs:
        ip = index_path(str(path), conv)
        if ip is not None and ip.exists() and (why := index_file_problem(ip)):
            out.append(f"vector index of conversation {safe(conv, False)!r} ({ip.name}) {why}")
    return out


def _check(cfg: DictConfig) -> dict:
    """Verify a memory without changing it: SQLite and FTS5 integrity, the forest and provenance invariants
    (Store.check), and every vector index file's checksum. Problems: an error line, exit 2."""
    from .store import Store

    path = _memory_path(cfg, must_exist=True)
    store = Store(str(path))  # FTS5's integrity-check is issued as a write statement; it changes nothing
    try:
        problems = store.check()
        convs = list(store.conversations())
    finally:
        store.close()
    problems += _derived_problems(path, convs)
    if problems:
        raise InputError(f"memory {path}: {len(problems)} problems: " + "; ".join(problems[:8])
                         + ". command=repair rebuilds the derived indexes (text and vector); a base table that "
                         "fails is not repairable here: restore it from an export (command=import)")
    print(f"memory {path}: ok ({len(convs)} conversations; SQLite, text indexes, forest, provenance and vector "
          "index checksums verified)")
    return {"memory": str(path), "conversations": convs, "problems": []}


def _repair(cfg: DictConfig) -> dict:
    """Rebuild what is derived from the rows: every FTS5 index and every conversation's vector index."""
    from .index import VectorIndex, index_path
    from .store import Store

    path = _memory_path(cfg, must_exist=True)
    store = Store(str(path), synchronous=cfg.runtime.store.synchronous)
    try:
        store.lock_for_writing(float(cfg.runtime.store.lock_timeout_s))
        store.rebuild_text_indexes()
        dim = store.get_meta("embedding_dim")
        convs = list(store.conversations())
        for conv in convs:
            ip = index_path(str(path), conv)
            if ip is None or dim is None:
                continue
            VectorIndex(store, conv, int(dim), ip).rebuild()  # a fresh graph from SQLite, saved with its checksum
        problems = store.check()
    finally:
        store.close()
    problems += _derived_problems(path, convs)
    if problems:
        raise InputError(f"memory {path}: still {len(problems)} problems after the repair: " + "; ".join(problems[:8]))
    print(f"repaired {path}: text indexes and {len(convs)} vector indexes rebuilt from the stored rows; check passes")
    return {"memory": str(path), "conversations": convs}


def _render(cfg: DictConfig) -> dict:
    from .render import RENDER_SUFFIXES, render_forest

    out = _out_path(cfg, "render", RENDER_SUFFIXES)
    hq = _opt(cfg, "highlight_question")
    path = _memory_path(cfg, must_exist=True)
    mem = _open(cfg, path, _conversation(cfg), read_only=True)
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
    if not dry_run and getattr(mem.store, "checkpoint_pending", False):
        raise InputError(f"the forget was committed to {path}, but its write-ahead log ({path}-wal) could not be "
                         "checkpointed: another process holds an old snapshot open, so the forgotten text may stay in "
                         "that file until it closes; close the other readers, then run any writing command (ingest "
                         "or forget) to checkpoint it")
    print(f"memory {path} conversation {mem.conv!r}" + (" (unchanged: dry run): " if dry_run else ": ")
          + ", ".join(f"{k}={v}" for k, v in counts.items()))
    return {**report.to_json(), "memory": str(path), "counts_after": counts}


HANDLERS = {"ingest": _ingest, "ask": _ask, "show": _show, "export": _export, "import": _import, "render": _render,
            "forget": _forget, "check": _check, "repair": _repair}


def run(cfg: DictConfig) -> dict:
    """Run cfg.command; returns the command's result as a dict (also printed for the user)."""
    command = _opt(cfg, "command")
    if not isinstance(command, str) or command not in HANDLERS:
        got = "not set" if command is None else f"{command!r} is unknown"
        raise ConfigError(f"option command: {got}; valid values: {', '.join(COMMANDS)}")
    from .layers import check_layers

    from .store import SQLITE_ERRORS, damage_text

    check_layers(OmegaConf.to_container(cfg.runtime.context, resolve=True))  # before any file is touched
    try:
        return HANDLERS[command](cfg)
    except SQLITE_ERRORS as e:  # full disk, damaged pages, a locked or read-only file (input files that are not
        # UTF-8 are refused where they are read)
        raise InputError(f"memory={str(_opt(cfg, 'memory'))!r}: SQLite says: {damage_text(e)}. Nothing of the "
                         "failed step was stored (each turn and each forget is one transaction)") from None
    except OSError as e:
        if e.filename is None:
            raise
        raise InputError(f"{e.filename}: {e.strerror or e}") from None


def hydra_quote(text: str) -> str:
    """A Hydra override value that is exactly `text` (quotes, apostrophes, parentheses, '=' and all)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def plain_argv(argv: list[str]) -> list[str]:
    """The plain forms, turned into Hydra overrides before Hydra parses them: a first word that is a command
    (`cli ask ...` is `command=ask`), and the text after `--` as the question, any characters as typed:

        python -m arbor_train.runtime.cli ask memory=m.sqlite -- What is Bob's venue (the new one)?
    """
    args = list(argv)
    text = None
    if "--" in args:
        cut = args.index("--")
        text, args = " ".join(args[cut + 1:]), args[:cut]
    if args and args[0] in COMMANDS:
        args[0] = f"command={args[0]}"
    if text is not None:
        args.append(f"question={hydra_quote(text)}")
    return args


@hydra.main(config_path=str(CONF_DIR), config_name="runtime_cli", version_base="1.3")
@entry_point
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    sys.argv[1:] = plain_argv(sys.argv[1:])
    main()
