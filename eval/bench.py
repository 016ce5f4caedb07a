"""Benchmarks that print measured numbers; the last line of stdout is one JSON object.

    python -m eval.bench target=runtime                       # ingest s/turn, query p50/p95, forget ms at 1k and 10k nodes
    python -m eval.bench target=runtime bench.sizes=[1000]    # quicker
    python -m eval.bench target=train                         # extractor SFT step: ours vs HF Trainer + PEFT
    python -m eval.bench target=extract           # every extractor layout under each lever: cost and quality
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

from arbor_train.errors import ConfigError, MissingInputError, conf_options, entry_point, parse_choice, parse_int
from arbor_train.paths import CONF_DIR

log = logging.getLogger(__name__)

PAPER_INGEST_S = 1.363  # the method paper's seconds per ingested turn, with LLM calls (../shared/docs/arbormem.md "Efficiency")

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


def bench_forget(mem, b: DictConfig, scratch: Path) -> dict:
    """Milliseconds of `forget(nodes=...)` for each count in bench.forget_counts, on copies of this memory.

    Each count starts from a fresh copy of the file (and its index), so earlier forgets do not shrink the
    forest; nodes are drawn at random from the whole forest, so the cascade re-attaches children and
    re-summarizes their subtrees as a user's deletions would. `moved` counts the nodes re-summarized,
    `depth_fixed` the nodes whose depth changed (the cascade's work beyond the deleted rows).
    """
    import shutil

    from arbor_train.runtime import ArborMemory

    mem.index.save()
    mem.store.checkpoint()
    src = Path(mem.store.path)
    out: dict = {}
    for count in (parse_int(c, "bench.forget_counts[]", minimum=1) for c in b.forget_counts):
        times, moved, shifted, compacted = [], [], [], 0
        for rep in range(int(b.forget_repeats)):
            copy = scratch / f"{count}_{rep}" / src.name
            copy.parent.mkdir(parents=True)
            shutil.copy(src, copy)
            shutil.copytree(f"{src}.hnsw", f"{copy}.hnsw")
            m = ArborMemory.open(copy, mem.conv, mem.cfg, components=mem.components)
            ids = m.store.node_ids(mem.conv)
            pick = random.Random(count * 1000 + rep).sample(ids, min(count, len(ids)))
            t = time.perf_counter()
            r = m.forget(nodes=pick)
            times.append(time.perf_counter() - t)
            moved.append(r.counts["nodes_moved"])
            shifted.append(r.counts["nodes_depth_fixed"])
            compacted += r.counts["index_compacted"]
            m.close()
            shutil.rmtree(copy.parent)
        out[f"nodes_{count}"] = {"ms_median": round(1000 * statistics.median(times), 2),
                                 "ms_max": round(1000 * max(times), 2),
                                 "ms_per_node": round(1000 * statistics.median(times) / count, 3),
                                 "moved_median": statistics.median(moved), "depth_fixed_median": statistics.median(shifted),
                                 "index_rebuilds": compacted,
                                 "repeats": len(times)}
    return out


def extractor_names(comp: dict) -> list[str]:
    """The distinct extractor classes a runtime's enabled kinds run (SpanExtractor alone: one bundle, every kind)."""
    ex = comp["extractors"]
    return sorted({type(ex.by_kind[k]).__name__ for k in ex.enabled})


def bench_runtime(cfg: DictConfig) -> dict:
    from arbor_train.runtime import ArborMemory, build_components, default_config
    from arbor_train.runtime.rerank import build_reranker

    b = cfg.bench
    sizes = sorted(parse_int(s, f"bench.sizes[{k}]", minimum=1) for k, s in enumerate(b.sizes))
    results: dict = {}
    for label in b.profiles:
        rcfg = default_config(*b.runtimes[label])
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
                # bulk build with the heuristic reranker (the two measured windows use the runtime's own)
                while built < size - 2 * b.window:
                    u, a, q = next(stream)
                    mem.step(u, a)
                    questions.append(q)
                    built += 1
                    if built % 1000 == 0:
                        print(f"[{label}] built {built} nodes ({time.perf_counter() - t0:.0f}s)", flush=True)
                mem.reranker = measured_reranker
                # batched: a replay's ingest (ArborMemory.steps), runtime.ingest.extract_ahead turns extracted at once
                window = [next(stream) for _ in range(b.window)]
                questions += [q for _, _, q in window]
                t1 = time.perf_counter()
                for _ in mem.steps([{"user": u, "assistant": a} for u, a, _ in window]):
                    pass
                batched = (time.perf_counter() - t1) / b.window
                built += b.window
                # online: one turn at a time, as a live assistant commits (the stage split is this window's)
                mem.timings.__init__()
                t1 = time.perf_counter()
                while built < size:
                    u, a, q = next(stream)
                    mem.step(u, a)
                    questions.append(q)
                    built += 1
                ingest = (time.perf_counter() - t1) / b.window
                stages = {k: round(1000 * v / b.window, 2) for k, v in sorted(mem.timings.stages.items())}
                stages["other"] = round(1000 * ingest - sum(stages.values()), 2)  # cues, lookups, bookkeeping
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
                    "ingest_batched_s_per_turn": round(batched, 5),
                    "paper_over_online": round(PAPER_INGEST_S / ingest, 1),  # the paper's s/turn over this online one
                    "ingest_localize_s": round(statistics.mean(tm.localize_s[: b.window]), 5),
                    "ingest_extract_s": round(statistics.mean(tm.extract_s), 5),
                    "ingest_write_s": round(statistics.mean(tm.commit_s), 5),
                    "ingest_stages_ms": stages,  # ms per ingested turn in each stage (Timings.stage)
                    "query_p50_s": round(p50, 5), "query_p95_s": round(p95, 5), "queries": len(lat),
                }
                res[f"nodes_{size}"]["forget"] = bench_forget(mem, b, Path(d) / f"forget_{size}")
                print(f"[{label}] {size} nodes: {json.dumps(res[f'nodes_{size}'])}", flush=True)
                print(f"[{label}] {size} nodes, ingest ms per turn by stage: "
                      + ", ".join(f"{k} {v:.2f}" for k, v in stages.items()), flush=True)
                mem.reranker = bulk["reranker"]
            mem.close()
        if len(sizes) > 1:
            lo, hi = res[f"nodes_{sizes[0]}"], res[f"nodes_{sizes[-1]}"]
            res["query_p95_ratio"] = round(hi["query_p95_s"] / max(lo["query_p95_s"], 1e-9), 3)
        res["reranker"] = measured_reranker.name
        res["embedder"] = comp["embedder"].name
        res["tagger"] = type(comp["tagger"]).__name__
        res["extractors"] = extractor_names(comp)
        res["extract_ahead"] = int(rcfg.get("ingest", {}).get("extract_ahead", 1))
        results[label] = res
    results["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version(),
                          "processor": platform.processor() or platform.machine()}
    return results


