"""python -m data_gen.reader data_dir=<BranchMemEval set> out_dir=<...> [overrides]

Reader supervision assembled by the runtime itself. Each session of a BranchMemEval-style set is replayed
online through ArborMemory (exactly as `eval.run` replays it) under a few read settings drawn from a grid
of budgets x ablations; at every question the context the runtime assembled is kept with the question and
the target answer: the gold where the context holds it (`arbor_train.scoring.answers.context_flags`), else "unknown".
So the reader trains on the layered evidence it will read at test time, with the confounders and the
missing evidence that come with it.

Every row carries its session's content fingerprint (`session_fingerprint`: the turns' text, not the id,
which presets and seeds reuse), and a reader bundle lists the fingerprints it trained on, so an evaluation
can refuse to score a reader on its own training sessions (eval/run.py).
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from arbor_train.errors import (
    ConfigError,
    MissingInputError,
    OutputExistsError,
    conf_options,
    entry_point,
    parse_bool,
    parse_choice,
    parse_int,
)
from arbor_train.paths import CONF_DIR
from arbor_train.prompts import UNKNOWN_ANSWER


class ContextCollector:
    """Stands in for the answer model in `replay_session`: keeps each question's context, answers nothing."""

    def __init__(self):
        self.contexts: list[str] = []

    def ask(self, context: str, question: str, done, sources=None) -> None:
        self.contexts.append(context)

    def forget(self, unit: str, turns: list[int]) -> int:
        return 0


def settings_for(session_id: str, grid: list[tuple[int, str]], k: int, seed: int) -> list[tuple[int, str]]:
    """k distinct (budget, ablation) settings for one session, drawn reproducibly from the grid."""
    rng = random.Random(f"{seed}:{session_id}")
    return rng.sample(grid, min(k, len(grid)))


def check_options(c: dict) -> None:
    if not c.get("data_dir"):
        raise ConfigError("option data_dir (a BranchMemEval set: python -m data_gen.branchmem) is required")
    sessions = Path(str(c["data_dir"])) / "jsonl" / "sessions.jsonl"
    if not sessions.is_file():
        raise MissingInputError(f"option data_dir={c['data_dir']!r}: {sessions} missing (python -m data_gen.branchmem)")
    for key in ("budgets", "ablations"):
        if not isinstance(c[key], list) or not c[key]:
            raise ConfigError(f"option {key} must be a non-empty list, got {c[key]!r}")
    c["budgets"] = [parse_int(b, f"budgets[{i}]", minimum=64) for i, b in enumerate(c["budgets"])]
    known = conf_options("ablation")
    for i, a in enumerate(c["ablations"]):
        parse_choice(a, f"ablations[{i}]", known)
    c["settings_per_session"] = parse_int(c["settings_per_session"], "settings_per_session", minimum=1)
    if c["max_sessions"] is not None:
        c["max_sessions"] = parse_int(c["max_sessions"], "max_sessions", minimum=1)
    c["seed"] = parse_int(c["seed"], "seed")
    if not isinstance(c["exclude"], list):
        raise ConfigError(f"option exclude must be a list of BranchMemEval set folders, got {c['exclude']!r}")
    for i, d in enumerate(c["exclude"]):
        f = Path(str(d)) / "jsonl" / "sessions.jsonl"
        if not f.is_file():
            raise MissingInputError(f"option exclude[{i}]={d!r}: {f} missing")
    c["overwrite"] = parse_bool(c["overwrite"], "overwrite")
    c["progress"] = parse_bool(c["progress"], "progress")


def runtime_for(c: dict, ablation: str) -> dict:
    """The runtime configuration of one ablation setting (eval.run's composition: the runtime group, then the
    ablation's switches)."""
    from arbor_train.runtime.config import runtime_config

    switches = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "ablation" / f"{ablation}.yaml"))
    return runtime_config({"runtime": c["runtime"], "ablation": switches})


def build_rows(c: dict, sessions: list[tuple[dict, str]], runtimes: dict[str, dict]) -> list[dict]:
    """Reader rows of (session, fingerprint) pairs; `runtimes`: ablation -> its checked runtime config."""
    from tqdm import tqdm

    from arbor_train.replay.methods import build_method
    from arbor_train.replay.sessions import replay_session
    from arbor_train.runtime import TokenCounter, build_components

    grid = [(b, a) for b in c["budgets"] for a in c["ablations"]]
    components: dict[str, dict] = {}
    counter = None
    rows: list[dict] = []
    for sess, fp in tqdm(sessions, desc="reader contexts", unit="session", disable=not c["progress"]):
        qinfo = {q["turn"]: q for q in sess["questions"]}
        turns = {t["index"]: t for t in sess["turns"]}
        for budget, ablation in settings_for(sess["session_id"], grid, c["settings_per_session"], c["seed"]):
            rc = runtimes[ablation]
            if ablation not in components:
                components[ablation] = build_components(rc)
            comps = components[ablation]
            counter = counter or TokenCounter(rc["context"]["tokenizer"])
            collector = ContextCollector()
            method = build_method("arbormem", rc, comps, sess["session_id"], counter, 2.0)
            try:
                qrecs, _ = replay_session(sess, method, collector, budget)
            finally:
                method.close()
            for rec, context in zip(qrecs, collector.contexts):
                q, t = qinfo[rec["turn"]], turns[rec["turn"]]
                rows.append({
                    "session_id": sess["session_id"], "turn": rec["turn"], "input": t["user"],
                    "timestamp": t["timestamp"], "context": context,
                    "answer": q["gold"] if rec["gold_in_context"] else UNKNOWN_ANSWER,
                    "gold": q["gold"], "confounder": q["confounder"], "question_type": q["type"],
                    "dimension": q["dimension"], "budget": budget, "ablation": ablation,
                    "gold_in_context": bool(rec["gold_in_context"]),
                    "confounder_in_context": bool(rec["confounder_in_context"]), "session_fingerprint": fp})
    return rows


