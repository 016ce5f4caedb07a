"""python -m eval.pipeline [overrides]: the whole loop, one command.

generate (formal, train, heldout) -> LoRA-tune reranker, tagger, extractor -> export three bundles ->
evaluate on `formal`: baselines and ablations (heuristic components, whole set); heuristic vs tuned
routers (whole set); heuristic vs untuned prompted small model vs tuned bundles with answers (the LLM
subset) -> report (markdown, plots, an offline W&B run).

Every stage is one command, printed before it runs and kept in `<out>/<stage>/stage.json`, so any number
in the report can be reproduced by pasting it. A stage is skipped when its `stage.json` records the same
fingerprint (its command and its inputs' fingerprints) and a clean finish; training stages write
checkpoints into a fixed run dir, so an interrupted pipeline continues from them. Stages run as
subprocesses: memory is returned between stages and a training stage can go to SLURM
(`train.launcher="sbatch --wait ... slurm/train.sbatch"`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from arbor_train import roles
from arbor_train.errors import ConfigError, UserError, conf_options, entry_point, parse_bool, parse_choice, parse_int
from arbor_train.paths import CONF_DIR, REPO_ROOT

FINGERPRINT_VERSION = 1
EXIT_USER_ERROR = 2
HEADLINE_ROWS = ("runtime", "heuristic", "bm25", "dense", "untuned")
HEADLINE_WHAT = {
    "runtime": "tuned reader over the tuned runtime's context (tuned reranker + tagger), whole formal set",
    "heuristic": "tuned reader over the heuristic runtime's context, whole formal set",
    "bm25": "tuned reader over BM25's context, whole formal set",
    "dense": "tuned reader over the dense (MiniLM) baseline's context, whole formal set",
    "untuned": "untuned SmolLM2 reader over the tuned runtime's context, whole formal set",
}


class StageError(RuntimeError):
    """The pipeline cannot go on: an option naming no stage (StageConfigError), or a stage that failed."""


class StageConfigError(StageError, ConfigError):
    """An option of the pipeline that cannot work (a user error: `error: ...`, exit 2)."""


class StageUserError(StageError, UserError):
    """A stage refused its options or input (it exited 2): the pipeline passes the user error on (exit 2)."""


def check_options(c: dict) -> None:
    """The pipeline's own options, checked before any stage is planned or run (a string such as
    echo=maybe is refused, naming the option); stage options are checked by the stage commands."""
    for key in ("only", "force"):
        if not isinstance(c[key], list) or not all(isinstance(n, str) for n in c[key]):
            raise StageConfigError(f"option {key} must be a list of stage names, got {c[key]!r}")
    c["echo"] = parse_bool(c["echo"], "echo")
    c["wandb"]["enabled"] = parse_bool(c["wandb"]["enabled"], "wandb.enabled")
    d = c["data"]
    d["workers"] = parse_int(d["workers"], "data.workers", minimum=1)
    for name, node in d.items():
        if name == "workers":
            continue
        if not isinstance(node, dict) or "preset" not in node or "seed" not in node:
            raise StageConfigError(f"option data.{name} must be {{preset: <conf/preset>, seed: <int>}}, got {node!r}")
        node["seed"] = parse_int(node["seed"], f"data.{name}.seed")
    if not isinstance(c["train"], dict):
        raise StageConfigError(f"option train must map roles to {{experiment, overrides, launcher}}, got {c['train']!r}")
    for role, t in c["train"].items():
        if role == "launcher":
            continue
        if not isinstance(t, dict) or not isinstance(t.get("experiment"), str):
            raise StageConfigError(f"option train.{role}.experiment must name a conf/experiment file, got {t!r}")
        parse_choice(t["experiment"], f"train.{role}.experiment", conf_options("experiment"))
        if not isinstance(t.get("overrides", []), list):
            raise StageConfigError(f"option train.{role}.overrides must be a list of overrides, got {t['overrides']!r}")
    rd = c["reader_data"]
    if not isinstance(rd.get("budgets"), list) or not rd["budgets"]:
        raise StageConfigError(f"option reader_data.budgets must be a non-empty list of read budgets, got {rd.get('budgets')!r}")
    for split in ("train", "heldout"):
        parse_int(rd["max_sessions"][split], f"reader_data.max_sessions.{split}", minimum=1)
    parse_int(rd["settings_per_session"], "reader_data.settings_per_session", minimum=1)
    e = c["eval"]
    e["budget"] = parse_int(e["budget"], "eval.budget", minimum=1)
    from eval.compare import SETS

    if not isinstance(e["sets"], list):
        raise StageConfigError(f"option eval.sets must be a list of eval.compare sets, got {e['sets']!r}")
    for k, name in enumerate(e["sets"]):
        parse_choice(name, f"eval.sets[{k}]", sorted(SETS))
    parse_choice(e["answer_model"], "eval.answer_model", conf_options("answer_model"))
    for key in ("tuned_runtime", "answer_overrides", "headline"):
        if not isinstance(e[key], list):
            raise StageConfigError(f"option eval.{key} must be a list, got {e[key]!r}")
    for k, name in enumerate(e["headline"]):
        parse_choice(name, f"eval.headline[{k}]", HEADLINE_ROWS)
    from arbor_train.runtime.config import check_overrides

    check_overrides(e["tuned_runtime"], "eval.tuned_runtime")


@dataclass
class Stage:
    name: str
    argv: list[str]
    deps: list[str] = field(default_factory=list)
    what: str = ""

    def command(self) -> str:
        return shlex.join(self.argv)


def _data_dirs(role: str) -> tuple[str, str]:
    """The stages whose folders a role trains and validates on: the generated sets, or (a role whose
    supervision the runtime assembles, the reader) the reader sets built from them."""
    return ("data_reader_train", "data_reader_heldout") if roles.get(role).supervision == "reader" else (
        "data_train", "data_heldout")


def _train_argv(c: dict, py: list[str], role: str, out: Path) -> list[str]:
    t = c["train"][role]
    tr, va = _data_dirs(role)
    args = [f"experiment={t['experiment']}", f"data.train_dir={out / tr}",
            f"data.val_dir={out / va}", f"run_dir={out / f'train_{role}' / 'run'}", *t["overrides"]]
    launcher = t.get("launcher") or c["train"]["launcher"]
    prefix = shlex.split(launcher) if launcher else [*py, "-m", "arbor_train.train"]
    return [*prefix, *args]


def train_roles(c: dict) -> dict[str, dict]:
    """role -> the `task` node its experiment trains (composed as the training stage will compose it), for
    every role under `train:` (the keys other than `launcher`), in order."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from arbor_train.runtime.config import compose

    out = {}
    for role, t in c["train"].items():
        if role == "launcher":
            continue
        try:
            roles.get(role)  # a known role, or a clear error naming it
        except ConfigError as e:
            raise StageConfigError(f"option train.{role}: {e}") from e
        try:
            cfg = compose("train", [f"experiment={t['experiment']}", *t["overrides"]])
            out[role] = OmegaConf.to_container(cfg.task, resolve=True)
        except (HydraException, OmegaConfBaseException) as e:
            raise StageConfigError(f"option train.{role} (experiment={t['experiment']}, overrides={t['overrides']}): "
                                   f"{e}") from e
        if out[role]["role"] != role:
            raise StageConfigError(f"option train.{role}.experiment={t['experiment']} trains role "
                                   f"{out[role]['role']!r}, not {role!r}")
    return out


