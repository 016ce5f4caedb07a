"""The multi-GPU wrapping policy, in one short function: FSDP shards (and, with gradient checkpointing,
re-computes) each transformer block named in conf/model/<name>.yaml `wrap_layers`."""

from __future__ import annotations


def fsdp_policy(mcfg: dict) -> set[type]:
    import transformers

    classes = set()
    for name in mcfg.get("wrap_layers") or []:
        cls = None
        for mod in ("models.bert.modeling_bert", "models.llama.modeling_llama", "models.qwen3.modeling_qwen3",
                    "models.qwen3_moe.modeling_qwen3_moe"):
            try:
                m = __import__(f"transformers.{mod}", fromlist=[name])
            except ImportError:
                continue
            cls = getattr(m, name, None)
            if cls is not None:
                break
        if cls is None:
            raise ValueError(f"model option wrap_layers names {name!r}, which transformers {transformers.__version__} lacks")
        classes.add(cls)
    if not classes:
        raise ValueError("model option wrap_layers is empty: FSDP needs the transformer block class to wrap")
    return classes
