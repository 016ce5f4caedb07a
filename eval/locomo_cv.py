"""python -m eval.locomo_cv [overrides]: LoCoMo cross-validation of the learned memory, one command, one table.

The conversations of `input` are split into `folds` folds (ids sorted, contiguous: 8 conversations give
4 folds of 2). For each fold, as printed commands (stages, skipped when already done; see
eval.pipeline.run_stages):

1. `router_f<k>` / `export_router_f<k>`: the question router (`router.experiment`), trained on the LoCoMo
   question-localization rows of the *other* folds' conversations (its `data.mix[router.locomo_mix]`
   source, pointed at `supervision`, with `exclude_sessions` = this fold) mixed with BranchMemEval. The
   bundle lists the LoCoMo conversations it saw, and eval.run refuses to score it on them.
2. `train_f<k>` / `export_f<k>` (when `tuned_kinds` or the tuned fact extractor need it): the extractor
   adapter for every kind (`extractor.experiment`), trained on BranchMemEval gold plus the other folds'
   LoCoMo observations (facts), likewise excluded and checked.
3. `facts_<extractor>_f<k>`: the fact extractor against the held-out conversations' observations
   (eval.extraction): heuristic, untuned prompted (first `facts_untuned_interactions` of each
   conversation: a CPU budget), tuned; and, for a distillation of LoCoMo (`distilled`: the out_dir of
   `python -m data_gen.distill input_format=locomo roles=[facts]`), the teacher's own labels
   (`teacher`: eval.extraction extractor=recorded) and the student distilled from them (`distilled`:
   `train_d_f<k>` / `export_d_f<k>`, the tuned adapter's recipe with the teacher's facts of the other
   folds' conversations in place of the observations). `facts_max_interactions` caps every fact
   evaluation at the first N interactions of each held-out conversation.
4. `eval_f<k>`: every row of `rows` and every ablation of the localized runtime (`ablations`) at every
   budget of `budgets` on the held-out conversations (one eval.compare grid process, so a cross-encoder
   scores each question-state pair once across budgets).
5. `reader_f<k>` / `export_reader_f<k>` and `answers_f<k>`: the reader (`reader.experiment`, SmolLM2-135M +
   LoRA) trained on the `reader` rows of `supervision` (the runtime's contexts of each question, the gold
   answer the target) of every conversation but the fold's; then each row of `answers.rows` is read at
   `answers.budget` on the held-out conversations and answered by that reader and by the untuned
   SmolLM2-135M (`answers.readers`), scored with LoCoMo F1 per category.

The reranker and tagger bundles of the "today" row (`reranker_bundle`, `tagger_bundle`) are trained on
BranchMemEval only, so they hold no LoCoMo text and serve every fold. The merged table (`<out>/table.md`,
`merged.json`, plots) gives, per row and budget, the mean over folds and each fold's value, for evidence
recall and answer-token recall, per LoCoMo category, question localization (an evidence state at 1, in
the top 5, among the recalled candidates), and the cost (read p95); and LoCoMo F1 per reader, row and
category.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from arbor_train.errors import (
    ConfigError,
    MissingInputError,
    conf_options,
    entry_point,
    parse_bool,
    parse_choice,
    parse_int,
)
from arbor_train.paths import CONF_DIR

# row name -> eval.run overrides ({tuned}: the overrides that plug the main job's reranker, the tagger and the
# fold's extraction in; {router}: the same with the fold's question router; both filled per fold)
ROWS = {
    # the runtime with the fold's router, read through the states it localizes (read policy cross_session)
    "localized": "method=arbormem runtime/components=tuned_every_kind runtime/read_policy=cross_session {router}",
    # the runtime before issue #40: BranchMemEval reranker, read policy cross_session_v1
    "today": "method=arbormem runtime/components=tuned_every_kind runtime/read_policy=cross_session_v1 {tuned}",
    "heuristic": "method=arbormem runtime/read_policy=cross_session_v1",
    # the conversation is extracted ahead in batches (LoCoMo builds memory once)
    "untuned": "method=arbormem runtime/components=untuned_smollm2 runtime/read_policy=cross_session_v1 "
               "runtime.extractors.states.llm.batch_size=16",
    "bm25": "method=bm25",
    "dense": "method=dense runtime/components=minilm",
    "hybrid": "method=hybrid runtime/components=minilm",
    # the same baselines with the relative dates written out, as the localized runtime's turn layers do
    "bm25_dates": "method=bm25 runtime.context.resolve_dates=true",
    "hybrid_dates": "method=hybrid runtime/components=minilm runtime.context.resolve_dates=true",
    "fact_store": "method=fact_store runtime/components=tuned_every_kind runtime/read_policy=cross_session {tuned}",
    "full_context": "method=full_context",
}
ROUTED = ("localized",)  # rows that need the fold's router
BUNDLED = ("localized", "today", "fact_store")  # rows that need the reranker and tagger bundles
ABLATIONS = ("state_localization", "localized_states", "routing", "atomic_facts", "structured_extraction",
             "structured_evidence")
MEASURES = ("evidence_recall", "answer_token_recall")
LOCALIZATION = ("localization_at_1", "localization_at_5", "evidence_in_candidates")
FACT_EXTRACTORS = ("heuristic", "untuned", "tuned", "teacher", "distilled")
READERS = ("tuned", "untuned")  # the fold's reader; the prompted SmolLM2-135M (the floor)


def split_folds(ids: list[str], k: int) -> list[list[str]]:
    """Sorted ids (numerically where they are numbers) in k contiguous folds whose sizes differ by at most 1."""
    ids = sorted(ids, key=lambda x: (0, int(x), x) if x.isdigit() else (1, 0, x))
    n, r = divmod(len(ids), k)
    out, i = [], 0
    for f in range(k):
        size = n + (1 if f < r else 0)
        out.append(ids[i : i + size])
        i += size
    return out


def check_options(c: dict) -> None:
    for key in ("only", "force"):
        if not isinstance(c[key], list) or not all(isinstance(n, str) for n in c[key]):
            raise ConfigError(f"option {key} must be a list of stage names, got {c[key]!r}")
    c["echo"] = parse_bool(c["echo"], "echo")
    c["folds"] = parse_int(c["folds"], "folds", minimum=2)
    if c.get("run_folds") is not None:
        if not isinstance(c["run_folds"], list) or not c["run_folds"]:
            raise ConfigError(f"option run_folds must be null or a non-empty list of fold numbers, got {c['run_folds']!r}")
        c["run_folds"] = [parse_int(k, f"run_folds[{i}]", minimum=0) for i, k in enumerate(c["run_folds"])]
        bad = [k for k in c["run_folds"] if k >= c["folds"]]
        if bad:
            raise ConfigError(f"option run_folds: {bad} not below folds={c['folds']} (folds are numbered from 0)")
    if not isinstance(c["budgets"], list) or not c["budgets"]:
        raise ConfigError(f"option budgets must be a non-empty list of read budgets, got {c['budgets']!r}")
    c["budgets"] = [parse_int(b, f"budgets[{i}]", minimum=1) for i, b in enumerate(c["budgets"])]
    c["facts_untuned_interactions"] = parse_int(c["facts_untuned_interactions"], "facts_untuned_interactions", minimum=1)
    if c.get("facts_max_interactions") is not None:
        c["facts_max_interactions"] = parse_int(c["facts_max_interactions"], "facts_max_interactions", minimum=1)
    for key, known in (("rows", ROWS), ("ablations", ABLATIONS), ("fact_extractors", FACT_EXTRACTORS),
                       ("tuned_kinds", ("summary", "entities", "facts", "states", "artifacts", "events"))):
        for i, x in enumerate(listed(c[key], key)):
            parse_choice(x, f"{key}[{i}]", tuple(known))
    check_trainer(c, "extractor")
    if {"teacher", "distilled"} & set(c["fact_extractors"]) and not (Path(str(c["distilled"])) / "stats.json").exists():
        raise MissingInputError(f"option distilled={c['distilled']!r}: no finished distillation there (python -m "
                                "data_gen.distill input=<LoCoMo files> input_format=locomo 'roles=[facts]' teacher=... "
                                f"out_dir={c['distilled']})")
    for key in ("input", "supervision"):
        if not Path(str(c[key])).exists():
            hint = " (run python -m data_gen.locomo input=<LoCoMo files> first)" if key == "supervision" else ""
            raise MissingInputError(f"option {key}={c[key]!r}: no such file or folder{hint}")
    check_answers(c)
    check_trainer(c, "router")
    c["router"]["locomo_mix"] = parse_int(c["router"]["locomo_mix"], "router.locomo_mix", minimum=0)
    rows = [*c["rows"], *answered(c)]
    needs = {"reranker_bundle": any(r in BUNDLED and r not in ROUTED for r in rows),
             "tagger_bundle": c["tagger_bundle"] is not None and (any(r in BUNDLED for r in rows) or c["ablations"])}
    for key in ("reranker_bundle", "tagger_bundle"):
        if needs[key] and not (Path(str(c[key])) / "manifest.json").exists():
            raise MissingInputError(f"option {key}={c[key]!r}: no bundle there (python -m arbor_train.export; the "
                                    f"main job writes outputs/pipeline/bundles/{key.split('_')[0]})")
    if any(r in ROUTED for r in rows) or c["ablations"]:
        check_supervision(Path(str(c["supervision"])))
    if answered(c) and "tuned" in c["answers"]["readers"]:
        f = Path(str(c["supervision"])) / "jsonl" / "reader.jsonl"
        if not f.exists() or f.stat().st_size == 0:
            raise MissingInputError(f"option supervision={c['supervision']!r}: no reader rows (jsonl/reader.jsonl) to "
                                    f"tune the fold's reader on; make it again: {SUPERVISION_HINT} (reader_budgets is "
                                    "on by default), or set answers.readers=[untuned]")


def listed(value, option: str, what: str = "a list") -> list:
    """`value` itself when it is a list; otherwise a ConfigError naming the option."""
    if not isinstance(value, list):
        raise ConfigError(f"option {option} must be {what}, got {value!r}")
    return value


def check_trainer(c: dict, key: str) -> None:
    """A model the CV trains per fold (`router`, `extractor`, `reader`): a shipped experiment, a list of overrides."""
    parse_choice(c[key]["experiment"], f"{key}.experiment", conf_options("experiment"))
    listed(c[key].get("overrides", []), f"{key}.overrides", "a list of overrides")


def answered(c: dict) -> list[str]:
    """The rows whose contexts are answered (none without a reader)."""
    return list(c["answers"]["rows"]) if c["answers"]["readers"] else []


def check_answers(c: dict) -> None:
    a = c["answers"]
    for key, known in (("rows", ROWS), ("readers", READERS), ("overrides", ())):
        for i, x in enumerate(listed(a.get(key), f"answers.{key}")):
            if known:
                parse_choice(x, f"answers.{key}[{i}]", tuple(known))
    a["budget"] = parse_int(a["budget"], "answers.budget", minimum=1)
    if a.get("max_questions") is not None:
        a["max_questions"] = parse_int(a["max_questions"], "answers.max_questions", minimum=1)
    if "tuned" in a["readers"] and a["rows"]:
        check_trainer(c, "reader")


def check_supervision(sup: Path) -> None:
    """The LoCoMo question-localization rows carry each candidate's own turn (what the router reads of a
    question's candidate): sets written before that option must be made again."""
    f = sup / "jsonl" / "localization.jsonl"
    if not f.exists():
        raise MissingInputError(f"option supervision={str(sup)!r}: no jsonl/localization.jsonl ({SUPERVISION_HINT})")
    with f.open(encoding="utf-8") as fh:
        first = json.loads(fh.readline() or "{}")
    if not any("state_text" in cand for cand in first.get("candidates", [])):
        raise MissingInputError(f"{f}: the candidates carry no state_text (written before question documents, or with "
                                f"a narrow recall); make it again: {SUPERVISION_HINT}")