def _throughput(tokens: list[int], seconds: list[float], warmup: int, padding: list[float], **extra) -> dict:
    """tokens/s over the timed steps (those after `warmup`), from per-step real tokens and wall times."""
    if len(seconds) <= warmup:
        raise ConfigError(f"only {len(seconds)} steps ran, not more than bench_train.warmup_steps={warmup}: "
                         "raise bench_train.examples (the data ran out) or lower warmup_steps")
    tok, sec = sum(tokens[warmup : len(seconds)]), sum(seconds[warmup:])
    return {"tokens_per_s": round(tok / sec, 1), "padding_fraction": round(statistics.mean(padding[: len(seconds)]), 4),
            "timed_steps": len(seconds) - warmup, "timed_tokens": tok, "timed_seconds": round(sec, 3),
            "step_seconds_median": round(statistics.median(seconds[warmup:]), 3), **extra}


def bench_train(cfg: DictConfig) -> dict:
    """Tokens/s and padding fraction of this toolkit's extractor training step (completion-only logits,
    packing, attention within each packed example: arbor_train/packing.py) against a plain Hugging Face Trainer + PEFT run
    (dynamically padded batches, the model's own loss) on the same model, LoRA config and data.

    Each side's steps are timed by callbacks around the whole step (forward, backward, optimizer);
    the first `warmup_steps` are left out; tokens are the real (non-padding) tokens of the timed steps.
    """
    import lightning as L
    import torch
    from transformers import DataCollatorForSeq2Seq, Trainer, TrainerCallback, TrainingArguments

    from arbor_train import roles
    from arbor_train.data import load_sets, select_rows
    from arbor_train.models import add_lora, build_decoder
    from arbor_train.packing import padding_fraction, real_tokens
    from arbor_train.roles.extractor import sft_examples
    from arbor_train.runtime.config import compose

    b = cfg.bench_train
    steps, warmup = int(b.steps), int(b.warmup_steps)
    if steps <= warmup:
        raise ConfigError(f"option bench_train.steps={steps} must exceed bench_train.warmup_steps={warmup}")
    scratch = tempfile.TemporaryDirectory(prefix="arbor_bench_train_")
    over = [f"model={b.model}", "task=extractor_states", f"data.train_dir={b.data_dir}", "logger=csv",
            f"data.max_train_examples={b.examples}", "data.max_val_examples=8", f"task.batch_size={b.packs_per_batch}",
            f"task.pack_length={b.pack_length}", f"task.max_length={b.max_length}", f"run_dir={scratch.name}/ours",
            *list(b.get("overrides") or [])]
    c = OmegaConf.to_container(compose("train", over), resolve=True)
    torch.set_num_threads(int(b.threads))
    res: dict = {"model": b.model, "steps": steps, "warmup_steps": warmup, "threads": int(b.threads)}

    def recording(collate, tokens: list, padding: list):
        def wrapped(items):
            out = collate(items)
            tokens.append(real_tokens(out))
            padding.append(padding_fraction(out))
            return out
        return wrapped

    # ours: the extractor role as `python -m arbor_train.train` builds it, under Lightning
    built = roles.get("extractor").build(c)
    module, loader = built.module, built.train_loader
    ours_tok, ours_pad, ours_sec, t0 = [], [], [], [0.0]
    loader.collate = recording(loader.collate, ours_tok, ours_pad)

    class StepTimer(L.Callback):
        def on_train_batch_start(self, *args):
            t0[0] = time.perf_counter()

        def on_train_batch_end(self, *args):
            ours_sec.append(time.perf_counter() - t0[0])

    trainer = L.Trainer(max_steps=steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        num_sanity_val_steps=0, limit_val_batches=0, enable_model_summary=False,
                        callbacks=[StepTimer()])
    trainer.fit(module, loader)
    res["ours"] = _throughput(ours_tok, ours_sec, warmup, ours_pad,
                              batch=(f"{c['task']['batch_size']} pack(s) of <= {c['task']['pack_length']} tokens"
                                     if c["task"]["packing"] else f"{c['task']['batch_size']} padded examples"),
                              attention=module.model.config._attn_implementation)
    del built, module, loader, trainer

    # plain HF Trainer + PEFT: one example per row, padded per batch by DataCollatorForSeq2Seq
    rows = select_rows(load_sets(b.data_dir, ["extraction"])["extraction"], b.examples, c["task"]["nonempty_share"],
                       ["states"])
    model, tok = build_decoder(c["model"], seed=0)
    model = add_lora(model, c["peft"], c["model"], "CAUSAL_LM")
    exs, _, _ = sft_examples(rows, tok, ["states"], int(b.max_length))
    hf_tok, hf_pad, hf_sec = [], [], []
    collator = recording(DataCollatorForSeq2Seq(tok, padding=True, label_pad_token_id=-100), hf_tok, hf_pad)

    class HFStepTimer(TrainerCallback):
        def on_step_begin(self, *args, **kwargs):
            t0[0] = time.perf_counter()

        def on_step_end(self, *args, **kwargs):
            hf_sec.append(time.perf_counter() - t0[0])

    args = TrainingArguments(output_dir=f"{scratch.name}/hf", per_device_train_batch_size=int(b.hf_batch_size),
                             max_steps=steps, learning_rate=1e-4, logging_steps=1000, save_strategy="no",
                             report_to=[], use_cpu=True, dataloader_num_workers=0, disable_tqdm=True,
                             remove_unused_columns=False, seed=0)
    data = [{"input_ids": x["input_ids"], "labels": x["labels"]} for x in exs]
    Trainer(model=model, args=args, train_dataset=data, data_collator=collator, callbacks=[HFStepTimer()]).train()
    res["hf_trainer_peft"] = _throughput(hf_tok, hf_sec, warmup, hf_pad, batch=f"{b.hf_batch_size} padded examples",
                                         attention=model.config._attn_implementation)
    res["speedup_tokens_per_s"] = round(res["ours"]["tokens_per_s"] / res["hf_trainer_peft"]["tokens_per_s"], 3)
    scratch.cleanup()
    return res


