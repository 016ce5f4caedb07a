"""python -m eval.run benchmark=<branchmem|locomo|longmemeval|beam|irc> method=<name> [overrides]

One driver for every benchmark: the options are checked, the protocol's units (sessions, conversations,
files) loaded, each replayed through a fresh memory of the method with the shared answer model (and
judge), and the protocol's summary written as results.json, questions.jsonl and table.md (plus W&B).
The protocols live in eval/protocols/ (registered in eval/protocols/__init__.py), the methods in
arbor_train/replay/methods.py. `run(cfg) -> dict` is the importable function.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from arbor_train.errors import ConfigError, entry_point, parse_bool, parse_choice, parse_float, parse_int
from arbor_train.paths import CONF_DIR

from .protocols import BENCHMARKS, PROTOCOLS

LLM_BACKENDS = ("hf", "openai", "bundle")


def _check_llm(node: dict, option: str) -> None:
    if not isinstance(node, dict):
        raise ConfigError(f"option {option} must be a mapping with backend ({', '.join(LLM_BACKENDS)}) and model")
    parse_choice(node.get("backend", "hf"), f"{option}.backend", LLM_BACKENDS)
    if node.get("backend") == "bundle":  # a tuned reader: its manifest is read (and refused) before any model loads
        from arbor_train.runtime.bundle import load_bundle

        if not isinstance(node.get("path"), str) or node["path"] in ("", "???"):
            raise ConfigError(f"option {option}.path must name a reader bundle (python -m arbor_train.export), "
                              f"got {node.get('path')!r}")
        load_bundle(node["path"], role="reader")
    elif not isinstance(node.get("model"), str) or not node["model"]:
        raise ConfigError(f"option {option}.model must name a model, got {node.get('model')!r}")
    if node.get("batch_size") is not None:
        parse_int(node["batch_size"], f"{option}.batch_size", minimum=1)


def _set(d: dict, key: str, parsed) -> None:
    """Keep a valid value as the user wrote it (results.json records the config); a string becomes its parse."""
    if isinstance(d.get(key), str):
        d[key] = parsed


def check_options(c: dict) -> None:
    """Refuse, before any model or data is loaded, options that cannot work (numbers and booleans read
    strictly: budget=lots or wandb.enabled=maybe is an error naming the option); a number or boolean
    given as a string is replaced in `c` by its value."""
    from arbor_train.replay.methods import METHODS

    parse_choice(c["method"], "method", METHODS)
    parse_choice(c["benchmark"], "benchmark", BENCHMARKS)
    _set(c, "budget", parse_int(c["budget"], "budget", minimum=1))
    _set(c, "prefilter", parse_float(c["prefilter"], "prefilter", minimum=0.0, exclusive=True))
    if c["max_sessions"] is not None:
        _set(c, "max_sessions", parse_int(c["max_sessions"], "max_sessions", minimum=1))
    for k, v in c["ablation"].items():
        if k != "name":
            _set(c["ablation"], k, parse_bool(v, f"ablation.{k}"))
    _set(c["wandb"], "enabled", parse_bool(c["wandb"]["enabled"], "wandb.enabled"))
    _set(c, "extract_ahead", parse_bool(c.get("extract_ahead", False), "extract_ahead"))
    am = c["answer_model"]
    parse_choice(am.get("kind"), "answer_model.kind", ("none", "llm"))
    _set(am, "max_new_tokens", parse_int(am.get("max_new_tokens"), "answer_model.max_new_tokens", minimum=1))
    if am["kind"] == "llm":
        _check_llm(am.get("llm"), "answer_model.llm")
    judge = c.get("judge") or {}
    parse_choice(judge.get("kind", "none"), "judge.kind", ("none", "llm"))
    if judge.get("kind") == "llm":
        _check_llm(judge.get("llm"), "judge.llm")
    PROTOCOLS[c["benchmark"]].check(c)


def check_reader_heldout(c: dict, protocol, units: list) -> None:
    """A tuned reader is never scored on its own training sessions: the bundle's `training_sessions`
    (content fingerprints) against the evaluated units' (where the benchmark defines them)."""
    llm = c["answer_model"].get("llm") or {}
    if c["answer_model"]["kind"] != "llm" or llm.get("backend") != "bundle" or protocol.fingerprint is None:
        return
    from arbor_train.runtime.bundle import load_bundle

    trained = set(load_bundle(llm["path"], role="reader").manifest.get("training_sessions") or [])
    seen = [protocol.unit_id(u) for u in units if protocol.fingerprint(u) in trained]
    if seen:
        raise ConfigError(f"option answer_model.llm.path={llm['path']!r}: the reader was trained on {len(seen)} of the "
                          f"{len(units)} evaluated sessions (e.g. {', '.join(seen[:3])}); evaluate it on held-out "
                          f"sessions (another seed or preset)")