SUPERVISION_HINT = ("python -m data_gen.locomo input=<LoCoMo files> out_dir=<supervision> overwrite=true "
                    "runtime/components=minilm runtime.reranker.kind=heuristic runtime/read_policy=cross_session")


def locomo_mix_index(c: dict) -> int:
    """The `data.mix` source of the router experiment that the CV points at `supervision` (`router.locomo_mix`),
    checked against the experiment itself, so the fold's exclusion lands on the LoCoMo questions."""
    from arbor_train.runtime.config import compose  # (under `python -m eval.locomo_cv`, Hydra is initialized)

    cfg = compose("train", [f"experiment={c['router']['experiment']}", *c["router"].get("overrides", [])])
    mix = OmegaConf.to_container(cfg.data, resolve=True).get("mix") or []
    at = c["router"]["locomo_mix"]
    if not 0 <= at < len(mix) or "localization" not in (mix[at].get("sets") or []):
        raise ConfigError(f"option router.locomo_mix={at}: experiment {c['router']['experiment']} has no data.mix "
                          f"source {at} with the localization set (its sources: "
                          f"{[(m.get('dir'), m.get('sets')) for m in mix]})")
    return at


def _list(items: list[str]) -> str:
    return "[" + ",".join(f'"{i}"' for i in items) + "]"


