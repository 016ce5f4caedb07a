"""Supervised fine-tuning examples with completion-only loss, and sequence packing without cross-talk.

The loss mask is decided when an example is built (:func:`build_sft_example`), never in a collator:
``labels`` is ``-100`` on every prompt token and equals ``input_ids`` on the completion tokens
(the completion text followed by the tokenizer's ``eos_token``).

Two ways to batch examples:

- :func:`collate_padded` -- the baseline: one example per row, right-padded, 2D attention mask.
- :func:`pack_examples` + :func:`collate_packed` -- several examples per row, concatenated with no
  padding between them; ``position_ids`` restart at 0 for each example and a 4D block-diagonal
  causal mask stops every token from attending across example boundaries, so each example is
  computed exactly as it would be alone.

How transformers 5 treats the 4D mask (checked in ``transformers/masking_utils.py`` and
``models/llama/modeling_llama.py``, transformers 5.24):

- ``LlamaModel.forward`` calls ``create_causal_mask(config, inputs_embeds, attention_mask, cache,
  position_ids)``; its ``_preprocess_mask_arguments`` returns early for any mask with
  ``len(attention_mask.shape) == 4`` ("already prepared, or custom") and the tensor is passed
  unchanged to every attention layer. No dtype conversion and no validation happen.
- The *eager* attention does ``attn_weights = attn_weights + attention_mask``, so the mask must be
  **additive float** (0 = attend, large negative = masked); a boolean mask would be silently wrong
  there. *SDPA* hands the mask to ``torch.nn.functional.scaled_dot_product_attention``, which
  accepts either a boolean mask (True = attend) or an additive float mask (build it in the model's
  dtype; torch 2.13 on CPU also took a float32 mask with a bf16 model, but not every backend
  promotes). An additive float mask therefore works for both eager and SDPA -- that is the
  convention used here (``torch.finfo(dtype).min`` = masked, ``0`` = allowed, the same as
  transformers' own ``eager_mask``). Checked on a tiny Llama: a boolean 4D mask matches under SDPA
  but gives wrong losses under eager.
- flash-attention does not consume a 4D mask. For it (and as an alternative for SDPA/eager), pass
  ``attention_mask=None`` together with the restarting ``position_ids`` **and ``use_cache=False``**:
  only when the mask is None *and there is no cache* does ``_preprocess_mask_arguments`` run
  ``find_packed_sequence_indices(position_ids)`` (a new sequence starts wherever consecutive
  positions do not differ by exactly 1) and build the same block-diagonal causal mask itself.
  ``LlamaModel.forward`` creates a ``DynamicCache`` whenever ``use_cache`` is true, which is the
  config default even in ``train()`` mode, and then the detection is silently skipped (plain causal
  over the whole row). Pad positions get ``position_ids == 0`` so that each pad token is its own
  one-token "sequence" under that rule as well.

Packed attention without the dense mask (:data:`PACKED_ATTENTION`, the default for packed training):
a 4D mask makes SDPA compute a full ``L x L`` score matrix per pack and leaves its causal fast path,
so a 1,024-token pack of four examples pays four times the attention work of its examples. The
attention function :func:`packed_sdpa_attention`, registered with transformers' ``AttentionInterface``
under that name, attends within each example instead (``packed_seq_lens`` is passed through the
model's ``**kwargs`` down to every attention layer): on a GPU in bf16/fp16 with one variable-length
flash-attention kernel (``torch.nn.attention.varlen``), elsewhere with one ``is_causal`` SDPA call per
example's slice (measured: on 2 CPU cores the loop is the fast path; on an H200 its thousands of small
launches per step made it 4x slower than padding, and the varlen kernel 1.37x faster). Batches for it are built by
:func:`collate_packed` with ``layout="segments"``: all packs of a batch laid end to end in one row, so
there is no padding at all, and no mask. Without ``packed_seq_lens`` (generation, validation with a
cache) the function is transformers' own SDPA, with the same masks.

Losses: :func:`pack_examples` also sets the label of the first token of each packed example to
``-100`` (that label is never predicted in the unpacked case either, because causal-LM losses shift
labels by one), so the model's built-in ``labels=`` loss, which shifts over a whole row, never
trains a token to predict the next example's first token. The mean token loss of a packed batch
therefore equals that of the padded batch for the same examples.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100
PACKED_ATTENTION = "arbor_packed_sdpa"

__all__ = [
    "IGNORE_INDEX",
    "PACKED_ATTENTION",
    "packed_sdpa_attention",
    "use_packed_attention",
    "real_tokens",
    "build_sft_example",
    "pack_examples",
    "collate_packed",
    "collate_padded",
    "block_causal_mask",
    "per_example_loss",
    "padding_fraction",
]


def build_sft_example(tokenizer: Any, messages: list[dict], completion: str, max_length: int,
                      truncate_prompt: bool = True) -> dict | None:
    """Tokenize one prompt/completion pair with a completion-only loss mask.

    The prompt is ``tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)``;
    it and ``completion + tokenizer.eos_token`` are tokenized separately with
    ``add_special_tokens=False`` and concatenated.

    Returns ``{"input_ids", "labels", "n_prompt", "n_completion"}`` where ``labels`` is ``-100`` on the
    ``n_prompt`` prompt tokens and the token ids on the ``n_completion`` completion tokens. When the
    whole is longer than ``max_length`` the prompt is truncated from the left (its oldest tokens go
    first) and the completion is kept intact; when the completion alone is longer than ``max_length``
    the example is dropped and ``None`` is returned (callers count these). With ``truncate_prompt=False``
    an example whose prompt does not fit is dropped the same way instead of truncated.
    """
    if max_length <= 0:
        raise ValueError(f"max_length must be positive, got {max_length}")
    eos = tokenizer.eos_token
    if not eos:
        raise ValueError("tokenizer has no eos_token; set tokenizer.eos_token before building SFT examples")
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prompt_ids = list(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    completion_ids = list(tokenizer(completion + eos, add_special_tokens=False)["input_ids"])
    if len(completion_ids) > max_length:
        return None
    room = max_length - len(completion_ids)
    if len(prompt_ids) > room:
        if not truncate_prompt:
            return None
        prompt_ids = prompt_ids[len(prompt_ids) - room :] if room > 0 else []
    return {
        "input_ids": prompt_ids + completion_ids,
        "labels": [IGNORE_INDEX] * len(prompt_ids) + completion_ids,
        "n_prompt": len(prompt_ids),
        "n_completion": len(completion_ids),
    }


def pack_examples(examples: Sequence[dict], max_length: int) -> list[dict]:
    """Pack examples sequentially (input order kept) into rows of at most ``max_length`` tokens.

    A new pack starts whenever the next example does not fit in the current one; the result is
    deterministic. Each pack is ``{"input_ids", "labels", "position_ids", "seq_lens"}``: the examples'
    tokens concatenated with no padding, ``position_ids`` restarting at 0 for each example, and
    ``seq_lens`` the list of example lengths in order. The label of each example's first token is
    set to ``-100`` (see the module docstring). An example longer than ``max_length`` raises
    ``ValueError`` (build examples with the same ``max_length``).
    """
    packs: list[dict] = []
    cur: dict | None = None
    for i, ex in enumerate(examples):
        ids = list(ex["input_ids"])
        labels = list(ex["labels"])
        n = len(ids)
        if n == 0:
            continue
        if n > max_length:
            raise ValueError(f"example {i} has {n} tokens, more than max_length={max_length}")
        if len(labels) != n:
            raise ValueError(f"example {i}: {len(labels)} labels for {n} input_ids")
        if cur is None or len(cur["input_ids"]) + n > max_length:
            cur = {"input_ids": [], "labels": [], "position_ids": [], "seq_lens": []}
            packs.append(cur)
        cur["input_ids"].extend(ids)
        cur["labels"].append(IGNORE_INDEX)
        cur["labels"].extend(labels[1:])
        cur["position_ids"].extend(range(n))
        cur["seq_lens"].append(n)
    return packs


def block_causal_mask(
    seq_lens: Sequence[Sequence[int]], length: int, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Additive 4D mask ``(B, 1, length, length)``: token i attends to j iff same example and j <= i.

    ``seq_lens[b]`` are the example lengths laid out from the start of row ``b``; positions after
    them are padding and attend only to themselves (so no softmax row is fully masked -> no NaN).
    Allowed = ``0``, masked = ``torch.finfo(dtype).min``.
    """
    if not dtype.is_floating_point:
        raise ValueError(f"an additive mask needs a floating dtype, got {dtype}")
    bsz = len(seq_lens)
    seg = torch.full((bsz, length), -1, dtype=torch.long)
    for b, lens in enumerate(seq_lens):
        start = 0
        for k, n in enumerate(lens):
            seg[b, start : start + n] = k
            start += n
        if start > length:
            raise ValueError(f"row {b}: seq_lens sum to {start} > length {length}")
        # every pad position is its own segment (unique ids past the real ones)
        n_pad = length - start
        seg[b, start:] = torch.arange(len(lens), len(lens) + n_pad)
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    allowed = (seg[:, :, None] == seg[:, None, :]) & causal
    mask = torch.zeros(bsz, 1, length, length, dtype=dtype)
    mask.masked_fill_(~allowed[:, None], torch.finfo(dtype).min)
    return mask


