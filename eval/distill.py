"""python -m eval.distill [distilled=outputs/data/distilled] [input=docs/examples/chats.jsonl]

The student report of a distillation (data_gen/distill.py). On the held-out split of the distilled folder
(conversations the students never trained on), for each row of `rows` (conf/distill_report.yaml):

- routing agreement: on every turn the teacher routed by its scores, the row's router scores the same
  recalled candidates (the teacher's forest) and picks one, or a new thread when its best score is below
  its threshold (a bundle's calibrated one, else the runtime's); agreement is the share of turns where it
  picks what the teacher picked;
- routing vs labels: on the same turns, where the conversation file has `parent` labels, the share where
  the pick is one of the labelled parents (or both say new thread). The teacher gets this column too;
- extraction agreement per kind, with the teacher's validated output as the reference and the shared
  metrics (arbor_train.scoring.training.extraction_metrics): summary ROUGE-L, entity F1, fact F1, slot F1,
  event-text F1 and artifact-item F1, each over the turns where the teacher's output of that kind passed
  validation;
- valid outputs: the share of (turn, kind) extraction outputs the runtime's validation accepted, over the
  held-out turns and every enabled kind (the teacher's from its dropped.jsonl, over the same turns);
- cost: seconds per turn of the row's routing and extraction, measured here; the teacher's is the
  distillation's (stats.json `teacher_s_per_turn`: wall seconds per teacher call, with its concurrency,
  times the calls a turn needs).

Writes results.json, table.md and agreement.png to `out`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from arbor_train.errors import ConfigError, InputError, MissingInputError, entry_point, parse_float, parse_int
from arbor_train.paths import CONF_DIR

KIND_METRIC = {"summary": ("rouge_l", "summary ROUGE-L"), "entities": ("entity_f1", "entity F1"),
               "facts": ("fact_f1", "fact F1"), "states": ("slot_value_f1", "slot F1"),
               "events": ("event_text_f1", "event text F1"), "artifacts": ("artifact_item_f1", "artifact item F1")}


def load_distilled(data: Path, split: str = "heldout") -> tuple[dict[str, list[dict]], dict]:
    from arbor_train.conversations.io import read_rows

    if not (data / "README.md").exists() or not (data / split / "jsonl").is_dir():
        raise MissingInputError(f"option distilled={str(data)!r}: not a finished distillation with a {split} split "
                                "(python -m data_gen.distill ... heldout=0.25)")
    rows = {s: read_rows(data / split / "jsonl" / f"{s}.jsonl", None) for s in ("routing", "extraction")}
    return rows, json.loads((data / "stats.json").read_text())


def file_labels(path: str, limits: dict) -> dict[tuple[str, int], set[int]]:
    """(conversation, turn position) -> the labelled parents' positions ({-1}: a new thread), for labelled
    turns of the file (positions are 1-based, as the distilled rows number them)."""
    from arbor_train.conversations.files import load_conversations
    from data_gen.conversations import numbered

    out = {}
    for conv in load_conversations(path, limits):
        for t in numbered(conv):
            if t["parents"] is not None:
                out[(conv.conversation_id, t["turn"])] = set(t["parents"]) if t["parents"] else {-1}
    return out


def build_router(spec, runtime_cfg: dict):
    """(reranker, threshold) for a row's `reranker`: heuristic or a bundle folder."""
    from arbor_train.runtime.rerank import HeuristicReranker, load_bundle_reranker

    loc = runtime_cfg["localization"]
    if spec == "heuristic":
        return HeuristicReranker(**runtime_cfg["reranker"]["heuristic"]), float(loc["new_root_threshold"])
    if not Path(str(spec)).is_dir():
        raise MissingInputError(f"option rows.<row>.reranker={spec!r}: no such bundle folder "
                                "(python -m arbor_train.export; docs/tutorials/distill.md)")
    r = load_bundle_reranker(str(spec))
    tuned = getattr(r, "new_root_threshold", None)
    return r, float(tuned) if tuned is not None and loc["threshold_from_bundle"] else float(loc["new_root_threshold"])


def route(rows: list[dict], reranker, threshold: float) -> tuple[list[int], float]:
    """Each row's pick among its candidates (-1: a new thread) and the seconds it took."""
    from arbor_train.data import candidate_of

    picks, t0 = [], time.perf_counter()
    for r in rows:
        scores = reranker.score(r["input"], [candidate_of(c) for c in r["candidates"]])
        best = max(range(len(scores)), key=lambda i: scores[i])
        picks.append(-1 if scores[best] < threshold else r["candidates"][best]["turn"])
    return picks, time.perf_counter() - t0