def tuned_overrides(c: dict, bundle: Path, reranker: Path | None = None) -> str:
    """The runtime overrides that plug the fold's bundles in, space-separated (eval.compare --row tokens):
    the reranker (`reranker`, else the main job's), the tagger, and the fold's extractor for `tuned_kinds`."""
    kinds = set(c["tuned_kinds"])
    ov = [f"runtime.reranker.bundle.path={Path(reranker or c['reranker_bundle']).resolve()}",
          f"runtime.tagger.bundle.path={Path(c['tagger_bundle']).resolve()}" if c["tagger_bundle"] is not None
          else "runtime.tagger.kind=heuristic"]
    for k in ("summary", "entities", "facts", "states", "artifacts", "events"):
        ov.append(f"runtime.extractors.{k}.path={bundle}" if k in kinds else f"runtime.extractors.{k}=heuristic")
    return " ".join(ov)


def trained(py: list[str], name: str, export: str, experiment: str, run_dir: Path, bundle: Path, args: list[str],
            what: str, what_bundle: str) -> list:
    """A per-fold model: its training stage (python -m arbor_train.train experiment=... run_dir=... args) and
    the export of its bundle."""
    from eval.pipeline import Stage

    return [Stage(name, [*py, "-m", "arbor_train.train", f"experiment={experiment}", f"run_dir={run_dir}", *args],
                  what=what),
            Stage(export, [*py, "-m", "arbor_train.export", f"run_dir={run_dir}", f"out={bundle}", "overwrite=true"],
                  [name], what=what_bundle)]


def stage_deps(rows: list[str], needs_of: dict, router: bool = False) -> list[str]:
    """The stages an evaluation of these rows waits for: the bundles their `{tuned}`/`{router}` fills name
    (`router`: the fold's router besides, for the ablations of the localized runtime)."""
    keys = [key for key in ("tuned", "router") if any("{" + key + "}" in ROWS[r] for r in rows) or (key == "router" and router)]
    return sorted({d for key in keys for d in needs_of[key]})