def plan(c: dict) -> list[Stage]:
    """The stages, in order, with their commands (all paths absolute)."""
    out = Path(c["out"]).resolve()
    py = [c["python"] or sys.executable]
    stages: list[Stage] = []
    for name, d in c["data"].items():
        if name == "workers":
            continue
        stages.append(Stage(f"data_{name}", [*py, "-m", "data_gen.branchmem", f"preset={d['preset']}",
                                             f"seed={d['seed']}", f"out_dir={out / f'data_{name}'}",
                                             "overwrite=true", f"workers={c['data']['workers']}"],
                            what=f"BranchMemEval-style `{d['preset']}` set, seed {d['seed']}"))
    trained = train_roles(c)
    if any(roles.get(r).supervision == "reader" for r in trained):
        rd = c["reader_data"]
        for split, src in (("train", "data_train"), ("heldout", "data_heldout")):
            stages.append(Stage(f"data_reader_{split}", [
                *py, "-m", "data_gen.reader", f"data_dir={out / src}", f"out_dir={out / f'data_reader_{split}'}",
                _list("exclude", [str(out / "data_formal")]), f"max_sessions={rd['max_sessions'][split]}",
                "budgets=[" + ",".join(str(b) for b in rd["budgets"]) + "]", f"settings_per_session={rd['settings_per_session']}",
                "overwrite=true"], [src, "data_formal"],
                what=f"reader contexts assembled by the runtime over `{src}` (formal sessions left out)"))
    for role in trained:
        stages.append(Stage(f"train_{role}", _train_argv(c, py, role, out), list(_data_dirs(role)),
                            what=f"LoRA {role} (`experiment={c['train'][role]['experiment']}`)"))
        stages.append(Stage(f"export_{role}", [*py, "-m", "arbor_train.export",
                                               f"run_dir={out / f'train_{role}' / 'run'}",
                                               f"out={out / 'bundles' / role}", "overwrite=true"],
                            [f"train_{role}"], what=f"{role} bundle"))
    e = c["eval"]
    formal = out / "data_formal"
    common = [f"data_dir={formal}", f"budget={e['budget']}", f"wandb.project={c['wandb']['project']}"]
    bundles = out / "bundles"
    # the bundles the tuned runtime loads: every trained role's plug overrides, but those under a key that
    # eval.tuned_runtime sets itself (runtime.extractors.states=heuristic keeps the extractor out)
    fixed = [o.split("=", 1)[0] + "." for o in e["tuned_runtime"] if o.startswith("runtime.")]
    plugged = {role: [o for o in roles.get(role).plug_overrides(bundles / role, task)
                      if not any(o.startswith(k) for k in fixed)] for role, task in trained.items()}
    tuned_paths = [o for ov in plugged.values() for o in ov]
    exports = [f"export_{role}" for role, ov in plugged.items() if ov]
    for s in e["sets"]:
        stages.append(Stage(f"eval_{s}", [*py, "-m", "eval.compare", s, *common, "--out", str(out / f"eval_{s}")],
                            ["data_formal"], what=f"`{s}` with heuristic components, whole formal set"))
    # whole set, no answers: routing and retrieval of the heuristic runtime (the tuned runtime's are in its
    # headline row, which replays the same set)
    stages.append(Stage("eval_full_heuristic", [*py, "-m", "eval.run", *common, f"run_dir={out / 'eval_full_heuristic'}"],
                        ["data_formal"], what="heuristic runtime, whole formal set"))
    # the headline: answers to every question of the formal set, the same questions for every row
    reader = next((r for r in trained if roles.get(r).supervision == "reader"), None)
    tuned_reader = ([*roles.get(reader).answer_overrides(bundles / reader), *e["answer_overrides"]], [f"export_{reader}"]) \
        if reader else None
    untuned_reader = ([f"answer_model={e['answer_model']}", *e["answer_overrides"]], [])
    tuned_rt = [*e["tuned_runtime"], *tuned_paths]
    rows = {  # row -> (memory overrides, its deps, the answer model)
        "runtime": (["method=arbormem", *tuned_rt], exports, tuned_reader),
        "heuristic": (["method=arbormem"], [], tuned_reader),
        "bm25": (["method=bm25"], [], tuned_reader),
        "dense": (["method=dense", "runtime/components=minilm"], [], tuned_reader),
        "untuned": (["method=arbormem", *tuned_rt], exports, untuned_reader),
    }
    for row in e["headline"]:
        memory, deps, ans = rows[row]
        if ans is None:  # no reader role trained: only the untuned reader's row can run
            continue
        stages.append(Stage(f"eval_answer_{row}", [*py, "-m", "eval.run", *common, *memory, *ans[0],
                                                   f"run_dir={out / f'eval_answer_{row}'}"],
                            ["data_formal", *deps, *ans[1]], what=HEADLINE_WHAT[row]))
    evals = [s.name for s in stages if s.name.startswith("eval_")]
    stages.append(Stage("report", [*py, "-m", "eval.pipeline_report", f"out={out}",
                                   f"wandb.enabled={c['wandb']['enabled']}", f"wandb.project={c['wandb']['project']}"],
                        [*(f"export_{role}" for role in trained), *evals, *(f"train_{role}" for role in trained)],
                        what="report.md, plots, W&B run"))
    return stages


