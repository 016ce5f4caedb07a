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

ROWS = ("heuristic", "untuned", "tuned", "reader")
ROW_LABEL = {"heuristic": "heuristic components (no model)", "untuned": "untuned prompted SmolLM2-135M",
             "tuned": "tuned bundles", "reader": "heuristic components, tuned SmolLM2 reader answering"}
LOC = ("state_localization_every_turn", "state_localization_at_questions")


def _json(p: Path) -> dict | None:
    return json.loads(p.read_text()) if p.exists() else None


def _eval(out: Path, name: str) -> dict | None:
    r = _json(out / name / "results.json")
    return r["results"] if r else None


def _rows_table(rows: dict, col: str, cell) -> list[str]:
    """The heuristic / untuned / tuned rows present, with localization, gold, one extra column, seconds."""
    lines = [f"| runtime | state localization: every turn | at questions | gold in context | {col} | s |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in ROWS:
        if x := rows.get(r):
            lines.append(f"| {ROW_LABEL[r]} | {_f(x.get(LOC[0]))} | {_f(x.get(LOC[1]))} | {_f(x.get('gold_in_context'))} "
                         f"| {cell(x)} | {_f(x.get('seconds'), 0)} |")
    return lines


def verdicts(full: dict, llm: dict) -> list[str]:
    """Does the tuned row beat the heuristic and untuned rows? Measured, metric by metric."""
    lines = []
    checks = [("LLM subset", llm, m) for m in (*LOC, "accuracy")] + [("whole set", full, m) for m in LOC]
    for where, rows, m in checks:
        t = (rows.get("tuned") or {}).get(m)
        others = {r: (rows.get(r) or {}).get(m) for r in ("heuristic", "untuned") if (rows.get(r) or {}).get(m) is not None}
        if t is None or not others:
            continue
        vs = ", ".join(f"{r} {_f(v)}" for r, v in others.items())
        if all(t > v for v in others.values()):
            word = "beats " + ("both" if len(others) == 2 else "it")
        elif all(t >= v for v in others.values()):
            beaten = [r for r, v in others.items() if t > v]
            word = "ties " + " and ".join(r for r, v in others.items() if t == v) + (
                f", beats {' and '.join(beaten)}" if beaten else "")
        else:
            word = "is below " + " and ".join(r for r, v in others.items() if t < v)
        lines.append(f"- {where}, `{m}`: tuned {_f(t)} vs {vs}: **{word}**")
    reader, base = (llm.get("reader") or {}).get("accuracy"), (llm.get("heuristic") or {}).get("accuracy")
    if reader is not None and base is not None:  # same memory and contexts, only the answer model differs
        word = "beats" if reader > base else "ties" if reader == base else "is below"
        lines.append(f"- LLM subset, `accuracy` over the heuristic memory: tuned reader {_f(reader)} vs untuned "
                     f"SmolLM2 {_f(base)}: **{word} it**")
    return lines


def headline_plot(full: dict, llm: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("whole formal set", full, [*LOC, "gold_in_context"]), ("LLM subset", llm, [*LOC, "gold_in_context", "accuracy"])]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4), gridspec_kw={"width_ratios": [3, 4]})
    colors = {"heuristic": "#8c8c8c", "untuned": "#e0a030", "tuned": "#2a7ab0", "reader": "#3a9a5a"}
    for ax, (title, rows, metrics) in zip(axes, panels):
        present = [r for r in ROWS if rows.get(r)]
        w = 0.8 / max(1, len(present))
        for j, r in enumerate(present):
            vals = [rows[r].get(m) or 0.0 for m in metrics]
            xs = [i + j * w for i in range(len(metrics))]
            bars = ax.bar(xs, vals, w, label=ROW_LABEL[r], color=colors[r])
            ax.bar_label(bars, labels=[_f(v, 2) for v in vals], fontsize=7)
        ax.set_xticks([i + w * (len(present) - 1) / 2 for i in range(len(metrics))])
        ax.set_xticklabels([m.replace("state_localization_", "state loc. ").replace("_", " ") for m in metrics], fontsize=8)
        ax.set_ylim(0, 1.1)
        ax.set_title(title)
    axes[1].legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def build(out: Path) -> dict:
    rep = out / "report"
    rep.mkdir(parents=True, exist_ok=True)
    stages = sorted((s for s in (json.loads(p.read_text()) for p in out.glob("*/stage.json")) if s.get("finished")),
                    key=lambda s: s["finished"])
    full = {r: _eval(out, f"eval_full_{r}") for r in ROWS}
    llm = {r: _eval(out, f"eval_llm_{r}") for r in ROWS}
    md = ["# ArborTrain pipeline report", ""]
    try:
        commit = subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True, cwd=Path(__file__).parent,
                                         stderr=subprocess.DEVNULL).strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    md += [f"Pipeline folder `{out}`, git commit `{commit}`, {os.cpu_count()} CPU cores.", ""]

    md += ["## Tuned vs heuristic vs untuned", ""]
    sub = llm.get("tuned") or llm.get("heuristic") or {}
    md += [f"Whole formal set ({(full.get('heuristic') or {}).get('sessions', '—')} sessions, "
           f"{(full.get('heuristic') or {}).get('questions', '—')} questions), no answer model; the tuned row "
           "uses the tuned reranker and tagger with heuristic extractors (no LLM call per turn):", "",
           *_rows_table(full, "context tokens", lambda x: _f(x.get("context_tokens_mean"), 0))]
    md += ["", f"LLM subset: the first {sub.get('sessions', '—')} sessions ({sub.get('questions', '—')} questions) of "
           "the formal set, where every row's models run on every turn and SmolLM2-135M answers (the whole set: "
           "`eval.llm_sessions=null`, about 25x longer on this CPU):", "",
           *_rows_table(llm, "answer accuracy", lambda x: _f(x.get("accuracy")))]
    md += ["", *verdicts(full, llm), ""]
    pic = headline_plot(full, llm, rep / "headline.png")
    md += [f"![tuned vs heuristic vs untuned]({pic.name})", ""]

    md += ["## Training (held-out supervision)", ""]
    trained = {}
    for st in (s for s in stages if s["stage"].startswith("train_")):
        run = out / st["stage"] / "run" / "final"
        res = _json(run / "metrics.json")
        if res and res.get("role"):
            model = OmegaConf.load(run / "config.yaml").model.name
            trained[res["role"]] = res
            md += [*roles.get(res["role"]).report_table(res, model), ""]

    pictures = [pic]
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
    summary = {"full": full, "llm": llm, "train": trained,
               "stages": stages, "verdicts": verdicts(full, llm)}
    (rep / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return {"markdown": text, "pictures": pictures, "summary": summary}


def log_wandb(out: Path, res: dict, project: str) -> None:
    import wandb

    from arbor_train.conversations.io import quiet

    with quiet():
        run = wandb.init(project=project, job_type="pipeline_report", dir=str(out / "report"), name=f"pipeline-{out.name}",
                         mode=os.environ.get("WANDB_MODE", "offline"), reinit="finish_previous")
        for kind, rows in (("full", res["summary"]["full"]), ("llm", res["summary"]["llm"])):
            for r, x in rows.items():
                if x:
                    run.summary.update({f"{kind}/{r}/{k}": v for k, v in x.items() if isinstance(v, (int, float))})
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