def plan(c: dict, folds: list[list[str]], out: Path) -> list:
    from eval.pipeline import Stage

    py = [c["python"] or sys.executable]
    stages: list[Stage] = []
    sup = str(Path(c["supervision"]).resolve())
    routed = any(r in ROUTED for r in [*c["rows"], *answered(c)]) or bool(c["ablations"])
    mix_at = locomo_mix_index(c) if routed else None
    extract = bool(set(c["tuned_kinds"])) or "tuned" in c["fact_extractors"]
    for k, held in enumerate(folds):
        if c.get("run_folds") is not None and k not in c["run_folds"]:
            continue
        fold = out / f"fold{k}"
        bundle, run_dir, distilled = fold / "bundle", fold / "train" / "run", fold / "bundle_distilled"
        router, router_run = fold / "router", fold / "router_train" / "run"
        if routed:
            stages += trained(py, f"router_f{k}", f"export_router_f{k}", c["router"]["experiment"], router_run, router,
                              [f"data.mix.{mix_at}.dir={sup}", f"data.mix.{mix_at}.exclude_sessions={_list(held)}",
                               *c["router"].get("overrides", [])],
                              f"question router; LoCoMo questions from every conversation but {held}", "router bundle")
        if not extract:
            bundle = None
        adapters = []  # (stage suffix, bundle, run folder, LoCoMo facts source, what)
        if bundle is not None:
            adapters.append(("", bundle, run_dir, sup, "LoCoMo facts"))
        if "distilled" in c["fact_extractors"]:
            adapters.append(("_d", distilled, fold / "train_distilled" / "run",
                             str((Path(c["distilled"]) / "train").resolve()), "the teacher's LoCoMo facts"))
        for tag, b_dir, r_dir, facts_dir, facts_what in adapters:
            mix = ("data.mix=[{dir: " + facts_dir + ", sets: [extraction], kinds: [facts], exclude_sessions: "
                   + _list(held) + ", max_rows: " + str(c["mix_max_rows"]) + "}]")
            # the untuned model's held-out metrics are the same in every fold (same base model, same held-out
            # BranchMemEval set): the first adapter this run trains computes them, the others skip them
            again = [] if not any(st.name.startswith("train_") for st in stages) else ["task.compare_baselines=false"]
            stages += trained(py, f"train{tag}_f{k}", f"export{tag}_f{k}", c["extractor"]["experiment"], r_dir, b_dir,
                              [mix, *again, *c["extractor"].get("overrides", [])],
                              f"extractor adapter, every kind; {facts_what} from every conversation but {held}",
                              "extractor bundle")
        common = [f"input={c['input']}", f"conversations={_list(held)}"]
        cap = [] if c.get("facts_max_interactions") is None else [f"max_interactions={c['facts_max_interactions']}"]
        for ex in c["fact_extractors"]:
            argv = [*py, "-m", "eval.extraction", *common, f"run_dir={out / f'facts_{ex}_f{k}'}"]
            deps: list[str] = []
            if ex == "untuned":
                argv += ["extractor=prompted", f"max_interactions={c['facts_untuned_interactions']}"]
            else:
                argv += cap
            if ex == "tuned":
                argv += ["extractor=bundle", f"bundle.path={bundle}"]
                deps = [f"export_f{k}"]
            elif ex == "distilled":
                argv += ["extractor=bundle", f"bundle.path={distilled}"]
                deps = [f"export_d_f{k}"]
            elif ex == "teacher":
                argv += ["extractor=recorded", f"recorded.dir={Path(c['distilled']).resolve()}"]
            stages.append(Stage(f"facts_{ex}_f{k}", argv, deps, what=f"fact F1 against held-out observations ({ex})"))
        fills = {"tuned": tuned_overrides(c, bundle), "router": tuned_overrides(c, bundle, router)}
        needs_of = {"tuned": [f"export_f{k}"] if bundle is not None else [],
                    "router": ([f"export_f{k}"] if bundle is not None else []) + [f"export_router_f{k}"]}
        ev = ["benchmark=locomo", f"locomo.input={c['input']}", f"units={_list(held)}", "wandb.enabled=false"]
        # the ablations run in the same process as the rows: a cross-encoder scores each (question, state)
        # pair once per process, so the localized runtime without a read layer costs its reads only
        specs = [ROWS[r].format(**fills) for r in c["rows"]]
        specs += [ROWS["localized"].format(**fills) + f" ablation={a}" for a in c["ablations"]]
        if specs:
            deps = stage_deps(c["rows"], needs_of, router=bool(c["ablations"]))
            stages.append(Stage(f"eval_f{k}", [*py, "-m", "eval.compare", "grid",
                                               *[x for sp in specs for x in ("--row", sp)], "--budgets",
                                               *map(str, c["budgets"]), "--out", str(out / f"eval_f{k}" / "runs"), *ev],
                                deps, what=f"rows and ablations x budgets on conversations {held}"))
        stages += answer_stages(c, k, held, fold, sup, py, out, ev, fills, needs_of)
    return stages


