"""One command, one table: run a set of evaluation configurations in-process and print the merged table.

    python -m eval.compare table=<name> [overrides] [--out DIR] [--resume]   # a published table, by name (conf/table/)

    python -m eval.compare methods   [eval overrides...]   # arbormem, full_context, bm25, dense, fact_store
    python -m eval.compare ablations [eval overrides...]   # full and each component removed alone
    python -m eval.compare budgets   [eval overrides...]   # 256 ... 32768 tokens for arbormem and the baselines
    python -m eval.compare policies  [eval overrides...]   # read policies vs BM25 and dense at 512-2048 tokens
    python -m eval.compare grid --row "method=bm25" --row "method=dense runtime/components=minilm" \
        --budgets 512 1024 [eval overrides...]           # your own rows, each at each budget

Overrides are those of `python -m eval.run` (Hydra syntax), e.g. `runtime/components=tuned
runtime.reranker.bundle.path=outputs/bundles/reranker answer_model=smollm2`. Every run
keeps its own folder under --out; the table, merged.json and the plots land in --out.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from arbor_train.errors import entry_point
from arbor_train.replay.methods import MEMORY_METHODS

SETS = {
    "methods": [[f"method={m}"] for m in MEMORY_METHODS],
    "ablations": [["ablation=full"]] + [[f"ablation={a}"] for a in (
        "state_localization", "routing", "atomic_facts", "structured_extraction", "structured_evidence")],
    "budgets": [[f"method={m}", f"budget={b}"] for m in ("arbormem", "full_context", "bm25", "dense")
                for b in (256, 512, 1024, 2048, 4096, 8192, 16384, 32768)],
    # the two read policies (conf/runtime/read_policy: default, in-dialogue; cross_session, after the
    # conversation) beside BM25 and MiniLM dense retrieval, at three budgets; pass benchmark=locomo for LoCoMo
    "policies": [[f"budget={b}", *m] for b in (512, 1024, 2048) for m in (
        ["method=arbormem", "runtime/read_policy=default"], ["method=arbormem", "runtime/read_policy=cross_session"],
        ["method=bm25"], ["method=dense", "runtime/components=minilm"])],
}


def grid(rows: list[str], budgets: list[int]) -> list[list[str]]:
    """Your own set: each row (a space-separated string of eval.run overrides) at each budget."""
    return [[*r.split(), f"budget={b}"] for r in rows for b in budgets]


def compare(kind: str, overrides: list[str], out: str | Path, configs: list[list[str]] | None = None) -> dict:
    """Run every configuration of set `kind` (or `configs`, for kind=grid) with the common overrides."""
    from arbor_train.runtime.config import compose

    from .report import report
    from .run import run

    if configs is None and kind not in SETS:
        raise ValueError(f"compare set must be one of {sorted(SETS)}, got {kind!r}")
    out = Path(out)
    for i, extra in enumerate(configs if configs is not None else SETS[kind]):
        name = "-".join(e.split("=", 1)[1].replace("/", "_") for e in extra if not e.startswith("runtime."))[:80]
        cfg = compose("eval", [*overrides, *extra, f"run_dir={out / f'{i:02d}-{name}'}"])
        run(cfg)
    return report([out], out)


@entry_point
def table_main(argv: list[str]) -> None:
    """`table=<name>`: the table's config runs (eval/tables.py); a user mistake is one error line, exit 2."""
    from .tables import run_table

    ap = argparse.ArgumentParser(prog="python -m eval.compare table=<name>")
    ap.add_argument("overrides", nargs="*", help="added to every row (Hydra syntax), e.g. max_sessions=2")
    ap.add_argument("--out", default=None, help="output folder (default docs/results/generated/<name>)")
    ap.add_argument("--resume", action="store_true",
                    help="finish an interrupted run of the same command: keep the stages it finished (tables whose "
                         "module runs fingerprinted stages, e.g. locomo_cv; only while the stages' code is unchanged)")
    a = ap.parse_intermixed_args(argv[1:])
    run_table(argv[0].split("=", 1)[1], a.overrides, a.out, resume=a.resume)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1].startswith("table="):
        table_main(sys.argv[1:])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kind", choices=[*sorted(SETS), "grid"])
    ap.add_argument("overrides", nargs="*", help="eval.run overrides (Hydra syntax)")
    ap.add_argument("--out", default=None, help="output folder (default outputs/reports/<kind>)")
    ap.add_argument("--row", action="append", default=[],
                    help="grid: one row, a space-separated string of eval.run overrides (repeat the option)")
    ap.add_argument("--budgets", type=int, nargs="+", default=[2048], help="grid: the read budgets of every row")
    a = ap.parse_intermixed_args()  # overrides may come before or after the options
    if a.kind == "grid" and not a.row:
        ap.error("grid needs at least one --row")
    compare(a.kind, a.overrides, a.out or f"outputs/reports/{a.kind}",
            grid(a.row, a.budgets) if a.kind == "grid" else None)


if __name__ == "__main__":
    main()
