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

from arbor_train.paths import CONF_DIR

from .generate import build_session, merge_shards, run_generation, session_targets


def _preset(cfg: DictConfig) -> dict:
    p = OmegaConf.to_container(cfg.preset, resolve=True)
    for key in ("sessions", "turns_min", "turns_max", "delay_min", "max_attempts"):
        if not isinstance(p.get(key), int) or p[key] < 0:
            raise ValueError(f"option preset.{key} must be a non-negative integer, got {p.get(key)!r}")
    if p["turns_min"] > p["turns_max"]:
        raise ValueError(f"option preset.turns_min ({p['turns_min']}) exceeds preset.turns_max ({p['turns_max']})")
    return p


def _runtime_cfg(cfg: DictConfig) -> dict | None:
    if not cfg.mine:
        return None
    from arbor_train.runtime import default_config

    return default_config(cfg.runtime_profile)


def _cfg_text(cfg: DictConfig) -> str:
    """What determines the data (preset, seed, mining profile): the same for shards and a single run."""
    return OmegaConf.to_yaml(OmegaConf.create({"preset": OmegaConf.to_container(cfg.preset, resolve=True),
                                               "seed": cfg.seed, "mine": cfg.mine,
                                               "runtime_profile": cfg.runtime_profile,
                                               "verbalizer": OmegaConf.to_container(cfg.verbalizer, resolve=True)}))


def run(cfg: DictConfig) -> dict:
    from data_gen.io import quiet

    with quiet():
        return _run(cfg)


def _run(cfg: DictConfig) -> dict:
    cmd = cfg.command
    if cmd == "generate":
        p = _preset(cfg)
        shard = {"index": int(cfg.shard.index), "count": int(cfg.shard.count)}
        if not 0 <= shard["index"] < shard["count"]:
            raise ValueError(f"option shard.index={shard['index']} must lie in [0, shard.count={shard['count']})")
        out = Path(str(cfg.out_dir))
        if shard["count"] > 1:
            out = out / f"shard-{shard['index']:05d}-of-{shard['count']:05d}"
        verbalizer = OmegaConf.to_container(cfg.verbalizer, resolve=True) if cfg.verbalizer.enabled else None
        stats = run_generation(p, int(cfg.seed), out, _runtime_cfg(cfg), int(cfg.workers), shard, _cfg_text(cfg),
                               bool(cfg.overwrite), bool(cfg.progress), verbalizer)
        elapsed, total = stats.pop("_elapsed_s"), stats.pop("_total_s")
        n = stats["sessions"]
        print(f"wrote {out}: {n} sessions, {stats['questions']} questions, {stats['non_question_turns']} "
              f"non-question turns, turns/session {stats['turns_per_session']}; generated in {elapsed:.1f}s "
              f"({n / max(elapsed, 1e-9):.1f} sessions/s), {total:.1f}s with writing")
        print(f"validation: {stats['validation']}")
        return stats
    if cmd == "merge":
        dirs = [Path(str(d)) for d in cfg.merge_from]
        if not dirs:
            raise ValueError("command=merge needs option merge_from=[shard dirs]")
        stats = merge_shards(dirs, Path(str(cfg.out_dir)), _cfg_text(cfg), bool(cfg.overwrite))
        print(f"merged {len(dirs)} shards into {cfg.out_dir}: {stats['sessions']} sessions")
        return stats
    if cmd == "benchmark":
        return benchmark(cfg)
    raise ValueError(f"option command must be generate, merge or benchmark, got {cmd!r}")


def benchmark(cfg: DictConfig) -> dict:
    """Sessions per second: plan+realize+validate alone, and with supervision mining (one process)."""
    from .generate import init_worker, work_session

    p = _preset(cfg)
    n = min(int(cfg.bench.sessions), p["sessions"])
    seed = int(cfg.seed)
    targets = session_targets(p, seed)
    t0 = time.perf_counter()
    regenerated = 0
    for i in range(n):
        regenerated += build_session(i, p, seed, targets)[2]["attempts"] - 1
    plan_s = time.perf_counter() - t0
    init_worker(p, seed, targets, _runtime_cfg(OmegaConf.merge(cfg, {"mine": True})))
    t0 = time.perf_counter()
    for i in range(n):
        work_session(i)
    mine_s = time.perf_counter() - t0
    res = {"preset": p["name"], "sessions": n, "regenerated": regenerated,
           "plan_realize_validate_sessions_per_s": round(n / plan_s, 2),
           "with_mining_sessions_per_s": round(n / mine_s, 2),
           "projected_formal_s_one_process": round(33 / (n / mine_s), 1),
           "projected_10k_shard_s_one_process": round(10_000 / (n / mine_s), 1),
           "workers_default": int(cfg.workers)}
    print(json.dumps(res, sort_keys=True))
    return res


@hydra.main(config_path=str(CONF_DIR), config_name="data_gen", version_base="1.3")
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    main()