def answer_stages(c: dict, k: int, held: list[str], fold: Path, sup: str, py: list[str], out: Path, ev: list[str],
                  fills: dict, needs_of: dict) -> list:
    """The fold's reader (trained on the other folds' reader rows) and the answers: each row of `answers.rows`
    at `answers.budget` on the held-out conversations, answered by every reader of `answers.readers`."""
    from eval.pipeline import Stage

    a, stages = c["answers"], []
    rows = answered(c)
    if not rows:
        return []
    reader, reader_run = fold / "reader", fold / "reader_train" / "run"
    models = []
    if "tuned" in a["readers"]:
        stages += trained(py, f"reader_f{k}", f"export_reader_f{k}", c["reader"]["experiment"], reader_run, reader,
                          [f"data.train_dir={sup}", f"data.exclude_sessions={_list(held)}", *c["reader"].get("overrides", [])],
                          f"reader; runtime contexts of every conversation but {held}", "reader bundle")
        models.append(f"answer_model=bundle answer_model.llm.path={reader}")
    if "untuned" in a["readers"]:
        models.append("answer_model=smollm2")
    specs = [f"{ROWS[r].format(**fills)} {m} {' '.join(a['overrides'])}".strip() for r in rows for m in models]
    deps = sorted({*stage_deps(rows, needs_of), *([f"export_reader_f{k}"] if "tuned" in a["readers"] else [])})
    cap = [] if a.get("max_questions") is None else [f"locomo.max_questions={a['max_questions']}"]
    stages.append(Stage(f"answers_f{k}", [*py, "-m", "eval.compare", "grid", *[x for sp in specs for x in ("--row", sp)],
                                          "--budgets", str(a["budget"]), "--out", str(out / f"answers_f{k}" / "runs"),
                                          *ev, *cap],
                        deps, what=f"answers (LoCoMo F1) over {rows} at {a['budget']} tokens on conversations {held}"))
    return stages


def row_name(r: dict) -> str:
    """The CV row a results.json belongs to, from its method, runtime (components / read policy / domain)
    and ablation."""
    from arbor_train.runtime.config import label

    found = []
    for name, spec in ROWS.items():
        parts = [p.split("=", 1) for p in spec.split() if "=" in p]
        method = dict(parts)["method"]
        choices = {k.split("/", 1)[1]: v for k, v in parts if k.startswith("runtime/")}
        # keys a row sets itself (bm25_dates: runtime.context.resolve_dates=true), not the bundles filled in
        own = {p.lower() for p in spec.split() if p.startswith("runtime.") and "{" not in p}
        if r["method"] == method and r.get("runtime") == label({"choices": choices}) \
                and own <= {x.lower() for x in r.get("runtime_settings") or []}:  # (recorded as True)
            found.append((len(own), name))
    if not found:
        return f"{r['method']} ({r.get('runtime')})"
    name = max(found)[1]  # the most specific row
    abl = r.get("ablation", "full")  # the ablation config's name: full, or no_<component>
    return name if abl == "full" else f"{name} without {abl.removeprefix('no_')}"


