"""`python -m eval.bench target=train` on a tiny decoder: both sides run, the numbers are measured."""

import pytest
from hydra import compose, initialize_config_dir

from arbor_train.paths import CONF_DIR
from eval.bench import run


def bcfg(data, *overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="bench", overrides=[
            "target=train", "bench_train.model=tiny_decoder", f"bench_train.data_dir={data}", "bench_train.examples=40",
            "bench_train.steps=3", "bench_train.warmup_steps=1", "bench_train.max_length=256",
            "bench_train.pack_length=512", "bench_train.hf_batch_size=2", *overrides])


def test_train_bench_times_both_steps(smoke_data):
    res = run(bcfg(smoke_data))
    ours, hf = res["ours"], res["hf_trainer_peft"]
    assert ours["attention"] == "arbor_packed_sdpa" and hf["attention"] == "sdpa"
    for side in (ours, hf):
        assert side["timed_steps"] == 2 and side["timed_tokens"] > 0 and side["timed_seconds"] > 0
        assert side["tokens_per_s"] == pytest.approx(side["timed_tokens"] / side["timed_seconds"], rel=0.05)  # rounding
    assert ours["padding_fraction"] == 0.0  # packs laid end to end in one row
    assert 0.0 < hf["padding_fraction"] < 1.0  # examples of different lengths, padded per batch
    assert res["speedup_tokens_per_s"] == pytest.approx(ours["tokens_per_s"] / hf["tokens_per_s"], rel=0.01)


def test_train_bench_options_are_checked(smoke_data):
    with pytest.raises(ValueError, match="bench_train.steps=1 must exceed bench_train.warmup_steps=1"):
        run(bcfg(smoke_data, "bench_train.steps=1"))
    with pytest.raises(ValueError, match="target must be one of"):
        run(bcfg(smoke_data, "target=gpu"))


@pytest.mark.slow
def test_gpu_check_script_runs_its_correctness_checks_on_the_cpu(smoke_data, tmp_path):
    """`python -m eval.gpu_check` (run on a lent H200 for the README): its checks A and C also run on the CPU."""
    import json
    import os
    import subprocess
    import sys

    from arbor_train.paths import REPO_ROOT

    ex = tmp_path / "examples.json"
    subprocess.run([sys.executable, "-m", "eval.gpu_check", "prepare", str(smoke_data), str(ex)], cwd=REPO_ROOT,
                   check=True)
    assert len(json.loads(ex.read_text())) > 12
    subprocess.run([sys.executable, "-m", "eval.gpu_check", "run", str(ex), str(tmp_path / "out")], cwd=REPO_ROOT,
                   check=True, env={**os.environ, "DEV": "cpu", "SKIP_B": "1"})
    res = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    fp32 = res["A_packed_vs_padded_float32"]
    assert fp32["max_abs_diff_segments"] < 1e-3 and fp32["grad_rel_diff"] < 1e-4
    assert fp32["kernel"] == "per-example sdpa loop"
    moe = res["C_moe_lora"]
    assert moe["expert_lora_B"] > 0 and moe["expert_lora_B_with_grad"] == moe["expert_lora_B"]
