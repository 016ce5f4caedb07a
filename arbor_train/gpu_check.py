"""GPU checks of the training step, on random-weight models of the real architectures (no downloads).

    python -m arbor_train.gpu_check prepare [data_dir] [examples.json]   # here: tokenize extraction examples
    python -m arbor_train.gpu_check run [examples.json] [out_dir]        # on a GPU machine: prints JSON lines

`prepare` (CPU) writes 600 extractor SFT examples of `data_dir` (default
outputs/data/branchmem_train_cpu_seed0) tokenized with SmolLM2's tokenizer, so the GPU machine needs
no data pipeline. `run` then checks, with the token ids as they are:

- A: packed per-example losses (segments and dense-mask layouts) and gradients equal the padded ones
  on a small random Qwen3, in fp32 and bf16, and says which packed kernel ran (varlen on a GPU in bf16);
- C: the Qwen3-30B-A3B experiment's LoRA (attention + fused expert parameters) on a small random
  Qwen3-MoE: every expert LoRA gets a gradient in bf16 on the GPU;
- B: tokens/s of one training step (forward, backward, AdamW) on a random-weight Qwen3-4B
  architecture in bf16 with conf/model/qwen3_4b.yaml's LoRA targets and gradient checkpointing:
  this toolkit's packed step (2 x 4,096-token packs, one row, per-example attention, completion-only
  logits) against the same packs with a dense block mask, and against padded batches of 32 examples
  with the model's own loss over all positions (what a plain Trainer step computes).
Results go to stdout and `out_dir/gpu_check.json` (default $OUT or /tmp). DEV=cpu SKIP_B=1 runs A and
C on the CPU (a smoke test). The README quotes the numbers of one H200.
"""
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from arbor_train.models import add_lora
from arbor_train.packing import (
    PACKED_ATTENTION,
    collate_packed,
    collate_padded,
    pack_examples,
    per_example_loss,
    use_packed_attention,
)
from arbor_train.paths import CONF_DIR


def prepare(data_dir: str = "outputs/data/branchmem_train_cpu_seed0", out: str = "outputs/gpu_check/examples.json",
            n: int = 600) -> int:
    from arbor_train.data import load_sets, select_rows
    from arbor_train.models import build_tokenizer
    from arbor_train.roles.extractor import sft_examples
    from arbor_train.runtime.config import compose

    c = OmegaConf.to_container(compose("train", ["model=smollm2_135m", "task=extractor_states", "run_dir=unused"]),
                               resolve=True)
    rows = select_rows(load_sets(data_dir, ["extraction"])["extraction"], n, 0.6, ["states"])
    exs, _, _ = sft_examples(rows, build_tokenizer(c["model"]), ["states"], 384)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps([{"input_ids": e["input_ids"], "labels": e["labels"]} for e in exs]))
    print(f"wrote {len(exs)} examples to {out}")
    return len(exs)


