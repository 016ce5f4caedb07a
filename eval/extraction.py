"""python -m eval.extraction [extractor=heuristic|prompted|bundle|recorded] [conversations=[...]]

The fact extractor measured against LoCoMo's session observations, the one free-form fact annotation
we hold. Each interaction (a message and the other speaker's reply) of the chosen conversations goes
through the configured extractor for the `facts` kind, with the runtime's validation; the predicted
facts are matched one-to-one to the observations citing that interaction (greedy, token F1 >=
`match_threshold`; `arbor_train.scoring.training.fact_f1`). Interactions with no observation count too: their
facts are false positives. Writes results.json (overall and per conversation) and table.md.

`extractor=recorded` scores labels already made instead of calling a model: the facts a teacher gave each
interaction in a distillation of LoCoMo (`python -m data_gen.distill input_format=locomo`, its out_dir as
`recorded.dir`). An interaction whose output the validation rejected (in dropped.jsonl) has no facts and
counts as invalid JSON; the cost is the teacher's seconds per turn from the distillation's card.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from arbor_train.errors import ConfigError, MissingInputError, entry_point, parse_choice, parse_float, parse_int
from arbor_train.paths import CONF_DIR

EXTRACTORS = ("heuristic", "prompted", "bundle", "recorded")


def extractor_spec(c: dict):
    kind = parse_choice(c["extractor"], "extractor", EXTRACTORS)
    if kind == "heuristic":
        return "heuristic"
    if kind == "prompted":
        return {"kind": "prompted", **c["prompted"]}
    if kind == "recorded":
        d = c["recorded"].get("dir")
        if not d or not (Path(str(d)) / "stats.json").exists():
            raise MissingInputError(f"option recorded.dir={d!r}: no finished distillation there (python -m "
                                    "data_gen.distill input_format=locomo ... out_dir=<it>)")
        return {"kind": "recorded", "dir": str(d)}
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
    recorded = RecordedFacts(spec["dir"]) if isinstance(spec, dict) and spec["kind"] == "recorded" else None
    if recorded is None:
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
            if recorded is not None:
                for k, it in enumerate(chunk):
                    facts, ok = recorded.facts(conv.conversation_id, s + k, it)
                    p_conv.append(facts)
                    valid.append(ok)
                g_conv += [[f["text"] for f in gold_of.get(s + k, [])] for k in range(len(chunk))]
                continue
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
           "seconds_per_interaction": (recorded.seconds_per_turn if recorded is not None
                                       else round(seconds / max(1, len(preds)), 4))}
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


class RecordedFacts:
    """A LoCoMo distillation's facts per (conversation, interaction): the rows of data_gen.distill
    input_format=locomo (a row's `turn` is the interaction's 1-based position, its `input` the message) and
    the outputs its validation rejected (dropped.jsonl)."""

    def __init__(self, out_dir: str):
        from arbor_train.conversations.io import read_rows
        from arbor_train.errors import InputError

        d = Path(out_dir)
        try:
            stats = json.loads((d / "stats.json").read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            raise ConfigError(f"option recorded.dir={out_dir!r}: no readable stats.json of a finished "
                              f"data_gen.distill run ({type(e).__name__}: {e})") from None
        if stats.get("input_format") != "locomo":
            raise ConfigError(f"option recorded.dir={out_dir!r}: a distillation of {stats.get('input_format') or 'a conversation file'}"
                              ", not of LoCoMo (data_gen.distill input_format=locomo)")
        self.seconds_per_turn = stats.get("teacher_s_per_turn")
        self.rows: dict[tuple[str, int], dict] = {}
        self.rejected = set()
        files = [(d / split / "jsonl" / "extraction.jsonl", "rows") for split in ("train", "heldout")]
        for f, what in [*files, (d / "dropped.jsonl", "drops")]:
            for n, r in enumerate(read_rows(f, None) if f.exists() else [], 1):
                try:
                    key = (str(r["session_id"]), int(r["turn"]))
                except (KeyError, TypeError, ValueError) as e:
                    raise InputError(f"{f}: row {n}: no session_id and turn ({type(e).__name__}: {e})") from None
                if what == "rows":
                    self.rows[key] = r
                elif r.get("kind") == "facts":
                    self.rejected.add(key)

    def facts(self, conv_id: str, index: int, it) -> tuple[list[str], bool]:
        """(fact texts, output valid) of the interaction at 0-based `index`; a row for another text (the file
        distilled differs from the one scored) is refused."""
        key = (conv_id, index + 1)
        if key in self.rejected:
            return [], False
        r = self.rows.get(key)
        if r is None:
            raise ConfigError(f"option recorded.dir: no row for conversation {conv_id} interaction {index + 1}: the "
                              "distillation did not label it (max_turns, max_conversations) or labelled other files")
        if r.get("input") != it.user:
            raise ConfigError(f"option recorded.dir: conversation {conv_id} interaction {index + 1} holds another "
                              "message than the input's: the distillation read other files")
        target = json.loads(r["target"])
        return [f["text"] for f in target.get("facts", [])], "facts" in target


@hydra.main(config_path=str(CONF_DIR), config_name="extraction", version_base="1.3")
@entry_point
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    main()
