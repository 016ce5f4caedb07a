"""python -m data_gen.distill input=chats.jsonl teacher=openai out_dir=outputs/data/distilled [heldout=0.25]

A teacher's labels for your own conversations: each conversation of a conversation file
(docs/reference/conversation_files.md) is replayed online through the runtime with the teacher's
components (conf/teacher: every role prompted through an OpenAI-compatible endpoint, a local model, or
any runtime components such as tuned bundles), and what the teacher decided becomes training rows in
the schemas the roles already train on (arbor_train/conversations/supervision.py):

- routing: every turn the teacher's router scored, with the runtime's recalled candidates, the teacher's
  score of each (`teacher_score`, the soft target) and of the new-root option (`teacher_new_root`, its
  threshold), labelled with the teacher's top choice (`label_rule: teacher`). The reranker trains on the
  choice, or on the whole distribution with `task.distill.weight` (listwise KL, arbor_train/roles/reranker.py);
- extraction: per turn, the teacher's output of every kind that passed the runtime's own validation (a
  kind the validation rejected is left out of the row, counted, and listed with its reason in
  dropped.jsonl; a row with no kind left is not written);
- tags: the teacher tagger's labels for the turn's message, where its output was valid.

Every turn is committed where the teacher routed it, with the teacher's extraction, so later candidates
come from the teacher's own forest. File labels (`parent`) are not used: the teacher labels every turn.

`roles=[...]` limits what the teacher labels (routing, tags, and extraction kinds by name); the other roles
run with the heuristic components and give no rows, so a teacher that is only asked for facts costs one
call per turn. `input_format=locomo` reads LoCoMo JSON instead of a conversation file, one turn per
interaction (the unit eval.extraction scores; arbor_train.conversations.locomo.interaction_files), and
`input_format=irc` a split folder of the Ubuntu IRC corpus, one conversation per file, one turn per
message read as `nick: text` (arbor_train.conversations.irc.irc_conversations; its links are not read).

Teacher calls go through a disk cache (arbor_train.runtime.llm.RecordedLLM) written call by call, so a
killed run started again with the same command repeats no finished call; the card reports calls made,
calls answered from the cache, tokens, wall time, the estimated cost and the drops.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from arbor_train.errors import (ConfigError, MissingInputError, OutputExistsError, entry_point, parse_bool, parse_choice,
                                parse_float, parse_int)
from arbor_train.paths import CONF_DIR

SETS = ("routing", "extraction", "tags")
INPUT_FORMATS = ("conversations", "locomo", "irc")
TEACHER_ROUTES = ("rerank", "temporal_return")  # routes the teacher's router decided (others: cues, no scores)


def reason_of(message: str) -> str:
    """A validation message as a countable reason: item numbers, quoted values and counts left out."""
    kind, _, msg = message.partition(": ")
    msg = re.sub(r"item \d+: ", "", msg)
    if msg.startswith("invalid JSON"):  # the rest is the output itself (dropped.jsonl keeps it)
        msg = "invalid JSON"
    return f"{kind}: {re.sub(r'[0-9]+', 'N', msg)}"


def record_calls(comps: dict, cache, stats: Counter, on_call=None) -> list:
    """Route every LLM call of the teacher's components through one disk cache (RecordedLLM); returns the
    wrapped backends. Components without an LLM (a tuned cross-encoder, the heuristics), and extractors with
    decoding levers on a local model (JSON-constrained, prefix KV), are left as they are: they are local and
    deterministic."""
    from arbor_train.runtime.extract import LLMExtractor
    from arbor_train.runtime.llm import RecordedLLM
    from arbor_train.runtime.rerank import PromptedReranker
    from arbor_train.runtime.tags import LLMTagger

    wrapped: dict[int, RecordedLLM] = {}
    written: set[str] = set()
    requested: set[str] = set()
    reused: set[str] = set()

    def wrap(llm):
        if id(llm) not in wrapped:
            wrapped[id(llm)] = RecordedLLM(llm, cache, stats, getattr(llm, "concurrency", 1), on_call, written,
                                           requested, reused)
        return wrapped[id(llm)]

    owners = [comps["reranker"], comps["tagger"], *comps["extractors"].by_kind.values()]
    for o in {id(o): o for o in owners}.values():  # kinds with the same options share one extractor
        if isinstance(o, LLMExtractor) and (o.constraint is not None or o.prefix_kv is not None):
            continue  # decoding levers drive the local model itself (a tuned teacher: local and deterministic)
        if isinstance(o, (PromptedReranker, LLMTagger, LLMExtractor)):
            o.llm = wrap(o.llm)
    return list(wrapped.values())


def endpoints(recorded: list) -> list:
    """The OpenAI-compatible endpoints behind the recorded backends, each once."""
    from arbor_train.runtime.llm import OpenAIEndpoint

    return list({id(r.llm): r.llm for r in recorded if isinstance(r.llm, OpenAIEndpoint)}.values())


def endpoint_usage(recorded: list) -> Counter:
    """Tokens and requests the teacher's endpoints reported (each endpoint once)."""
    total: Counter = Counter()
    for ep in endpoints(recorded):
        total.update(ep.usage_snapshot())
    return total


