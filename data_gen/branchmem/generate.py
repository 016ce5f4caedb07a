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

from data_gen.io import write_sets

from .plan import PlanError, allocate, plan_session
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
    raise RuntimeError(f"session {i}: no valid session after {p['max_attempts']} attempts "
                       f"(plan errors {report['plan_errors']}, failures {dict(report['failures'])})")


def session_row(plan, turns: list[Turn]) -> dict:
    return {
        "session_id": plan.session_id, "seed": plan.seed, "n_branches": len(plan.branches),
        "turns": [{"index": t.index, "user": t.user, "assistant": t.assistant, "timestamp": t.timestamp,
                   "branch": -1 if t.branch is None else t.branch, "move": t.move, "is_question": t.is_question,
                   "gold_parent": -1 if t.gold_parent is None else t.gold_parent} for t in turns],
        "questions": [{"turn": t.index, "type": t.question["type"], "dimension": t.question["dimension"],
                       "gold": t.question["gold"], "confounder": t.question["confounder"], "branch": t.branch,
                       "confounder_branch": t.question["confounder_branch"]} for t in turns if t.is_question],
        "plan": json.dumps(plan.to_json(), sort_keys=True),
    }


# ---------------------------------------------------------------------- workers
_W: dict[str, Any] = {}


def _init_worker(p: dict, seed: int, targets, runtime_cfg: dict | None, verbalizer_cfg: dict | None = None) -> None:
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


def _work(i: int) -> tuple[dict[str, list[dict]], dict]:
    plan, turns, report = build_session(i, _W["p"], _W["seed"], _W["targets"], _W["verbalizer"])
    rows: dict[str, list[dict]] = {"sessions": [session_row(plan, turns)]}
    if _W["runtime_cfg"] is not None:
        from .mine import mine_session

        rows.update(mine_session(plan.session_id, turns, _W["runtime_cfg"], _W["components"]))
    return rows, report


