"""Batched ingest (ArborMemory.steps: a replay extracts runtime.ingest.extract_ahead turns at once, then localizes and
commits them one by one) and the benchmark table that measures it with every role tuned."""

from __future__ import annotations

import pytest
from test_runtime_cli import make_cfg, write_json
from test_runtime_reliability import content, ingest, long_conversation

from arbor_train.errors import ConfigError
from arbor_train.runtime.cli import run
from arbor_train.runtime.extract import ExtractorSet


def test_extracting_ahead_builds_the_same_memory_as_one_turn_at_a_time(tmp_path, monkeypatch):
    conv = write_json(tmp_path / "conv.json", long_conversation(36))
    batches: list[int] = []
    extract = ExtractorSet.extract
    monkeypatch.setattr(ExtractorSet, "extract", lambda self, turns: batches.append(len(turns)) or extract(self, turns))
    ingest(conv, tmp_path / "one.sqlite", "runtime.ingest.extract_ahead=1")
    assert batches == [1] * 36  # each turn extracted as it is committed
    batches.clear()
    res = ingest(conv, tmp_path / "ahead.sqlite", "runtime.ingest.extract_ahead=8")
    assert batches == [8, 8, 8, 8, 4] and res["added"] == 36
    assert content(tmp_path / "ahead.sqlite") == content(tmp_path / "one.sqlite")
    # a re-ingest extracts nothing: every turn is already stored
    batches.clear()
    assert ingest(conv, tmp_path / "ahead.sqlite", "runtime.ingest.extract_ahead=8")["added"] == 0 and batches == []


def test_a_bad_extract_ahead_is_refused_by_name_before_the_memory_is_opened(tmp_path):
    conv = write_json(tmp_path / "conv.json", long_conversation(6))
    with pytest.raises(ConfigError, match=r"runtime\.ingest\.extract_ahead"):
        run(make_cfg("command=ingest", f"input={conv}", f"memory={tmp_path / 'm.sqlite'}", "runtime.ingest.extract_ahead=0"))
    assert not (tmp_path / "m.sqlite").exists()


def test_the_tuned_runtime_table_runs_at_smoke_size_on_tiny_bundles(tmp_path, smoke_data):
    """table=bench_tuned_runtime at smoke size, its three bundles 2-step tiny ones (reranker, tagger, span
    extractor): the every-role-tuned row runs the tagger and the span extractor, with both ingest figures."""
    from test_spans import span_run_cfg
    from test_train import tcfg

    from arbor_train.export import export
    from arbor_train.train import train
    from eval.tables import GENERATED, JOIN, load, run_table

    bundles = {}
    for role, extra in (("reranker", []), ("tagger", ["task=tagger"])):
        res = train(tcfg(tmp_path / role, smoke_data, "trainer.max_steps=2", *extra))
        bundles[role] = export(res["run_dir"], tmp_path / f"{role}_bundle", log_artifact=False, merged=True)
    train(span_run_cfg(tmp_path / "spans", smoke_data, steps=2, train_rows=20, val_rows=4))
    bundles["extractor"] = export(str(tmp_path / "spans"), str(tmp_path / "spans_bundle"))

    t = load("bench_tuned_runtime")
    before = (GENERATED / "bench_tuned_runtime" / "table.md").read_text()
    given = [f"bench.bundles.{role}={path}" for role, path in bundles.items()]
    out = run_table("bench_tuned_runtime", [*t["smoke"], *given], tmp_path / "table")
    published = [line.split("|")[1].strip() for line in before.splitlines()[2:]]
    assert [r["row"] for r in out["rows"]] == published == ["heuristic", "minilm_cross_encoder", "every_role_tuned"]
    rows = {r["row"]: r for r in out["rows"]}
    assert rows["every_role_tuned"]["extractors"] == ["SpanExtractor"] and rows["every_role_tuned"]["tagger"] == "EncoderTagger"
    assert rows["heuristic"]["extractors"] == ["HeuristicExtractor"] and rows["heuristic"]["tagger"] == "HeuristicTagger"
    for key in ("ingest_s_per_turn", "ingest_batched_s_per_turn", "ingest_stages_ms.extract", "ingest_stages_ms.tag"):
        cell = rows["every_role_tuned"][JOIN.join([f"nodes_1000.{key}", f"nodes_10000.{key}"])]
        assert cell[0] > 0 and cell[1] is None, key  # measured at the smoke size only
    assert (GENERATED / "bench_tuned_runtime" / "table.md").read_text() == before


def test_the_end_to_end_figures_the_docs_state_are_the_generated_tables():
    """README and the benchmarks page state the every-role-tuned seconds at 10,000 nodes: they are the published
    run's (docs/results/generated/bench_tuned_runtime/results.json), rounded as the docs write them."""
    import json

    from arbor_train.paths import REPO_ROOT
    from eval.tables import GENERATED, JOIN

    rows = {r["row"]: r for r in json.loads((GENERATED / "bench_tuned_runtime" / "results.json").read_text())}
    tuned = rows["every_role_tuned"]
    online, batched = (tuned[JOIN.join([f"nodes_1000.{k}", f"nodes_10000.{k}"])][1]
                       for k in ("ingest_s_per_turn", "ingest_batched_s_per_turn"))
    claim = f"{online:.3f} s online and {batched:.3f} s batched at 10,000 nodes"
    readme = " ".join((REPO_ROOT / "README.md").read_text().split())
    page = " ".join((REPO_ROOT / "docs" / "results" / "benchmarks.md").read_text().split())
    assert f"ingests a turn in {online:.3f} s online and {batched:.3f} s batched at 10,000 nodes" in readme, claim
    assert f"a turn is ingested in {online:.3f} s online and {batched:.3f} s batched at 10,000 nodes" in page, claim