def _list(key: str, items: list[str]) -> str:
    return f"{key}=[" + ",".join(f'"{i}"' for i in items) + "]"


def fingerprint(stage: Stage, upstream: dict[str, str]) -> str:
    """The stage's command (less the interpreter path) and the identity of the outputs it reads: each
    dependency's fingerprint and finish time, so a redone upstream stage makes its users stale."""
    blob = json.dumps({"v": FINGERPRINT_VERSION, "argv": stage.argv[1:], "deps": {d: upstream.get(d) for d in stage.deps}},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _state(out: Path, name: str) -> dict | None:
    f = out / name / "stage.json"
    try:
        return json.loads(f.read_text()) if f.exists() else None
    except json.JSONDecodeError:
        return None


def _run(stage: Stage, log: Path, echo: bool, env: dict) -> int:
    """Run the stage's command; its output goes to `log` and, with echo, to the terminal as it comes."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as f:
        f.write(f"\n$ {stage.command()}\n".encode())
        proc = subprocess.Popen(stage.argv, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert proc.stdout is not None
        while chunk := proc.stdout.read1(8192):
            f.write(chunk)
            f.flush()
            if echo:
                sys.stdout.buffer.write(chunk)
                sys.stdout.flush()
        return proc.wait()


def run_stages(stages: list[Stage], out: Path, only: list[str], force: list[str], echo: bool, env: dict,
               label: str = "pipeline", rerun: str = "python -m eval.pipeline") -> dict:
    """Run planned stages in order under `out`, skipping each whose stage.json records the same
    fingerprint and a clean finish (`only`: run just these, reuse the others; `force`: redo these, or
    [all]). Returns {out, total_s, stages: per-stage timings}; a failed stage raises StageError."""
    names = [s.name for s in stages]
    for key, chosen in (("only", only), ("force", force)):
        bad = [n for n in chosen if n not in names and n != "all"]
        if bad:
            raise StageConfigError(f"option {key}={bad}: unknown stage(s); stages are {', '.join(names)}")
    out.mkdir(parents=True, exist_ok=True)
    fps: dict[str, str] = {}
    timings: list[dict] = []
    t_all = time.perf_counter()
    print(f"[{label}] {len(stages)} stages -> {out}", flush=True)
    for i, st in enumerate(stages, 1):
        fp = fingerprint(st, fps)
        prev = _state(out, st.name)
        done = prev is not None and prev.get("fingerprint") == fp and prev.get("returncode") == 0
        forced = st.name in force or "all" in force
        skip = (done and not forced) or (only and st.name not in only)
        if skip:
            if not done:
                raise StageConfigError(f"option only={only}: stage {st.name} has no finished output matching "
                                       f"this configuration; run it (drop it from only=...) first")
            print(f"[{label} {i}/{len(stages)}] {st.name}: up to date (fingerprint {fp}, "
                  f"{prev['wall_s']:.1f}s when it ran), skipped", flush=True)
            timings.append({"stage": st.name, "wall_s": 0.0, "skipped": True, "ran_s": prev["wall_s"],
                            "command": st.command(), "what": st.what})
            fps[st.name] = f"{fp}@{prev['finished']}"
            continue
        print(f"[{label} {i}/{len(stages)}] {st.name}: {st.what}\n  $ {st.command()}", flush=True)
        stage_dir = out / st.name
        if prev is not None and (prev.get("fingerprint") != fp or forced) and (stage_dir / "run").exists():
            shutil.rmtree(stage_dir / "run")  # another configuration's checkpoints: start fresh, not resume
        stage_dir.mkdir(parents=True, exist_ok=True)
        # written before the command runs: an interrupted stage keeps its run dir and resumes next time
        (stage_dir / "stage.json").write_text(json.dumps({"stage": st.name, "fingerprint": fp, "command": st.command(),
                                                          "returncode": None, "wall_s": None}, indent=2))
        t0 = time.perf_counter()
        rc = _run(st, out / "logs" / f"{st.name}.log", echo, env)
        wall = time.perf_counter() - t0
        finished = time.strftime("%Y-%m-%dT%H:%M:%S") + f".{time.time_ns() % 10**9:09d}"
        record = {"stage": st.name, "fingerprint": fp, "command": st.command(), "argv": st.argv, "what": st.what,
                  "returncode": rc, "wall_s": round(wall, 1), "finished": finished}
        (stage_dir / "stage.json").write_text(json.dumps(record, indent=2))
        fps[st.name] = f"{fp}@{record['finished']}"
        if rc != 0:
            tail = (out / "logs" / f"{st.name}.log").read_text(errors="replace").splitlines()[-25:]
            # exit 2: the stage refused its options or input (a user error, passed on); else it crashed
            cls = StageUserError if rc == EXIT_USER_ERROR else StageError
            raise cls(f"stage {st.name} failed (exit {rc}); log {out / 'logs' / (st.name + '.log')}:\n"
                      + "\n".join(tail) + f"\nrerun: {rerun} (finished stages are kept)")
        print(f"[{label} {i}/{len(stages)}] {st.name}: done in {wall:.1f}s", flush=True)
        timings.append({"stage": st.name, "wall_s": round(wall, 1), "skipped": False, "command": st.command(),
                        "what": st.what})
    total = time.perf_counter() - t_all
    summary = {"out": str(out), "total_s": round(total, 1), "stages": timings}
    (out / "timings.json").write_text(json.dumps(summary, indent=2))
    print(f"\n[{label}] wall time per stage")
    for t in timings:
        print(f"  {t['stage']:<22} " + ("skipped" if t["skipped"] else f"{t['wall_s']:8.1f}s"))
    print(f"  {'total':<22} {total:8.1f}s", flush=True)
    return summary


def run_pipeline(cfg: DictConfig | dict) -> dict:
    c = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else cfg
    check_options(c)
    out = Path(c["out"]).resolve()
    env = dict(os.environ, PYTHONUNBUFFERED="1", WANDB_MODE=os.environ.get("WANDB_MODE", c["wandb"]["mode"]),
               ARBOR_OUTPUT_ROOT=os.environ.get("ARBOR_OUTPUT_ROOT", str(out.parent)))
    summary = run_stages(plan(c), out, c["only"], c["force"], c["echo"], env)
    print(f"[pipeline] report: {out / 'report' / 'report.md'}", flush=True)
    return summary


@hydra.main(config_path=str(CONF_DIR), config_name="pipeline", version_base="1.3")
@entry_point
def main(cfg: DictConfig) -> None:
    """A user error (a pipeline option, or a stage that refused its own: exit 2) is an `error:` line and exit
    2 (entry_point); a stage that crashed is reported with its log's tail and exit 1."""
    exit_on_stage_error(run_pipeline, cfg, "pipeline")


def exit_on_stage_error(fn, cfg, label: str) -> None:
    """Run a staged command: a stage that crashed is its log's tail and exit 1; a user error passes on
    (entry_point prints it as one `error:` line, exit 2)."""
    try:
        fn(cfg)
    except StageError as e:
        if isinstance(e, UserError):
            raise
        print(f"[{label}] {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
