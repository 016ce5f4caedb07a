"""Training on tiny models: frozen base / moving LoRA, checkpoints, exact kill-and-resume, export to
the runtime (merged == base + adapter), 2-process CPU DDP, configs, refusals."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from arbor_train.paths import CONF_DIR, REPO_ROOT
from arbor_train.train import ConfigError, check_combination, train


def tcfg(run_dir, data, *overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[
            "model=tiny_encoder", "logger=csv", f"data.train_dir={data}", f"run_dir={run_dir}",
            "trainer.enable_progress_bar=false", "trainer.max_steps=12", "callbacks.model_checkpoint.every_n_train_steps=6",
            "task.compare_baselines=false", *overrides])
    return OmegaConf.to_container(cfg, resolve=True)


def trainable_tensors(module):
    return {n: p.detach().clone() for n, p in module.named_parameters() if p.requires_grad}


def test_base_weights_stay_frozen_while_lora_and_head_train(tmp_path, smoke_data):
    from arbor_train import roles

    c = tcfg(tmp_path / "run", smoke_data)
    built = roles.get("reranker").build(c)
    module = built.module
    frozen = {n: p.detach().clone() for n, p in module.named_parameters() if not p.requires_grad}
    trainable = trainable_tensors(module)
    assert all("lora_" in n or "classifier" in n or "new_root" in n for n in trainable)
    assert built.param_counts["trainable"] < built.param_counts["total"] / 10
    L.Trainer(max_steps=5, logger=False, enable_checkpointing=False, enable_progress_bar=False,
              num_sanity_val_steps=0, enable_model_summary=False).fit(module, built.train_loader)
    for n, p in module.named_parameters():
        if not p.requires_grad:
            assert torch.equal(p, frozen[n]), f"frozen weight {n} changed"
    moved = [n for n, p in module.named_parameters() if p.requires_grad and not torch.equal(p, trainable[n])]
    assert any("lora_B" in n for n in moved) and any("classifier" in n for n in moved)


class BatchTally(L.Callback):
    """A callback (instantiated by `_target_` like the configured ones) keeping every training batch's
    input ids, so a test can count the tokens a run trained on by itself."""

    batches: list = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        BatchTally.batches.append(batch["input_ids"].detach().clone())


def test_reranker_run_writes_metrics_checkpoints_and_final_adapter(tmp_path, smoke_data):
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    c = tcfg(tmp_path / "run", smoke_data, "task.compare_baselines=true")
    c["callbacks"] = {**c["callbacks"], "tally": {"_target_": f"{__name__}.BatchTally"}}
    BatchTally.batches = []
    t0 = time.perf_counter()
    res = train(c)
    wall = time.perf_counter() - t0
    run = Path(res["run_dir"])
    assert res["global_step"] == 12 and len(BatchTally.batches) == 12
    # throughput: the non-padding tokens of the 12 training batches, counted here, over the timed fit
    pad = AutoTokenizer.from_pretrained(str(run / "final" / "tokenizer")).pad_token_id
    tokens = sum(int((ids != pad).sum()) for ids in BatchTally.batches)
    assert 0 < res["train_seconds"] <= wall
    assert res["tokens_per_s"] == pytest.approx(tokens / res["train_seconds"], rel=0.02)
    assert {"acc@1", "mrr"} <= set(res["metrics"]) and {"heuristic", "untuned"} <= set(res["baselines"])
    written = json.loads((run / "final" / "metrics.json").read_text())
    for k in ("global_step", "tokens_per_s", "train_seconds", "metrics", "baselines", "data_fingerprint"):
        assert written[k] == res[k], k
    # the final adapter: the configured LoRA, holding the weights of the last (step-12) checkpoint
    acfg = json.loads((run / "final" / "adapter" / "adapter_config.json").read_text())
    assert acfg["peft_type"] == "LORA" and acfg["r"] == c["peft"]["r"] and acfg["lora_alpha"] == c["peft"]["alpha"]
    assert set(acfg["target_modules"]) == set(c["model"]["lora_targets"]) and "classifier" in acfg["modules_to_save"]
    adapter = load_file(run / "final" / "adapter" / "adapter_model.safetensors")
    last = torch.load(run / "checkpoints" / "step-000012.ckpt", weights_only=False)["state_dict"]
    as_saved = {k.removeprefix("model.").replace(".modules_to_save", "").replace(".default", ""): v
                for k, v in last.items() if k.startswith("model.")}
    assert set(adapter) == set(as_saved) and any("lora_B" in k for k in adapter)
    for k, v in adapter.items():
        assert torch.equal(v, as_saved[k]), k
    ckpts = sorted((run / "checkpoints").glob("step-*.ckpt"))
    assert [p.name for p in ckpts] == ["step-000006.ckpt", "step-000012.ckpt"]
    ck = torch.load(ckpts[0], weights_only=False)
    assert ck["state_dict"] and all(("lora_" in k or "classifier" in k or "new_root" in k) for k in ck["state_dict"])
    assert "rng" in ck and ck["hyper_parameters"]["config"]["model"]["name"] == "tiny_encoder"
    import csv
    import math

    logged = [list(csv.DictReader(f.open())) for f in (run / "csv").rglob("metrics.csv")]
    assert len(logged) == 1, "the CSV logger wrote one metrics file"
    rows = logged[0]
    assert any(r["train/loss"] and math.isfinite(float(r["train/loss"])) for r in rows), "training losses logged"
    last_val = [r for r in rows if r["val/acc@1"]][-1]  # the validation at step 12 logged what res reports
    assert int(last_val["step"]) == 12
    for k in ("acc@1", "mrr", "loss"):
        assert float(last_val[f"val/{k}"]) == pytest.approx(res["metrics"][k], abs=1e-5), k


TESTS_DIR = Path(__file__).resolve().parent


def slow_after(step: int) -> dict:
    """A callbacks entry (instantiated from config like any other) that slows training after `step`."""
    return {"_target_": "train_helpers.SlowAfter", "step": step}


def kill_after_checkpoint(proc: subprocess.Popen, ckpt: Path, timeout: float = 300) -> None:
    """SIGKILL the run's whole process group once `ckpt` is complete (every rank dies at once)."""
    deadline = time.time() + timeout
    while not ckpt.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    time.sleep(1.0)  # let the checkpoint file be complete
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)