def parse_roles(value) -> tuple[str, ...] | None:
    """Option roles: null (every role the teacher's components play) or a list of ROLES."""
    from arbor_train.runtime.extract import KINDS

    if value is None:
        return None
    known = ("routing", "tags", *KINDS)
    items = list(value) if not isinstance(value, str) and hasattr(value, "__iter__") else None
    if not items or any(not isinstance(x, str) or x not in known for x in items):
        raise ConfigError(f"option roles must be null or a non-empty list of {', '.join(known)}; got {value!r}")
    return tuple(dict.fromkeys(items))


def teach_only(runtime_cfg: dict, roles: tuple[str, ...] | None) -> dict:
    """The teacher's runtime with the roles not in `roles` played by the heuristic components (no calls)."""
    if roles is None:
        return runtime_cfg
    out = dict(runtime_cfg, extractors={k: (v if k in roles else "heuristic")
                                        for k, v in runtime_cfg["extractors"].items()})
    if "routing" not in roles:
        out["reranker"] = {"kind": "heuristic"}
    if "tags" not in roles:
        out["tagger"] = {"kind": "heuristic"}
    return out


def record_run(path: Path, calls: int, call_s: float) -> tuple[int, float]:
    """Add this run's calls made and the wall seconds spent on them to the cache's ledger; returns the totals
    over every run that wrote the cache (what the teacher's cost per call is measured on)."""
    from arbor_train.runtime.kvcache import SqliteKV

    runs = SqliteKV(path, table="runs", value="calls")
    try:
        if calls:
            runs.put_many([(time.strftime("%Y-%m-%dT%H:%M:%S") + f".{time.time_ns() % 10**9:09d}",
                            json.dumps({"calls": calls, "call_s": call_s}))])
        rows = [json.loads(v) for v in runs.values()]
    finally:
        runs.close()
    return sum(r["calls"] for r in rows), sum(r["call_s"] for r in rows)


def check_teacher(recorded: list, path: Path) -> None:
    """The cache remembers which checkpoint answered each endpoint's calls (OpenAIEndpoint.identity); a cache
    written by another checkpoint served under the same name and URL is refused, naming both."""
    from arbor_train.runtime.kvcache import SqliteKV

    teachers = SqliteKV(path, table="teachers", value="identity")
    try:
        for ep in endpoints(recorded):
            now, before = ep.identity(), teachers.get(ep.cache_id)
            if before is None:
                teachers.put_many([(ep.cache_id, now)])
            elif before != now:
                raise ConfigError(f"cache={path}: its calls to {ep.cache_id} were answered by {before!r}, and the "
                                  f"endpoint now serves {now!r}; pass cache=<another file> (or delete this one)")
    finally:
        teachers.close()


