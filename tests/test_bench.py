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
        assert side["tokens_per_s"] == pytest.approx(side["timed_tokens"] / side["timed_seconds"], rel=0.01)
    assert ours["padding_fraction"] == 0.0  # packs laid end to end in one row
    assert 0.0 < hf["padding_fraction"] < 1.0  # examples of different lengths, padded per batch
    assert res["speedup_tokens_per_s"] == pytest.approx(ours["tokens_per_s"] / hf["tokens_per_s"], rel=0.01)


def test_train_bench_options_are_checked(smoke_data):
    with pytest.raises(ValueError, match="bench_train.steps=1 must exceed bench_train.warmup_steps=1"):
        run(bcfg(smoke_data, "bench_train.steps=1"))
    with pytest.raises(ValueError, match="target must be one of"):
        run(bcfg(smoke_data, "target=gpu"))