def test_kill_and_resume_is_exact(tmp_path, smoke_data):
    straight = train(tcfg(tmp_path / "straight", smoke_data))
    w_straight = torch.load(Path(straight["run_dir"]) / "checkpoints" / "step-000012.ckpt",
                            weights_only=False)["state_dict"]
    c = tcfg(tmp_path / "killed", smoke_data)
    slowed = dict(c, callbacks={**c["callbacks"], "slow": slow_after(6)})
    proc = subprocess.Popen([sys.executable, "-c", "import json, sys; from arbor_train.train import train; "
                             "train(json.loads(sys.argv[1]))", json.dumps(slowed)], cwd=REPO_ROOT,
                            env=dict(os.environ, PYTHONPATH=str(TESTS_DIR)), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ckpt = tmp_path / "killed" / "checkpoints" / "step-000006.ckpt"
    kill_after_checkpoint(proc, ckpt)
    assert ckpt.exists() and not (tmp_path / "killed" / "checkpoints" / "step-000012.ckpt").exists()
    with pytest.raises(ConfigError, match="different configuration.*optim"):
        train(dict(c, optim=dict(c["optim"], lr=1e-3)))    # the same run_dir, another config: refused
    resumed = train(c)    # resume=auto: the newest checkpoint in run_dir, as a requeued SLURM job does
    assert resumed["resumed_from"].endswith(".ckpt") and resumed["resumed_at_step"] == 6
    assert resumed["global_step"] == 12
    w_resumed = torch.load(Path(resumed["run_dir"]) / "checkpoints" / "step-000012.ckpt",
                           weights_only=False)["state_dict"]
    assert w_straight.keys() == w_resumed.keys()
    for k in w_straight:
        assert torch.allclose(w_straight[k], w_resumed[k], atol=1e-6), f"{k} differs after resume"


def test_export_plugs_into_the_runtime_and_merged_equals_base_plus_adapter(tmp_path, smoke_data):
    from peft import PeftModel

    from arbor_train.export import export, load_base
    from arbor_train.runtime import ArborMemory, default_config, load_bundle

    res = train(tcfg(tmp_path / "run", smoke_data))
    bundle = export(res["run_dir"], tmp_path / "bundle", log_artifact=False)
    b = load_bundle(bundle, role="reranker")
    assert b.manifest["kind"] == "cross_encoder" and b.manifest["merged"] == "merged"
    # the calibrated threshold is the sigmoid of the new-root logit the run learned (its last checkpoint)
    logit = torch.load(Path(res["run_dir"]) / "checkpoints" / "step-000012.ckpt", weights_only=False)["state_dict"][
        "new_root_logit"]
    assert b.manifest["new_root_threshold"] == pytest.approx(torch.sigmoid(logit).item(), abs=1e-6)
    assert b.manifest["data_fingerprint"] == res["data_fingerprint"] and res["data_fingerprint"].startswith("sha256:")
    merged, tok = b.load_model(prefer="merged")
    train_cfg = OmegaConf.to_container(OmegaConf.load(Path(res["run_dir"]) / "final" / "config.yaml"))
    base_plus = PeftModel.from_pretrained(load_base(train_cfg, {"role": "reranker"}), str(bundle / "adapter")).eval()
    enc = tok(["What is Ann's budget?"] * 2, ["Topic: Ann trip", "Topic: Bo agenda"], return_tensors="pt", padding=True)
    with torch.no_grad():
        assert torch.allclose(merged(**enc).logits, base_plus(**enc).logits, atol=1e-5)
    cfg = default_config("runtime/components=tuned", f"runtime.reranker.bundle.path={bundle}",
                       "runtime.reranker.bundle.quantize=null", "runtime.embedder.kind=hashing")
    mem = ArborMemory.open(tmp_path / "m.sqlite", "c", cfg)
    assert mem.reranker.name.startswith("bundle:")
    assert mem.new_root_threshold == pytest.approx(b.manifest["new_root_threshold"])
    mem.step("Ann is planning a trip to Lisbon. Ann's budget is $900.", "Noted.")
    loc, _ = mem.read("What is Ann's budget?")
    # the runtime scores with the exported model: sigmoid of the merged cross-encoder's logit per pair
    assert loc.candidates
    pairs = tok(["What is Ann's budget?"] * len(loc.candidates), [c.document() for c in loc.candidates],
                truncation=True, max_length=b.manifest["max_length"], padding=True, return_tensors="pt")
    with torch.no_grad():
        expect = torch.sigmoid(merged(**pairs).logits[:, 0]).tolist()
    assert [c.score for c in loc.candidates] == pytest.approx(expect, abs=1e-5)
    mem.close()
    with pytest.raises(FileExistsError, match="overwrite=true"):
        export(res["run_dir"], bundle, log_artifact=False)


def test_tagger_and_extractor_roles_train(tmp_path, smoke_data):
    """Training moves the held-out metric each role reports, against the untuned model on the same examples."""
    res = train(tcfg(tmp_path / "tag", smoke_data, "task=tagger", "trainer.max_steps=30", "optim.lr=5e-3",
                     "task.compare_baselines=true"))
    tuned, untuned = res["metrics"], res["baselines"]["untuned"]
    assert tuned["macro_f1"] > untuned["macro_f1"] + 0.1, (untuned, tuned)
    assert tuned["loss"] < untuned["loss"]
    # a random 2-layer decoder: LoRA alone barely moves its frozen random head, so train it in full here
    res = train(tcfg(tmp_path / "ext", smoke_data, "model=tiny_decoder", "task=extractor_states", "trainer.max_steps=30",
                     "peft.enabled=false", "optim.lr=3e-3", "task.gen_examples=2", "task.max_new_tokens=6",
                     "data.max_val_examples=16", "task.compare_baselines=true"))
    tuned, untuned = res["metrics"], res["baselines"]["untuned"]
    assert tuned["generated"] == 2 and res["kinds"] == ["states"]
    assert tuned["loss"] < untuned["loss"] - 1.0, (untuned["loss"], tuned["loss"])   # completion NLL, nats per token


def test_tagger_weights_rare_positive_labels():
    import torch.nn.functional as F

    from arbor_train.data import label_pos_weight
    from arbor_train.roles.tagger import TaggerModule

    exs = [{"labels": [1.0, 0.0, 0.0]}, {"labels": [1.0, 1.0, 0.0]}, {"labels": [0.0, 0.0, 0.0]},
           {"labels": [1.0, 0.0, 0.0]}]
    assert label_pos_weight(exs, 10.0) == [1 / 3, 3.0, 10.0]   # 3 of 4 positive; 1 of 4; none: the cap
    assert label_pos_weight(exs, 2.0) == [1 / 3, 2.0, 2.0] and label_pos_weight(exs, None) is None
    m = TaggerModule(torch.nn.Identity(), {"optim": {}}, ["a", "b", "c"], [1.0, 3.0, 10.0])
    logits, y = torch.zeros(1, 3), torch.tensor([[0.0, 1.0, 1.0]])
    # positives cost pos_weight * log 2 each at logit 0, negatives log 2
    assert torch.isclose(m._bce(logits, y), torch.tensor((1 + 3 + 10) / 3 * 0.6931), atol=1e-3)
    assert torch.isclose(TaggerModule(torch.nn.Identity(), {"optim": {}}, ["a", "b", "c"])._bce(logits, y),
                         F.binary_cross_entropy_with_logits(logits, y))


def ddp_cmd(data, run_dir, *extra) -> list[str]:
    return [sys.executable, "-m", "arbor_train.train", "model=tiny_encoder", "logger=csv", "trainer=ddp",
            "trainer.accelerator=cpu", "trainer.devices=2", "trainer.enable_progress_bar=false",
            "task.compare_baselines=false", f"data.train_dir={data}", f"run_dir={run_dir}", *extra]


def ddp_env(tmp_path) -> dict:
    return dict(os.environ, ARBOR_OUTPUT_ROOT=str(tmp_path / "out"), PYTHONUNBUFFERED="1",
                PYTHONPATH=str(TESTS_DIR))


def batch_log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def assert_ranks_share_one_epoch(ranks: list[list[dict]], single: list[dict]) -> None:
    """Disjoint shares whose union is the one-process epoch: every sequence exactly as often as in that
    epoch, and rank r's k-th batch is the one-process run's (k x world + r)-th batch (all but the last
    step, where the short last global batch is split over the ranks)."""
    from collections import Counter

    world = len(ranks)
    assert len({len(r) for r in ranks}) == 1, "every rank makes the same number of steps"
    counts = [Counter(h for rec in r for h in rec["seqs"]) for r in ranks]
    epoch = Counter(h for rec in single for h in rec["seqs"])
    assert sum(counts, Counter()) == epoch, "the ranks' union is not the one-process epoch"
    once = {h for h, n in epoch.items() if n == 1}
    for a in range(world):
        for b in range(a + 1, world):
            shared = set(counts[a]) & set(counts[b]) & once
            assert not shared, f"ranks {a} and {b} both trained on {len(shared)} sequence(s)"
    for k in range(len(ranks[0]) - 1):
        for r in range(world):
            assert ranks[r][k]["batch"] == single[k * world + r]["batch"], (r, k)


def test_two_process_cpu_ddp_ranks_train_on_disjoint_shares_of_the_epoch(tmp_path, smoke_data):
    """One epoch under 2-process DDP on the CPU against the same epoch in one process (debug=batches logs
    each rank's batches)."""
    single = train(tcfg(tmp_path / "one", smoke_data, "debug=batches", "trainer.max_steps=-1", "trainer.max_epochs=1"))
    one = batch_log(tmp_path / "one" / "batch_hashes" / "rank-0.jsonl")
    assert single["global_step"] == len(one) > 10
    run_dir = tmp_path / "ddp"
    p = subprocess.run(ddp_cmd(smoke_data, run_dir, "debug=batches", "trainer.max_steps=-1", "trainer.max_epochs=1"),
                       cwd=REPO_ROOT, env=ddp_env(tmp_path), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    m = json.loads((run_dir / "final" / "metrics.json").read_text())
    assert m["world_size"] == 2 and m["global_step"] == (len(one) + 1) // 2
    ranks = [batch_log(run_dir / "batch_hashes" / f"rank-{r}.jsonl") for r in range(2)]
    assert_ranks_share_one_epoch(ranks, one)


def test_two_process_cpu_ddp_kill_and_resume_is_exact(tmp_path, smoke_data):
    env = ddp_env(tmp_path)
    common = ["trainer.max_steps=12", "callbacks.model_checkpoint.every_n_train_steps=6", "debug=batches"]
    straight = tmp_path / "straight"
    p = subprocess.run(ddp_cmd(smoke_data, straight, *common), cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    killed = tmp_path / "killed"
    proc = subprocess.Popen(ddp_cmd(smoke_data, killed, *common, "+callbacks.slow._target_=train_helpers.SlowAfter",
                                    "+callbacks.slow.step=6"),
                            cwd=REPO_ROOT, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    kill_after_checkpoint(proc, killed / "checkpoints" / "step-000006.ckpt")
    assert not (killed / "checkpoints" / "step-000012.ckpt").exists()
    p = subprocess.run(ddp_cmd(smoke_data, killed, *common, f"callbacks.batch_hashes.out_dir={tmp_path / 'resumed'}"),
                       cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    m = json.loads((killed / "final" / "metrics.json").read_text())
    assert m["resumed_at_step"] == 6 and m["global_step"] == 12 and m["world_size"] == 2
    for r in range(2):   # every rank continues with exactly the batches of the uninterrupted run
        want = [rec["batch"] for rec in batch_log(straight / "batch_hashes" / f"rank-{r}.jsonl") if rec["step"] >= 6]
        assert [rec["batch"] for rec in batch_log(tmp_path / "resumed" / f"rank-{r}.jsonl")] == want, f"rank {r}"
    a = torch.load(straight / "checkpoints" / "step-000012.ckpt", weights_only=False)["state_dict"]
    b = torch.load(killed / "checkpoints" / "step-000012.ckpt", weights_only=False)["state_dict"]
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-6), f"{k} differs after the 2-process resume"


def ecfg(name, run_dir, data, *extra):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[
            f"experiment={name}", "logger=csv", f"data.train_dir={data}", "data.val_dir=null", f"run_dir={run_dir}",
            *extra])
    c = OmegaConf.to_container(cfg, resolve=True)
    for src in c["data"].get("mix") or []:  # an experiment's extra folders come from its own commands
        src["dir"] = str(data)
    return c


def reader_smoke(smoke_data, out):
    """The reader set of the smoke sessions (python -m data_gen.reader), built once per test."""
    if not out.exists():
        from data_gen.reader import run

        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            run(compose(config_name="reader_data", overrides=[f"data_dir={smoke_data}", f"out_dir={out}",
                                                               "progress=false", "budgets=[256]"]))
    return out


def test_every_experiment_config_composes_and_instantiates(tmp_path, smoke_data):
    from arbor_train import roles

    names = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))
    assert {"reranker_minilm_cpu", "extractor_smollm2_cpu", "tagger_minilm_cpu"} <= set(names)
    for name in names:
        first = (CONF_DIR / "experiment" / f"{name}.yaml").read_text().splitlines()[1]
        assert (first.startswith("# python -m arbor_train.train experiment=") or
                re.match(r"# sbatch .*slurm/train\.sbatch experiment=", first)), f"{name}: first comment is the command"
        assert f"experiment={name}" in first
        data = smoke_data
        if roles.get(ecfg(name, tmp_path / name, smoke_data)["task"]["role"]).supervision == "reader":
            data = reader_smoke(smoke_data, tmp_path / "reader_smoke")  # contexts the runtime assembles
        c = ecfg(name, tmp_path / name, data)
        extra = []
        if not str(c["model"]["ref"] or "").startswith("pkg:"):
            # hub models are not on this machine and SmolLM2 is the slow tier: same wiring, tiny model of the family
            extra.append("model=tiny_decoder" if c["model"]["family"] == "decoder" else "model=tiny_encoder")
        if c["trainer"]["accelerator"] == "gpu":  # the same wiring on the CPU; the GPU refusal is tested below
            extra += ["trainer.accelerator=cpu", "trainer.precision=32"]
            if c["trainer"]["strategy"] not in ("auto", "ddp"):
                extra.append("trainer=cpu")  # FSDP / ZeRO-3 strategies need GPUs
        if c["task"].get("locomo_f1"):  # the smoke reader rows are BranchMemEval's (LoCoMo's reader: test_locomo_cv)
            extra.append("task.locomo_f1=false")
        if extra:
            c = ecfg(name, tmp_path / name, data, *extra)
        check_combination(c)
        built = roles.get(c["task"]["role"]).build(c)
        # LoRA went where the config puts it: the trainable weights are the adapters (+ the head modules)
        params = dict(built.module.model.named_parameters())
        trainable = [n for n, p in params.items() if p.requires_grad]
        heads = c["model"]["head_modules"]
        assert any("lora_" in n for n in trainable), name
        assert all("lora_" in n or any(h in n.split(".") for h in heads) for n in trainable), name
        assert any(f".{t}." in n for n in trainable for t in c["model"]["lora_targets"]), name
        assert built.param_counts == {"total": sum(p.numel() for p in params.values()),
                                      "trainable": sum(params[n].numel() for n in trainable)}, name
        assert built.param_counts["trainable"] < built.param_counts["total"], name


def test_qwen3_moe_lora_config_reaches_every_routed_expert():
    """The Qwen3-30B-A3B experiment's model and LoRA config on a tiny Qwen3-MoE of the same transformers class: the
    fused expert parameters get LoRA (and gradients for every expert that routing picks), the router and
    base weights stay frozen, and merging keeps the outputs."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    from arbor_train.models import add_lora

    c = ecfg("extractor_qwen3_30b_a3b_fsdp", "/tmp/unused", "/tmp/unused")
    mcfg, pcfg = c["model"], c["peft"]
    assert "Qwen3MoeDecoderLayer" in mcfg["wrap_layers"]
    torch.manual_seed(0)
    n_exp = 4
    cfg = Qwen3MoeConfig(vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                         num_experts=n_exp, num_experts_per_tok=n_exp, max_position_embeddings=64)
    base = Qwen3MoeForCausalLM(cfg)
    assert base.model.layers[0].mlp.experts.gate_up_proj.dim() == 3  # fused experts: no per-expert Linear
    ids = torch.randint(0, 64, (2, 12))
    with torch.no_grad():
        base_out = base.eval()(input_ids=ids).logits
    model = add_lora(base, pcfg, mcfg, "CAUSAL_LM")
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert all("lora_" in n for n in trainable)
    for layer in range(2):
        assert any(f"layers.{layer}.mlp.experts" in n for n in trainable), f"layer {layer}: experts have no LoRA"
        assert any(f"layers.{layer}.self_attn.q_proj" in n for n in trainable)
    assert not any("mlp.gate." in n for n in trainable)  # the router stays frozen
    # B starts at zero; give it values so the merged model differs from the base
    with torch.no_grad():
        for n, p in trainable.items():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    model.train()
    model(input_ids=ids, labels=ids).loss.backward()
    for n, p in trainable.items():
        if "experts" in n:
            assert p.grad is not None and p.grad.abs().sum() > 0, n
    model.eval()
    with torch.no_grad():
        lora_out = model(input_ids=ids).logits
        merged = model.merge_and_unload()(input_ids=ids).logits
    assert not torch.allclose(lora_out, base_out, atol=1e-3)
    torch.testing.assert_close(merged, lora_out, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("overrides, msg", [
    (["trainer=fsdp"], "needs GPUs"),
    (["trainer=deepspeed_zero3"], "needs GPUs"),
    (["task=extractor_states"], "needs a decoder"),
    (["model=tiny_decoder", "task=reranker"], "needs an encoder"),
    (["model=tiny_decoder", "task=extractor_spans"], r"needs an encoder model \(task.layout=spans\)"),
    (["model=qwen3_4b", "task=extractor_states", "peft.enabled=false"], "full fine-tuning"),
    (["model=qwen3_30b_a3b", "task=extractor_states", "peft.dropout=0.05"], "set peft.dropout=0"),
])
def test_impossible_combinations_are_refused_before_work(tmp_path, smoke_data, overrides, msg):
    with pytest.raises(ConfigError, match=msg):
        check_combination(tcfg(tmp_path, smoke_data, *overrides))


def test_llm_scorer_reranker_trains_and_exports_to_the_runtime(tmp_path, smoke_data):
    from arbor_train.export import export
    from arbor_train.runtime import load_bundle
    from arbor_train.runtime.rerank import build_reranker
    from arbor_train.runtime.schema import Candidate

    res = train(tcfg(tmp_path / "llm", smoke_data, "model=tiny_decoder", "task=reranker_llm", "trainer.max_steps=4",
                     "task.max_length=160"))
    assert {"acc@1", "mrr"} <= set(res["metrics"])
    bundle = export(res["run_dir"], tmp_path / "b", log_artifact=False)
    assert load_bundle(bundle).kind == "llm_scorer"
    r = build_reranker({"kind": "bundle", "bundle": {"path": str(bundle), "quantize": None}})
    cands = [Candidate(1, "Ann trip", "Ann trip: budget", "Ann's budget is $900", ["Ann"], 0, 1),
             Candidate(2, "Bo agenda", "Bo agenda: venue", "Bo's venue", ["Bo"], 1, 2)]
    s = r.score("What is Ann's budget?", cands)
    # each score is p(yes) / (p(yes) + p(no)) of the exported model's next token after the training-side
    # rerank prompt, computed here one unpadded prompt at a time
    from arbor_train.prompts import rerank_prompt

    model, tok = r.llm.model, r.llm.tokenizer
    yes, no = tok.encode("yes", add_special_tokens=False)[0], tok.encode("no", add_special_tokens=False)[0]
    expect = []
    for c in cands:
        ids = tok(rerank_prompt(tok, "What is Ann's budget?", c.document()), return_tensors="pt",
                  add_special_tokens=False)
        with torch.no_grad():
            logits = model(**ids).logits[0, -1]
        expect.append(torch.softmax(torch.stack([logits[no], logits[yes]]).float(), 0)[1].item())
    assert s == pytest.approx(expect, abs=1e-4)
    role = json.loads((Path(res["run_dir"]) / "final" / "role.json").read_text())
    assert r.new_root_threshold == role["new_root_threshold"] == load_bundle(bundle).manifest["new_root_threshold"]


@pytest.mark.slow
@pytest.mark.parametrize("model, task", [("minilm_l6", "reranker"), ("smollm2_135m", "extractor_states"),
                                         ("minilm_l6", "tagger")])
def test_real_small_models_train_a_few_steps(tmp_path, smoke_data, model, task):
    res = train(tcfg(tmp_path / model, smoke_data, f"model={model}", f"task={task}", "trainer.max_steps=2",
                     "data.max_val_examples=16", "task.gen_examples=2", "task.max_new_tokens=8")
                if task == "extractor_states" else
                tcfg(tmp_path / model, smoke_data, f"model={model}", f"task={task}", "trainer.max_steps=2",
                     "data.max_val_examples=16"))
    assert res["global_step"] == 2 and res["params"]["trainable"] < res["params"]["total"] / 5


def test_fsdp_strategy_wraps_blocks_and_restores_lightnings_loader():
    """FSDP itself needs GPUs (checked on an H200, see the README); here: the strategy's policy and that its
    resume loader swap never leaks out of a load, even a failing one."""
    import lightning.pytorch.strategies.fsdp as lfsdp
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeDecoderLayer

    from arbor_train.wrap import fsdp_strategy, gathered_state_dict, through_root

    mcfg = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "model" / "qwen3_30b_a3b.yaml"))
    strategy = fsdp_strategy(mcfg["wrap_layers"], activation_checkpointing=mcfg["gradient_checkpointing"])
    assert isinstance(strategy, lfsdp.FSDPStrategy)
    assert Qwen3MoeDecoderLayer in strategy.kwargs["auto_wrap_policy"]._module_classes
    before = lfsdp._lazy_load
    with pytest.raises(Exception):
        strategy.load_checkpoint("/nonexistent/step-000001.ckpt")
    assert lfsdp._lazy_load is before
    assert gathered_state_dict(None) is None

    class M:
        _trainer = None

        def twice(self, x):
            return 2 * x

    assert through_root(M(), "twice", 4) == 8


def test_locomo_f1_refuses_reader_rows_that_are_not_locomos(tmp_path, smoke_data):
    """experiment=reader_smollm2_locomo_cpu scores validation answers with LoCoMo F1 by category: BranchMemEval
    reader rows (question types, not categories) are refused naming the option, before any model loads."""
    from arbor_train import roles

    data = reader_smoke(smoke_data, tmp_path / "reader_smoke")
    c = ecfg("reader_smollm2_locomo_cpu", tmp_path / "r", data, "model=tiny_decoder")
    with pytest.raises(ConfigError, match=r"option task.locomo_f1=true needs LoCoMo reader rows .* has \["):
        roles.get("reader").build(c)