def collate_packed(
    packs: Sequence[dict], pad_id: int, dtype: torch.dtype = torch.float32, layout: str = "dense"
) -> dict[str, Any]:
    """Collate packs for a causal LM. Returns ``input_ids``, ``labels`` (-100 on padding),
    ``position_ids`` (restarting per example, 0 on padding) and ``seq_lens`` (per row, the example
    lengths laid out from its start), plus, by ``layout``:

    - ``"dense"``: one pack per row, right-padded to the longest, and ``attention_mask`` the additive
      float 4D mask of :func:`block_causal_mask`, shape ``(B, 1, L, L)`` -- for eager or SDPA attention.
      Pass ``dtype`` = the model's dtype (transformers passes a 4D mask through unchanged, with no cast).
    - ``"segments"``: every pack laid end to end in a single row (no padding, no mask) -- for
      :data:`PACKED_ATTENTION` (pass ``packed_seq_lens=batch["seq_lens"]``) or flash-attention
      (transformers finds the examples from ``position_ids``; pass ``use_cache=False``).
    """
    if not packs:
        raise ValueError("empty batch")
    if layout not in ("dense", "segments"):
        raise ValueError(f"layout must be 'dense' or 'segments', got {layout!r}")
    for b, p in enumerate(packs):
        if sum(p["seq_lens"]) != len(p["input_ids"]):
            raise ValueError(f"pack {b}: seq_lens sum to {sum(p['seq_lens'])}, not {len(p['input_ids'])}")
    if layout == "segments":
        packs = [{k: [x for p in packs for x in p[k]] for k in ("input_ids", "labels", "position_ids", "seq_lens")}]
    input_ids = pad_sequences([p["input_ids"] for p in packs], pad_id)
    out: dict[str, Any] = {
        "input_ids": input_ids,
        "labels": pad_sequences([p["labels"] for p in packs], IGNORE_INDEX),
        "position_ids": pad_sequences([p["position_ids"] for p in packs], 0),
        "seq_lens": [list(p["seq_lens"]) for p in packs],
    }
    if layout == "dense":
        out["attention_mask"] = block_causal_mask(out["seq_lens"], input_ids.shape[1], dtype)
    return out


