"""The encoder span layout (issue #41): every extraction kind tagged in one forward pass of an encoder
(arbor_train/runtime/spans.py), trained by the extractor role (task.layout=spans), loaded from a bundle."""

import json

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from arbor_train.paths import CONF_DIR
from arbor_train.runtime.spans import IGNORE, KIND_CHANNELS, SpanCodec, encode, gold_spans, learn_vocab, third_person

TURN = ("Quick note: Amelie paid $135 for the ferry. The companion for Amelie is Mei Lehmann. "
        "Order for Amelie's itinerary: 1) the space centre 2) the folk museum.")
TARGETS = {
    "summary": "Amelie paid $135 for the ferry",
    "entities": ["Amelie", "Mei Lehmann"],
    "facts": [{"text": "The companion for Amelie is Mei Lehmann", "entities": [], "tags": []}],
    "states": [{"key": "companion", "value": "Mei Lehmann", "tag": "person", "entities": [], "evidence": ""}],
    "events": [{"subject": "Amelie", "action": "pay", "category": "payments", "quantity": 135.0, "unit": "$",
                "date": None, "text": "Quick note: Amelie paid $135 for the ferry.", "entities": ["Amelie"]}],
    "artifacts": [{"name": "itinerary", "subject": "Amelie", "items": ["the space centre", "the folk museum"],
                   "entities": ["Amelie"]}],
}


@pytest.fixture(scope="module")
def tok():
    from arbor_train.models import build_tokenizer

    return build_tokenizer(dict(OmegaConf.to_container(OmegaConf.load(CONF_DIR / "model" / "tiny_encoder.yaml"))))


def codec_for(targets_rows) -> SpanCodec:
    return SpanCodec.build(*learn_vocab(targets_rows, min_count=1))


def round_trip(tok, codec, user, assistant, targets, ts=None):
    """Gold targets -> spans -> token labels -> spans -> the runtime's items: what a perfect tagger writes."""
    enc = encode(tok, [(user, assistant)], 256)
    offs = [tuple(x) for x in enc["offset_mapping"][0].tolist()]
    spans = gold_spans(user, assistant, targets, set(codec.vocab["state_keys"]),
                       {w: a for w, (a, _) in codec.vocab["actions"].items()})
    labels = codec.token_labels(offs, enc.sequence_ids(0), spans, {c for k in targets for c in KIND_CHANNELS[k]})
    return labels, codec.decode(codec.spans_of([[max(0, x) for x in t] for t in labels], offs, enc.sequence_ids(0)),
                                (user, assistant), ts)


def test_a_perfect_tagger_writes_back_every_kind_of_the_turn(tok):
    codec = codec_for([TARGETS])
    assert codec.vocab["state_keys"] == ["companion"] and codec.vocab["actions"] == {"paid": ["pay", "payments"]}
    assert "states:B-companion" in codec.labels
    _, out = round_trip(tok, codec, TURN, "Noted.", TARGETS, "2025-03-01")
    assert out["entities"] == ["Amelie", "Mei Lehmann"]
    assert [f["text"] for f in out["facts"]] == ["The companion for Amelie is Mei Lehmann"]
    assert [(s["key"], s["value"], s["tag"]) for s in out["states"]] == [("companion", "Mei Lehmann", "person")]
    (ev,) = out["events"]
    assert (ev["subject"], ev["action"], ev["category"], ev["quantity"], ev["unit"], ev["date"]) == (
        "Amelie", "pay", "payments", 135.0, "$", "2025-03-01")
    (art,) = out["artifacts"]
    assert (art["name"], art["subject"], art["items"]) == ("itinerary", "Amelie", ["the space centre", "the folk museum"])
    assert out["summary"] == "Amelie paid $135 for the ferry"


def test_a_row_that_supervises_facts_only_leaves_every_other_channel_out_of_the_loss(tok):
    codec = codec_for([TARGETS])
    labels, _ = round_trip(tok, codec, TURN, "", {"facts": TARGETS["facts"]})
    order = codec.order
    for c, ch in enumerate(order):
        col = [t[c] for t in labels]
        if ch == "facts":
            assert any(x > 0 for x in col) and 0 in col
        else:
            assert set(col) == {IGNORE}, ch