def extract(rows: list[dict], spec, runtime_cfg: dict, kinds: list[str]) -> tuple[list, float]:
    from arbor_train.runtime.extract import ExtractorSet, TurnInput

    if spec != "heuristic":
        if not Path(str(spec)).is_dir():
            raise MissingInputError(f"option rows.<row>.extractor={spec!r}: no such bundle folder")
        spec = {"kind": "bundle", "path": str(spec)}
    ex = ExtractorSet({k: spec for k in kinds}, runtime_cfg["heuristics"], enabled=kinds)
    out, t0 = [], time.perf_counter()
    for i in range(0, len(rows), 8):
        out += ex.extract([TurnInput(r["input"], r["assistant"], r["timestamp"]) for r in rows[i : i + 8]])
    return out, time.perf_counter() - t0


def valid_share(extractions: list, kinds: list[str]) -> float | None:
    """The share of (turn, kind) outputs the runtime's validation accepted (a summary: a non-empty one)."""
    bad = sum(len({m.split(": ", 1)[0] for m in e.report.rejected} & set(kinds))
              + ("summary" in kinds and not str(e.raw.get("summary") or "").strip()) for e in extractions)
    return round(1 - bad / (len(extractions) * len(kinds)), 4) if extractions and kinds else None


def teacher_valid_share(data: Path, rows: list[dict], kinds: list[str]) -> float | None:
    """The same share for the teacher, over the same held-out turns and kinds (dropped.jsonl: one line per
    rejected output, with its split)."""
    drops = [json.loads(x) for x in (data / "dropped.jsonl").read_text().splitlines() if x.strip()]
    if any("split" not in d for d in drops):
        raise InputError(f"{data / 'dropped.jsonl'}: lines without a 'split' field (written by an older "
                         "data_gen.distill: run it again with overwrite=true; its calls are cached)")
    turns = {(r["session_id"], r["turn"]) for r in rows}
    bad = sum(d["split"] == "heldout" and d["set"] == "extraction" and d["kind"] in kinds
              and (d["session_id"], d["turn"]) in turns for d in drops)
    return round(1 - bad / (len(turns) * len(kinds)), 4) if turns and kinds else None


def has_kind(row: dict, kind: str) -> bool:
    """Whether a distilled extraction row holds the teacher's (valid) output of this kind."""
    return bool(row["summary"]) if kind == "summary" else kind in json.loads(row["target"])


def agreement(extractions: list, rows: list[dict], kinds: list[str], threshold: float) -> dict[str, dict]:
    """Per kind: the metric against the teacher's validated output, over the turns that have one."""
    from arbor_train.scoring.training import extraction_metrics

    out = {}
    for kind in kinds:
        metric, _ = KIND_METRIC[kind]
        if kind == "summary":
            pairs = [(e.summary, r["summary"]) for e, r in zip(extractions, rows) if has_kind(r, kind)]
        else:
            pairs = [(getattr(e, kind), json.loads(r["target"])[kind]) for e, r in zip(extractions, rows)
                     if has_kind(r, kind)]
        if pairs:
            m = extraction_metrics(kind, [p for p, _ in pairs], [g for _, g in pairs], threshold)
            out[kind] = {"value": round(float(m[metric]), 4), "turns": len(pairs)}
    return out


