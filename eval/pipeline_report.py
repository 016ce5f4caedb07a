"""python -m eval.pipeline_report out=<pipeline folder>: the pipeline's report (markdown, plots, W&B run).

Reads only what the stages wrote (stage.json, the training runs' final/metrics.json, the evaluation
runs' results.json and the compare sets' tables and plots); nothing in it is typed in by hand.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from omegaconf import OmegaConf

from arbor_train import roles
from arbor_train.roles.common import fmt as _f

HEADLINE = ("runtime", "heuristic", "bm25", "dense", "untuned")
HEADLINE_LABEL = {"runtime": "tuned reader, tuned runtime", "heuristic": "tuned reader, heuristic runtime",
                  "bm25": "tuned reader, BM25", "dense": "tuned reader, dense (MiniLM)",
                  "untuned": "untuned SmolLM2, tuned runtime"}
ROUTING = {"heuristic": ("eval_full_heuristic", "heuristic runtime (no model)"),
           "tuned": ("eval_answer_runtime", "tuned runtime (tuned reranker + tagger, heuristic extractors)")}
LOC = ("state_localization_every_turn", "state_localization_at_questions")


def _json(p: Path) -> dict | None:
    return json.loads(p.read_text()) if p.exists() else None


def _eval(out: Path, name: str) -> dict | None:
    r = _json(out / name / "results.json")
    return r["results"] if r else None


def _correct(out: Path, name: str) -> dict[tuple[str, int], bool] | None:
    """(session, turn) -> answered right, for every answered question of an evaluation stage."""
    f = out / name / "questions.jsonl"
    if not f.exists():
        return None
    recs = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    if not recs or any(r.get("correct") is None for r in recs):
        return None
    return {(r["session_id"], r["turn"]): bool(r["correct"]) for r in recs}


def headline(out: Path) -> list[dict]:
    """Each headline row's accuracy with its Wilson interval, and against the first row (the tuned reader
    over the tuned runtime) the paired difference, its interval and the sign test, on the same questions."""
    from arbor_train.scoring.paired import paired, wilson

    answers = {r: _correct(out, f"eval_answer_{r}") for r in HEADLINE}
    present = [r for r in HEADLINE if answers[r]]
    if not present:
        return []
    ref = present[0]
    keys = sorted(answers[ref])
    rows = []
    for r in present:
        if sorted(answers[r]) != keys:
            raise ValueError(f"eval_answer_{r} answered other questions than eval_answer_{ref}")
        right = [answers[r][k] for k in keys]
        lo, hi = wilson(sum(right), len(right))
        row = {"row": r, "label": HEADLINE_LABEL[r], "questions": len(right), "accuracy": sum(right) / len(right),
               "ci": (lo, hi), "stage": f"eval_answer_{r}"}
        if r != ref:
            cmp = paired([answers[ref][k] for k in keys], right)
            row.update(vs=ref, difference=cmp["difference"], diff_ci=cmp["ci"], ref_only=cmp["a_only"],
                       row_only=cmp["b_only"], sign_test_p=cmp["sign_test_p"])
        rows.append(row)
    return rows


def headline_table(rows: list[dict]) -> list[str]:
    ref = rows[0]["label"]
    lines = [f"| reader, memory | accuracy | 95% CI | {ref}: difference | 95% CI | only it right / only this row right "
             "| sign test p |", "|---|---:|---|---:|---|---:|---:|"]
    for r in rows:
        ci = f"[{_f(r['ci'][0])}, {_f(r['ci'][1])}]"
        if "difference" in r:
            d = f"{r['difference']:+.3f} | [{r['diff_ci'][0]:+.3f}, {r['diff_ci'][1]:+.3f}] | {r['ref_only']} / {r['row_only']} " \
                f"| {r['sign_test_p']:.3g}"
        else:
            d = "— | — | — | —"
        lines.append(f"| {r['label']} | {_f(r['accuracy'])} | {ci} | {d} |")
    return lines


def verdicts(rows: list[dict], routing: dict) -> list[str]:
    """What the headline shows, row by row: a difference counts when its paired interval excludes 0."""
    lines = []
    for r in rows[1:]:
        lo, hi = r["diff_ci"]
        word = ("**beats it**" if lo > 0 else "**is below it**" if hi < 0
                else "**no difference this sample can show** (the interval holds 0)")
        lines.append(f"- {rows[0]['label']} {_f(rows[0]['accuracy'])} against {r['label']} {_f(r['accuracy'])}: "
                     f"{r['difference']:+.3f} [{lo:+.3f}, {hi:+.3f}], sign test p = {r['sign_test_p']:.3g}: {word}")
    h, t = routing.get("heuristic"), routing.get("tuned")
    if h and t:
        for m in (*LOC, "gold_in_context"):
            if h.get(m) is not None and t.get(m) is not None:
                word = "beats" if t[m] > h[m] else "ties" if t[m] == h[m] else "is below"
                lines.append(f"- Routing, `{m}`: tuned runtime {_f(t[m])} against heuristic {_f(h[m])}: **{word} it**")
    return lines


def headline_plot(rows: list[dict], routing: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), gridspec_kw={"width_ratios": [5, 3]})
    ax = axes[0]
    colors = {"runtime": "#2a7ab0", "heuristic": "#8c8c8c", "bm25": "#c05050", "dense": "#e0a030", "untuned": "#7a5ab0"}
    xs = range(len(rows))
    accs = [r["accuracy"] for r in rows]
    err = [[a - r["ci"][0] for a, r in zip(accs, rows)], [r["ci"][1] - a for a, r in zip(accs, rows)]]
    bars = ax.bar(xs, accs, yerr=err, capsize=4, color=[colors[r["row"]] for r in rows])
    ax.bar_label(bars, labels=[_f(a, 2) for a in accs], fontsize=8, padding=8)
    ax.set_xticks(list(xs))
    ax.set_xticklabels([r["label"].replace(", ", "\n") for r in rows], fontsize=8)
    ax.set_ylim(0, 1.0)
    ax.set_ylabel("answer accuracy (95% Wilson interval)")
    ax.set_title(f"every question of the formal set ({rows[0]['questions']})")
    ax = axes[1]
    metrics = [*LOC, "gold_in_context"]
    for j, (k, color) in enumerate((("heuristic", "#8c8c8c"), ("tuned", "#2a7ab0"))):
        if routing.get(k):
            vals = [routing[k].get(m) or 0.0 for m in metrics]
            b = ax.bar([i + j * 0.4 for i in range(len(metrics))], vals, 0.4, label=f"{k} runtime", color=color)
            ax.bar_label(b, labels=[_f(v, 2) for v in vals], fontsize=7)
    ax.set_xticks([i + 0.2 for i in range(len(metrics))])
    ax.set_xticklabels(["routing:\nevery turn", "localization:\nat questions", "gold in\ncontext"], fontsize=8)
    ax.set_ylim(0, 1.2)
    ax.legend(fontsize=8, loc="upper center", ncol=2)
    ax.set_title("routing and retrieval")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def build(out: Path) -> dict:
    rep = out / "report"
    rep.mkdir(parents=True, exist_ok=True)
    stages = sorted((s for s in (json.loads(p.read_text()) for p in out.glob("*/stage.json")) if s.get("finished")),
                    key=lambda s: s["finished"])
    rows = headline(out)
    routing = {k: _eval(out, stage) for k, (stage, _) in ROUTING.items()}
    md = ["# ArborTrain pipeline report", ""]
    try:
        commit = subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True, cwd=Path(__file__).parent,
                                         stderr=subprocess.DEVNULL).strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    md += [f"Pipeline folder `{out}`, git commit `{commit}`, {os.cpu_count()} CPU cores.", ""]
    pictures = []
    if rows:
        budget = (_eval(out, rows[0]["stage"]) or {}).get("budget", "—")
        md += ["## Headline: every question of the formal set, answered", "",
               f"{rows[0]['questions']} questions, each answered by every row from a {budget}-token read; the "
               "difference is paired (the same questions), with Newcombe's 95% interval and the exact sign test "
               "on the questions only one row got right (arbor_train/scoring/paired.py).", "",
               *headline_table(rows), ""]
    md += ["## Routing and retrieval: heuristic vs tuned runtime (whole formal set, no answers needed)", "",
           "| runtime | state localization: every turn | at questions | gold in context | context tokens | s |",
           "|---|---:|---:|---:|---:|---:|"]
    for k, (stage, label) in ROUTING.items():
        if x := routing.get(k):
            md.append(f"| {label} | {_f(x.get(LOC[0]))} | {_f(x.get(LOC[1]))} | {_f(x.get('gold_in_context'))} | "
                      f"{_f(x.get('context_tokens_mean'), 0)} | {_f(x.get('seconds'), 0)} |")
    # the published part (python -m eval.compare table=main_job copies it into the docs): both tables
    routing_lines = md[md.index("## Routing and retrieval: heuristic vs tuned runtime (whole formal set, no answers needed)") + 2:]
    (rep / "headline.md").write_text("\n".join([*(headline_table(rows) if rows else []), "", *routing_lines]).strip() + "\n")
    md += ["", *verdicts(rows, routing), ""]
    if rows:
        pic = headline_plot(rows, routing, rep / "headline.png")
        pictures.append(pic)
        md += [f"![headline]({pic.name})", ""]

    md += ["## Training (held-out supervision)", ""]
    trained = {}
    for st in (s for s in stages if s["stage"].startswith("train_")):
        run = out / st["stage"] / "run" / "final"
        res = _json(run / "metrics.json")
        if res and res.get("role"):
            model = OmegaConf.load(run / "config.yaml").model.name
            trained[res["role"]] = res
            md += [*roles.get(res["role"]).report_table(res, model), ""]

    for s in ("methods", "ablations", "budgets"):
        d = out / f"eval_{s}"
        if (d / "table.md").exists():
            md += [f"## `eval.compare {s}` (heuristic components, whole formal set)", "", (d / "table.md").read_text(), ""]
            for png in sorted(d.glob("*.png")):
                shutil.copy(png, rep / f"{s}_{png.name}")
                pictures.append(rep / f"{s}_{png.name}")
                md += [f"![{s} {png.stem}]({s}_{png.name})", ""]

    md += ["## Stages (each number above comes from one of these commands)", "",
           "| stage | what | wall s | command |", "|---|---|---:|---|"]
    for s in stages:
        md.append(f"| {s['stage']} | {s.get('what', '')} | {s['wall_s']} | `{s['command']}` |")
    total = sum(s["wall_s"] for s in stages)
    md += ["", f"Sum of stage wall times: {total:.0f} s ({total / 60:.1f} min).", ""]
    text = "\n".join(md)
    (rep / "report.md").write_text(text)
    summary = {"headline": rows, "routing": routing, "train": trained, "stages": stages,
               "verdicts": verdicts(rows, routing)}
    (rep / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return {"markdown": text, "pictures": pictures, "summary": summary}


def log_wandb(out: Path, res: dict, project: str) -> None:
    import wandb

    from arbor_train.conversations.io import quiet

    with quiet():
        run = wandb.init(project=project, job_type="pipeline_report", dir=str(out / "report"), name=f"pipeline-{out.name}",
                         mode=os.environ.get("WANDB_MODE", "offline"), reinit="finish_previous")
        for r in res["summary"]["headline"]:
            run.summary.update({f"headline/{r['row']}/{k}": v for k, v in r.items() if isinstance(v, (int, float))})
        for r, x in res["summary"]["routing"].items():
            if x:
                run.summary.update({f"routing/{r}/{k}": v for k, v in x.items() if isinstance(v, (int, float))})
        run.log({p.stem: wandb.Image(str(p)) for p in res["pictures"]})
        run.log({"report": wandb.Html(f"<pre>{res['markdown']}</pre>")})
        run.finish()


def main() -> None:
    c = OmegaConf.merge(OmegaConf.create({"out": None, "wandb": {"enabled": True, "project": "arbortrain"}}),
                        OmegaConf.from_cli(sys.argv[1:]))
    if not c.out:
        sys.exit("usage: python -m eval.pipeline_report out=<pipeline folder> [wandb.enabled=false]")
    out = Path(c.out)
    if not out.is_dir():
        sys.exit(f"option out={out}: no such pipeline folder")
    res = build(out)
    if c.wandb.enabled:
        log_wandb(out, res, c.wandb.project)
    print(res["markdown"])
    print(f"wrote {out / 'report' / 'report.md'}")


if __name__ == "__main__":
    main()