def extraction_row(base: dict, assistant: str, ex, kinds: list[str], drops: list[dict]) -> dict | None:
    """The teacher's extraction of one turn as a training row: every enabled kind whose output passed the
    runtime's validation (repairs such as a removed fence are kept, as the runtime keeps them); a rejected
    kind is appended to `drops` with its reasons. None when no kind is left."""
    from arbor_train.prompts import extract_target

    rejected: dict[str, list[str]] = {}
    for msg in ex.report.rejected:
        rejected.setdefault(msg.split(": ", 1)[0], []).append(msg)
    target, summary = {}, ""
    for kind in kinds:
        if kind == "summary":
            raw = ex.raw.get("summary")
            if isinstance(raw, str) and raw.strip():
                summary = ex.summary
            else:
                rejected["summary"] = ["summary: empty output"]
        elif kind not in rejected:
            target[kind] = getattr(ex, kind)
    for kind, msgs in rejected.items():
        drops.append({**{k: base[k] for k in ("session_id", "turn")}, "set": "extraction", "kind": kind,
                      "reasons": msgs, "raw": str(ex.raw.get(kind, ""))[:500]})
    if not target and not summary:
        return None
    return {**base, "assistant": assistant, "target": extract_target("commit", target), "summary": summary}


def prefetch(comps: dict, turns: list[dict], kinds: list[str]) -> None:
    """Ask the teacher for every turn's extraction and tags up front, each kind as one list of prompts, so an
    endpoint gets them `concurrency` at a time (they do not depend on the forest; routing does, and stays
    turn by turn). The answers land in the call cache, where the replay's own calls find them."""
    from arbor_train.prompts import extract_messages, tag_messages
    from arbor_train.runtime.extract import SUMMARY_TOKENS, LLMExtractor, OnePassExtractor
    from arbor_train.runtime.llm import RecordedLLM
    from arbor_train.runtime.tags import LLMTagger

    for kind in kinds:  # only recorded calls: an unrecorded local model would run twice for nothing
        ex = comps["extractors"].by_kind[kind]
        if isinstance(ex, LLMExtractor) and not isinstance(ex, OnePassExtractor) and isinstance(ex.llm, RecordedLLM):
            ex.generate([extract_messages(kind, t["user"], t.get("assistant") or "", t.get("timestamp")) for t in turns],
                        SUMMARY_TOKENS if kind == "summary" else ex.max_new_tokens,
                        grammar=None if kind == "summary" else kind)  # as LLMExtractor.run asks
    tagger = comps["tagger"]
    if isinstance(tagger, LLMTagger) and isinstance(tagger.llm, RecordedLLM):
        tagger.llm.chat([tag_messages(t["user"], tagger.labels) for t in turns], max_new_tokens=48)


def distill_conversation(conv_id: str, turns: list[dict], runtime_cfg: dict, comps: dict, rows_from: int,
                         rows: dict[str, list[dict]], drops: list[dict], counts: Counter, split_name: str,
                         on_turn=None, roles: tuple[str, ...] | None = None) -> None:
    """One conversation through the teacher: rows for its turns from position `rows_from` on (earlier turns
    are context), appended to `rows` and `drops`; only for `roles` (None: every role)."""
    from arbor_train.runtime.extract import TurnInput
    from arbor_train.runtime.memory import enabled_kinds
    from data_gen.replay import Replay

    kinds = [k for k in enabled_kinds(runtime_cfg) if roles is None or k in roles]
    routing, tagging = (roles is None or r in roles for r in ("routing", "tags"))
    checked = getattr(comps["tagger"], "predict_checked", None)
    prefetch(comps, turns, kinds)
    with Replay(conv_id, runtime_cfg, comps) as rp:
        threshold = rp.mem.new_root_threshold
        for step in rp.steps(turns):
            t, loc = step.turn, step.loc
            ex = comps["extractors"].extract([TurnInput(t["user"], t.get("assistant") or "", t.get("timestamp"))])[0]
            step.extraction = ex  # committed with the teacher's own extraction (no second call)
            if step.pos >= rows_from:
                base = {"session_id": conv_id, "turn": t["turn"], "input": t["user"], "timestamp": t.get("timestamp")}
                counts["turns"] += 1
                cands = step.candidates
                if routing and loc.route in TEACHER_ROUTES and cands:
                    # a temporal return attaches to the best candidate whatever its score: its row keeps the
                    # choice, without soft targets that would put the mass on a new root it did not take
                    soft = loc.route == "rerank"
                    for c in cands:
                        c["teacher_score"] = c["runtime_score"] if soft else None
                    best = -1 if loc.parent_id is None else cands[0]["turn"]  # candidates: best first
                    rows["routing"].append({**base, "candidates": cands, "gold_parent": best,
                                            "gold_states": [] if best < 0 else [best],
                                            "runtime_choice": -1 if step.chosen is None else step.chosen,
                                            "route": loc.route, "gold_recalled": True, "label_rule": "teacher",
                                            "teacher_new_root": float(threshold) if soft else None})
                    counts["new_root"] += best < 0
                elif routing:
                    counts[f"routing_no_scores_{loc.route}"] += 1
                n_drops = len(drops)
                row = extraction_row(base, t.get("assistant") or "", ex, kinds, drops) if kinds else None
                if row is not None:
                    rows["extraction"].append(row)
                if tagging and checked is not None:
                    tags, report, raw = checked([t["user"]])[0]
                    if report.rejected:
                        drops.append({"session_id": conv_id, "turn": t["turn"], "set": "tags", "kind": "tags",
                                      "reasons": list(report.rejected), "raw": str(raw)[:500]})
                    else:
                        rows["tags"].append({**base, "source": "turn", "tags": tags})
                elif tagging:
                    rows["tags"].append({**base, "source": "turn", "tags": comps["tagger"].predict([t["user"]])[0]})
                for d in drops[n_drops:]:
                    d["split"] = split_name
            if on_turn is not None:
                on_turn()