def picture(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    cols = ["routing agreement", "routing vs labels"] + [label for _, label in KIND_METRIC.values()]
    keys = ["routing_agreement", "routing_vs_labels"] + [k for k in KIND_METRIC]
    fig, ax = plt.subplots(figsize=(10, 4))
    width = 0.8 / max(1, len(results))
    x = np.arange(len(cols))
    for i, r in enumerate(results):
        vals = [r.get(k) if k.startswith("routing") else (r["extraction"].get(k) or {}).get("value") for k in keys]
        ax.bar(x + i * width, [np.nan if v is None else v for v in vals], width, label=r["row"])
    ax.set_xticks(x + width * (len(results) - 1) / 2, cols, rotation=25, ha="right")
    ax.set_ylim(0, 1)
    ax.set_ylabel("agreement with the teacher (labels: accuracy)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def fmt(v) -> str:
    return "-" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)


def run(cfg: DictConfig) -> dict:
    from arbor_train.conversations.io import quiet
    from arbor_train.runtime.config import runtime_config
    from arbor_train.runtime.memory import enabled_kinds

    c = OmegaConf.to_container(cfg, resolve=True)
    runtime_cfg = runtime_config(c)
    threshold = parse_float(c["match_threshold"], "match_threshold", minimum=0.0)
    cap = None if c["max_turns"] is None else parse_int(c["max_turns"], "max_turns", minimum=1)
    specs = {k: v for k, v in (c["rows"] or {}).items() if v is not None}
    if not specs:
        raise ConfigError("option rows must map row ids to {name: ..., reranker: ..., extractor: ...}")
    for rid, spec in specs.items():
        if not isinstance(spec, dict) or set(spec) - {"name", "reranker", "extractor"}:
            raise ConfigError(f"option rows.{rid} must be {{name: ..., reranker: teacher|heuristic|<bundle>|null, "
                              f"extractor: teacher|heuristic|<bundle>|null}}, got {spec!r}")
    rows, stats = load_distilled(Path(str(c["distilled"])))
    routing, extraction = rows["routing"][:cap], rows["extraction"][:cap]
    labels = file_labels(str(c["input"]), dict(runtime_cfg["limits"])) if c.get("input") else {}
    labelled = [i for i, r in enumerate(routing) if (r["session_id"], r["turn"]) in labels]
    kinds = [k for k in enabled_kinds(runtime_cfg) if any(has_kind(r, k) for r in extraction)]
    teacher_s = stats.get("teacher_s_per_turn")
    results = []
    for rid, spec in specs.items():
        res: dict = {"row": spec.get("name") or rid, "routing_turns": len(routing), "labelled_turns": len(labelled)}
        picks, s_route, s_extract = None, 0.0, 0.0
        with quiet():
            if spec.get("reranker") == "teacher":
                picks = [r["gold_parent"] for r in routing]
                res["routing_agreement"] = 1.0 if routing else None
            elif spec.get("reranker"):
                reranker, thr = build_router(spec["reranker"], runtime_cfg)
                picks, s_route = route(routing, reranker, thr)
                res["routing_agreement"] = (round(sum(p == r["gold_parent"] for p, r in zip(picks, routing))
                                                  / len(routing), 4) if routing else None)
            res["extraction"] = {}
            if spec.get("extractor") == "teacher":
                res["extraction"] = {k: {"value": 1.0, "turns": None} for k in kinds}
                res["valid_outputs"] = teacher_valid_share(Path(str(c["distilled"])), extraction,
                                                           enabled_kinds(runtime_cfg))
            elif spec.get("extractor"):
                outs, s_extract = extract(extraction, spec["extractor"], runtime_cfg, enabled_kinds(runtime_cfg))
                res["extraction"] = agreement(outs, extraction, kinds, threshold)
                res["valid_outputs"] = valid_share(outs, enabled_kinds(runtime_cfg))
        if "teacher" in (spec.get("reranker"), spec.get("extractor")):
            res["s_per_turn"] = teacher_s
        else:
            res["s_per_turn"] = round(s_route / max(1, len(routing)) + s_extract / max(1, len(extraction)), 4)
        if picks is not None and labelled:
            res["routing_vs_labels"] = round(sum(picks[i] in labels[(routing[i]["session_id"], routing[i]["turn"])]
                                                 for i in labelled) / len(labelled), 4)
        results.append(res)
    out = Path(str(c["out"]))
    out.mkdir(parents=True, exist_ok=True)
    head = (["row", "routing agreement", "routing vs labels"] + [KIND_METRIC[k][1] for k in kinds]
            + ["valid outputs", "s per turn"])
    lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    for r in results:
        vals = [r.get("routing_agreement"), r.get("routing_vs_labels")]
        vals += [(r["extraction"].get(k) or {}).get("value") for k in kinds] + [r.get("valid_outputs"), r.get("s_per_turn")]
        lines.append("| " + " | ".join([r["row"], *map(fmt, vals)]) + " |")
    n_kind = {k: sum(has_kind(e, k) for e in extraction) for k in kinds}
    note = (f"{len(routing)} held-out turns the teacher routed by its scores ({len(labelled)} labelled in the file); "
            f"{len(extraction)} held-out turns with a valid teacher extraction ("
            + ", ".join(f"{k} {n}" for k, n in n_kind.items()) + ").")
    table = "\n".join(lines) + "\n\n" + note + "\n"
    (out / "table.md").write_text(table)
    (out / "results.json").write_text(json.dumps({"rows": results, "teacher": stats["teacher"],
                                                  "teacher_model": stats["teacher_model"], "kinds": kinds,
                                                  "data": str(c["distilled"]), "input": c.get("input")}, indent=2))
    picture(results, out / "agreement.png")
    print(table, end="")
    return {"rows": results, "kinds": kinds}


@hydra.main(config_path=str(CONF_DIR), config_name="distill_report", version_base="1.3")
@entry_point
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    main()