def compute_stats(c: dict, sessions: list[dict], rows: list[dict]) -> dict:
    from arbor_train.runtime.config import label as runtime_label
    from arbor_train.runtime.config import settings as runtime_settings

    return {
        "source": str(c["data_dir"]), "sessions": len(sessions), "rows": len(rows),
        "runtime": runtime_label(c["runtime"]), "runtime_settings": runtime_settings(c["runtime"]),
        "settings_per_session": c["settings_per_session"], "seed": c["seed"],
        "unknown_targets": sum(r["answer"] == UNKNOWN_ANSWER for r in rows),
        "confounder_in_context": sum(r["confounder_in_context"] for r in rows),
        "by_budget": dict(sorted(Counter(r["budget"] for r in rows).items())),
        "by_ablation": dict(sorted(Counter(r["ablation"] for r in rows).items())),
        "by_question_type": dict(sorted(Counter(r["question_type"] for r in rows).items())),
        "session_fingerprints": sorted({r["session_fingerprint"] for r in rows}),
    }


def card(stats: dict) -> str:
    n = max(1, stats["rows"])
    lines = [
        "# Reader supervision (runtime-assembled contexts)", "",
        f"Written by `python -m data_gen.reader` (ArborTrain) from `{stats['source']}`: {stats['sessions']} sessions "
        f"replayed through the runtime (`{stats['runtime']}`), "
        f"{stats['settings_per_session']} read settings per session (seed {stats['seed']}). Sessions left out because "
        f"an evaluation set holds the same session (option `exclude`): {len(stats.get('excluded_sessions', []))} "
        f"({', '.join(stats.get('excluded_sessions', [])) or 'none'}).", "",
        "| rows | target \"unknown\" (gold not in context) | confounder in context |", "|---:|---:|---:|",
        f"| {stats['rows']:,} | {stats['unknown_targets']:,} ({stats['unknown_targets'] / n:.1%}) | "
        f"{stats['confounder_in_context']:,} ({stats['confounder_in_context'] / n:.1%}) |", "",
        "| read budget | rows |", "|---:|---:|", *[f"| {k} | {v:,} |" for k, v in stats["by_budget"].items()], "",
        "| ablation | rows |", "|---|---:|", *[f"| {k} | {v:,} |" for k, v in stats["by_ablation"].items()], "",
        "| question type | rows |", "|---|---:|", *[f"| {k} | {v:,} |" for k, v in stats["by_question_type"].items()], "",
    ]
    return "\n".join(lines)


def run(cfg: DictConfig | dict) -> dict:
    from arbor_train.conversations.io import quiet, write_sets
    from arbor_train.replay.sessions import load_sessions

    c = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
    check_options(c)
    out = Path(str(c["out_dir"]))
    if out.exists() and not c["overwrite"]:  # fail before any work
        raise OutputExistsError(f"out_dir={str(out)!r} already exists; pass overwrite=true to replace it")
    from arbor_train.replay.sessions import session_fingerprint

    held = {session_fingerprint(s) for d in c["exclude"] for s in load_sessions(d)}
    pairs = [(s, session_fingerprint(s)) for s in load_sessions(c["data_dir"])]
    excluded = [s["session_id"] for s, fp in pairs if fp in held]
    pairs = [(s, fp) for s, fp in pairs if fp not in held][: c["max_sessions"] or None]
    sessions = [s for s, _ in pairs]
    with quiet():
        # every setting's runtime options checked before the replay starts
        runtimes = {a: runtime_for(c, a) for a in c["ablations"]}
        rows = build_rows(c, pairs, runtimes)
    stats = compute_stats(c, sessions, rows)
    stats["excluded_sessions"] = excluded
    write_sets(out, {"reader": rows}, stats, card(stats), c["overwrite"])
    print(f"wrote {out}: {stats['rows']} reader rows from {stats['sessions']} sessions "
          f"({stats['unknown_targets']} with target {UNKNOWN_ANSWER!r})")
    return stats


@hydra.main(config_path=str(CONF_DIR), config_name="reader_data", version_base="1.3")
@entry_point
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    main()