def packed_sdpa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    packed_seq_lens: Sequence[Sequence[int]] | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers attention function (registered as :data:`PACKED_ATTENTION`).

    With ``packed_seq_lens`` (row ``b`` holds examples of these lengths from its start; any rest of the
    row is padding, computed as one more segment) each example attends causally to itself only, so
    the work is the sum of the examples' squared lengths, not the row's: on a GPU in bf16/fp16 one
    variable-length flash-attention kernel (:func:`varlen_kernel`), elsewhere one ``is_causal`` SDPA
    call per example. Without it this is transformers' SDPA attention, mask and all.
    Shapes as transformers passes them: ``query`` ``(B, heads, L, d)``; returns ``(B, L, heads, d)``.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if packed_seq_lens is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    bsz, _, length, _ = query.shape
    if key.shape[2] != length:
        raise ValueError(f"packed attention needs keys for exactly the {length} query positions (got {key.shape[2]}); "
                         "call the model with use_cache=False and no past key values")
    if len(packed_seq_lens) != bsz:
        raise ValueError(f"packed_seq_lens has {len(packed_seq_lens)} rows for a batch of {bsz}")
    segments = []  # per row: the example lengths, then the trailing padding as one more segment
    for b, lens in enumerate(packed_seq_lens):
        total = sum(lens)
        if total > length:
            raise ValueError(f"row {b}: packed_seq_lens sum to {total} > sequence length {length}")
        segments.append([*lens, length - total] if total < length else list(lens))
    varlen = varlen_kernel(query)
    if varlen is not None:
        return varlen(module, query, key, value, segments, scaling), None
    rows = []
    for b, row in enumerate(segments):
        parts, start = [], 0
        for n in row:
            part, _ = sdpa_attention_forward(module, query[b : b + 1, :, start : start + n],
                                             key[b : b + 1, :, start : start + n],
                                             value[b : b + 1, :, start : start + n], None, dropout=dropout,
                                             scaling=scaling)
            parts.append(part)
            start += n
        rows.append(torch.cat(parts, dim=1) if len(parts) > 1 else parts[0])
    return (torch.cat(rows, dim=0) if bsz > 1 else rows[0]), None