def merge(out: Path, folds: list[list[str]], c: dict) -> dict:
    """Per row and budget: the mean over folds of each measure (each fold's value kept), per category,
    cost; fact extraction per fold and mean. Written as merged.json, table.md and plots."""
    from eval.report import collect

    cells: dict[tuple[str, int], dict[int, dict]] = {}
    for k in range(len(folds)):
        for sub in (f"eval_f{k}", f"ablations_f{k}"):  # (ablations_f<k>: runs made before they joined eval_f<k>)
            d = out / sub / "runs"
            if d.exists():
                for r in collect([d]):
                    cells.setdefault((row_name(r), int(r["budget"])), {})[k] = r
    answers: dict[tuple[str, str, int], dict[int, dict]] = {}
    a = c.get("answers") or {}
    for k in range(len(folds)):
        d = out / f"answers_f{k}" / "runs"
        for r in collect([d]) if d.exists() else []:
            # eval.run names a reader bundle's answers "bundle <path>" (eval.run.answer_model_name)
            reader = "tuned" if str(r.get("reader") or "").startswith("bundle ") else "untuned"
            name = row_name(r)
            # only what the options ask for now: runs an earlier `answers.*` left in the folder are not merged
            if r.get("f1") is not None and int(r["budget"]) == a.get("budget") and reader in a.get("readers", ()) \
                    and name in a.get("rows", ()):
                answers.setdefault((name, reader, int(r["budget"])), {})[k] = r
    facts: dict[str, dict[int, dict]] = {}
    for ex in c["fact_extractors"]:
        for k in range(len(folds)):
            f = out / f"facts_{ex}_f{k}" / "results.json"
            if f.exists():
                facts.setdefault(ex, {})[k] = json.loads(f.read_text())["results"]

    def mean(xs: list[float | None]) -> float | None:
        xs = [x for x in xs if x is not None]
        return round(sum(xs) / len(xs), 4) if xs else None

    merged = {"folds": folds, "rows": [], "facts": {}, "answers": []}
    for (name, reader, budget), by_fold in sorted(answers.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        cats = sorted({cat for r in by_fold.values() for cat in (r.get("f1_by_category") or {})})
        merged["answers"].append({
            "row": name, "reader": reader, "label": f"{reader} reader, {name}", "budget": budget,
            "folds_done": sorted(by_fold),
            "questions": sum(r.get("questions") or 0 for r in by_fold.values()),
            **{m: mean([by_fold[k].get(m) for k in sorted(by_fold)]) for m in ("f1", "answer_token_recall")},
            "f1_per_fold": {k: mean([by_fold[k].get("f1")]) for k in sorted(by_fold)},  # (rounded as the mean)
            "f1_by_category": {cat: mean([(r.get("f1_by_category") or {}).get(cat) for r in by_fold.values()])
                               for cat in cats}})
    for (name, budget), by_fold in sorted(cells.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        row = {"row": name, "budget": budget, "folds_done": sorted(by_fold)}
        for m in (*MEASURES, *LOCALIZATION, "ingest_s_per_turn", "read_s_p95"):
            row[m] = mean([by_fold[k].get(m) for k in sorted(by_fold)])
            row[f"{m}_per_fold"] = {k: by_fold[k].get(m) for k in sorted(by_fold)}
        for m in MEASURES:
            cats = sorted({cat for r in by_fold.values() for cat in (r.get(f"{m}_by_category") or {})})
            row[f"{m}_by_category"] = {cat: mean([(r.get(f"{m}_by_category") or {}).get(cat) for r in by_fold.values()])
                                       for cat in cats}
        merged["rows"].append(row)
    for ex, by_fold in facts.items():
        merged["facts"][ex] = {
            "per_fold": {k: {x: r[x] for x in ("precision", "recall", "f1", "json_validity", "interactions",
                                               "seconds_per_interaction")} for k, r in sorted(by_fold.items())},
            **{x: mean([r[x] for r in by_fold.values()]) for x in ("precision", "recall", "f1", "json_validity",
                                                                  "seconds_per_interaction")}}
    (out / "merged.json").write_text(json.dumps(merged, indent=2, sort_keys=True))
    text = tables(merged, c)
    (out / "table.md").write_text(text)
    plot(merged, out)
    return merged


def _f(v) -> str:
    return "—" if v is None else f"{v:.3f}"


def tables(merged: dict, c: dict) -> str:
    folds = merged["folds"]
    done = sorted({k for r in merged["rows"] for k in r["folds_done"]})
    lines = [f"LoCoMo cross-validation: {len(folds)} folds ({'; '.join(','.join(f) for f in folds)}), "
             f"{len(done)} run ({', '.join(map(str, done))}); each cell is the mean over the folds run of "
             "evidence recall / answer-token recall (per-fold values below).", ""]
    if not merged["rows"]:  # answers or fact extraction only (rows=[] ablations=[])
        lines = [f"LoCoMo cross-validation: {len(folds)} folds ({'; '.join(','.join(f) for f in folds)}), no "
                 "retrieval rows (rows=[], ablations=[])."]
    budgets = sorted({r["budget"] for r in merged["rows"]})
    names = list(dict.fromkeys(r["row"] for r in merged["rows"]))
    at = {(r["row"], r["budget"]): r for r in merged["rows"]}
    # ingest seconds are left out here: a fold's runs reuse the extraction cache its fact evaluation filled
    # (eval.bench target=extract measures extraction cost without it)
    lines += ["| row | " + " | ".join(f"{b:,}" for b in budgets) + " | read p95 (ms, worst budget) |",
              "|---|" + "---:|" * (len(budgets) + 1)] if names else []
    for n in names:
        cells = [f"{_f(at[(n, b)]['evidence_recall'])} / {_f(at[(n, b)]['answer_token_recall'])}" if (n, b) in at else "—"
                 for b in budgets]
        # the worst budget's: a process scores each question-state pair once, so the budgets read after the
        # first reuse the reranker's scores and time only the packing
        p95s = [at[(n, b)].get("read_s_p95") for b in budgets if (n, b) in at and at[(n, b)].get("read_s_p95") is not None]
        p95 = max(p95s) if p95s else None
        lines.append(f"| {n} | " + " | ".join(cells) + f" | {'—' if p95 is None else f'{p95 * 1000:.1f}'} |")
    for m in MEASURES if names else ():
        lines += ["", f"Per fold, {m.replace('_', ' ')}:", "",
                  "| row | budget | mean | " + " | ".join(f"fold {k} ({','.join(f)})" for k, f in enumerate(folds)) + " |",
                  "|---|---:|---:|" + "---:|" * len(folds)]
        for r in merged["rows"]:
            pf = r[f"{m}_per_fold"]
            lines.append(f"| {r['row']} | {r['budget']} | {_f(r[m])} | "
                         + " | ".join(_f(pf.get(k, pf.get(str(k)))) for k in range(len(folds))) + " |")
    loc_rows = [r for r in merged["rows"] if r.get("localization_at_1") is not None]
    if loc_rows:
        lines += ["", "Question localization, mean over folds: an evidence state is the reranker's top state (@1), among "
                  "its top 5 (@5), or among the candidates recall found (recalled):", "",
                  "| row | budget | @1 | @5 | recalled |", "|---|---:|---:|---:|---:|"]
        for r in loc_rows:
            lines.append(f"| {r['row']} | {r['budget']} | {_f(r['localization_at_1'])} | {_f(r['localization_at_5'])} | "
                         f"{_f(r['evidence_in_candidates'])} |")
        pf = [r for r in loc_rows if r["row"] == "localized"][:1]
        if pf:
            per = pf[0]
            lines += ["", "Per fold, the localized runtime's evidence among its recalled candidates: "
                      + ", ".join(f"fold {k} {_f(per['evidence_in_candidates_per_fold'].get(k, per['evidence_in_candidates_per_fold'].get(str(k))))}"
                                  for k in range(len(folds)))]
    cats = sorted({cat for r in merged["rows"] for cat in r["evidence_recall_by_category"]})
    if cats:
        lines += ["", "Per LoCoMo category (1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop), mean over folds, "
                  "evidence / answer tokens:", "",
                  "| row | budget | " + " | ".join(cats) + " |", "|---|---:|" + "---:|" * len(cats)]
        for r in merged["rows"]:
            lines.append(f"| {r['row']} | {r['budget']} | " + " | ".join(
                f"{_f(r['evidence_recall_by_category'].get(cat))} / {_f(r['answer_token_recall_by_category'].get(cat))}"
                for cat in cats) + " |")
    if merged.get("answers"):
        budget = merged["answers"][0]["budget"]
        cats = sorted({cat for r in merged["answers"] for cat in r["f1_by_category"]})
        lines += ["", f"Answers: LoCoMo F1 at {budget:,} tokens, mean over folds (tuned: the fold's SmolLM2-135M reader, "
                  "trained on runtime contexts of the other folds' conversations; untuned: SmolLM2-135M prompted), per "
                  "category (1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop) and per fold:", "",
                  "| reader | row | F1 | " + " | ".join(f"cat {cat}" for cat in cats) + " | answer-token recall | "
                  + " | ".join(f"F1 fold {k}" for k in range(len(folds))) + " | questions |",
                  "|---|---|---:|" + "---:|" * (len(cats) + 1 + len(folds)) + "---:|"]
        for r in merged["answers"]:
            pf = r["f1_per_fold"]
            lines.append(f"| {r['reader']} | {r['row']} | {_f(r['f1'])} | "
                         + " | ".join(_f(r["f1_by_category"].get(cat)) for cat in cats)
                         + f" | {_f(r['answer_token_recall'])} | "
                         + " | ".join(_f(pf.get(k, pf.get(str(k)))) for k in range(len(folds))) + f" | {r['questions']} |")
        if c["answers"].get("max_questions"):
            lines.append(f"\n(the first {c['answers']['max_questions']} QA questions of each held-out conversation)")
    if merged["facts"]:
        lines += ["", "Fact extraction against the held-out conversations' observations (token F1 >= 0.5, one-to-one):", "",
                  "| extractor | P | R | F1 | JSON valid | s/interaction | " + " | ".join(f"F1 fold {k}" for k in range(len(folds))) + " |",
                  "|---|---:|---:|---:|---:|---:|" + "---:|" * len(folds)]
        for ex, r in merged["facts"].items():
            pf = r["per_fold"]
            lines.append(f"| {ex} | {_f(r['precision'])} | {_f(r['recall'])} | {_f(r['f1'])} | {_f(r['json_validity'])} | "
                         f"{_f(r['seconds_per_interaction'])} | "
                         + " | ".join(_f((pf.get(k) or pf.get(str(k)) or {}).get("f1")) for k in range(len(folds))) + " |")
        if "untuned" in merged["facts"]:
            lines.append(f"\n(untuned: the first {c['facts_untuned_interactions']} interactions of each held-out "
                         "conversation)")
        if c.get("facts_max_interactions") and set(merged["facts"]) - {"untuned"}:
            lines.append(f"\n(every other extractor: the first {c['facts_max_interactions']} interactions of each "
                         "held-out conversation)")
        if {"teacher", "distilled"} & set(merged["facts"]):
            lines.append(f"\n(teacher: the labels of the distillation in {c['distilled']}, scored without calling it "
                         "again; distilled: the tuned recipe with those labels in place of the observations)")
    return "\n".join(lines) + "\n"


def plot(merged: dict, out: Path) -> list[Path]:
    """Budget curves, mean over folds: one panel per measure, one line per row (ablations left out)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in merged["rows"] if " without " not in r["row"]]
    names = list(dict.fromkeys(r["row"] for r in rows))
    budgets = sorted({r["budget"] for r in rows})
    pics = plot_facts(merged, out, plt) + plot_answers(merged, out, plt)
    if len(budgets) < 2:
        return pics
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, m in zip(axes, MEASURES):
        for n in names:
            pts = sorted((r["budget"], r[m]) for r in rows if r["row"] == n and r[m] is not None)
            if pts:
                ax.plot([b for b, _ in pts], [v for _, v in pts], marker="o", label=n,
                        linewidth=2.5 if n == "localized" else 1.5)
        ax.set_xscale("log", base=2)
        ax.set_xticks(budgets, [f"{b:,}" for b in budgets])
        ax.set_xlabel("read budget (tokens)")
        done = len({k for r in rows for k in r["folds_done"]})
        ax.set_title(m.replace("_", " ") + f", mean of {done} of {len(merged['folds'])} folds")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("recall")
    axes[1].legend(fontsize=8, loc="lower right")
    fig.suptitle("LoCoMo cross-validation: held-out conversations")
    fig.tight_layout()
    p = out / "locomo_cv_budget_curve.png"
    fig.savefig(p, dpi=120)
    plt.close(fig)
    return [p, *pics]


def grouped_bars(ax, series: list[tuple[str, list, str | None]], n_groups: int) -> None:
    """One bar per (label, values, hatch) series in each of `n_groups` groups; a None value draws no bar."""
    width = 0.8 / len(series)
    for i, (label, ys, hatch) in enumerate(series):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(n_groups)]
        ax.bar([x for x, y in zip(xs, ys) if y is not None], [y for y in ys if y is not None], width, label=label,
               hatch=hatch)


def save_bars(plt, fig, ax, path: Path, legend_size: int) -> list[Path]:
    ax.legend(fontsize=legend_size)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return [path]


def plot_answers(merged: dict, out: Path, plt) -> list[Path]:
    """LoCoMo F1 per category: one group of bars per category (and overall), one bar per reader and row."""
    rows = merged.get("answers") or []
    if not rows:
        return []
    cats = sorted({cat for r in rows for cat in r["f1_by_category"]})
    groups = [*cats, "all"]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.5 * len(groups) + 2), 3.8))
    grouped_bars(ax, [(f"{r['reader']} reader, {r['row']}", [r["f1_by_category"].get(cat) for cat in cats] + [r["f1"]],
                       None if r["reader"] == "tuned" else "//") for r in rows], len(groups))
    names = {"1": "multi-hop", "2": "temporal", "3": "open-domain", "4": "single-hop"}
    ax.set_xticks(range(len(groups)), [f"{g}\n{names.get(g, '')}".strip() for g in groups])
    ax.set_ylabel("LoCoMo F1")
    done = len({k for r in rows for k in r["folds_done"]})
    ax.set_title(f"LoCoMo answers at {rows[0]['budget']:,} tokens, mean of {done} of {len(merged['folds'])} folds")
    return save_bars(plt, fig, ax, out / "locomo_cv_answers.png", 7)


def plot_facts(merged: dict, out: Path, plt) -> list[Path]:
    """Fact F1 against the held-out observations: one group of bars per fold, one bar per extractor."""
    facts = merged["facts"]
    if not facts:
        return []
    folds = merged["folds"]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(folds) + 2), 3.8))
    grouped_bars(ax, [(f"{n} (mean {f['f1']:.3f})" if f["f1"] is not None else n,
                       [(f["per_fold"].get(k) or f["per_fold"].get(str(k)) or {}).get("f1") for k in range(len(folds))],
                       None) for n, f in facts.items()], len(folds))
    ax.set_xticks(range(len(folds)), [f"fold {k}\n({','.join(f)})" for k, f in enumerate(folds)])
    ax.set_ylabel("fact F1 vs observations")
    ax.set_title("LoCoMo fact extraction on held-out conversations")
    return save_bars(plt, fig, ax, out / "locomo_cv_facts.png", 8)


def run(cfg: DictConfig | dict) -> dict:
    from arbor_train.conversations.locomo import load_locomo
    from eval.pipeline import run_stages

    c = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else cfg
    check_options(c)
    ids = [x.conversation_id for x in load_locomo(c["input"])]
    if len(ids) < c["folds"]:
        raise ConfigError(f"option folds={c['folds']}: {c['input']} holds only {len(ids)} conversations")
    folds = split_folds(ids, c["folds"])
    out = Path(c["out"]).resolve()
    env = dict(os.environ, PYTHONUNBUFFERED="1", WANDB_MODE=os.environ.get("WANDB_MODE", "offline"))
    summary = run_stages(plan(c, folds, out), out, c["only"], c["force"], c["echo"], env, label="locomo_cv",
                         rerun="python -m eval.locomo_cv")
    merged = merge(out, folds, c)
    print("\n" + (out / "table.md").read_text())
    print(f"[locomo_cv] table: {out / 'table.md'}; plot: {out / 'locomo_cv_budget_curve.png'}", flush=True)
    return {"summary": summary, "merged": merged, "table": (out / "table.md").read_text()}


@hydra.main(config_path=str(CONF_DIR), config_name="locomo_cv", version_base="1.3")
@entry_point
def main(cfg: DictConfig) -> None:
    from eval.pipeline import exit_on_stage_error

    exit_on_stage_error(run, cfg, "locomo_cv")


if __name__ == "__main__":
    main()