def test_a_transcript_fact_is_read_in_the_third_person_from_whichever_speaker_said_it(tok):
    assert third_person("Caroline: I went to a support group and my friends came.", "Caroline") == (
        "Caroline went to a support group and Caroline's friends came.")
    codec = codec_for([])
    user, reply = "Caroline: Hey Mel! How have you been?", "Melanie: I'm swamped with the kids and work. What's new?"
    fact = {"text": "Melanie is swamped with the kids and work", "entities": [], "tags": []}
    _, out = round_trip(tok, codec, user, reply, {"facts": [fact]})
    assert [f["text"] for f in out["facts"]] == ["Melanie is swamped with the kids and work"]


def test_labels_out_of_order_or_missing_a_channel_are_refused():
    codec = codec_for([TARGETS])
    with pytest.raises(ValueError, match="lack the channel"):
        SpanCodec([l for l in codec.labels if not l.startswith("artifacts:")], codec.vocab)
    labels = list(codec.labels)
    i = labels.index("facts:O")
    labels[i], labels[i + 1] = labels[i + 1], labels[i]
    with pytest.raises(ValueError, match="start with facts:O"):
        SpanCodec(labels, codec.vocab)


def span_run_cfg(run_dir, data, steps: int, train_rows: int, val_rows: int) -> dict:
    """A short span-layout run on the tiny encoder over the smoke set (no LoCoMo mix)."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[
            "task=extractor_spans", "model=tiny_encoder", "logger=csv", f"data.train_dir={data}",
            f"data.val_dir={data}", f"run_dir={run_dir}", "trainer.enable_progress_bar=false",
            f"trainer.max_steps={steps}", "task.compare_baselines=false", f"data.max_train_examples={train_rows}",
            f"data.max_val_examples={val_rows}", "data.mix=[]"])
    return OmegaConf.to_container(cfg, resolve=True)


def test_trained_span_bundle_plugs_into_the_runtime_as_one_extractor_for_every_kind(tmp_path, smoke_data):
    """A short run of the span layout on the tiny encoder, exported, loaded by the runtime: one forward pass per
    batch of turns answers every kind, through the runtime's validation; a damaged manifest is refused by name."""
    from arbor_train import roles
    from arbor_train.export import export
    from arbor_train.runtime.bundle import BundleError, load_bundle
    from arbor_train.runtime.extract import KINDS, ExtractorSet, SpanExtractor, TurnInput
    from arbor_train.train import train

    c = span_run_cfg(tmp_path / "run", smoke_data, steps=3, train_rows=40, val_rows=12)
    assert roles.get("extractor").bundle_kind("encoder") == "encoder_spans"
    train(c)
    metrics = json.loads((tmp_path / "run" / "final" / "metrics.json").read_text())["metrics"]
    assert metrics["decoded"] == 12 and {"rouge_l", "entity_f1", "fact_f1", "slot_value_f1"} <= set(metrics)
    out = export(str(tmp_path / "run"), str(tmp_path / "bundle"))
    b = load_bundle(out, role="extractor")
    assert b.kind == "encoder_spans" and b.manifest["layout"] == "spans" and b.manifest["kinds"] == c["task"]["kinds"]

    from arbor_train.runtime import default_config

    cfg = default_config("runtime/components=tuned_spans", *(f"runtime.extractors.{k}.path={out}" for k in KINDS))
    ex = ExtractorSet(cfg["extractors"], cfg["heuristics"])  # (the other tuned components need their bundles)
    span = ex.by_kind["facts"]
    assert isinstance(span, SpanExtractor) and all(ex.by_kind[k] is span for k in KINDS) and ex.uses_models
    calls = []
    read = span.read
    span.read = lambda turns: calls.append(len(turns)) or read(turns)
    turns = [TurnInput("My budget is now $400. Amelie paid $135 for the ferry.", "Noted."),
             TurnInput("Caroline: I went to a support group.", "Melanie: wow", "2025-01-02")]
    got = ex.extract(turns)
    assert calls == [2]  # one pass for both turns and all six kinds
    assert len(got) == 2 and all(g.summary for g in got)  # a summary always (the user turn when none is tagged)

    m = json.loads((out / "manifest.json").read_text())
    m["labels"] = [l for l in m["labels"] if not l.startswith("summary:")]
    (out / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(BundleError, match="field 'labels'.*summary"):
        load_bundle(out)
