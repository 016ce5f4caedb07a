"""FSDP for the trainer: the wrapping policy (FSDP shards, and with gradient checkpointing re-computes,
each transformer block named in conf/model/<name>.yaml `wrap_layers`), a strategy that resumes from
full-state checkpoints, and the helpers that run generation and gather the adapter through the root."""

from __future__ import annotations


def fsdp_policy(wrap_layers: list[str]) -> set[type]:
    """The transformer block classes named in `model.wrap_layers`."""
    import transformers

    classes = set()
    for name in wrap_layers or []:
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


def fsdp_strategy(wrap_layers: list[str], activation_checkpointing: bool = False,
                  sharding_strategy: str = "FULL_SHARD", **kwargs):
    """Lightning's FSDPStrategy wrapping (and, with `activation_checkpointing`, re-computing) each block
    named in `wrap_layers`, with resume fixed for PyTorch >= 2.11. conf/trainer/fsdp.yaml builds it
    (`trainer.strategy._target_`); other FSDPStrategy arguments pass through `kwargs`.

    Lightning 2.6's FSDP resume reads a full-state checkpoint file with its own lazy unpickler, which
    fails on checkpoints written by PyTorch >= 2.11 ("'UntypedStorage' object has no attribute 'dtype'",
    seen on an H200 with torch 2.11 and reproduced on torch 2.13 here). Lightning's Fabric already reads
    such files with ``torch.load(mmap=True)`` (memory-mapped, so no rank holds a second copy); this
    strategy does the same and leaves the rest of Lightning's loading (FSDP full-state-dict context,
    optimizer re-keying) as it is.
    """
    import lightning.pytorch.strategies.fsdp as lfsdp
    import torch

    def _mmap_load(path):
        return torch.load(path, mmap=True, map_location="cpu", weights_only=True)  # never runs code (train.load_checkpoint)

    class ArborFSDPStrategy(lfsdp.FSDPStrategy):
        def load_checkpoint(self, checkpoint_path, weights_only=None):
            original = lfsdp._lazy_load
            lfsdp._lazy_load = _mmap_load
            try:
                return super().load_checkpoint(checkpoint_path, weights_only=weights_only)
            finally:
                lfsdp._lazy_load = original

    policy = fsdp_policy(list(wrap_layers or []))
    return ArborFSDPStrategy(auto_wrap_policy=policy, sharding_strategy=sharding_strategy,
                             activation_checkpointing_policy=policy if activation_checkpointing else None, **kwargs)


def is_fsdp(trainer) -> bool:
    from lightning.pytorch.strategies import FSDPStrategy

    return trainer is not None and isinstance(trainer.strategy, FSDPStrategy)


def through_root(module, method: str, *args, **kwargs):
    """Call ``module.<method>(*args, **kwargs)`` through the FSDP root's forward when the module is sharded.

    Under FSDP the root unit's parameters (embeddings, final norm, LM head) are gathered and cast only
    inside the root's forward; calling the inner Hugging Face model directly (as ``generate`` does) meets
    sharded, un-cast weights. Lightning routes ``training_step`` through the root the same way.
    """
    trainer = module._trainer
    if trainer is None:
        return getattr(module, method)(*args, **kwargs)
    # the precision context of training and validation steps (autocast under bf16-mixed): FSDP's
    # mixed precision casts the sharded blocks' weights to bf16 while the embeddings' output stays fp32
    with trainer.precision_plugin.forward_context():
        if is_fsdp(trainer) and trainer.strategy.model is not None and trainer.strategy.model is not module:
            from lightning.pytorch.strategies.strategy import _ForwardRedirection

            return _ForwardRedirection()(trainer.strategy.model, module, method, *args, **kwargs)
        return getattr(module, method)(*args, **kwargs)


def gathered_state_dict(trainer) -> dict | None:
    """Under FSDP, the wrapped Hugging Face model's full state dict (a collective: call it on every rank;
    rank 0 gets the tensors, on the CPU). None for any other strategy (the module holds full weights)."""
    if not is_fsdp(trainer):
        return None
    full = trainer.strategy.lightning_module_state_dict()
    return {k[len("model."):]: v for k, v in full.items() if k.startswith("model.")}
