"""Command line of the reference runtime (Hydra; options in conf/runtime_cli.yaml).

    python -m arbor_train.runtime.cli command=ingest input=conv.json memory=outputs/mem.sqlite
    python -m arbor_train.runtime.cli command=ask question='Where is Maria going?' memory=outputs/mem.sqlite
    python -m arbor_train.runtime.cli command=show memory=outputs/mem.sqlite
    python -m arbor_train.runtime.cli command=export out=forest.json memory=outputs/mem.sqlite
    python -m arbor_train.runtime.cli command=render out=forest.png highlight_question='...' memory=...

Conversation files (ingest): JSON {"conversation_id"?: str, "turns": [{"user", "assistant", "timestamp"?}, ...]}
or JSONL with one turn object per line. The whole file is validated before anything is written.

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

from ..paths import CONF_DIR

COMMANDS = ("ingest", "ask", "show", "export", "render")
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
        raise ValueError(f"option {key} could not be resolved ({e}); pass {key}=... explicitly") from e


def _required(cfg: DictConfig, key: str, command: str, hint: str) -> Any:
    v = _opt(cfg, key)
    if v is None or (isinstance(v, str) and not v.strip()):
        raise ValueError(f"command={command} needs option {key} ({hint}), e.g. {key}=...")
    return v


def _out_path(cfg: DictConfig, command: str, suffixes: tuple[str, ...]) -> Path:
    out = Path(str(_required(cfg, "out", command, "the output file, " + " or ".join(suffixes))))
    if out.suffix.lower() not in suffixes:
        raise ValueError(f"out={str(out)!r}: command={command} writes {' or '.join(suffixes)} "
                         f"(got suffix {out.suffix or 'none'!r})")
    return out


def _memory_path(cfg: DictConfig, must_exist: bool) -> Path:
    p = _opt(cfg, "memory")
    if p is None:
        raise ValueError("option memory (the memory SQLite file) is not set; pass memory=PATH")
    p = Path(str(p))
    if must_exist and not p.exists():
        raise ValueError(f"memory={str(p)!r} does not exist; build one first with command=ingest")
    return p


# ---------------------------------------------------------------------- conversation files
def _check_turn(turn: Any, where: str) -> dict:
    if not isinstance(turn, dict):
        raise ValueError(f"{where}: a turn must be an object with 'user' and 'assistant', got {type(turn).__name__}")
    for key in ("user", "assistant"):
        if key not in turn:
            raise ValueError(f"{where} is missing field {key!r}")
        if not isinstance(turn[key], str):
            raise ValueError(f"{where}: field {key!r} must be a string, got {type(turn[key]).__name__}")
    if not turn["user"].strip():
        raise ValueError(f"{where}: field 'user' is empty")
    ts = turn.get("timestamp")
    if ts is not None and not isinstance(ts, str):
        raise ValueError(f"{where}: field 'timestamp' must be a string or null, got {type(ts).__name__}")
    return {"user": turn["user"], "assistant": turn["assistant"], "timestamp": ts}


def load_conversation(path: str | Path) -> tuple[str | None, list[dict]]:
    """(conversation_id or None, validated turns) of a conversation JSON / JSONL file.

    Raises ValueError naming the file, the turn (1-based; and line for JSONL) and the field.
    """
    p = Path(path)
    if not p.exists():
        raise ValueError(f"input={str(p)!r}: file does not exist")
    if not p.is_file():
        raise ValueError(f"input={str(p)!r}: not a file")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{p}: not UTF-8 text ({e})") from e
    if not text.strip():
        raise ValueError(f"{p}: file is empty")

    data: Any = None
    jsonl = p.suffix.lower() == ".jsonl"
    if not jsonl:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            if p.suffix.lower() == ".json":
                raise ValueError(f"{p}: invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}") from e
            jsonl = True  # no telling suffix: try one object per line

    conv_id: str | None = None
    turns: list[dict] = []
    if jsonl:
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{p}: invalid JSON on line {lineno} (column {e.colno}): {e.msg}") from e
            turns.append(_check_turn(obj, f"{p}: turn {len(turns) + 1} (line {lineno})"))
    else:
        if isinstance(data, list):
            raw_turns = data
        elif isinstance(data, dict):
            if "turns" not in data:
                raise ValueError(f"{p}: missing field 'turns' (a list of {{'user', 'assistant'}} objects)")
            raw_turns = data["turns"]
            cid = data.get("conversation_id")
            if cid is not None and (not isinstance(cid, str) or not cid.strip()):
                raise ValueError(f"{p}: field 'conversation_id' must be a non-empty string")
            conv_id = cid
        else:
            raise ValueError(f"{p}: expected an object with 'turns' or a list of turns, got {type(data).__name__}")
        if not isinstance(raw_turns, list):
            raise ValueError(f"{p}: field 'turns' must be a list, got {type(raw_turns).__name__}")
        turns = [_check_turn(t, f"{p}: turn {i}") for i, t in enumerate(raw_turns, 1)]
    if not turns:
        raise ValueError(f"{p}: no turns")
    return conv_id, turns


# ---------------------------------------------------------------------- commands
def _open(cfg: DictConfig, path: Path, conversation_id: str):
    from .memory import ArborMemory

    return ArborMemory.open(path, conversation_id, cfg.runtime)


def _ingest(cfg: DictConfig) -> dict:
    from tqdm import tqdm

    src = _required(cfg, "input", "ingest", "a conversation JSON/JSONL file")
    file_conv, turns = load_conversation(str(src))  # everything is validated before the memory is opened
    conv = str(cfg.conversation_id)
    if conv == "default" and file_conv:
        conv = file_conv
    path = _memory_path(cfg, must_exist=False)
    if cfg.get("reset") and path.exists():  # start this memory file over (its vector index too)
        import shutil

        for extra in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
            extra.unlink(missing_ok=True)
        shutil.rmtree(f"{path}.hnsw", ignore_errors=True)
        print(f"reset: removed {path}")
    mem = _open(cfg, path, conv)
    routes: list[dict] = []
    verbose = len(turns) < PER_TURN_LINES_BELOW
    try:
        before = mem.stats()["nodes"]
        bar = tqdm(turns, desc=f"ingest {conv}", unit="turn", file=sys.stderr, disable=None)
        for i, t in enumerate(bar, 1):
            node, loc = mem.step(t["user"], t["assistant"], t["timestamp"])
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
        print(f"ingested {len(turns)} turns: {new_roots} new roots; routes "
              + ", ".join(f"{k}={v}" for k, v in by_route.most_common()))
    print(f"memory {path} conversation {conv!r}: " + ", ".join(f"{k}={v}" for k, v in counts.items()))
    return {"conversation_id": conv, "memory": str(path), "turns": len(turns), "nodes_before": before,
            "counts": counts, "routes": routes}


def _fmt_channels(ch: dict[str, float]) -> str:
    return " ".join(f"{k}={v:.3g}" for k, v in ch.items())


def _ask(cfg: DictConfig) -> dict:
    question = _required(cfg, "question", "ask", "the question text")
    now = _opt(cfg, "now")
    budget = _opt(cfg, "budget")
    if budget is not None:
        try:
            budget = int(budget)
        except (TypeError, ValueError) as e:
            raise ValueError(f"option budget must be an integer number of tokens, got {budget!r}") from e
        if budget <= 0:
            raise ValueError(f"option budget must be positive, got {budget}")
    path = _memory_path(cfg, must_exist=True)
    mem = _open(cfg, path, str(cfg.conversation_id))
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
    conv = str(cfg.conversation_id)
    mem = _open(cfg, path, conv)
    try:
        counts = mem.stats()
        roots = root_summaries(mem.nodes())
        others = [r[0] for r in mem.store.db.execute(
            "SELECT DISTINCT conversation_id FROM nodes WHERE conversation_id != ? ORDER BY 1", (conv,))]
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
    mem = _open(cfg, path, str(cfg.conversation_id))
    try:
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
    mem = _open(cfg, path, str(cfg.conversation_id))
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


HANDLERS = {"ingest": _ingest, "ask": _ask, "show": _show, "export": _export, "render": _render}


def run(cfg: DictConfig) -> dict:
    """Run cfg.command; returns the command's result as a dict (also printed for the user)."""
    command = _opt(cfg, "command")
    if not isinstance(command, str) or command not in HANDLERS:
        got = "not set" if command is None else f"{command!r} is unknown"
        raise ValueError(f"option command: {got}; valid values: {', '.join(COMMANDS)}")
    return HANDLERS[command](cfg)


@hydra.main(config_path=str(CONF_DIR), config_name="runtime_cli", version_base="1.3")
def main(cfg: DictConfig) -> None:
    try:
        run(cfg)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
