"""`python -m eval.bench`: target=train on a tiny decoder (both sides run, the numbers are measured), target=runtime's
forget copies, stage split and option checks."""

import pytest
from hydra import compose, initialize_config_dir

from arbor_train.errors import UserError
from arbor_train.paths import CONF_DIR
from eval.bench import run


def bcfg(data, *overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="bench", overrides=[
            "target=train", "bench_train.model=tiny_decoder", f"bench_train.data_dir={data}", "bench_train.examples=40",
            "bench_train.steps=3", "bench_train.warmup_steps=1", "bench_train.max_length=256",
            "bench_train.pack_length=512", "bench_train.hf_batch_size=2", *overrides])


def test_train_bench_times_both_steps(smoke_data, monkeypatch):
    import time

    import arbor_train.packing as P
    import arbor_train.roles.extractor as E

    batches = {"ours": [], "hf": []}   # every collated batch each side fed its model, in order
    real = P.real_tokens

    def spy(batch):
        batches["ours" if "seq_lens" in batch else "hf"].append(batch)
        return real(batch)

    # the bench's collate recorder looks real_tokens up when it runs; the extractor module (which counts
    # each batch again on its device) keeps its own reference, left unspied
    monkeypatch.setattr(P, "real_tokens", spy)
    monkeypatch.setattr(E, "real_tokens", real)
    t0 = time.perf_counter()
    res = run(bcfg(smoke_data))
    wall = time.perf_counter() - t0
    ours, hf = res["ours"], res["hf_trainer_peft"]
    assert ours["attention"] == "arbor_packed_sdpa" and hf["attention"] == "sdpa"
    # tokens and padding recounted here from the batches of the 3 steps (1 warm-up + 2 timed):
    # packed rows hold their examples' seq_lens end to end; padded rows are what their attention mask keeps
    ours_tok = [sum(sum(lens) for lens in b["seq_lens"]) for b in batches["ours"][:3]]
    ours_pad = [1 - t / b["input_ids"].numel() for t, b in zip(ours_tok, batches["ours"][:3])]
    hf_tok = [int(b["attention_mask"].sum()) for b in batches["hf"][:3]]
    hf_pad = [1 - t / b["attention_mask"].numel() for t, b in zip(hf_tok, batches["hf"][:3])]
    for side, tok, pad in ((ours, ours_tok, ours_pad), (hf, hf_tok, hf_pad)):
        assert len(tok) == 3 and side["timed_steps"] == 2 and side["timed_tokens"] == sum(tok[1:])
        assert side["padding_fraction"] == pytest.approx(sum(pad) / 3, abs=1e-4)
        assert 0 < side["timed_seconds"] <= wall
        assert side["tokens_per_s"] == pytest.approx(side["timed_tokens"] / side["timed_seconds"], rel=0.05)  # rounding
    assert ours["padding_fraction"] == 0.0  # packs laid end to end in one row
    # examples of different lengths, padded per batch
    assert hf["padding_fraction"] > 0.0 and any(len(set(b["attention_mask"].sum(1).tolist())) > 1 for b in batches["hf"][:3])
    assert res["speedup_tokens_per_s"] == pytest.approx(ours["tokens_per_s"] / hf["tokens_per_s"], rel=0.01)


def test_train_bench_options_are_checked(smoke_data):
    with pytest.raises(ValueError, match="bench_train.steps=1 must exceed bench_train.warmup_steps=1"):
        run(bcfg(smoke_data, "bench_train.steps=1"))
    with pytest.raises(ValueError, match="target must be one of"):
        run(bcfg(smoke_data, "target=gpu"))