def extract_turns(ex, kinds: list[str], turns: list, online: bool) -> dict[str, list]:
    """Every kind's raw outputs for these turns, as the runtime's ExtractorSet asks for them (kind by kind;
    a one-pass extractor generates once per batch and answers the other kinds from it). online: one turn
    at a time, as a live assistant commits; otherwise the whole list at once (batched by the model)."""
    if online:
        raws: dict[str, list] = {k: [] for k in kinds}
        for t in turns:
            for kind in kinds:
                raws[kind] += ex.by_kind[kind].run(kind, [t])
        return raws
    return {kind: ex.by_kind[kind].run(kind, turns) for kind in kinds}


def model_texts(ex, kinds: list[str], raws: dict[str, list], summaries: bool = False) -> list[str]:
    """The raw model texts behind these outputs: a one-pass extractor's generations (one per turn, held by
    it after its last run), or each list kind's text of a kind-conditioned one (and each summary, with
    `summaries`); none for the heuristic."""
    from arbor_train.runtime.extract import OnePassExtractor

    first = ex.by_kind[kinds[0]]
    if isinstance(first, OnePassExtractor):
        return [raw for _, raw in first._last[1]] if first._last else []
    return [r for k in kinds if summaries or k != "summary" for r in raws[k] if isinstance(r, str)]


