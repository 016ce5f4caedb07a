"""Model builders: one function per architecture family, chosen by conf/model/*.yaml.

    model:
      name: minilm_l6            # display name, written into bundle manifests
      family: encoder | decoder
      ref: pkg:... | gguf:... | <hub id or local path> | null (tiny: built in-process)
      tokenizer: <model ref>     # tiny models borrow a shipped tokenizer
      tiny: {...} | null         # config kwargs of an in-process model (BertConfig / LlamaConfig)
      dtype: fp32 | bf16
      attn_implementation: null  # transformers' default (sdpa) | eager | flash_attention_2 | ...
      lora_targets: [...]        # module names LoRA wraps (conf/peft reads them)
      lora_target_parameters: [...]  # optional: nn.Parameter names LoRA wraps (fused MoE experts)
"""

from __future__ import annotations

from typing import Any

import torch

from .modelref import resolve

SIMPLE_CHAT = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
               "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def _dtype(name: str):
    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[name]


def build_tokenizer(mcfg: dict):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(resolve(mcfg["tokenizer"] or mcfg["ref"]))
    if mcfg["family"] == "decoder":
        if tok.chat_template is None:
            tok.chat_template = SIMPLE_CHAT
        if tok.eos_token is None:
            tok.eos_token = tok.sep_token or tok.pad_token
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
    return tok


def build_encoder(mcfg: dict, num_labels: int, multilabel: bool = False, seed: int = 0):
    """(model, tokenizer): an encoder with a classification head of num_labels outputs."""
    from transformers import AutoModelForSequenceClassification, BertConfig, BertForSequenceClassification

    tok = build_tokenizer(mcfg)
    kwargs: dict[str, Any] = {"num_labels": num_labels}
    if multilabel:
        kwargs["problem_type"] = "multi_label_classification"
    torch.manual_seed(seed)  # the new head (and a tiny model) start from the same weights every run
    if mcfg.get("tiny"):
        model = BertForSequenceClassification(BertConfig(vocab_size=len(tok), **mcfg["tiny"], **kwargs))
    else:
        model = AutoModelForSequenceClassification.from_pretrained(resolve(mcfg["ref"]), dtype=_dtype(mcfg["dtype"]),
                                                                   **kwargs)
    return model, tok


def build_token_encoder(mcfg: dict, num_labels: int, seed: int = 0):
    """(model, tokenizer): an encoder with a token-classification head of num_labels outputs (the span
    extractor, arbor_train/runtime/spans.py)."""
    from transformers import AutoModelForTokenClassification, BertConfig, BertForTokenClassification

    tok = build_tokenizer(mcfg)
    torch.manual_seed(seed)
    if mcfg.get("tiny"):
        model = BertForTokenClassification(BertConfig(vocab_size=len(tok), num_labels=num_labels, **mcfg["tiny"]))
    else:
        model = AutoModelForTokenClassification.from_pretrained(resolve(mcfg["ref"]), dtype=_dtype(mcfg["dtype"]),
                                                                num_labels=num_labels)
    return model, tok


def build_decoder(mcfg: dict, seed: int = 0):
    """(model, tokenizer): a causal LM."""
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    tok = build_tokenizer(mcfg)
    torch.manual_seed(seed)
    if mcfg.get("tiny"):
        model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), pad_token_id=tok.pad_token_id, **mcfg["tiny"]))
    else:
        kwargs: dict[str, Any] = {"dtype": _dtype(mcfg["dtype"])}
        if mcfg.get("device_map"):
            kwargs["device_map"] = mcfg["device_map"]  # accelerate: empty-weight init + placement
        model = AutoModelForCausalLM.from_pretrained(resolve(mcfg["ref"]), **kwargs)
    if mcfg.get("attn_implementation"):  # e.g. flash_attention_2 on a GPU with flash-attn installed
        model.set_attn_implementation(mcfg["attn_implementation"])
    return model, tok


def add_lora(model, pcfg: dict, mcfg: dict, task_type: str, modules_to_save: list[str] | None = None):
    """Wrap with PEFT LoRA on mcfg.lora_targets (nn.Linear names) and mcfg.lora_target_parameters
    (parameter names, for layers that hold weights as bare nn.Parameters, such as transformers 5's fused
    MoE experts); everything else frozen (asserted in tests)."""
    from peft import LoraConfig, get_peft_model

    if not pcfg.get("enabled", True):
        return model
    cfg = LoraConfig(r=pcfg["r"], lora_alpha=pcfg["alpha"], lora_dropout=pcfg["dropout"],
                     target_modules=list(mcfg["lora_targets"]), modules_to_save=modules_to_save,
                     target_parameters=list(mcfg.get("lora_target_parameters") or []) or None,
                     task_type=task_type, bias="none")
    return get_peft_model(model, cfg)


def param_counts(model) -> dict[str, int]:
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {"total": total, "trainable": trainable}