def select_by_id(items: list, want, id_of, option: str, source: str) -> list:
    """The items whose id (`id_of(item)`) option `option` names, in their own order; all when `want` is null.
    A bad option (not a non-empty list, or ids `source` does not hold) raises ConfigError naming both."""
    if want is None:
        return items
    if not isinstance(want, list) or not want:
        raise ConfigError(f"option {option} must be null or a non-empty list of ids, got {want!r}")
    want = {str(u) for u in want}
    have = {str(id_of(u)) for u in items}
    missing = sorted(want - have)
    if missing:
        raise ConfigError(f"option {option}: {missing} not in {source} (it has {len(have)}, e.g. {sorted(have)[:5]})")
    return [u for u in items if str(id_of(u)) in want]


def select_units(c: dict, protocol, units: list) -> list:
    """The units named by `units` (conversation or session ids), in the benchmark's order; all when null."""
    return select_by_id(units, c.get("units"), protocol.unit_id, "units", f"benchmark={c['benchmark']}")


def check_extractor_heldout(runtime_cfg: dict, unit_ids: list[str]) -> None:
    """A tuned extractor or reranker is never scored on conversations it was trained on: each such bundle's
    `training_sessions` (the mixed-in sessions, e.g. LoCoMo conversation ids) against the evaluated units."""
    from arbor_train.runtime.bundle import load_bundle

    paths = {(spec["path"], "extractor", "extractors.*.path") for spec in (runtime_cfg.get("extractors") or {}).values()
             if isinstance(spec, dict) and spec.get("kind") == "bundle" and spec.get("path")}
    rr = runtime_cfg.get("reranker") or {}
    if rr.get("kind") == "bundle" and (rr.get("bundle") or {}).get("path"):
        paths.add((rr["bundle"]["path"], "reranker", "reranker.bundle.path"))
    for path, role, option in sorted(paths):
        trained = set(map(str, load_bundle(path, role=role).manifest.get("training_sessions") or []))
        seen = [u for u in unit_ids if u in trained]
        if seen:
            raise ConfigError(f"runtime option {option}={path!r}: the {role} was trained on {len(seen)} of "
                              f"the {len(unit_ids)} evaluated units ({', '.join(seen[:5])}); evaluate it on held-out "
                              f"conversations (option units) or train it without them (data.mix[].exclude_sessions)")


def answer_model_name(cfg: dict) -> str | None:
    """Which model answered, for tables: a reader bundle's folder, or the model reference (None: no answers)."""
    if cfg["kind"] == "none":
        return None
    llm = cfg["llm"]
    return f"bundle {llm['path']}" if llm.get("backend") == "bundle" else str(llm.get("model"))


def build_answer_model(cfg: dict):
    """None (no generation: answer-independent metrics only), or an LLM backend (hf | openai)."""
    if cfg["kind"] == "none":
        return None
    from arbor_train.runtime.llm import build_llm

    return build_llm(cfg["llm"])