def generated_tokens(ex, kinds: list[str], raws: dict[str, list]) -> int:
    """Tokens a model extractor generated for these turns, every kind (summaries included), counted with the
    model's own tokenizer (EOS not counted)."""
    tok = ex.by_kind[kinds[0]].llm.tokenizer
    return sum(len(tok(t, add_special_tokens=False)["input_ids"]) for t in model_texts(ex, kinds, raws, summaries=True))


def extract_quality(raws: dict[str, list], golds: dict[str, list]) -> dict:
    """Per-kind metrics (arbor_train.scoring.training.extraction_metrics) of what the runtime would store:
    each raw output through the runtime's own validation, against the rows' gold (None: the row does not
    supervise that kind, left out). JSON validity: the share of a model's raw list-kind outputs that parse
(None for the heuristic, which writes objects)."""
    from arbor_train.runtime.validate import ValidationReport, validate_kind
    from arbor_train.scoring.training import extraction_metrics

    out: dict = {}
    for kind, raw in raws.items():
        pairs = [(r, g) for r, g in zip(raw, golds[kind]) if g is not None]
        rep = ValidationReport()
        if kind == "summary":
            pred: list = [str(r) for r, _ in pairs]
        else:
            pred = [validate_kind(r, kind, rep) for r, _ in pairs]
        out.update({k: round(v, 4) for k, v in extraction_metrics(kind, pred, [g for _, g in pairs]).items()
                    if isinstance(v, float)})
    return out


