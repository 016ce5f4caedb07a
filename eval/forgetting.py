"""python -m eval.forgetting [data_dir=...] [methods=[...]] [budget=2048]: the forgetting evaluation.

Each BranchMemEval session gets one forget request (data_gen/branchmem/forgetting.py): a stated value
is forgotten mid-session, the session goes on, and a probe asks for the forgotten slot (gold: the value
before the forgotten update, or "unknown"). Every method replays each session three times, in one run:
- `request`: the request is applied through the method's `forget`;
- `no deletion`: the same session, the request ignored (the control that shows what would leak);
- `original`: the session without the request (the reference for the questions nothing touched).

Reported per method: the leak rate (share of reads after the request whose context holds the
forgotten value; a deleting method must score 0), the same without deletion, gold-in-context of the
update probes (the old value), and gold-in-context of the untouched questions with the request against
the original session (questions on the forgotten slot or naming its value are left out). Writes
results.json, table.md and forgetting.png to run_dir.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from arbor_train.errors import ConfigError, entry_point, parse_int
from arbor_train.paths import CONF_DIR


def _mean(xs: list) -> float | None:
    return round(sum(xs) / len(xs), 4) if xs else None


def untouched(sess: dict, forget: dict) -> list[bool]:
    """Per original question: True when the forget cannot change its answer (another slot or branch, and
    neither its gold nor its confounder is the forgotten value)."""
    moves = json.loads(sess["plan"])["moves"]
    out = []
    for q in sess["questions"]:
        slot = (moves[q["turn"]].get("question") or {}).get("slot")
        same = q["branch"] == forget["branch"] and slot == forget["slot"]
        out.append(not same and forget["value"] not in (q["gold"], q["confounder"]))
    return out


def evaluate(c: dict) -> dict:
    from arbor_train.conversations.io import quiet
    from arbor_train.replay.methods import METHODS, build_method
    from arbor_train.replay.sessions import load_sessions, replay_session
    from arbor_train.runtime import TokenCounter, build_components
    from arbor_train.runtime.config import label, runtime_config
    from data_gen.branchmem.forgetting import with_forget_request

    methods = list(c["methods"])
    for m in methods:
        if m not in METHODS:
            raise ConfigError(f"option methods: {m!r} is not a method; valid: {', '.join(METHODS)}")
    budget = parse_int(c["budget"], "budget", minimum=64)
    runtime_cfg = runtime_config(c)
    counter = TokenCounter(runtime_cfg["context"]["tokenizer"])
    sessions = load_sessions(c["data_dir"])[: c["max_sessions"] or None]
    pairs = []
    for i, s in enumerate(sessions):
        f = with_forget_request(s, random.Random(int(c["seed"]) * 1_000_003 + i))
        if f is not None:
            pairs.append((s, f))
    if not pairs:
        raise ConfigError(f"data_dir={c['data_dir']}: no session has a value that can be forgotten cleanly")
    kinds = {k: sum(f["forget"]["type"] == k for _, f in pairs) for k in ("forgotten_update", "forgotten_fact")}
    rows = []
    t0 = time.perf_counter()
    with quiet():
        comps = build_components(runtime_cfg)
        for name in methods:
            recs = {"request": [], "no_deletion": [], "original": []}
            keep: list[bool] = []
            for s, f in pairs:
                for variant, sess, apply in (("request", f, True), ("no_deletion", f, False), ("original", s, True)):
                    m = build_method(name, runtime_cfg, comps, sess["session_id"], counter, c["prefilter"])
                    q, _ = replay_session(sess, m, None, budget, apply_forget=apply)
                    m.close()
                    recs[variant].append(q)
                keep += untouched(s, f["forget"])
            req = [r for q in recs["request"] for r in q]
            nodel = [r for q in recs["no_deletion"] for r in q]
            orig = [r for q in recs["original"] for r in q]
            # the original questions come first, in order, in both variants; the probe closes the session
            with_req = [r for q, o in zip(recs["request"], recs["original"]) for r in q[: len(o)]]
            probes = [q[-1] for q in recs["request"]]
            probes_nodel = [q[-1] for q in recs["no_deletion"]]
            upd = [p["gold_in_context"] for p in probes if p["question_type"] == "forgotten_update"]
            upd_nodel = [p["gold_in_context"] for p in probes_nodel if p["question_type"] == "forgotten_update"]
            g_req = [r["gold_in_context"] for r, k in zip(with_req, keep) if k]
            g_orig = [r["gold_in_context"] for r, k in zip(orig, keep) if k]
            after = [r for r in req if r.get("after_forget")]
            after_nodel = [r for r in nodel if r.get("after_forget")]
            row = {"method": name, "reads_after_request": len(after),
                   "leak_rate": _mean([r["leak"] for r in after]),
                   "leak_rate_no_deletion": _mean([r["leak"] for r in after_nodel]),
                   "probe_old_value_in_context": _mean(upd), "probe_old_value_in_context_no_deletion": _mean(upd_nodel),
                   "untouched_questions": len(g_req), "untouched_gold_in_context": _mean(g_req),
                   "untouched_gold_in_context_original": _mean(g_orig)}
            row["untouched_delta"] = (round(row["untouched_gold_in_context"] - row["untouched_gold_in_context_original"], 4)
                                      if g_req else None)
            rows.append(row)
            print(f"[forgetting] {name}: {json.dumps(row)}", flush=True)
    return {"sessions": len(pairs), "sessions_skipped": len(sessions) - len(pairs), "forget_types": kinds,
            "budget": budget, "runtime": label(runtime_cfg), "seconds": round(time.perf_counter() - t0, 1),
            "rows": rows}


def table(res: dict) -> str:
    head = ("| method | leak rate | leak rate, no deletion | probe: old value in context (no deletion) | "
            "untouched gold-in-context | original session | delta |\n|---|---:|---:|---:|---:|---:|---:|")
    lines = [head]
    for r in res["rows"]:
        lines.append(f"| {r['method']} | {r['leak_rate']:.3f} | {r['leak_rate_no_deletion']:.3f} | "
                     f"{_fmt(r['probe_old_value_in_context'])} ({_fmt(r['probe_old_value_in_context_no_deletion'])}) | "
                     f"{_fmt(r['untouched_gold_in_context'])} | {_fmt(r['untouched_gold_in_context_original'])} | "
                     f"{_fmt(r['untouched_delta'], signed=True)} |")
    return "\n".join(lines) + "\n"


def _fmt(v, signed: bool = False) -> str:
    if v is None:
        return "—"
    return f"{v:+.3f}" if signed else f"{v:.3f}"


def plot(res: dict, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["method"] for r in res["rows"]]
    x = range(len(names))
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.bar([i - 0.2 for i in x], [r["leak_rate_no_deletion"] for r in res["rows"]], 0.4, label="request ignored")
    ax.bar([i + 0.2 for i in x], [r["leak_rate"] for r in res["rows"]], 0.4, label="request applied")
    ax.set_xticks(list(x), names)
    ax.set_ylabel("reads holding the forgotten value")
    ax.set_title(f"Forgetting: leak rate after the request ({res['sessions']} sessions, {res['budget']} tokens)")
    ax.legend()
    fig.tight_layout()
    path = out / "forgetting.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def run(cfg: DictConfig) -> dict:
    c = OmegaConf.to_container(cfg, resolve=True)
    res = evaluate(c)
    out = Path(c["run_dir"])
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"results": res, "config": c}, indent=2, sort_keys=True))
    (out / "table.md").write_text(table(res))
    picture = plot(res, out)
    print(table(res))
    print(f"wrote {out / 'results.json'}, {out / 'table.md'}, {picture}")
    return res


@hydra.main(config_path=str(CONF_DIR), config_name="forgetting", version_base="1.3")
@entry_point
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    main()
