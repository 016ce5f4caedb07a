"""Generate BranchMemEval-style sessions and their supervision: plan -> realize -> validate -> mine.

Session i of a run depends only on (seed, i) and the preset, so index-range shards made in parallel
(a SLURM job array) merge, in index order, into exactly the output of a single run.
"""

from __future__ import annotations

import hashlib
import json
import logging
import multiprocessing as mp
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

from arbor_train.conversations.io import SetWriter

from .plan import SPECIFICITY, PlanError, allocate, plan_session
from .realize import Turn, realize
from .validate import RULES, validate_session

log = logging.getLogger(__name__)

SETS = ("sessions", "routing", "localization", "extraction", "tags", "summaries")


def sub_seed(seed: int, *parts: int) -> int:
    h = hashlib.sha256(("/".join(str(p) for p in (seed, *parts))).encode()).digest()
    return int.from_bytes(h[:8], "little") >> 1


def session_targets(p: dict, seed: int) -> list[tuple[int, int]] | None:
    """Exact presets fix every session's (turns, questions) globally; free presets draw per session."""
    if p["total_turns"] is None:
        return None
    return allocate(p["sessions"], p["total_turns"], p["total_questions"], p["turns_min"], p["turns_max"],
                    random.Random(sub_seed(seed, -1)))


def target_for(i: int, p: dict, seed: int, targets: list | None) -> tuple[int, int]:
    if targets is not None:
        return targets[i]
    r = random.Random(sub_seed(seed, i, -2))
    return r.randint(p["turns_min"], p["turns_max"]), r.choice(list(p["questions_per_session"]))


def build_session(i: int, p: dict, seed: int, targets: list | None, verbalizer=None) -> tuple[Any, list[Turn], dict]:
    """Plan, realize (optionally verbalize) and validate session i, regenerating until it is valid."""
    from .verbalize import VerbalizeReport

    n_turns, n_q = target_for(i, p, seed, targets)
    report = {"attempts": 0, "plan_errors": 0, "failures": Counter(), "checks": 0, "verbalize": VerbalizeReport()}
    for attempt in range(p["max_attempts"]):
        report["attempts"] += 1
        s = sub_seed(seed, i, attempt)
        try:
            plan = plan_session(f"{p['name']}-{i:06d}", s, n_turns, n_q, p)
        except PlanError:
            report["plan_errors"] += 1
            continue
        turns = realize(plan, start_day=i % 300)
        if verbalizer is not None:
            turns = verbalizer.rewrite(turns, report["verbalize"])
        report["checks"] += len(RULES)
        fails = validate_session(plan, turns, p["delay_min"])
        if not fails:
            return plan, turns, report
        for rule, msgs in fails.items():
            report["failures"][rule] += len(msgs)
    from arbor_train.errors import ConfigError

    # every draw of this preset failed: the preset cannot be realized (a user's option, not a bug)
    raise ConfigError(f"option preset (preset.name={p['name']}): session {i} found no valid session in "
                      f"preset.max_attempts={p['max_attempts']} attempts (plan errors {report['plan_errors']}, "
                      f"failures {dict(report['failures'])}); widen preset.turns_min/turns_max or lower the "
                      f"questions per session")


def session_row(plan, turns: list[Turn]) -> dict:
    return {
        "session_id": plan.session_id, "seed": plan.seed, "n_branches": len(plan.branches),
        "turns": [{"index": t.index, "user": t.user, "assistant": t.assistant, "timestamp": t.timestamp,
                   "branch": -1 if t.branch is None else t.branch, "move": t.move, "is_question": t.is_question,
                   "gold_parent": -1 if t.gold_parent is None else t.gold_parent,
                   **({} if t.gold_secondary is None else {"gold_secondary": t.gold_secondary})} for t in turns],
        "questions": [{"turn": t.index, "type": t.question["type"], "dimension": t.question["dimension"],
                       "gold": t.question["gold"], "confounder": t.question["confounder"], "branch": t.branch,
                       "confounder_branch": t.question["confounder_branch"],
                       "specificity": t.question.get("specificity", "explicit"),
                       **({"secondary_branch": t.question["secondary_branch"]} if "secondary_branch" in t.question else {})}
                      for t in turns if t.is_question],
        "plan": json.dumps(plan.to_json(), sort_keys=True),
    }