def bench_extract(cfg: DictConfig) -> dict:
    """Extraction cost and quality of each extractor layout under each decoding lever, in one run.

    Rows: every (layout, lever) pair, and the heuristic. Per row: seconds per turn for every kind the bundle
    extracts, batched (`batch_size` turns a generation, as a replay extracts ahead) and online (one turn
    at a time, as a live assistant commits), on held-out BranchMemEval turns and on LoCoMo interactions;
    quality per kind on those BranchMemEval turns (their gold), and fact F1 on the LoCoMo interactions
    against the session observations (conversations the bundles were not trained on). The output cache is
    off: every number is a generation."""
    import torch
    from tqdm import tqdm

    from arbor_train.conversations.io import quiet
    from arbor_train.conversations.locomo import load_locomo
    from arbor_train.conversations.schema import interactions
    from arbor_train.data import load_sets
    from arbor_train.roles.extractor import row_target
    from arbor_train.runtime import default_config
    from arbor_train.runtime.bundle import load_bundle
    from arbor_train.runtime.extract import DECODING_LEVERS, KINDS, ExtractorSet, TurnInput
    from arbor_train.runtime.validate import ValidationReport, validate_items
    from arbor_train.scoring.training import fact_f1, json_validity
    from data_gen.locomo import observation_facts

    from .run import check_extractor_heldout, select_by_id

    b = OmegaConf.to_container(cfg.bench_extract, resolve=True)
    heur = default_config()["heuristics"]
    # held-out BranchMemEval turns with their gold, a seeded sample
    rows = load_sets(b["branchmem_dir"], ["extraction"])["extraction"]
    rows = random.Random(0).sample(list(rows), min(int(b["turns"]), len(rows)))
    bm_turns = [TurnInput(r["input"], r.get("assistant") or "", r.get("timestamp")) for r in rows]
    bm_gold = {k: [row_target(r, k) for r in rows] for k in KINDS}
    # LoCoMo interactions of conversations no bundle trained on, with the observations citing each
    convs = select_by_id(load_locomo(b["locomo_input"]), b["locomo_conversations"], lambda x: x.conversation_id,
                         "bench_extract.locomo_conversations", b["locomo_input"])
    lc_turns: list = []
    lc_gold: list = []
    per_conv = max(1, int(b["interactions"]) // len(convs))
    for conv in convs:
        inters = interactions(conv)
        gold_of = observation_facts(conv, {tid: i for i, it in enumerate(inters) for tid in it.turn_ids})
        lc_turns += [TurnInput(it.user, it.assistant, it.timestamp) for it in inters[:per_conv]]
        lc_gold += [[f["text"] for f in gold_of.get(i, [])] for i in range(min(per_conv, len(inters)))]
    single = int(b["single"])

    def measure(ex, kinds: list[str]) -> dict:
        r: dict = {"kinds": len(kinds)}
        for label, turns in (("branchmem", bm_turns), ("locomo", lc_turns)):
            t0 = time.perf_counter()
            raws = extract_turns(ex, kinds, turns, online=False)
            r[f"{label}_batched_s"] = round((time.perf_counter() - t0) / len(turns), 4)
            texts = model_texts(ex, kinds, raws)  # before the online run: a one-pass extractor holds its last batch
            if label == "branchmem" and kinds and hasattr(ex.by_kind[kinds[0]], "llm"):
                n = generated_tokens(ex, kinds, raws)
                r["gen_tokens_per_turn"] = round(n / len(turns), 1)  # what the batched seconds paid for
                r["ms_per_gen_token"] = round(1000 * r["branchmem_batched_s"] * len(turns) / max(n, 1), 2)
            t0 = time.perf_counter()
            extract_turns(ex, kinds, turns[:single], online=True)
            r[f"{label}_online_s"] = round((time.perf_counter() - t0) / min(single, len(turns)), 4)
            if label == "branchmem":
                r.update(extract_quality(raws, {k: bm_gold[k] for k in kinds}))
                r["json_validity"] = round(json_validity(texts), 4) if texts else None  # as generated
            elif "facts" in kinds:
                rep = ValidationReport()
                pred = [[f["text"] for f in validate_items(x, "facts", rep)] for x in raws["facts"]]
                r["locomo_fact_f1"] = round(fact_f1(pred, lc_gold, float(b["match_threshold"]))["f1"], 4)
        return r

    results: dict = {}
    torch.set_num_threads(int(b["threads"]))
    with quiet():
        results["heuristic"] = {"layout": "heuristic", "lever": "-", "threads": int(b["threads"]),
                                **measure(ExtractorSet({}, heur), list(KINDS))}
    combos = [(lay, path, lev, opts) for lay, path in b["layouts"].items() for lev, opts in b["levers"].items()]
    for layout, path, lever, opts in tqdm(combos, desc="layouts x levers", unit="row", disable=None):
        manifest = load_bundle(str(path), role="extractor").manifest
        bundle_layout = manifest.get("layout", "kind")
        kinds = [k for k in KINDS if k in (manifest.get("kinds") or KINDS)]
        opts = dict(opts or {})
        if bundle_layout == "spans" and any(opts.get(k) for k in DECODING_LEVERS):
            continue  # decoding levers: a span tagger generates nothing
        threads = int(opts.pop("threads", b["threads"]))
        spec = {"kind": "bundle", "path": str(path), "max_new_tokens": int(b["max_new_tokens"].get(bundle_layout, 0)),
                "dtype": "fp32", "batch_size": int(b["batch_size"]), **opts}
        check_extractor_heldout({"extractors": {"facts": spec}}, [c.conversation_id for c in convs])
        torch.set_num_threads(threads)
        with quiet():
            ex = ExtractorSet({k: spec for k in kinds}, heur, enabled=kinds)
        key = f"{layout}, {lever}"
        results[key] = {"layout": layout, "lever": lever, "threads": threads, "bundle_layout": bundle_layout,
                        **measure(ex, kinds)}
        print(f"[{key}] {json.dumps(results[key])}", flush=True)
        torch.set_num_threads(int(b["threads"]))
        del ex
    return {"target": "extract", "rows": results, "branchmem_turns": len(bm_turns), "locomo_interactions": len(lc_turns),
            "locomo_conversations": [c.conversation_id for c in convs], "online_turns": single,
            "batch_size": int(b["batch_size"]), "threads": int(b["threads"]), "paper_ingest_s_per_turn": PAPER_INGEST_S,
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()}}


