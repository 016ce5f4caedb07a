"""Benchmarks that print measured numbers; the last line of stdout is one JSON object.

    python -m eval.bench target=runtime                       # ingest s/turn, query p50/p95 at 1k and 10k nodes
    python -m eval.bench target=runtime bench.sizes=[1000]    # quicker
"""

from __future__ import annotations

import json
import logging
import os
import platform
import random
import statistics
import tempfile
import time
from pathlib import Path

import hydra
import numpy as np
from omegaconf import DictConfig, OmegaConf

from arbor_train.paths import CONF_DIR

log = logging.getLogger(__name__)

FIRST = ["Alice", "Bob", "Carmen", "Dmitri", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kemal", "Lucia",
         "Marek", "Nadia", "Oskar", "Priya", "Quentin", "Rosa", "Samir", "Tomas", "Uma", "Viktor", "Wen", "Yara"]
PLACES = ["Lisbon", "Porto", "Kyoto", "Oslo", "Quito", "Tunis", "Riga", "Hanoi", "Lima", "Cork", "Bergen", "Split",
          "Graz", "Lyon", "Bilbao", "Tallinn", "Krakow", "Seville", "Nagoya", "Perth"]
TOPICS = ["trip to {p}", "conference in {p}", "wedding in {p}", "move to {p}", "marathon in {p}", "project in {p}"]
SLOTS = [("budget", lambda r: f"${r.randint(2, 90) * 100}"), ("date", lambda r: f"June {r.randint(1, 28)}"),
         ("venue", lambda r: f"{r.choice(['Hotel', 'Hall', 'Studio', 'Garden'])} {r.choice(PLACES)}"),
         ("deadline", lambda r: f"May {r.randint(1, 28)}"), ("guest count", lambda r: str(r.randint(5, 300)))]


def synthetic_stream(n: int, seed: int = 0, active: int = 4, new_branch_p: float = 0.04):
    """An interleaved multi-branch conversation: yields (user, assistant, question_for_this_branch)."""
    r = random.Random(seed)
    branches: list[tuple[str, str]] = []
    for i in range(n):
        if not branches or r.random() < new_branch_p:
            person = f"{r.choice(FIRST)} {chr(65 + r.randint(0, 25))}."
            topic = r.choice(TOPICS).format(p=r.choice(PLACES))
            branches.append((person, topic))
            b = branches[-1]
            user = f"{b[0]} is planning a {b[1]}. Let's keep track of it."
        else:
            b = r.choice(branches[-active:])
            slot, val = r.choice(SLOTS)
            user = r.choice([
                f"For {b[0]}'s {b[1]}, the {slot} is {val(r)}.",
                f"Back to {b[0]}'s {b[1]}: change the {slot} to {val(r)}.",
                f"Also, {b[0]}'s {slot} is {val(r)} for the {b[1]}.",
            ])
        slot = r.choice(SLOTS)[0]
        yield user, "Noted.", f"What is {b[0]}'s {slot} for the {b[1]}?"


def _pcts(xs: list[float]) -> tuple[float, float]:
    a = np.asarray(xs)
    return float(np.percentile(a, 50)), float(np.percentile(a, 95))


def bench_runtime(cfg: DictConfig) -> dict:
    from arbor_train.runtime import ArborMemory, build_components, default_config
    from arbor_train.runtime.rerank import build_reranker

    b = cfg.bench
    sizes = sorted(int(s) for s in b.sizes)
    results: dict = {}
    for label, profile in b.profiles.items():
        rcfg = default_config(profile)
        comp = build_components(rcfg)
        measured_reranker = comp["reranker"]
        bulk = dict(comp, reranker=build_reranker({"kind": "heuristic", "heuristic": rcfg["reranker"]["heuristic"]}))
        with tempfile.TemporaryDirectory() as d:
            mem = ArborMemory.open(Path(d) / "bench.sqlite", "bench", rcfg, components=bulk)
            stream = synthetic_stream(max(sizes) + b.window + 1, seed=b.seed)
            questions: list[str] = []
            built = 0
            res: dict = {}
            for size in sizes:
                t0 = time.perf_counter()
                # bulk build with the heuristic reranker (the measured windows use the profile's own)
                while built < size - b.window:
                    u, a, q = next(stream)
                    mem.step(u, a)
                    questions.append(q)
                    built += 1
                    if built % 1000 == 0:
                        print(f"[{label}] built {built} nodes ({time.perf_counter() - t0:.0f}s)", flush=True)
                mem.reranker = measured_reranker
                mem.timings.__init__()
                t1 = time.perf_counter()
                while built < size:
                    u, a, q = next(stream)
                    mem.step(u, a)
                    questions.append(q)
                    built += 1
                ingest = (time.perf_counter() - t1) / b.window
                r = random.Random(size)
                qs = [questions[r.randrange(len(questions))] for _ in range(b.queries)]
                lat = []
                for q in qs[:5]:
                    mem.read(q)  # warm caches
                for q in qs:
                    t = time.perf_counter()
                    mem.read(q)
                    lat.append(time.perf_counter() - t)
                p50, p95 = _pcts(lat)
                tm = mem.timings
                res[f"nodes_{size}"] = {
                    "nodes": mem.stats()["nodes"], "roots": mem.stats()["roots"],
                    "ingest_s_per_turn": round(ingest, 5),
                    "ingest_localize_s": round(statistics.mean(tm.localize_s[: b.window]), 5),
                    "ingest_extract_s": round(statistics.mean(tm.extract_s), 5),
                    "ingest_write_s": round(statistics.mean(tm.commit_s), 5),
                    "query_p50_s": round(p50, 5), "query_p95_s": round(p95, 5), "queries": len(lat),
                }
                print(f"[{label}] {size} nodes: {json.dumps(res[f'nodes_{size}'])}", flush=True)
                mem.reranker = bulk["reranker"]
            mem.close()
        if len(sizes) > 1:
            lo, hi = res[f"nodes_{sizes[0]}"], res[f"nodes_{sizes[-1]}"]
            res["query_p95_ratio"] = round(hi["query_p95_s"] / max(lo["query_p95_s"], 1e-9), 3)
        res["reranker"] = measured_reranker.name
        res["embedder"] = comp["embedder"].name
        results[label] = res
    results["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version(),
                          "processor": platform.processor() or platform.machine()}
    return results


TARGETS = {"runtime": bench_runtime}


def run(cfg: DictConfig) -> dict:
    if cfg.target not in TARGETS:
        raise ValueError(f"option target must be one of {sorted(TARGETS)}, got {cfg.target!r}")
    return TARGETS[cfg.target](cfg)


@hydra.main(config_path=str(CONF_DIR), config_name="bench", version_base="1.3")
def main(cfg: DictConfig) -> None:
    logging.getLogger("arbor_train").setLevel(logging.ERROR)
    out = run(cfg)
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