# ---------------------------------------------------------------------- workers
_W: dict[str, Any] = {}


def init_worker(p: dict, seed: int, targets, runtime_cfg: dict | None, verbalizer_cfg: dict | None = None) -> None:
    import torch

    torch.set_num_threads(1)
    _W.update(p=p, seed=seed, targets=targets, runtime_cfg=runtime_cfg, components=None, verbalizer=None)
    if verbalizer_cfg:
        from arbor_train.runtime.llm import build_llm

        from .verbalize import Verbalizer

        _W["verbalizer"] = Verbalizer(build_llm(verbalizer_cfg["llm"]), verbalizer_cfg["max_new_tokens"],
                                      verbalizer_cfg["max_ratio"])
    if runtime_cfg is not None:
        from arbor_train.runtime import build_components

        _W["components"] = build_components(runtime_cfg)


def summarize(rows: dict[str, list[dict]]) -> dict:
    """The per-session numbers stats.json is made of (additive, so shards merge by summing)."""
    sess = rows["sessions"][0]
    routing = rows.get("routing", [])
    loc = rows.get("localization", [])
    return {
        "turns": len(sess["turns"]), "n_branches": sess["n_branches"],
        "questions": [(q["type"], q["dimension"], q["specificity"]) for q in sess["questions"]],
        "distractors": sum(t["move"] == "distractor" for t in sess["turns"]),
        "routing": [len(routing), sum(r["gold_recalled"] for r in routing), sum(r["gold_parent"] < 0 for r in routing)],
        "localization": [len(loc), sum(any(c["recalled"] and c["turn"] in set(x["gold_states"]) for c in x["candidates"])
                                       for x in loc)],
    }


def work_session(i: int) -> tuple[dict[str, list[str]], dict, dict]:
    """Build, mine and serialise session i in the worker; only text lines travel back."""
    from arbor_train.conversations.io import dumps

    plan, turns, report = build_session(i, _W["p"], _W["seed"], _W["targets"], _W["verbalizer"])
    rows: dict[str, list[dict]] = {"sessions": [session_row(plan, turns)]}
    if _W["runtime_cfg"] is not None:
        from .mine import mine_session

        rows.update(mine_session(plan.session_id, turns, _W["runtime_cfg"], _W["components"]))
    return {k: [dumps(r) for r in v] for k, v in rows.items()}, summarize(rows), report