def bench_scale(cfg: DictConfig) -> dict:
    """Ingest cost per turn as a conversation of many short turns that share common words grows: the
    runtime as configured against the same runtime with keyword recall scoring every matching row
    (`recall.keyword_max_postings=0`, the baseline), in one run. Each size is reached by ingesting, and the
    last `window` turns before it are timed."""
    from arbor_train.runtime import ArborMemory, default_config

    b = cfg.bench_scale
    sizes = sorted(parse_int(s, f"bench_scale.sizes[{k}]", minimum=1) for k, s in enumerate(b.sizes))
    window = parse_int(b.window, "bench_scale.window", minimum=1)
    results: dict = {}
    for label, overrides in b.runtimes.items():
        with tempfile.TemporaryDirectory() as d:
            mem = ArborMemory.open(Path(d) / "scale.sqlite", "scale", default_config(*overrides))
            res: dict = {}
            built, t0 = 0, time.perf_counter()
            for size in sizes:
                t1 = None
                while built < size:
                    if built == size - window:
                        t1 = time.perf_counter()
                    mem.step(str(b.turn).format(i=built), "ok")
                    built += 1
                    if built % 2000 == 0:
                        print(f"[{label}] {built} turns ({time.perf_counter() - t0:.0f} s)", flush=True)
                per_turn = (time.perf_counter() - t1) / window
                res[f"turns_{size}"] = {"ingest_ms_per_turn": round(1000 * per_turn, 3)}
                print(f"[{label}] {size} turns: {1000 * per_turn:.2f} ms per turn", flush=True)
            mem.close()
        lo, hi = res[f"turns_{sizes[0]}"], res[f"turns_{sizes[-1]}"]
        res["growth"] = round(hi["ingest_ms_per_turn"] / lo["ingest_ms_per_turn"], 3)
        results[label] = res
    head = "| runtime | " + " | ".join(f"{s:,} turns (ms/turn)" for s in sizes) + f" | growth {sizes[0]:,} → {sizes[-1]:,} |"
    rows = [head, "|---|" + "---:|" * (len(sizes) + 1)]
    for label, res in results.items():
        rows.append(f"| {label} | " + " | ".join(str(res[f"turns_{s}"]["ingest_ms_per_turn"]) for s in sizes)
                    + f" | {res['growth']}× |")
    print("\n".join(rows))
    results["table"] = "\n".join(rows) + "\n"
    results["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version()}
    return results


TARGETS = {"runtime": bench_runtime, "train": bench_train, "extract": bench_extract, "scale": bench_scale}


def check_options(cfg: DictConfig) -> None:
    """The target's options, checked before any model is built or any memory is filled."""
    parse_choice(cfg.target, "target", sorted(TARGETS))
    if cfg.target == "runtime":
        b = cfg.bench
        if isinstance(b.sizes, str) or not b.sizes:
            raise ConfigError(f"option bench.sizes must be a non-empty list of forest sizes, got {b.sizes!r}")
        sizes = sorted(parse_int(size, f"bench.sizes[{k}]", minimum=1) for k, size in enumerate(b.sizes))
        window = parse_int(b.window, "bench.window", minimum=1)
        parse_int(b.queries, "bench.queries", minimum=1)
        parse_int(b.seed, "bench.seed")
        for below, size in zip([0, *sizes], sizes):
            if size - below < 2 * window:
                raise ConfigError(f"option bench.sizes: {size} is less than twice bench.window={window} above "
                                  f"{below} (each size ends with a batched and an online window of that many turns)")
        if not b.runtimes:
            raise ConfigError("option bench.runtimes must map labels to lists of runtime overrides")
        if isinstance(b.profiles, str) or not b.profiles:
            raise ConfigError(f"option bench.profiles must be a non-empty list of bench.runtimes labels, got {b.profiles!r}")
        for k, name in enumerate(b.profiles):
            parse_choice(name, f"bench.profiles[{k}]", sorted(b.runtimes))
            for override in b.runtimes[name] or []:
                key, _, path = str(override).partition("=")
                if key.endswith(".path") and path not in ("", "null") and not (Path(path) / "manifest.json").exists():
                    raise MissingInputError(f"option bench.runtimes.{name}: {key}={path!r} holds no bundle (set it, or "
                                            "bench.bundles.<role>, to a folder of python -m arbor_train.export)")
        from arbor_train.runtime.config import check_overrides

        for label, overrides in b.runtimes.items():
            if isinstance(overrides, str) or overrides is None:
                raise ConfigError(f"option bench.runtimes.{label} must be a list of runtime overrides, got {overrides!r}")
            check_overrides(overrides, f"bench.runtimes.{label}")
        return
    if cfg.target == "scale":
        b = cfg.bench_scale
        for k, size in enumerate(b.sizes):
            if parse_int(size, f"bench_scale.sizes[{k}]", minimum=1) < parse_int(b.window, "bench_scale.window", minimum=1):
                raise ConfigError(f"option bench_scale.sizes[{k}]={size} is below bench_scale.window={b.window}")
        from arbor_train.runtime.config import check_overrides

        for label, overrides in b.runtimes.items():
            check_overrides(list(overrides or []), f"bench_scale.runtimes.{label}")
        return
    if cfg.target == "extract":
        b = cfg.bench_extract
        for key in ("turns", "interactions", "single", "batch_size", "threads"):
            parse_int(b[key], f"bench_extract.{key}", minimum=1)
        if not b.layouts:
            raise ConfigError("option bench_extract.layouts must map labels to extractor bundles")
        for label, path in b.layouts.items():
            if not path or not (Path(str(path)) / "manifest.json").exists():
                raise MissingInputError(f"option bench_extract.layouts.{label}={path!r}: no extractor bundle there "
                                        "(python -m arbor_train.export)")
        allowed = {"dtype", "quantize", "constrained", "prefix_cache", "threads"}
        for label, opts in (b.levers or {}).items():
            bad = sorted(set(opts or {}) - allowed)
            if bad:
                raise ConfigError(f"option bench_extract.levers.{label}: unknown key(s) {', '.join(bad)} "
                                  f"(known: {', '.join(sorted(allowed))})")
            if opts and "threads" in opts:
                parse_int(opts["threads"], f"bench_extract.levers.{label}.threads", minimum=1)
        for key in ("locomo_input", "branchmem_dir"):
            if not Path(str(b[key])).exists():
                raise MissingInputError(f"option bench_extract.{key}={b[key]!r}: no such file or folder")
        return
    b = cfg.bench_train
    parse_choice(b.model, "bench_train.model", conf_options("model"))
    for key in ("examples", "steps", "max_length", "pack_length", "packs_per_batch", "hf_batch_size", "threads"):
        parse_int(b[key], f"bench_train.{key}", minimum=1)
    steps, warmup = parse_int(b.steps, "bench_train.steps"), parse_int(b.warmup_steps, "bench_train.warmup_steps",
                                                                         minimum=0)
    if steps <= warmup:
        raise ConfigError(f"option bench_train.steps={steps} must exceed bench_train.warmup_steps={warmup}")
    if not (Path(str(b.data_dir)) / "hf").is_dir():
        raise MissingInputError(f"option bench_train.data_dir={str(b.data_dir)!r}: no hf/ folder (python -m "
                                f"data_gen.branchmem preset=train_cpu first)")


def run(cfg: DictConfig) -> dict:
    check_options(cfg)
    return TARGETS[cfg.target](cfg)


@hydra.main(config_path=str(CONF_DIR), config_name="bench", version_base="1.3")
@entry_point
def main(cfg: DictConfig) -> None:
    logging.getLogger("arbor_train").setLevel(logging.ERROR)
    out = run(cfg)
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