def run(examples: str = "outputs/gpu_check/examples.json", out_dir: str | None = None) -> dict:
    """Checks A, C and (unless SKIP_B) B; returns and writes the results."""
    OUT = out_dir or os.environ.get("OUT", "/tmp")
    EXAMPLES = examples
    res = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"}
    import peft
    import transformers  # noqa: E402

    res["transformers"], res["peft"] = transformers.__version__, peft.__version__
    dev = os.environ.get("DEV", "cuda")
    exs = json.load(open(EXAMPLES))


    def emit(k, v):
        res[k] = v
        print(json.dumps({k: v}), flush=True)
        Path(OUT).mkdir(parents=True, exist_ok=True)
        json.dump(res, open(f"{OUT}/gpu_check.json", "w"), indent=1)


    # A. correctness on CUDA: per-example losses of packed (segments, dense) == padded, fp32 and bf16
    from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM  # noqa: E402

    small = Qwen3Config(vocab_size=49152, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                        num_attention_heads=8, num_key_value_heads=2, head_dim=32, max_position_embeddings=8192)
    sub = exs[:12]
    for dtype in (torch.float32, torch.bfloat16):
        torch.manual_seed(0)
        with torch.device(dev):
            m = Qwen3ForCausalLM(small).to(dtype).eval()
        pad = collate_padded(sub, 0)
        with torch.no_grad():
            ref = per_example_loss(m(input_ids=pad["input_ids"].to(dev), attention_mask=pad["attention_mask"].to(dev)).logits,
                                   pad["labels"].to(dev))
            packs = pack_examples(sub, 1024)
            dense = collate_packed(packs, 0, dtype)
            d = per_example_loss(m(input_ids=dense["input_ids"].to(dev), attention_mask=dense["attention_mask"].to(dev),
                                   position_ids=dense["position_ids"].to(dev)).logits, dense["labels"].to(dev),
                                 dense["seq_lens"])
            assert use_packed_attention(m) == PACKED_ATTENTION
            seg = collate_packed(packs, 0, dtype, layout="segments")
            s = per_example_loss(m(input_ids=seg["input_ids"].to(dev), position_ids=seg["position_ids"].to(dev),
                                   packed_seq_lens=seg["seq_lens"], use_cache=False).logits, seg["labels"].to(dev),
                                 seg["seq_lens"])
        # gradients: the packed (segments) step against the padded step
        from arbor_train.packing import varlen_kernel
        m.train()
        m.set_attn_implementation("sdpa")
        per_example_loss(m(input_ids=pad["input_ids"].to(dev), attention_mask=pad["attention_mask"].to(dev)).logits,
                         pad["labels"].to(dev)).sum().backward()
        g_ref = m.model.layers[0].self_attn.q_proj.weight.grad.float().clone()
        m.zero_grad()
        use_packed_attention(m)
        per_example_loss(m(input_ids=seg["input_ids"].to(dev), position_ids=seg["position_ids"].to(dev),
                           packed_seq_lens=seg["seq_lens"], use_cache=False).logits, seg["labels"].to(dev),
                         seg["seq_lens"]).sum().backward()
        g = m.model.layers[0].self_attn.q_proj.weight.grad.float()
        probe = torch.zeros(1, 2, 8, 64, device=dev, dtype=dtype)
        emit(f"A_packed_vs_padded_{str(dtype)[6:]}", {
            "kernel": "varlen" if varlen_kernel(probe) is not None else "per-example sdpa loop",
            "grad_rel_diff": float((g - g_ref).norm() / g_ref.norm()),
            "examples": len(sub), "max_abs_diff_segments": float((s - ref).abs().max()),
            "max_abs_diff_dense": float((d - ref).abs().max()), "mean_loss_sum": float(ref.mean())})

    # C. Qwen3-MoE: LoRA from conf/model/qwen3_30b_a3b.yaml reaches the fused experts, bf16 backward on CUDA
    mcfg = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "model" / "qwen3_30b_a3b.yaml"))
    pcfg = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "peft" / "lora.yaml"))
    torch.manual_seed(0)
    with torch.device(dev):
        moe = Qwen3MoeForCausalLM(Qwen3MoeConfig(vocab_size=49152, hidden_size=512, intermediate_size=1024,
                                                moe_intermediate_size=256, num_hidden_layers=4, num_attention_heads=8,
                                                num_key_value_heads=4, head_dim=64, num_experts=16,
                                                num_experts_per_tok=4, max_position_embeddings=4096)).to(torch.bfloat16)
    moe = add_lora(moe, {**pcfg, "r": 16, "alpha": 32, "dropout": 0.0}, mcfg, "CAUSAL_LM")  # as the 30B experiment
    impl = use_packed_attention(moe)
    seg = collate_packed(pack_examples(exs[:16], 2048), 0, torch.bfloat16, layout="segments")
    out = moe(input_ids=seg["input_ids"].to(dev), position_ids=seg["position_ids"].to(dev),
              packed_seq_lens=seg["seq_lens"], use_cache=False, labels=seg["labels"].to(dev))
    out.loss.backward()
    exp = [(n, p) for n, p in moe.named_parameters() if p.requires_grad and "experts" in n]
    emit("C_moe_lora", {"attention": impl, "loss": float(out.loss), "expert_lora_tensors": len(exp),
                        "expert_lora_params": sum(p.numel() for _, p in exp),
                        "expert_lora_B": sum(1 for n, _ in exp if "lora_B" in n), "expert_lora_B_with_grad": sum(1 for n, p in exp if "lora_B" in n and p.grad is not None and p.grad.abs().sum() > 0),
                        "trainable": sum(p.numel() for p in moe.parameters() if p.requires_grad),
                        "total": sum(p.numel() for p in moe.parameters())})
    del moe, out

    if os.environ.get("SKIP_B"):
        return res
    # B. throughput, Qwen3-4B architecture (random init, bf16) + LoRA from conf: packed segments vs dense mask vs padded
    q4 = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "model" / "qwen3_4b.yaml"))
    cfg4 = Qwen3Config(vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                       num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                       rope_theta=1000000, tie_word_embeddings=True)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    with torch.device(dev):
        base = Qwen3ForCausalLM(cfg4).to(torch.bfloat16)
    base.gradient_checkpointing_enable()
    base.config.use_cache = False
    model = add_lora(base, {**pcfg}, q4, "CAUSAL_LM")
    model.train()
    emit("B_setup", {"build_s": round(time.perf_counter() - t0, 1), "params": sum(p.numel() for p in model.parameters()),
                     "gradient_checkpointing": True})
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    STEPS, WARM = 8, 2
    pool = exs * 4


    def timed(make_batches, step):
        times, toks = [], []
        for i, (b, n) in enumerate(make_batches()):
            if i >= STEPS:
                break
            torch.cuda.synchronize()
            t = time.perf_counter()
            loss = step(b)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
            toks.append(n)
        return {"tokens_per_s": round(sum(toks[WARM:]) / sum(times[WARM:]), 1),
                "step_s_median": round(statistics.median(times[WARM:]), 3), "tokens_per_step": round(statistics.mean(toks))}


    def keep_loss(b, **kw):
        labels = b["labels"].to(dev)
        target = labels[:, 1:]
        keep = torch.nonzero((target != -100).any(0)).squeeze(-1)
        out = model(input_ids=b["input_ids"].to(dev), position_ids=b["position_ids"].to(dev), use_cache=False,
                    logits_to_keep=keep, **kw)
        lg = out.logits.float()
        return torch.nn.functional.cross_entropy(lg.reshape(-1, lg.shape[-1]), target[:, keep].reshape(-1),
                                                 ignore_index=-100)


    PACK, PACKS, HFB = 4096, 2, 32
    packs = pack_examples(pool, PACK)


    def seg_batches():
        for i in range(0, len(packs), PACKS):
            b = collate_packed(packs[i:i + PACKS], 0, torch.bfloat16, layout="segments")
            yield b, sum(map(sum, b["seq_lens"]))


    def dense_batches():
        for i in range(0, len(packs), PACKS):
            b = collate_packed(packs[i:i + PACKS], 0, torch.bfloat16)
            b["attention_mask"] = b["attention_mask"].to(dev)
            yield b, sum(map(sum, b["seq_lens"]))


    def padded_batches():
        for i in range(0, len(pool), HFB):
            b = collate_padded(pool[i:i + HFB], 0)
            yield b, int(b["attention_mask"].sum())


    rows = {}
    assert use_packed_attention(model) == PACKED_ATTENTION
    rows["ours_packed_segments"] = timed(seg_batches, lambda b: keep_loss(b, packed_seq_lens=b["seq_lens"]))
    emit("B_ours_packed_segments", rows["ours_packed_segments"])
    model.set_attn_implementation("sdpa")
    rows["packed_dense_mask"] = timed(dense_batches, lambda b: keep_loss(b, attention_mask=b["attention_mask"]))
    emit("B_packed_dense_mask", rows["packed_dense_mask"])
    rows["padded_full_logits_hf_style"] = timed(padded_batches, lambda b: model(
        input_ids=b["input_ids"].to(dev), attention_mask=b["attention_mask"].to(dev), labels=b["labels"].to(dev)).loss)
    emit("B_padded_full_logits_hf_style", rows["padded_full_logits_hf_style"])
    emit("B_peak_mem_gb", round(torch.cuda.max_memory_allocated() / 2**30, 1))
    emit("B_speedup_vs_padded", round(rows["ours_packed_segments"]["tokens_per_s"]
                                      / rows["padded_full_logits_hf_style"]["tokens_per_s"], 3))
    print("DONE", flush=True)
    return res


if __name__ == "__main__":
    if sys.argv[1:2] == ["prepare"]:
        prepare(*sys.argv[2:4])
    elif sys.argv[1:2] == ["run"]:
        run(*sys.argv[2:4])
    else:
        raise SystemExit("usage: python -m arbor_train.gpu_check prepare [data_dir] [examples.json] | run [examples.json] [out_dir]")