def card(stats: dict) -> str:
    c = stats["calls"]
    lines = [f"# Distilled supervision: {stats['teacher']}", "",
             f"Source: {stats['source']}. Made by `python -m data_gen.distill` with teacher `{stats['teacher']}` "
             f"({stats['teacher_model']})"
             + (f", labelling {', '.join(stats['roles'])} only (the other roles heuristic, without rows)"
                if stats.get("roles") else "") + ".", "",
             "| split | conversations | turns | routing rows | new-root rows | extraction rows | tag rows |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, s in stats["splits"].items():
        lines.append(f"| {name} | {s['conversations']} | {s['turns']} | {s['routing']} | {s['new_root']} | "
                     f"{s['extraction']} | {s['tags']} |")
    lines += ["", "| teacher calls made | calls reused from an earlier run | prompt tokens | completion tokens | "
              "wall s | estimated cost |", "|---:|---:|---:|---:|---:|---:|",
              f"| {c['calls']} | {c['reused']} | {c['prompt_tokens']} | {c['completion_tokens']} | "
              f"{stats['wall_s']} | {stats['cost']:.4f} |", "",
              (f"The teacher: {c['distinct']} distinct calls, {stats['teacher_s_per_turn']} s of calls per turn "
               "(wall seconds per call made, concurrency included, times the calls a turn needs)." if c["distinct"] else
               f"The teacher makes no LLM calls (its components run in this process): {stats['teacher_s_per_turn']} s "
               "per turn, the whole replay's wall seconds over its turns."), "",
              "Tokens are those of the calls made by this run, as the endpoint reported them (a local model: counted "
              "with its tokenizer).", ""]
    drops = stats["dropped"]
    if drops:
        lines += [f"Teacher outputs the runtime's validation rejected ({sum(drops.values())}; each one is in "
                  "dropped.jsonl with the turn and the output):", "", "| set / reason | count |", "|---|---:|"]
        lines += [f"| {k} | {v} |" for k, v in sorted(drops.items(), key=lambda kv: (-kv[1], kv[0]))]
    else:
        lines.append("No teacher output was rejected.")
    skipped = {k: v for k, v in stats["turns_without_routing"].items() if v}
    if skipped:
        lines += ["", "Turns without a routing row (the runtime routed them without the teacher's scores): "
                  + ", ".join(f"{k} {v}" for k, v in sorted(skipped.items())) + "."]
    return "\n".join(lines) + "\n"


def run(cfg: DictConfig) -> dict:
    from arbor_train.conversations.io import quiet

    with quiet():
        return _run(cfg)


def _run(cfg: DictConfig) -> dict:
    from tqdm import tqdm

    from arbor_train.conversations.files import load_conversations
    from arbor_train.conversations.io import write_sets
    from arbor_train.runtime import build_components
    from arbor_train.runtime.config import label as runtime_label
    from arbor_train.runtime.config import runtime_config
    from arbor_train.runtime.kvcache import SqliteKV
    from data_gen.conversations import numbered, split

    for key, what in (("input", "a conversation file: docs/reference/conversation_files.md"),
                      ("out_dir", "the folder the rows are written to")):
        if OmegaConf.is_missing(cfg, key) or not cfg[key]:
            raise ConfigError(f"option {key} ({what}) is required")
    overwrite, progress = parse_bool(cfg.overwrite, "overwrite"), parse_bool(cfg.progress, "progress")
    share = parse_float(cfg.heldout, "heldout", minimum=0.0)
    if share >= 1.0:
        raise ConfigError(f"option heldout is the share of conversations held out, in [0, 1), got {cfg.heldout!r}")
    seed = parse_int(cfg.seed, "seed")
    max_convs = None if cfg.max_conversations is None else parse_int(cfg.max_conversations, "max_conversations", 1)
    max_turns = None if cfg.max_turns is None else parse_int(cfg.max_turns, "max_turns", 1)
    price = {k: parse_float(cfg.price[k], f"price.{k}", minimum=0.0) for k in ("prompt", "completion")}
    out = Path(str(cfg.out_dir))
    if (out / "README.md").exists() and not overwrite:  # a finished run; a killed one (no card) resumes
        raise OutputExistsError(f"out_dir={str(out)!r} holds a finished distillation; pass overwrite=true to "
                                "replace it (its teacher-call cache is reused)")
    fmt = parse_choice(cfg.input_format, "input_format", INPUT_FORMATS)
    roles = parse_roles(cfg.roles)
    if fmt != "conversations" and not Path(str(cfg.input)).exists():
        raise MissingInputError(f"option input={str(cfg.input)!r}: no such file or folder")
    if fmt == "locomo":
        from arbor_train.conversations.locomo import interaction_files

        convs = interaction_files(str(cfg.input))
    elif fmt == "irc":
        from arbor_train.conversations.irc import irc_conversations

        convs = irc_conversations(str(cfg.input))
    else:
        convs = load_conversations(str(cfg.input), dict(cfg.runtime.limits))  # the whole file checked first
    convs = convs[:max_convs] if max_convs else convs
    parts = split(convs, share, seed)
    for name, items in parts.items():  # before any teacher call
        if not any(lo < min(hi, max_turns or hi) for _, lo, hi in items):
            raise ConfigError(f"input={cfg.input}: the {name} split has no turn left to label with max_turns={max_turns} "
                              "(raise max_turns, or hold out whole conversations)")
    runtime_cfg = teach_only(runtime_config(OmegaConf.to_container(cfg, resolve=True)), roles)
    teacher = runtime_label(runtime_cfg)
    comps = build_components(runtime_cfg)
    cache_path = Path(str(cfg.cache or out / "teacher_calls.sqlite"))
    cache = SqliteKV(cache_path, table="calls", value="answer")
    calls: Counter = Counter()
    total_turns = sum(min(hi, max_turns or hi) for p in parts.values() for _, _, hi in p)
    bar = tqdm(total=total_turns, desc="distill", unit="turn", disable=not progress)
    recorded: list = []

    def show() -> None:
        u = endpoint_usage(recorded)
        tokens = calls["prompt_tokens"] + calls["completion_tokens"] + u["prompt_tokens"] + u["completion_tokens"]
        cost = ((calls["prompt_tokens"] + u["prompt_tokens"]) * price["prompt"]
                + (calls["completion_tokens"] + u["completion_tokens"]) * price["completion"]) / 1e6
        bar.set_postfix(calls=calls["calls"], reused=calls["reused"], tokens=tokens, cost=f"{cost:.4f}")

    recorded += record_calls(comps, cache, calls, on_call=show)
    model = sorted({r.name for r in recorded}) or [getattr(comps["reranker"], "name", "?")]
    stats: dict = {"teacher": teacher, "teacher_model": ", ".join(model), "source": str(cfg.input), "heldout": share,
                   "roles": list(roles) if roles is not None else None, "input_format": fmt,
                   "seed": seed, "splits": {}, "dropped": Counter(), "turns_without_routing": Counter()}
    t0 = time.perf_counter()
    written: dict[str, tuple[dict, dict]] = {}
    drops: list[dict] = []
    try:
        check_teacher(recorded, cache_path)
        for name, items in parts.items():
            rows: dict[str, list[dict]] = {s: [] for s in SETS}
            counts: Counter = Counter()
            for conv, lo, hi in items:
                hi = min(hi, max_turns or hi)
                if lo >= hi:
                    continue
                distill_conversation(conv.conversation_id, numbered(conv)[:hi], runtime_cfg, comps, lo, rows, drops,
                                     counts, name, on_turn=lambda: (bar.update(1), show()), roles=roles)
            if not any(rows.values()):
                raise ConfigError(f"input={cfg.input}: the {name} split gave no rows (every teacher output was "
                                  "rejected, or no turn was left: see max_turns)")
            stats["splits"][name] = {"conversations": len(items), "turns": counts["turns"], "new_root": counts["new_root"],
                                     **{s: len(rows[s]) for s in SETS}}
            for k, v in counts.items():
                if k.startswith("routing_no_scores_"):
                    stats["turns_without_routing"][k.removeprefix("routing_no_scores_")] += v
            written[name] = (rows, counts)
    except ConnectionError as e:  # the teacher's endpoint: one error line; every finished call stays in the cache
        raise ConfigError(f"the teacher (runtime.teacher_llm.base_url / model): {e}. The calls it had answered are "
                          f"kept in {cache_path}: the same command resumes from them") from None
    finally:
        bar.close()
    for d in drops:
        for r in d["reasons"]:
            stats["dropped"][f"{d['set']} / {reason_of(r)}"] += 1
    u = endpoint_usage(recorded)
    calls.update({"prompt_tokens": u["prompt_tokens"], "completion_tokens": u["completion_tokens"]})
    stats["calls"] = {k: calls[k] for k in ("calls", "cached", "reused", "prompt_tokens", "completion_tokens")}
    # the teacher's cost per turn: wall seconds per call made (concurrency included), over every run that wrote
    # this cache (a resumed run answers part of its calls from it), times the distinct calls a turn needs
    distinct = len(recorded[0].requested) if recorded else 0
    turns = sum(s["turns"] for s in stats["splits"].values())
    made, made_s = record_run(cache_path, calls["calls"], calls["call_s"])
    stats["calls"]["distinct"] = distinct
    stats["calls"]["call_s"] = round(calls["call_s"], 2)
    stats["cost"] = (calls["prompt_tokens"] * price["prompt"] + calls["completion_tokens"] * price["completion"]) / 1e6
    elapsed = time.perf_counter() - t0
    stats["wall_s"] = round(elapsed, 1)
    # an LLM teacher: wall seconds per call made, times the calls a turn needs; components without LLM calls (a
    # tuned bundle): the replay's own seconds per turn
    stats["teacher_s_per_turn"] = ((round(made_s / made * distinct / max(1, turns), 4) if made else None) if distinct
                                   else (round(elapsed / turns, 4) if turns else None))
    stats["dropped"], stats["turns_without_routing"] = dict(stats["dropped"]), dict(stats["turns_without_routing"])
    for name, (rows, _) in written.items():  # an earlier killed run may have left a split half-written
        write_sets(out / name, rows, dict(stats["splits"][name], source=str(cfg.input), split=name, teacher=teacher),
                   f"# {name}\n\nRows the teacher `{teacher}` labelled ({name}); see ../README.md.\n", True)
    with open(out / "dropped.jsonl", "w", encoding="utf-8") as f:
        for d in drops:
            f.write(json.dumps(d, ensure_ascii=False, sort_keys=True) + "\n")
    (out / "stats.json").write_text(json.dumps(stats, indent=2, sort_keys=True) + "\n")
    text = card(stats)
    (out / "README.md").write_text(text)  # last: its presence marks a finished run
    cache.close()
    print(text)
    return stats


@hydra.main(config_path=str(CONF_DIR), config_name="distill", version_base="1.3")
@entry_point
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    main()
