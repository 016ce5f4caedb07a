"""python -m eval.report <run dir or multirun dir> [...] [--out DIR]

Merges the results.json of evaluation runs (a Hydra multirun folder is searched recursively) into one
markdown table and PNG plots: accuracy or gold-in-context against the read budget per method, ablation
bars, and error categories. Every row names the run folder it came from.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

COLUMNS = ("benchmark", "method", "runtime", "ablation", "budget", "reader", "questions", "accuracy", "gold_in_context",
           "confounder_in_context", "primary_gold_only", "state_localization_at_questions", "state_localization_every_turn",
           "evidence_recall", "answer_token_recall", "f1", "messages", "routing_accuracy", "link_precision", "link_recall", "link_f1",
           "one_minus_vi", "one_to_one", "exact_f1", "context_tokens_mean", "ingest_s_per_turn", "read_s_p50", "read_s_p95", "questions_per_hour")


def collect(paths: list[str | Path]) -> list[dict]:
    rows = []
    for p in paths:
        p = Path(p)
        files = [p] if p.is_file() else sorted(p.rglob("results.json"))
        if not files:
            raise FileNotFoundError(f"{p}: no results.json found")
        for f in files:
            data = json.loads(f.read_text())
            r = data["results"]
            r.setdefault("runtime_settings", [])
            r["run"] = str(f.parent)
            rows.append(r)
    return rows


def fmt_value(v) -> str:
    if isinstance(v, list):  # a table cell of several values (eval.tables JOIN)
        return " / ".join(fmt_value(x) for x in v)
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def table(rows: list[dict]) -> str:
    cols = [c for c in COLUMNS if any(r.get(c) is not None for r in rows)] + ["run"]
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in sorted(rows, key=lambda r: (r.get("method", ""), r.get("ablation", ""), r.get("budget", 0))):
        out.append("| " + " | ".join(fmt_value(r.get(c)) for c in cols) + " |")
    return "\n".join(out) + "\n"


def label(r: dict) -> str:
    """A row's method, with its runtime (components / read policy / domain) where that is not the heuristic
    one and the bundles its runtime settings name (two rows of one runtime with different bundles stay
    apart), then its other settings by their last key: `arbormem (tuned; reranker=reranker_mixed,
    tagger=tagger; min_score=0.5)`."""
    prof = r.get("runtime", "heuristic")
    pairs = [o.removeprefix("runtime.").split("=", 1) for o in r.get("runtime_settings") or [] if "=" in o]
    bundles = [f"{k.removesuffix('.path').removesuffix('.bundle')}={Path(v).name}" for k, v in pairs if k.endswith(".path")]
    options = [f"{k.rsplit('.', 1)[-1]}={v}" for k, v in pairs if not k.endswith(".path")]
    inner = "; ".join(x for x in (None if prof == "heuristic" else prof, ", ".join(bundles), ", ".join(options)) if x)
    return f"{r['method']} ({inner})" if inner else r["method"]


def accuracy_table(rows: list[dict]) -> str:
    """Per run with answers: accuracy overall, per dimension and per question type, and the error categories
    ("" when no run has answers)."""
    from arbor_train.scoring.answers import ERROR_CATEGORIES

    rows = [r for r in rows if r.get("accuracy_by_dimension")]
    if not rows:
        return ""
    dims = sorted({d for r in rows for d in r["accuracy_by_dimension"]})
    types = sorted({t for r in rows for t in r.get("accuracy_by_type") or {}})
    out = ["| method | ablation | budget | reader | accuracy | " + " | ".join(d.replace("_", " ") for d in dims)
           + " | " + " | ".join(types) + " | " + " / ".join(c.replace("_", " ") for c in ERROR_CATEGORIES) + " |",
           "|---|---|---:|---|---:|" + "---:|" * (len(dims) + len(types)) + "---|"]
    for r in sorted(rows, key=lambda r: (str(r.get("reader")), label(r), r.get("ablation", ""), r.get("budget", 0))):
        cells = [fmt_value(r["accuracy_by_dimension"].get(d)) for d in dims]
        cells += [fmt_value((r.get("accuracy_by_type") or {}).get(t)) for t in types]
        errs = " / ".join(str((r.get("errors") or {}).get(c, 0)) for c in ERROR_CATEGORIES)
        out.append(f"| {label(r)} | {r.get('ablation')} | {r.get('budget')} | {r.get('reader')} | "
                   f"{fmt_value(r.get('accuracy'))} | " + " | ".join(cells) + f" | {errs} |")
    return "\n".join(out) + "\n"


def category_table(rows: list[dict]) -> str:
    """Per LoCoMo category: evidence recall / answer-token recall of each run ("" when no run has them)."""
    rows = [r for r in rows if r.get("evidence_recall_by_category")]
    if not rows:
        return ""
    cats = sorted({c for r in rows for c in r["evidence_recall_by_category"]}, key=str)
    out = ["| method | budget | " + " | ".join(f"cat {c} evidence / tokens" for c in cats) + " | all |",
           "|---|---:|" + "---:|" * (len(cats) + 1)]
    for r in sorted(rows, key=lambda r: (label(r), r.get("budget", 0))):
        ev, tok = r["evidence_recall_by_category"], r.get("answer_token_recall_by_category") or {}
        cells = [f"{fmt_value(ev.get(c))} / {fmt_value(tok.get(c))}" for c in cats]
        out.append(f"| {label(r)} | {r.get('budget')} | " + " | ".join(cells)
                   + f" | {fmt_value(r.get('evidence_recall'))} / {fmt_value(r.get('answer_token_recall'))} |")
    return "\n".join(out) + "\n"


def specificity_table(rows: list[dict]) -> str:
    """BranchMemEval runs split by question specificity (data_gen/branchmem/plan.py SPECIFICITY): per level,
    gold in context / confounder in context / gold without the confounder / state localization, the primary
    path's gold without the confounder where measured, and accuracy where answered ("" when no run has more
    than one level)."""
    from data_gen.branchmem.plan import SPECIFICITY

    rows = [r for r in rows if len(r.get("by_specificity") or {}) > 1]
    if not rows:
        return ""
    levels = [lv for lv in SPECIFICITY if any(lv in r["by_specificity"] for r in rows)]
    answered = any("accuracy" in x for r in rows for x in r["by_specificity"].values())
    primary = any("primary_gold_only" in x for r in rows for x in r["by_specificity"].values())
    head = ("gold / confounder / gold only / localization" + (" / primary path gold only" if primary else "")
            + (" / accuracy" if answered else ""))
    out = ["| method | ablation | budget | " + " | ".join(
        f"{lv} (n={max(r['by_specificity'].get(lv, {}).get('questions', 0) for r in rows)}): {head}" for lv in levels) + " |",
           "|---|---|---:|" + "---|" * len(levels)]
    keys = ("gold_in_context", "confounder_in_context", "gold_without_confounder", "state_localization") + (
        ("primary_gold_only",) if primary else ()) + (("accuracy",) if answered else ())
    for r in sorted(rows, key=lambda r: (label(r), r.get("ablation", ""), r.get("budget", 0))):
        cells = [" / ".join(fmt_value(r["by_specificity"][lv].get(k)) for k in keys) if lv in r["by_specificity"] else "—"
                 for lv in levels]
        out.append(f"| {label(r)} | {r.get('ablation', 'full')} | {r.get('budget')} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def multi_intent_table(rows: list[dict]) -> str:
    """BranchMemEval runs with multi-intent turns (the *_multi presets): routing of those turns (primary,
    secondary link into the right branch, both branches joined), the share of single-intent turns linked anyway, the
    calibration error of the routing confidences, and the linked_fact questions' gold / confounder in
    context, gold without the confounder and accuracy ("" when no run has multi-intent turns)."""
    rows = [r for r in rows if r.get("multi_intent")]
    if not rows:
        return ""
    out = ["| method | ablation | budget | multi-intent turns | primary | secondary | joined | single-intent linked "
           "| routing ECE | questions | gold | confounder | gold only | accuracy |",
           "|---|---|---:|" + "---:|" * 11]
    for r in sorted(rows, key=lambda r: (label(r), r.get("ablation", ""), r.get("budget", 0))):
        m = r["multi_intent"]
        cells = [m.get(k) for k in ("turns", "primary", "secondary", "joined", "single_intent_linked")] + [r.get("routing_ece")]
        cells += [m.get(k) for k in ("questions", "gold_in_context", "confounder_in_context", "gold_without_confounder",
                                     "accuracy")]
        out.append(f"| {label(r)} | {r.get('ablation', 'full')} | {r.get('budget')} | " + " | ".join(fmt_value(c) for c in cells) + " |")
    return "\n".join(out) + "\n"


def specificity_plot(rows: list[dict], out: Path) -> Path | None:
    """Gold in context without the confounder against the read budget, one panel per specificity level, one line per method
    (full runs only); None when no run has more than one level or no method has two budgets."""
    import matplotlib.pyplot as plt

    from data_gen.branchmem.plan import SPECIFICITY

    rows = [r for r in rows if len(r.get("by_specificity") or {}) > 1 and r.get("ablation", "full") == "full"]
    levels = [lv for lv in SPECIFICITY if any(lv in r["by_specificity"] for r in rows)]
    lines: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        for lv in levels:
            if lv in r["by_specificity"]:
                lines[lv][label(r)].append((r["budget"], r["by_specificity"][lv]["gold_without_confounder"]))
    if not any(len(p) > 1 for by in lines.values() for p in by.values()):
        return None
    fig, axes = plt.subplots(1, len(levels), figsize=(4.2 * len(levels), 3.8), sharey=True, squeeze=False)
    for ax, lv in zip(axes[0], levels):
        for name, pts in sorted(lines[lv].items()):
            pts.sort()
            ax.plot([b for b, _ in pts], [m for _, m in pts], marker="o", label=name)
        n = max(r["by_specificity"].get(lv, {}).get("questions", 0) for r in rows)
        ax.set_title(f"{lv} questions (n={n})")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("read budget (tokens)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("gold in context, confounder not")
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=min(3, len(names)), fontsize=8)
    fig.tight_layout(rect=(0, 0.06 * ((len(names) + 2) // 3) + 0.02, 1, 1))
    fig.savefig(out / "specificity_curve.png", dpi=120)
    plt.close(fig)
    return out / "specificity_curve.png"


IRC_METRICS = (("link_f1", "link F"), ("one_minus_vi", "1 - VI"), ("one_to_one", "one-to-one"), ("exact_f1", "exact F1"))


def irc_plot(rows: list[dict], out: Path) -> Path | None:
    """Ubuntu IRC runs: link F and the conversation metrics, one group of bars per metric, one bar per run
    (labelled by `label`); None when no run is an IRC run."""
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r.get("benchmark") == "irc" and r.get("link_f1") is not None]
    if not rows:
        return None
    rows = sorted(rows, key=lambda r: r["link_f1"])
    width = 0.8 / len(rows)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(IRC_METRICS) + 0.4 * len(rows)), 4.2))
    for k, r in enumerate(rows):
        xs = [i + (k - (len(rows) - 1) / 2) * width for i in range(len(IRC_METRICS))]
        vals = [r.get(m) or 0.0 for m, _ in IRC_METRICS]
        bars = ax.bar(xs, vals, width, label=label(r))
        ax.bar_label(bars, fmt="%.1f", fontsize=7, padding=1)
    ax.set_xticks(range(len(IRC_METRICS)), [name for _, name in IRC_METRICS])
    ax.set_ylabel("%")
    ax.set_ylim(0, 105)
    ax.set_title(f"Ubuntu IRC reply structure ({rows[0].get('messages', '?')} annotated messages)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=min(2, len(rows)))
    fig.tight_layout()
    fig.savefig(out / "irc_bars.png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    return out / "irc_bars.png"


def plots(rows: list[dict], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    # the budget curve plots the first metric every row has: BranchMemEval accuracy or gold in context,
    # LoCoMo F1 or evidence recall, LongMemEval / BEAM recall
    candidates = ("accuracy", "gold_in_context", "f1", "evidence_recall", "session_recall_any", "judge_accuracy")
    metric = next((m for m in candidates if all(isinstance(r.get(m), (int, float)) for r in rows)), None)
    by_method: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for r in rows if metric is not None else []:
        if r.get("ablation", "full") == "full":
            by_method[label(r)].append((r["budget"], r[metric]))
    if any(len(v) > 1 for v in by_method.values()):
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for name, pts in sorted(by_method.items()):
            pts.sort()
            ax.plot([b for b, _ in pts], [m for _, m in pts], marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("read budget (tokens)")
        ax.set_ylabel(metric.replace("_", " "))
        ax.set_title(f"{metric.replace('_', ' ')} against the read budget")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "budget_curve.png", dpi=120)
        plt.close(fig)
        written.append(out / "budget_curve.png")
    # ablation bars: the arbormem runs at the budget the ablations were run with, one bar per ablation
    removed = [r for r in rows if r["method"] == "arbormem" and r.get("ablation", "full") != "full"]
    budget = max({r["budget"] for r in removed}, key=lambda b: sum(r["budget"] == b for r in removed)) if removed else None
    by_abl = {r.get("ablation"): r for r in rows if r["method"] == "arbormem" and r["budget"] == budget
              and r.get("runtime", "heuristic") == (removed[0].get("runtime", "heuristic") if removed else None)}
    abl = sorted(by_abl.values(), key=lambda r: (r.get("ablation") != "full", r.get("ablation")))
    if len(abl) > 1 and metric is not None:
        fig, ax = plt.subplots(figsize=(7, 4))
        names = [r.get("ablation") for r in abl]
        ax.bar(names, [r[metric] for r in abl], color=["#2b6cb0" if n == "full" else "#a0aec0" for n in names])
        for i, r in enumerate(abl):
            ax.text(i, r[metric] + 0.01, f"{r[metric]:.2f}", ha="center", fontsize=8)
        ax.set_ylabel(metric.replace("_", " "))
        ax.set_ylim(0, 1.08)
        ax.set_title(f"ablations at a {budget}-token budget: one component removed at a time")
        plt.setp(ax.get_xticklabels(), rotation=20, ha="right")
        fig.tight_layout()
        fig.savefig(out / "ablation_bars.png", dpi=120)
        plt.close(fig)
        written.append(out / "ablation_bars.png")
    err = [r for r in rows if r.get("errors")]
    if err:
        from arbor_train.scoring.answers import ERROR_CATEGORIES  # stacked in decision order: correct, hedge, misses

        seen = {k for r in err for k in r["errors"]}
        cats = [c for c in ERROR_CATEGORIES if c in seen] + sorted(seen - set(ERROR_CATEGORIES))
        fig, ax = plt.subplots(figsize=(10.5, 1.4 + 0.42 * len(err)))
        left = [0.0] * len(err)
        labels = [f"{label(r)} / {r.get('ablation')} / {r.get('budget')}" + (f" / {_reader_short(r['reader'])}" if r.get("reader") else "")
                  for r in err]
        ys = list(range(len(err)))[::-1]  # first run on top
        for c in cats:
            vals = [r["errors"].get(c, 0) for r in err]
            ax.barh(ys, vals, left=left, label=c.replace("_", " "))
            left = [b + v for b, v in zip(left, vals)]
        ax.set_yticks(ys)
        ax.set_yticklabels(labels, fontsize=8)
        ax.set_xlabel("questions")
        ax.set_title("error categories (method / ablation / budget / reader)")
        ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
        fig.tight_layout()
        fig.savefig(out / "error_categories.png", dpi=120)
        plt.close(fig)
        written.append(out / "error_categories.png")
    if (spec := specificity_plot(rows, out)) is not None:
        written.append(spec)
    if (irc := irc_plot(rows, out)) is not None:
        written.append(irc)
    return written


def _reader_short(name: str) -> str:
    """A short name for the model that answered: "bundle reader" or "SmolLM2-135M-Instruct"."""
    if name.startswith("bundle "):
        return "bundle " + Path(name[len("bundle "):]).name
    return Path(name.split(":", 1)[-1]).name.split(".")[0]


def report(paths: list[str | Path], out: str | Path) -> dict:
    rows = collect(paths)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    md = table(rows)
    if acc := accuracy_table(rows):
        md += "\nAnswer accuracy per dimension and question type, and error categories:\n\n" + acc
    if spec := specificity_table(rows):
        md += "\nPer question specificity (each column names its fields):\n\n" + spec
    if multi := multi_intent_table(rows):
        md += "\nMulti-intent turns and the questions that depend on them:\n\n" + multi
    if cat := category_table(rows):
        md += "\nPer LoCoMo category (evidence recall / answer-token recall):\n\n" + cat
    (out / "table.md").write_text(md)
    (out / "merged.json").write_text(json.dumps(rows, indent=2, sort_keys=True, default=str))
    pics = plots(rows, out)
    print(md)
    for p in pics:
        print(f"wrote {p}")
    return {"rows": rows, "table": md, "plots": [str(p) for p in pics]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="run folders, multirun folders or results.json files")
    ap.add_argument("--out", default="outputs/reports/latest", help="folder for table.md, merged.json and plots")
    a = ap.parse_args()
    report(a.runs, a.out)


if __name__ == "__main__":
    main()
