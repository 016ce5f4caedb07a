"""The one-generation extraction layout (issue #41): one prompt per turn names every kind, one JSON object
answers them all, each kind's part validated by the runtime as any other output."""

import json

import pytest
from omegaconf import OmegaConf

from arbor_train.paths import CONF_DIR
from arbor_train.runtime.extract import KINDS, ExtractorSet, OnePassExtractor, TurnInput


class ObjectLLM:
    """Answers a one-pass prompt with one JSON object per turn (the turn's first word as a fact), counting prompts."""

    name = "object-llm"

    def __init__(self, broken: set[str] = frozenset()):
        self.prompts: list[list[dict]] = []
        self.broken = broken

    def chat(self, conversations, max_new_tokens=256):
        self.prompts += conversations
        out = []
        for m in conversations:
            word = m[-1]["content"].split("User: ", 1)[1].split()[0]
            if word in self.broken:
                out.append('{"summary": "cut off", "facts": [{"text": ')  # truncated mid-object
                continue
            out.append(json.dumps({"summary": f"{word} said hello", "entities": ["Alice"],
                                   "facts": [{"text": f"Alice said {word}", "entities": ["Alice"], "tags": []}],
                                   "states": [{"key": "budget", "value": "$3,600", "entities": ["Alice"]}],
                                   "artifacts": [], "events": "not a list"}))
        return out


def rejected(ex) -> set[str]:
    return {r.split(":")[0] for r in ex.report.rejected}


def one_pass_set(llm) -> ExtractorSet:
    ex = ExtractorSet({})
    op = OnePassExtractor(llm, 384, kinds=list(KINDS))
    for k in KINDS:
        ex.by_kind[k] = op
    return ex


def test_one_generation_per_turn_answers_every_kind_through_validation():
    llm = ObjectLLM()
    turns = [TurnInput("alpha Alice is here.", "ok"), TurnInput("beta Alice again.", "fine", "2025-01-02")]
    out = one_pass_set(llm).extract(turns)
    assert len(llm.prompts) == 2  # one generation per turn, not one per kind
    prompt = llm.prompts[0][-1]["content"]
    assert "Output one JSON object with these keys" in prompt and all(f"- {k}:" in prompt for k in KINDS)
    assert [x.summary for x in out] == ["alpha said hello", "beta said hello"]
    assert out[0].facts[0]["text"] == "Alice said alpha" and out[1].entities == ["Alice"]
    assert out[0].states[0]["key"] == "budget" and out[0].states[0]["value"] == "$3,600"
    assert out[0].events == [] and rejected(out[0]) == {"events"}  # a kind's bad part: that kind rejected


def test_an_object_that_does_not_parse_is_rejected_per_kind_and_the_summary_falls_back():
    llm = ObjectLLM(broken={"beta"})
    out = one_pass_set(llm).extract([TurnInput("alpha Alice is here."), TurnInput("beta Bob left. Done.")])
    assert out[0].facts and out[1].facts == [] and out[1].states == []
    assert out[1].summary == "beta Bob left. Done."  # the runtime's fallback: the user turn
    assert {"facts", "states", "entities", "events", "artifacts"} == rejected(out[1])


def test_one_pass_rows_hold_every_supervised_kind_in_one_completion():
    from arbor_train.models import build_decoder
    from arbor_train.roles.extractor import ONE_PASS, sft_examples

    _, tok = build_decoder(dict(OmegaConf.to_container(OmegaConf.load(CONF_DIR / "model" / "tiny_decoder.yaml"))))
    rows = [{"input": f"turn {i}", "assistant": "ok", "timestamp": None, "summary": f"s{i}",
             "target": json.dumps({"events": [], "facts": [{"text": f"f{i}"}]})} for i in range(3)]
    rows.append(dict(rows[0], _kinds=["facts"]))  # a mixed-in source that supervises facts only
    ex, gen, dropped = sft_examples(rows, tok, ["summary", "facts", "events"], 512, layout="one_pass")
    assert len(ex) == len(gen) == 4 and dropped == 0 and {g["kind"] for g in gen} == {ONE_PASS}
    assert gen[0]["target"] == {"summary": "s0", "facts": [{"text": "f0"}], "events": []}
    assert gen[3]["target"] == {"facts": [{"text": "f0"}]}
    assert "- facts:" in gen[3]["messages"][-1]["content"] and "- events:" not in gen[3]["messages"][-1]["content"]
    with pytest.raises(Exception, match="task.layout"):
        sft_examples(rows, tok, ["facts"], 512, layout="per_turn")


def test_a_one_pass_bundle_trains_exports_and_extracts_in_the_runtime(tmp_path, smoke_data):
    """A 2-step one-pass adapter on the tiny decoder: its manifest says one_pass, the runtime loads it as one
    extractor for every kind and generates once per turn."""
    from test_train import tcfg

    from arbor_train.export import export
    from arbor_train.runtime import default_config
    from arbor_train.train import train

    res = train(tcfg(tmp_path / "run", smoke_data, "model=tiny_decoder", "task=extractor_one_pass",
                     "trainer.max_steps=2", "task.gen_examples=2", "task.max_new_tokens=8",
                     "data.max_val_examples=8", "task.compare_baselines=false"))
    assert res["metrics"]["generated"] == 2 and "fact_f1" in res["metrics"] and "rouge_l" in res["metrics"]
    bundle = export(res["run_dir"], tmp_path / "bundle", log_artifact=False)
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["layout"] == "one_pass" and manifest["kinds"] == list(KINDS)
    # max_new_tokens null: the bundle's own (task.max_new_tokens, 8 here)
    cfg = default_config("runtime/components=tuned_one_pass", *(f"runtime.extractors.{k}.path={bundle}" for k in KINDS))
    ex = ExtractorSet(cfg["extractors"], cfg["heuristics"])  # (the other tuned components need their bundles)
    assert len({id(e) for e in ex.by_kind.values()}) == 1 and isinstance(ex.by_kind["facts"], OnePassExtractor)
    assert ex.by_kind["facts"].max_new_tokens == 8
    calls = []
    real = ex.by_kind["facts"].llm.chat
    ex.by_kind["facts"].llm.chat = lambda msgs, **kw: calls.append(len(msgs)) or real(msgs, **kw)
    out = ex.extract([TurnInput("Alice set the budget to $3,600.", "noted")])
    assert calls == [1] and out[0].summary  # one generation for the six kinds