def test_runtime_bench_measures_forget_on_copies_of_the_forest(monkeypatch):
    """Each forget count runs on a fresh copy: the measured forest keeps every node, and each copy lost
    exactly the nodes its forget was given."""
    from arbor_train.runtime import ArborMemory

    forgot: list[tuple[int, int]] = []
    real = ArborMemory.forget

    def spy(self, **kw):
        before = self.stats()["nodes"]
        rep = real(self, **kw)
        forgot.append((len(kw["nodes"]), before - self.stats()["nodes"]))
        return rep

    monkeypatch.setattr(ArborMemory, "forget", spy)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="bench", overrides=[
            "target=runtime", "bench.sizes=[120]", "bench.window=10", "bench.queries=5", "bench.forget_counts=[1,7]",
            "bench.forget_repeats=2", "bench.profiles=[heuristic]"])
    out = run(cfg)
    assert sorted(out) == ["heuristic", "machine"]  # the profiles named, only
    res = out["heuristic"]["nodes_120"]
    assert res["nodes"] == 120 and res["ingest_batched_s_per_turn"] > 0
    assert forgot == [(1, 1), (1, 1), (7, 7), (7, 7)]
    for k in ("nodes_1", "nodes_7"):
        f = res["forget"][k]
        assert f["repeats"] == 2 and f["ms_max"] >= f["ms_median"] > 0
    # where an ingested turn's time goes: every stage measured, and together they are the ingest time
    stages = res["ingest_stages_ms"]
    assert {"embed", "recall", "rerank", "write", "index", "other"} <= set(stages)
    assert stages["recall"] > 0 and stages["write"] > 0 and stages["other"] > -0.05
    assert sum(stages.values()) == pytest.approx(1000 * res["ingest_s_per_turn"], abs=0.1)


@pytest.mark.parametrize("override, message", [
    ("bench.profiles=[heuristic,nope]", r"option bench.profiles\[1\] must be one of every_role_tuned, heuristic, "),
    ("bench.sizes=[300]", r"option bench.sizes: 300 is less than twice bench.window=200"),
    ("bench.bundles.reranker=/no/such/bundle",
     r"option bench.runtimes.every_role_tuned: runtime.reranker.bundle.path='/no/such/bundle' holds no bundle"),
])
def test_runtime_bench_options_are_checked_before_any_model_is_built(override, message):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="bench", overrides=["target=runtime", "bench.profiles=[heuristic,every_role_tuned]",
                                                      override])
    with pytest.raises(UserError, match=message):
        run(cfg)


def test_the_minilm_profile_figures_the_benchmarks_page_states_are_the_generated_table():
    """The benchmarks page states the MiniLM profile's ingest and read p95 at 1k / 10k nodes, bf16 and int8 from
    the same run, and that the bf16 profile is under issue #41's goals (50 ms a turn at 10k, p95 at most 100 ms,
    at most 2x from 1k to 10k): the figures are the published run's (generated/bench_runtime/results.json)."""
    import json

    from arbor_train.paths import REPO_ROOT
    from eval.tables import GENERATED, JOIN

    rows = {r["row"]: r for r in json.loads((GENERATED / "bench_runtime" / "results.json").read_text())}

    def ms(row, key):
        return [1000 * v for v in rows[row][JOIN.join([f"nodes_1000.{key}", f"nodes_10000.{key}"])]]

    (i1, i10), (p1, p10) = ms("minilm_cross_encoder", "ingest_s_per_turn"), ms("minilm_cross_encoder", "query_p95_s")
    (j1, j10), (q1, q10) = (ms("minilm_cross_encoder_int8", "ingest_s_per_turn"),
                            ms("minilm_cross_encoder_int8", "query_p95_s"))
    page = " ".join((REPO_ROOT / "docs" / "results" / "benchmarks.md").read_text().split())
    assert (f"a turn is ingested in {i1:.1f} ms at 1,000 nodes and {i10:.1f} ms at 10,000**, under issue #41's 50 ms "
            f"goal, and a read's 95th percentile is {p1:.1f} and {p10:.1f} ms") in page
    assert f"ingests in {j1:.1f} and {j10:.1f} ms and reads at a p95 of {q1:.1f} and {q10:.1f} ms" in page
    assert i10 <= 50 and p10 <= 100 and i10 <= 2 * i1 and p10 <= 2 * p1
