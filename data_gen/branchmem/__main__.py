"""python -m data_gen.branchmem preset=<formal|train|smoke|heldout> seed=<int> out_dir=<dir> [command=...]

    command=generate   plan, realize, validate (regenerating invalid sessions) and mine supervision
    command=merge      merge_from=[shard dirs] -> out_dir (identical to a single-process run)
    command=benchmark  sessions/s for plan+realize+validate alone and with supervision mining

`run(cfg)` is the importable function; `main` is the thin Hydra wrapper.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from arbor_train.errors import ConfigError, entry_point, parse_bool, parse_choice, parse_float, parse_int
from arbor_train.paths import CONF_DIR

from .generate import build_session, merge_shards, run_generation, session_targets

COMMANDS = ("generate", "merge", "benchmark")
LLM_BACKENDS = ("hf", "openai")
# preset counts: key -> smallest valid value
_PRESET_COUNTS = {"sessions": 1, "turns_min": 1, "turns_max": 1, "type_stride": 1, "delay_min": 0, "max_attempts": 1}
_PRESET_SHARES = ("p_four_branches", "distractor_share", "p_stay_on_branch", "p_ask_when_ready")


def _share(value, option: str) -> float:
    out = parse_float(value, option, minimum=0.0)
    if out > 1:
        raise ConfigError(f"option {option} must lie in [0, 1], got {out}")
    return out


def _preset(cfg: DictConfig) -> dict:
    """The preset as a dict, every field checked (counts >= 1, shares in [0, 1], known question types)."""
    from .plan import QUESTION_TYPES

    p = OmegaConf.to_container(cfg.preset, resolve=True)
    if not isinstance(p.get("name"), str) or not p["name"]:
        raise ConfigError(f"option preset.name must be a non-empty string, got {p.get('name')!r}")
    for key, lo in _PRESET_COUNTS.items():
        v = parse_int(p.get(key), f"preset.{key}", minimum=lo)
        if isinstance(p[key], str):
            p[key] = v
    if p["turns_min"] > p["turns_max"]:
        raise ConfigError(f"option preset.turns_min ({p['turns_min']}) exceeds preset.turns_max ({p['turns_max']})")
    for key in _PRESET_SHARES:
        v = _share(p.get(key), f"preset.{key}")
        if isinstance(p[key], str):
            p[key] = v
    if p.get("total_turns") is not None:
        for key, lo in (("total_turns", 1), ("total_questions", 0)):
            if p.get(key) is None:
                raise ConfigError(f"option preset.{key} must be an integer when preset.total_turns is set "
                                  f"(null for both draws turns and questions per session)")
            v = parse_int(p[key], f"preset.{key}", minimum=lo)
            if isinstance(p[key], str):
                p[key] = v
        lo, hi = p["sessions"] * p["turns_min"], p["sessions"] * p["turns_max"]
        if not lo <= p["total_turns"] <= hi:
            raise ConfigError(f"option preset.total_turns={p['total_turns']} cannot be split into preset.sessions="
                              f"{p['sessions']} sessions of preset.turns_min..turns_max={p['turns_min']}-"
                              f"{p['turns_max']} turns (valid: {lo}-{hi}, or null)")
    else:
        qps = p.get("questions_per_session")
        if not isinstance(qps, list) or not qps:
            raise ConfigError(f"option preset.questions_per_session must be a non-empty list of counts, got {qps!r}")
        for k, n in enumerate(qps):
            if isinstance(n, str):
                raise ConfigError(f"option preset.questions_per_session[{k}] must be an integer, got {n!r}")
            parse_int(n, f"preset.questions_per_session[{k}]", minimum=0)
    qtypes = p.get("question_types")
    if not isinstance(qtypes, list) or not qtypes:
        raise ConfigError(f"option preset.question_types must be a non-empty list of question types "
                          f"({', '.join(QUESTION_TYPES)}), got {qtypes!r}")
    for k, t in enumerate(qtypes):
        parse_choice(t, f"preset.question_types[{k}]", QUESTION_TYPES)
    p["specificity"] = _specificity(p.get("specificity"))
    return p


def _specificity(spec) -> dict[str, float]:
    """preset.specificity: the share of questions at each level (SPECIFICITY), normalised; default all explicit."""
    from .plan import SPECIFICITY

    if spec is None:
        return {"explicit": 1.0}
    if not isinstance(spec, dict) or not spec:
        raise ConfigError(f"option preset.specificity must map levels ({', '.join(SPECIFICITY)}) to shares, got {spec!r}")
    out = {}
    for k, v in spec.items():
        parse_choice(k, "preset.specificity (a level)", SPECIFICITY)
        out[k] = parse_float(v, f"preset.specificity.{k}", minimum=0.0)
    total = sum(out.values())
    if total <= 0:
        raise ConfigError(f"option preset.specificity: the shares sum to 0 ({spec!r}); give at least one level a share")
    return {k: v / total for k, v in out.items()}


def check_options(cfg: DictConfig) -> dict:
    """Every option of the command, checked before any work; returns them parsed (and the preset)."""
    o: dict = {"command": parse_choice(cfg.command, "command", COMMANDS)}
    o["seed"] = parse_int(cfg.seed, "seed")
    o["workers"] = parse_int(cfg.workers, "workers", minimum=1)
    for key in ("overwrite", "progress", "mine"):
        o[key] = parse_bool(cfg[key], key)
    if o["command"] == "merge":
        dirs = cfg.merge_from
        if not dirs or isinstance(dirs, str):
            raise ConfigError("command=merge needs option merge_from=[shard dirs]")
        o["merge_from"] = [Path(str(d)) for d in dirs]
        for d in o["merge_from"]:
            if not d.is_dir():
                raise ConfigError(f"option merge_from names {str(d)!r}, which is not a folder")
        return o
    o["preset"] = _preset(cfg)
    o["shard"] = {"index": parse_int(cfg.shard.index, "shard.index", minimum=0),
                  "count": parse_int(cfg.shard.count, "shard.count", minimum=1)}
    if not o["shard"]["index"] < o["shard"]["count"]:
        raise ConfigError(f"option shard.index={o['shard']['index']} must lie in [0, shard.count={o['shard']['count']})")
    v = cfg.verbalizer
    o["verbalizer"] = parse_bool(v.enabled, "verbalizer.enabled")
    if o["verbalizer"]:
        parse_int(v.max_new_tokens, "verbalizer.max_new_tokens", minimum=1)
        parse_float(v.max_ratio, "verbalizer.max_ratio", minimum=0.0, exclusive=True)
        parse_choice(v.llm.backend, "verbalizer.llm.backend", LLM_BACKENDS)
        if v.llm.get("batch_size") is not None:
            parse_int(v.llm.batch_size, "verbalizer.llm.batch_size", minimum=1)
    if o["command"] == "benchmark":
        o["bench_sessions"] = parse_int(cfg.bench.sessions, "bench.sessions", minimum=1)
    return o


def _runtime_cfg(cfg: DictConfig, mine: bool) -> dict | None:
    if not mine:
        return None
    from arbor_train.runtime.config import runtime_config

    return runtime_config(OmegaConf.to_container(cfg, resolve=True))


def _cfg_text(cfg: DictConfig) -> str:
    """What determines the data (preset, seed, the mining runtime): the same for shards and a single run."""
    return OmegaConf.to_yaml(OmegaConf.create({"preset": OmegaConf.to_container(cfg.preset, resolve=True),
                                               "seed": cfg.seed, "mine": cfg.mine,
                                               "runtime": OmegaConf.to_container(cfg.runtime, resolve=True),
                                               "verbalizer": OmegaConf.to_container(cfg.verbalizer, resolve=True)}))


def run(cfg: DictConfig) -> dict:
    from arbor_train.conversations.io import quiet

    with quiet():
        return _run(cfg)


def _run(cfg: DictConfig) -> dict:
    o = check_options(cfg)
    cmd = o["command"]
    if cmd == "generate":
        p, shard = o["preset"], o["shard"]
        out = Path(str(cfg.out_dir))
        if shard["count"] > 1:
            out = out / f"shard-{shard['index']:05d}-of-{shard['count']:05d}"
        if out.exists() and not o["overwrite"]:  # before any work
            from arbor_train.errors import OutputExistsError

            raise OutputExistsError(f"out_dir={str(out)!r} already exists; pass overwrite=true to replace it")
        verbalizer = OmegaConf.to_container(cfg.verbalizer, resolve=True) if o["verbalizer"] else None
        stats = run_generation(p, o["seed"], out, _runtime_cfg(cfg, o["mine"]), o["workers"], shard, _cfg_text(cfg),
                               o["overwrite"], o["progress"], verbalizer)
        elapsed, total = stats.pop("_elapsed_s"), stats.pop("_total_s")
        n = stats["sessions"]
        print(f"wrote {out}: {n} sessions, {stats['questions']} questions, {stats['non_question_turns']} "
              f"non-question turns, turns/session {stats['turns_per_session']}; generated in {elapsed:.1f}s "
              f"({n / max(elapsed, 1e-9):.1f} sessions/s), {total:.1f}s with writing")
        print("questions by specificity: " + ", ".join(f"{k} {v}" for k, v in stats["questions_by_specificity"].items()))
        print(f"validation: {stats['validation']}")
        return stats
    if cmd == "merge":
        dirs = o["merge_from"]
        stats = merge_shards(dirs, Path(str(cfg.out_dir)), _cfg_text(cfg), o["overwrite"])
        print(f"merged {len(dirs)} shards into {cfg.out_dir}: {stats['sessions']} sessions")
        return stats
    return benchmark(cfg, o)


def benchmark(cfg: DictConfig, o: dict | None = None) -> dict:
    """Sessions per second: plan+realize+validate alone, and with supervision mining (one process)."""
    from .generate import init_worker, work_session

    o = o or check_options(OmegaConf.merge(cfg, {"command": "benchmark"}))
    p = o["preset"]
    n = min(o["bench_sessions"], p["sessions"])
    seed = o["seed"]
    targets = session_targets(p, seed)
    t0 = time.perf_counter()
    regenerated = 0
    for i in range(n):
        regenerated += build_session(i, p, seed, targets)[2]["attempts"] - 1
    plan_s = time.perf_counter() - t0
    init_worker(p, seed, targets, _runtime_cfg(cfg, True))
    t0 = time.perf_counter()
    for i in range(n):
        work_session(i)
    mine_s = time.perf_counter() - t0
    res = {"preset": p["name"], "sessions": n, "regenerated": regenerated,
           "plan_realize_validate_sessions_per_s": round(n / plan_s, 2),
           "with_mining_sessions_per_s": round(n / mine_s, 2),
           "projected_formal_s_one_process": round(33 / (n / mine_s), 1),
           "projected_10k_shard_s_one_process": round(10_000 / (n / mine_s), 1),
           "workers_default": o["workers"]}
    print(json.dumps(res, sort_keys=True))
    return res


@hydra.main(config_path=str(CONF_DIR), config_name="data_gen", version_base="1.3")
@entry_point
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    main()