def varlen_kernel(query: torch.Tensor):
    """On a GPU in half precision, PyTorch's variable-length flash attention (``torch.nn.attention.varlen``,
    PyTorch >= 2.10) does all examples in one kernel: one SDPA call per example is thousands of small
    launches per step there (measured on an H200: 4x slower than padding). None where it does not apply
    (the CPU, fp32, older PyTorch): then the per-example loop runs."""
    if not query.is_cuda or query.dtype not in (torch.float16, torch.bfloat16) or query.shape[-1] > 256:
        return None
    found = _varlen_attn()
    if found is None:
        return None
    varlen_attn, params = found

    def run(module, query, key, value, segments, scaling):
        bsz, heads, length, dim = query.shape
        kv_heads = key.shape[1]
        offsets = [0]
        for row in segments:
            for n in row:
                offsets.append(offsets[-1] + n)
        cu = torch.tensor(offsets, dtype=torch.int32, device=query.device)
        longest = max(b - a for a, b in zip(offsets, offsets[1:]))
        kw: dict[str, Any] = {"scale": scaling}
        if "window_size" in params:
            kw["window_size"] = (-1, 0)  # causal
        else:
            kw["is_causal"] = True
        if kv_heads != heads:
            if "enable_gqa" in params:
                kw["enable_gqa"] = True
            else:
                from transformers.integrations.sdpa_attention import repeat_kv

                key, value = repeat_kv(key, heads // kv_heads), repeat_kv(value, heads // kv_heads)
        q = query.transpose(1, 2).reshape(bsz * length, heads, dim)
        k = key.transpose(1, 2).reshape(bsz * length, key.shape[1], dim)
        v = value.transpose(1, 2).reshape(bsz * length, value.shape[1], value.shape[-1])
        out = varlen_attn(q, k, v, cu, cu, longest, longest, **kw)
        return out.reshape(bsz, length, heads, value.shape[-1])

    return run


@functools.cache
def _varlen_attn() -> tuple[Any, frozenset[str]] | None:
    """PyTorch's ``varlen_attn`` and its keyword names (they changed between releases), looked up once,
    not in every attention layer of every step; None before PyTorch 2.10."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    import inspect

    return varlen_attn, frozenset(inspect.signature(varlen_attn).parameters)


def use_packed_attention(model: Any) -> str:
    """Register :func:`packed_sdpa_attention` and switch a model that runs SDPA to it.

    Returns the model's attention implementation afterwards, which picks the batch layout:
    :data:`PACKED_ATTENTION` and ``flash_attention_*`` take ``layout="segments"``, anything else
    (eager, a user's choice) the ``"dense"`` 4D mask.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(PACKED_ATTENTION, packed_sdpa_attention)
    AttentionMaskInterface.register(PACKED_ATTENTION, sdpa_mask)  # generation: SDPA's own masks
    impl = model.config._attn_implementation
    if impl == "sdpa":
        model.set_attn_implementation(PACKED_ATTENTION)
        impl = model.config._attn_implementation
    return impl


def packed_layout(attn_implementation: str) -> str:
    """The :func:`collate_packed` layout an attention implementation consumes."""
    if attn_implementation == PACKED_ATTENTION or attn_implementation.startswith("flash_attention"):
        return "segments"
    return "dense"


def pad_sequences(seqs: Sequence[Sequence[int]], value: int, left: bool = False) -> torch.Tensor:
    """A (len(seqs), longest) long tensor, right-padded (or left-padded) with `value`."""
    length = max(len(x) for x in seqs)
    out = torch.full((len(seqs), length), value, dtype=torch.long)
    for b, x in enumerate(seqs):
        if len(x):
            if left:
                out[b, length - len(x):] = torch.tensor(x, dtype=torch.long)
            else:
                out[b, : len(x)] = torch.tensor(x, dtype=torch.long)
    return out


def collate_padded(examples: Sequence[dict], pad_id: int) -> dict[str, torch.Tensor]:
    """Unpacked baseline: one example per row, right-padded; ``labels`` -100 and mask 0 on padding."""
    if not examples:
        raise ValueError("empty batch")
    return {"input_ids": pad_sequences([e["input_ids"] for e in examples], pad_id),
            "labels": pad_sequences([e["labels"] for e in examples], IGNORE_INDEX),
            "attention_mask": pad_sequences([[1] * len(e["input_ids"]) for e in examples], 0)}


def per_example_loss(
    logits: torch.Tensor, labels: torch.Tensor, seq_lens: Sequence[Sequence[int]] | None = None
) -> torch.Tensor:
    """Summed token NLL for each example, as a 1D float32 tensor.

    ``logits`` ``(B, L, V)`` and ``labels`` ``(B, L)`` (-100 = ignored). ``seq_lens[b]`` lists the
    lengths of the examples laid out from the start of row ``b`` (a pack's ``"seq_lens"``); with
    ``None`` each row is one example (a padded batch). Within each example, logits at position t
    predict the label at t+1 (the causal-LM shift); nothing is predicted across an example boundary.
    Examples are returned row by row, in order -- the input order for :func:`pack_examples` output.
    """
    bsz, length = labels.shape
    if seq_lens is None:
        seq_lens = [[length]] * bsz
    if len(seq_lens) != bsz:
        raise ValueError(f"{len(seq_lens)} rows of seq_lens for a batch of {bsz}")
    out = []
    for b, lens in enumerate(seq_lens):
        start = 0
        for n in lens:
            lg = logits[b, start : start + n - 1].float()
            lb = labels[b, start + 1 : start + n].to(lg.device)
            out.append(F.cross_entropy(lg, lb, ignore_index=IGNORE_INDEX, reduction="sum"))
            start += n
    return torch.stack(out)


def padding_fraction(batch: dict[str, torch.Tensor]) -> float:
    """Share of positions in a collated batch that are padding.

    With a 2D ``attention_mask`` (:func:`collate_padded`) this is ``1 - mean(mask)``. Otherwise (a
    4D packed mask) it is labels-based: examples from :func:`build_sft_example` always end with a
    supervised token (the eos), and collators pad on the right, so a row's padding is its trailing
    run of ``-100`` labels.
    """
    mask = batch.get("attention_mask")
    if mask is not None and mask.dim() == 2:
        return float(1.0 - mask.float().mean().item())
    labels = batch["labels"]
    bsz, length = labels.shape
    if labels.numel() == 0:
        return 0.0
    supervised = labels != IGNORE_INDEX
    idx = torch.arange(length, device=labels.device).expand(bsz, length)
    last = torch.where(supervised, idx, torch.full_like(idx, -1)).max(dim=1).values  # -1 if none
    n_pad = (length - 1 - last).sum().item()
    return float(n_pad) / float(bsz * length)


def real_tokens(batch: dict[str, Any]) -> int:
    """Non-padding tokens in a collated batch: the packs' ``seq_lens`` when present, else the 2D mask."""
    if "seq_lens" in batch:
        return sum(sum(lens) for lens in batch["seq_lens"])
    mask = batch.get("attention_mask")
    if mask is not None and mask.dim() == 2:
        return int(mask.sum())
    return int(round(batch["labels"].numel() * (1.0 - padding_fraction(batch))))