def run(cfg: DictConfig) -> dict:
    from arbor_train.conversations.io import quiet
    from arbor_train.replay.methods import build_method
    from arbor_train.runtime import TokenCounter, build_components
    from arbor_train.runtime.config import label as runtime_label
    from arbor_train.runtime.config import runtime_config
    from arbor_train.runtime.config import settings as runtime_settings

    c = OmegaConf.to_container(cfg, resolve=True)
    check_options(c)
    runtime_cfg = runtime_config(c)
    counter = TokenCounter(runtime_cfg["context"]["tokenizer"])
    fixed = counter.count("Current time: 2025-01-01T00:00") + 40
    if c["budget"] <= fixed:
        raise ConfigError(f"option budget={c['budget']} is smaller than the fixed prompt ({fixed} tokens)")
    protocol = PROTOCOLS[c["benchmark"]]
    units = select_units(c, protocol, protocol.load(c))[: c["max_sessions"] or None]
    check_reader_heldout(c, protocol, units)
    check_extractor_heldout(runtime_cfg, [protocol.unit_id(u) for u in units])
    llm = build_answer_model(c["answer_model"])
    from .answers import Answers

    answers = (Answers(llm, c["answer_model"]["max_new_tokens"], c["answer_model"].get("cache"))
               if llm is not None else None)
    from .judge import build_judge

    judge = build_judge(c["judge"])
    qrecs, trecs = [], []
    t0 = time.perf_counter()
    with quiet():
        comps = build_components(runtime_cfg)
        if c.get("extraction_cache"):
            from arbor_train.runtime.extract import ExtractionCache

            comps["extractors"].attach_cache(ExtractionCache(c["extraction_cache"]))
        from tqdm import tqdm

        for unit in tqdm(units, desc=f"{c['benchmark']} {c['method']}", unit="conversation", disable=None):
            m = build_method(c["method"], runtime_cfg, comps, protocol.unit_id(unit), counter, c["prefilter"])
            try:
                q, t = protocol.replay(unit, m, answers, judge, c)
            finally:
                m.close()
            qrecs += q
            trecs += t
    answer_stats = answers.flush() if answers is not None else None
    if answers is not None:
        answers.close()
    elapsed = time.perf_counter() - t0
    summary = protocol.summarize(qrecs, trecs)
    res = {"benchmark": c["benchmark"], "method": c["method"], "ablation": c["ablation"]["name"], "budget": c["budget"],
           "runtime": runtime_label(runtime_cfg), "runtime_settings": runtime_settings(runtime_cfg), "answer_model": c["answer_model"]["kind"],
           "reader": answer_model_name(c["answer_model"]),
           "sessions": len(units), "seconds": round(elapsed, 2), "answer_calls": answer_stats,
           "questions_per_hour": round(len(qrecs) / max(elapsed, 1e-9) * 3600, 1), **summary}
    out = Path(c["run_dir"])
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"results": res, "config": c}, indent=2, sort_keys=True, default=str))
    with open(out / "questions.jsonl", "w", encoding="utf-8") as f:
        for r in qrecs:
            f.write(json.dumps(r, sort_keys=True, default=str) + "\n")
    from .report import plots, table

    (out / "table.md").write_text(table([dict(res, run=str(out))]))
    if c["wandb"]["enabled"]:
        log_wandb(c, res, out, plots([dict(res, run=str(out))], out))
    print(json.dumps(res, sort_keys=True, default=str))
    return res


def log_wandb(c: dict, res: dict, out: Path, pictures: list[Path]) -> None:
    """Results, the table and plots as a W&B run (offline unless WANDB_MODE=online)."""
    import os

    import wandb

    run = wandb.init(project=c["wandb"]["project"], job_type="eval", dir=str(out),
                     mode=os.environ.get("WANDB_MODE", c["wandb"]["mode"]),
                     name=f"{c['benchmark']}-{c['method']}-{c['ablation']['name']}-{c['budget']}", config=c)
    run.log({k: v for k, v in res.items() if isinstance(v, (int, float)) and v is not None})
    run.log({"results_table": wandb.Table(columns=["key", "value"], data=[[k, json.dumps(v, default=str)]
                                                                          for k, v in sorted(res.items())])})
    for p in pictures:
        run.log({p.stem: wandb.Image(str(p))})
    run.finish()


@hydra.main(config_path=str(CONF_DIR), config_name="eval", version_base="1.3")
@entry_point
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    main()