def iter_sessions(indices: list[int], p: dict, seed: int, runtime_cfg: dict | None, workers: int,
                  progress: bool = True, verbalizer_cfg: dict | None = None) -> Iterator[tuple[dict, dict, dict]]:
    from tqdm import tqdm

    targets = session_targets(p, seed)
    bar = tqdm(total=len(indices), desc=f"{p['name']} sessions", unit="session", disable=not progress)
    if workers <= 1:
        init_worker(p, seed, targets, runtime_cfg, verbalizer_cfg)
        for i in indices:
            yield work_session(i)
            bar.update()
    else:
        ctx = mp.get_context("fork")
        with ctx.Pool(workers, initializer=init_worker, initargs=(p, seed, targets, runtime_cfg, verbalizer_cfg)) as pool:
            for out in pool.imap(work_session, indices, chunksize=max(1, min(64, len(indices) // (workers * 8) or 1))):
                yield out
                bar.update()
    bar.close()


# ---------------------------------------------------------------------- statistics and card
def new_counts() -> dict:
    return {"sessions": 0, "turns": 0, "turns_min": None, "turns_max": None, "questions": 0, "branches": {},
            "by_type": {}, "by_dimension": {}, "by_specificity_type": {}, "distractors": 0, "routing": [0, 0, 0], "localization": [0, 0]}


def add_summary(c: dict, s: dict) -> None:
    c["sessions"] += 1
    c["turns"] += s["turns"]
    c["turns_min"] = s["turns"] if c["turns_min"] is None else min(c["turns_min"], s["turns"])
    c["turns_max"] = s["turns"] if c["turns_max"] is None else max(c["turns_max"], s["turns"])
    c["questions"] += len(s["questions"])
    k = str(s["n_branches"])
    c["branches"][k] = c["branches"].get(k, 0) + 1
    for t, d, level in s["questions"]:
        c["by_type"][t] = c["by_type"].get(t, 0) + 1
        c["by_dimension"][d] = c["by_dimension"].get(d, 0) + 1
        k = f"{level}/{t}"
        c["by_specificity_type"][k] = c["by_specificity_type"].get(k, 0) + 1
    c["distractors"] += s["distractors"]
    c["routing"] = [a + b for a, b in zip(c["routing"], s["routing"])]
    c["localization"] = [a + b for a, b in zip(c["localization"], s["localization"])]


def merge_counts(a: dict, b: dict) -> dict:
    out = new_counts()
    for c in (a, b):
        out["sessions"] += c["sessions"]
        out["turns"] += c["turns"]
        out["questions"] += c["questions"]
        out["distractors"] += c["distractors"]
        for key in ("branches", "by_type", "by_dimension", "by_specificity_type"):
            for k, v in c.get(key, {}).items():
                out[key][k] = out[key].get(k, 0) + v
        out["routing"] = [x + y for x, y in zip(out["routing"], c["routing"])]
        out["localization"] = [x + y for x, y in zip(out["localization"], c["localization"])]
    mins = [c["turns_min"] for c in (a, b) if c["turns_min"] is not None]
    maxs = [c["turns_max"] for c in (a, b) if c["turns_max"] is not None]
    out["turns_min"], out["turns_max"] = (min(mins) if mins else None), (max(maxs) if maxs else None)
    return out


def compute_stats(c: dict, validation: dict, supervision: dict[str, int]) -> dict:
    r, lo = c["routing"], c["localization"]
    return {
        "sessions": c["sessions"],
        "questions": c["questions"],
        "non_question_turns": c["turns"] - c["questions"],
        "turns": c["turns"],
        "turns_per_session": {"min": c["turns_min"], "max": c["turns_max"],
                              "mean": round(c["turns"] / max(1, c["sessions"]), 2)},
        "branches_per_session": dict(sorted(c["branches"].items())),
        "questions_by_type": dict(sorted(c["by_type"].items())),
        "questions_by_dimension": dict(sorted(c["by_dimension"].items())),
        "questions_by_specificity": {lv: n for lv in SPECIFICITY  # summed from the per-type counts
                                     if (n := sum(v for k, v in c["by_specificity_type"].items() if k.startswith(f"{lv}/")))},
        "distractor_turns": c["distractors"],
        "validation": validation,
        "supervision": {k: v for k, v in supervision.items() if k != "sessions"},
        "routing_gold_recalled": round(r[1] / r[0], 4) if r[0] else None,
        "routing_new_root_share": round(r[2] / r[0], 4) if r[0] else None,
        "localization_gold_recalled": round(lo[1] / lo[0], 4) if lo[0] else None,
        "counts": c,
    }


def merge_validation(reports: list[dict]) -> dict:
    failures: Counter = Counter()
    verbal: Counter = Counter()
    for r in reports:
        failures.update(r["failures"])
        v = r["verbalize"]
        verbal.update({"attempted": v.attempted, "accepted": v.accepted,
                       **{f"rejected_{k}": n for k, n in v.rejected.items()}})
    out = {
        "rules": list(RULES),
        "checks_run": sum(r["checks"] for r in reports),
        "failures": {k: failures.get(k, 0) for k in RULES},
        "plan_errors": sum(r["plan_errors"] for r in reports),
        "regenerated": sum(r["attempts"] - 1 for r in reports),
        "sessions_valid": len(reports),
    }
    if verbal["attempted"]:
        out["verbalizer"] = dict(sorted(verbal.items()))
    return out


def card(stats: dict, cfg_text: str, sample: dict) -> str:
    v = stats["validation"]
    tps = stats["turns_per_session"]
    lines = [
        f"# BranchMemEval-style set: preset `{stats['preset']}`, seed {stats['seed']}",
        "",
        "Generated by `python -m data_gen.branchmem` (ArborTrain). A programmatic planner fixes branch structure,",
        "slot values and updates, artifacts, events, distractors, question positions, gold answers and",
        "confounders before any text is realized; every question has a confounder from a parallel branch.",
        "",
        "## Composition",
        "",
        "| sessions | questions | non-question turns | turns per session (min / max / mean) | branches per session |",
        "|---:|---:|---:|---|---|",
        f"| {stats['sessions']:,} | {stats['questions']:,} | {stats['non_question_turns']:,} | "
        f"{tps['min']} / {tps['max']} / {tps['mean']} | "
        + ", ".join(f"{k}: {n}" for k, n in stats["branches_per_session"].items()) + " |",
        "",
        "| question type | count |", "|---|---:|",
        *[f"| {k} | {n} |" for k, n in stats["questions_by_type"].items()],
        "",
        "| dimension | count |", "|---|---:|",
        *[f"| {k} | {n} |" for k, n in stats["questions_by_dimension"].items()],
        "",
        "Specificity (how a question names its trajectory; `data_gen/branchmem/plan.py` SPECIFICITY):",
        "",
        "| question type | " + " | ".join(SPECIFICITY) + " |", "|---|" + "---:|" * len(SPECIFICITY),
        *[f"| {t} | " + " | ".join(str(stats["counts"]["by_specificity_type"].get(f"{lv}/{t}", 0)) for lv in SPECIFICITY)
          + " |" for t in stats["questions_by_type"]],
        "| all | " + " | ".join(str(stats["questions_by_specificity"].get(lv, 0)) for lv in SPECIFICITY) + " |",
        "",
        "## Validation",
        "",
        f"{v['checks_run']:,} checks run over {v['sessions_valid']:,} accepted sessions; "
        f"{v['regenerated']:,} candidate sessions regenerated ({v['plan_errors']:,} unplaceable plans).",
        "",
        "| rule | failures before regeneration |", "|---|---:|",
        *[f"| {k} | {n} |" for k, n in v["failures"].items()],
        "",
        "## Supervision sets (schemas: `arbor_train/conversations/supervision.py`)",
        "",
        "| set | rows |", "|---|---:|",
        *[f"| {k} | {n:,} |" for k, n in stats["supervision"].items()],
        "",
    ]
    if stats.get("routing_gold_recalled") is not None:
        lines += [f"Runtime recall found the gold parent for {stats['routing_gold_recalled']:.1%} of routing examples "
                  f"(the rest carry the gold as an added, `recalled: false` candidate); "
                  f"{stats['routing_new_root_share']:.1%} of turns start a new root. "
                  f"For questions, a gold-branch state was recalled {stats['localization_gold_recalled']:.1%} of the time.", ""]
    lines += ["## Sample (first session, first 12 turns)", "", "```"]
    for t in sample["turns"][:12]:
        tag = f"[b{t['branch']}]" if t["branch"] >= 0 else "[--]"
        lines.append(f"{t['index']:>2} {tag} U: {t['user']}")
        lines.append(f"        A: {t['assistant']}")
    lines += ["```", "", "Questions of that session:", ""]
    for q in sample["questions"]:
        lines.append(f"- turn {q['turn']} ({q['type']}, {q['dimension']}, {q['specificity']}): gold `{q['gold']}`, "
                     f"confounder `{q['confounder']}`")
    lines += ["", "## Configuration", "", "```yaml", cfg_text.strip(), "```", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------------- output
def run_generation(p: dict, seed: int, out_dir: Path, runtime_cfg: dict | None, workers: int, shard: dict,
                   cfg_text: str, overwrite: bool, progress: bool = True, verbalizer_cfg: dict | None = None) -> dict:
    n = p["sessions"]
    lo = n * shard["index"] // shard["count"]
    hi = n * (shard["index"] + 1) // shard["count"]
    names = [k for k in SETS if k == "sessions" or runtime_cfg is not None]
    writer = SetWriter(out_dir, names, overwrite)
    counts, reports, sample = new_counts(), [], None
    t0 = time.perf_counter()
    try:
        for lines, summary, report in iter_sessions(list(range(lo, hi)), p, seed, runtime_cfg, workers, progress,
                                                    verbalizer_cfg):
            for k, v in lines.items():
                writer.write_lines(k, v)
            if sample is None:
                sample = json.loads(lines["sessions"][0])
            add_summary(counts, summary)
            reports.append(report)
    except BaseException:
        writer.abort()
        raise
    elapsed = time.perf_counter() - t0
    stats = compute_stats(counts, merge_validation(reports), writer.counts)
    stats.update(preset=p["name"], seed=seed, shard={"index": shard["index"], "count": shard["count"],
                                                      "sessions": [lo, hi]}, sample=sample)
    writer.finish(_public(stats), card(stats, cfg_text, sample))
    stats["_elapsed_s"] = elapsed
    stats["_total_s"] = time.perf_counter() - t0
    return stats


def _public(stats: dict) -> dict:
    return {k: v for k, v in stats.items() if not k.startswith("_")}


def merge_shards(shard_dirs: list[Path], out_dir: Path, cfg_text: str, overwrite: bool) -> dict:
    """Concatenate shards in index order; counts are summed, so stats equal a single run's.

    An entry may also be a folder holding `shard-*` folders (what a SLURM generation array writes).
    """
    expanded = []
    for d in shard_dirs:
        inner = sorted(d.glob("shard-*-of-*")) if d.is_dir() and not (d / "stats.json").exists() else []
        expanded.extend(inner or [d])
    from arbor_train.errors import ConfigError, InputError, MissingInputError

    metas = []
    for d in expanded:
        f = d / "stats.json"
        if not f.exists():
            raise MissingInputError(f"shard {d}: stats.json missing (is it a finished shard?)")
        try:
            st = json.loads(f.read_text())
            _ = (st["shard"]["index"], st["shard"]["count"])
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise InputError(f"{f}: not a shard's stats.json (field 'shard.index' / 'shard.count': {e})") from e
        metas.append((st, d))
    metas.sort(key=lambda m: m[0]["shard"]["index"])
    counts_set = {m[0]["shard"]["count"] for m in metas}
    idx = [m[0]["shard"]["index"] for m in metas]
    if len(counts_set) != 1 or idx != list(range(next(iter(counts_set)))):
        raise ConfigError(f"option merge_from: shards {[str(d) for _, d in metas]} are not a complete set: indices "
                          f"{idx} of {counts_set}")
    names = [n for n in SETS if (metas[0][1] / "jsonl" / f"{n}.jsonl").exists()]
    writer = SetWriter(out_dir, names, overwrite)
    counts = new_counts()
    val = {"rules": list(RULES), "checks_run": 0, "failures": Counter(), "plan_errors": 0, "regenerated": 0,
           "sessions_valid": 0}
    verbal: Counter = Counter()
    try:
        for st, d in metas:
            for n in names:
                with open(d / "jsonl" / f"{n}.jsonl", encoding="utf-8") as f:
                    writer.write_lines(n, (line.rstrip("\n") for line in f))
            counts = merge_counts(counts, st["counts"])
            for k in ("checks_run", "plan_errors", "regenerated", "sessions_valid"):
                val[k] += st["validation"][k]
            val["failures"].update(st["validation"]["failures"])
            verbal.update(st["validation"].get("verbalizer", {}))
    except BaseException:
        writer.abort()
        raise
    val["failures"] = {k: val["failures"].get(k, 0) for k in RULES}
    if verbal:
        val["verbalizer"] = dict(sorted(verbal.items()))
    first = metas[0][0]
    stats = compute_stats(counts, val, writer.counts)
    stats.update(preset=first["preset"], seed=first["seed"], sample=first["sample"],
                 shard={"index": 0, "count": 1, "sessions": [0, stats["sessions"]]})
    writer.finish(stats, card(stats, cfg_text, first["sample"]))
    return stats
