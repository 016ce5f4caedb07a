"""python -m eval.extraction [extractor=heuristic|prompted|bundle] [conversations=[...]]

The fact extractor measured against LoCoMo's session observations, the one free-form fact annotation
we hold. Each interaction (a message and the other speaker's reply) of the chosen conversations goes
through the configured extractor for the `facts` kind, with the runtime's validation; the predicted
facts are matched one-to-one to the observations citing that interaction (greedy, token F1 >=
`match_threshold`; `arbor_train.scoring.training.fact_f1`). Interactions with no observation count too: their
facts are false positives. Writes results.json (overall and per conversation) and table.md.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from arbor_train.errors import ConfigError, MissingInputError, entry_point, parse_choice, parse_float, parse_int
from arbor_train.paths import CONF_DIR

EXTRACTORS = ("heuristic", "prompted", "bundle")


def extractor_spec(c: dict):
    kind = parse_choice(c["extractor"], "extractor", EXTRACTORS)
    if kind == "heuristic":
        return "heuristic"
    if kind == "prompted":
        return {"kind": "prompted", **c["prompted"]}
    if not c["bundle"].get("path"):
        raise ConfigError("extractor=bundle needs option bundle.path (a folder from python -m arbor_train.export)")
    if not Path(str(c["bundle"]["path"])).is_dir():
        raise MissingInputError(f"option bundle.path={c['bundle']['path']!r}: no such folder")
    return {"kind": "bundle", **c["bundle"]}


def run(cfg: DictConfig) -> dict:
    from tqdm import tqdm

    from arbor_train.conversations.io import quiet
    from arbor_train.conversations.locomo import load_locomo
    from arbor_train.conversations.schema import interactions
    from arbor_train.runtime.extract import ExtractorSet, TurnInput
    from arbor_train.runtime.validate import ValidationReport, validate_items
    from arbor_train.scoring.training import fact_f1, json_validity
    from data_gen.locomo import observation_facts

    c = OmegaConf.to_container(cfg, resolve=True)
    spec = extractor_spec(c)
    threshold = parse_float(c["match_threshold"], "match_threshold", minimum=0.0)
    if threshold > 1.0:
        raise ConfigError(f"option match_threshold must be at most 1 (a token F1), got {threshold}")
    batch = parse_int(c["batch_size"], "batch_size", minimum=1)
    cap = None if c["max_interactions"] is None else parse_int(c["max_interactions"], "max_interactions", minimum=1)
    if not Path(str(c["input"])).exists():
        raise MissingInputError(f"option input={c['input']!r}: no such file or folder")
    convs = load_locomo(c["input"])
    from .run import check_extractor_heldout, select_by_id

    convs = select_by_id(convs, c["conversations"], lambda x: x.conversation_id, "conversations", c["input"])
    if isinstance(spec, dict) and spec.get("kind") == "bundle":  # never scored on its own training conversations
        check_extractor_heldout({"extractors": {"facts": spec}}, [x.conversation_id for x in convs])
    heur = c["runtime"]["heuristics"]
    with quiet():
        ex = ExtractorSet({"facts": spec}, heur, enabled=["facts"])
        if c.get("extraction_cache"):
            from arbor_train.runtime.extract import ExtractionCache

            ex.attach_cache(ExtractionCache(c["extraction_cache"]))
    per_conv, preds, golds, valid, samples = {}, [], [], [], []
    report = ValidationReport()
    t0 = time.perf_counter()
    for conv in convs:
        inters = interactions(conv)
        gold_of = observation_facts(conv, {tid: i for i, it in enumerate(inters) for tid in it.turn_ids})
        inters = inters[:cap]
        p_conv, g_conv = [], []
        for s in tqdm(range(0, len(inters), batch), desc=f"facts {conv.conversation_id}", disable=None):
            chunk = inters[s: s + batch]
            raws = ex.by_kind["facts"].run("facts", [TurnInput(it.user, it.assistant, it.timestamp) for it in chunk])
            for raw in raws:  # what the runtime would store: the validated items
                p_conv.append([f["text"] for f in validate_items(raw, "facts", report)])
                valid.append(not isinstance(raw, str) or json_validity([raw]) == 1.0)
                if len(samples) < 3 and isinstance(raw, str):
                    samples.append(raw[:300])
            g_conv += [[f["text"] for f in gold_of.get(s + k, [])] for k in range(len(chunk))]
        per_conv[conv.conversation_id] = {"interactions": len(p_conv), **fact_f1(p_conv, g_conv, threshold)}
        preds += p_conv
        golds += g_conv
    seconds = time.perf_counter() - t0
    res = {"extractor": c["extractor"], "spec": spec, "conversations": [x.conversation_id for x in convs],
           "interactions": len(preds), "predicted_facts": sum(map(len, preds)), "gold_facts": sum(map(len, golds)),
           **fact_f1(preds, golds, threshold), "json_validity": round(sum(valid) / max(1, len(valid)), 4),
           "raw_samples": samples, "per_conversation": per_conv,
           "seconds_per_interaction": round(seconds / max(1, len(preds)), 4)}
    out = Path(c["run_dir"])
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"results": res, "config": c}, indent=2, sort_keys=True, default=str))
    (out / "table.md").write_text(
        "| extractor | interactions | predicted facts | observations | precision | recall | F1 | JSON valid |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|\n"
        f"| {c['extractor']} | {res['interactions']} | {res['predicted_facts']} | {res['gold_facts']} | "
        f"{res['precision']:.3f} | {res['recall']:.3f} | {res['f1']:.3f} | {res['json_validity']:.3f} |\n")
    print((out / "table.md").read_text(), end="")
    print(json.dumps({k: v for k, v in res.items() if k not in ("per_conversation", "raw_samples")}, default=str))
    return res


@hydra.main(config_path=str(CONF_DIR), config_name="extraction", version_base="1.3")
@entry_point
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    main()