def iter_sessions(indices: list[int], p: dict, seed: int, runtime_cfg: dict | None, workers: int,
                  progress: bool = True, verbalizer_cfg: dict | None = None) -> Iterator[tuple[dict, dict]]:
    from tqdm import tqdm

    targets = session_targets(p, seed)
    bar = tqdm(total=len(indices), desc=f"{p['name']} sessions", unit="session", disable=not progress)
    if workers <= 1:
        _init_worker(p, seed, targets, runtime_cfg, verbalizer_cfg)
        for i in indices:
            yield _work(i)
            bar.update()
    else:
        ctx = mp.get_context("fork")
        with ctx.Pool(workers, initializer=_init_worker, initargs=(p, seed, targets, runtime_cfg, verbalizer_cfg)) as pool:
            for out in pool.imap(_work, indices, chunksize=max(1, min(64, len(indices) // (workers * 8) or 1))):
                yield out
                bar.update()
    bar.close()


# ---------------------------------------------------------------------- statistics and card
def compute_stats(rows: dict[str, list[dict]], validation: dict) -> dict:
    sessions = rows["sessions"]
    lens = [len(s["turns"]) for s in sessions]
    qs = [q for s in sessions for q in s["questions"]]
    routing = rows.get("routing", [])
    loc = rows.get("localization", [])
    return {
        "sessions": len(sessions),
        "questions": len(qs),
        "non_question_turns": sum(lens) - len(qs),
        "turns": sum(lens),
        "turns_per_session": {"min": min(lens), "max": max(lens), "mean": round(sum(lens) / len(lens), 2)},
        "branches_per_session": {str(k): v for k, v in sorted(Counter(s["n_branches"] for s in sessions).items())},
        "questions_by_type": dict(sorted(Counter(q["type"] for q in qs).items())),
        "questions_by_dimension": dict(sorted(Counter(q["dimension"] for q in qs).items())),
        "distractor_turns": sum(t["move"] == "distractor" for s in sessions for t in s["turns"]),
        "validation": validation,
        "supervision": {k: len(v) for k, v in rows.items() if k != "sessions"},
        "routing_gold_recalled": round(sum(r["gold_recalled"] for r in routing) / len(routing), 4) if routing else None,
        "routing_new_root_share": round(sum(r["gold_parent"] < 0 for r in routing) / len(routing), 4) if routing else None,
        "localization_gold_recalled": round(
            sum(any(c["recalled"] and c["turn"] in set(x["gold_states"]) for c in x["candidates"]) for x in loc)
            / len(loc), 4) if loc else None,
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
        "## Validation",
        "",
        f"{v['checks_run']:,} checks run over {v['sessions_valid']:,} accepted sessions; "
        f"{v['regenerated']:,} candidate sessions regenerated ({v['plan_errors']:,} unplaceable plans).",
        "",
        "| rule | failures before regeneration |", "|---|---:|",
        *[f"| {k} | {n} |" for k, n in v["failures"].items()],
        "",
        "## Supervision sets (schemas: `data_gen/schema.py`)",
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
        lines.append(f"- turn {q['turn']} ({q['type']}, {q['dimension']}): gold `{q['gold']}`, "
                     f"confounder `{q['confounder']}`")
    lines += ["", "## Configuration", "", "```yaml", cfg_text.strip(), "```", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------------- output
def write_output(out_dir: Path, rows: dict[str, list[dict]], stats: dict, cfg_text: str, overwrite: bool) -> None:
    write_sets(out_dir, rows, stats, card(stats, cfg_text, rows["sessions"][0]), overwrite)


def read_jsonl_sets(d: Path) -> dict[str, list[dict]]:
    out = {}
    for name in SETS:
        f = d / "jsonl" / f"{name}.jsonl"
        if f.exists():
            out[name] = [json.loads(line) for line in f.open(encoding="utf-8")]
    return out


def run_generation(p: dict, seed: int, out_dir: Path, runtime_cfg: dict | None, workers: int, shard: dict,
                   cfg_text: str, overwrite: bool, progress: bool = True, verbalizer_cfg: dict | None = None) -> dict:
    n = p["sessions"]
    lo = n * shard["index"] // shard["count"]
    hi = n * (shard["index"] + 1) // shard["count"]
    rows: dict[str, list[dict]] = {k: [] for k in SETS if k == "sessions" or runtime_cfg is not None}
    reports = []
    t0 = time.perf_counter()
    for out, report in iter_sessions(list(range(lo, hi)), p, seed, runtime_cfg, workers, progress, verbalizer_cfg):
        for k, v in out.items():
            rows[k].extend(v)
        reports.append(report)
    elapsed = time.perf_counter() - t0
    stats = compute_stats(rows, merge_validation(reports))
    stats.update(preset=p["name"], seed=seed, shard={"index": shard["index"], "count": shard["count"],
                                                      "sessions": [lo, hi]})
    write_output(out_dir, rows, stats, cfg_text, overwrite)
    stats["_elapsed_s"] = elapsed
    stats["_validation_reports"] = reports
    return stats


def merge_shards(shard_dirs: list[Path], out_dir: Path, cfg_text: str, overwrite: bool) -> dict:
    """Concatenate shards in index order; stats are recomputed from the merged rows."""
    metas = []
    for d in shard_dirs:
        f = d / "stats.json"
        if not f.exists():
            raise FileNotFoundError(f"shard {d}: stats.json missing (is it a finished shard?)")
        metas.append((json.loads(f.read_text()), d))
    metas.sort(key=lambda m: m[0]["shard"]["index"])
    counts = {m[0]["shard"]["count"] for m in metas}
    idx = [m[0]["shard"]["index"] for m in metas]
    if len(counts) != 1 or idx != list(range(next(iter(counts)))):
        raise ValueError(f"shards {[str(d) for _, d in metas]} are not a complete set: indices {idx} of {counts}")
    rows: dict[str, list[dict]] = {}
    val = {"rules": list(RULES), "checks_run": 0, "failures": Counter(), "plan_errors": 0, "regenerated": 0,
           "sessions_valid": 0}
    for st, d in metas:
        for k, v in read_jsonl_sets(d).items():
            rows.setdefault(k, []).extend(v)
        for k in ("checks_run", "plan_errors", "regenerated", "sessions_valid"):
            val[k] += st["validation"][k]
        val["failures"].update(st["validation"]["failures"])
    val["failures"] = {k: val["failures"].get(k, 0) for k in RULES}
    first = metas[0][0]
    stats = compute_stats(rows, val)
    stats.update(preset=first["preset"], seed=first["seed"],
                 shard={"index": 0, "count": 1, "sessions": [0, stats["sessions"]]})
    write_output(out_dir, rows, stats, cfg_text, overwrite)
    return stats
