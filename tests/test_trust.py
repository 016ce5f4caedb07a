"""Untrusted artifacts (issue #39): a checkpoint cannot run code when it is read, a bundle names only its own
files, and export replaces only a bundle, through a temp folder of its own."""

import json
import os
from pathlib import Path

import pytest
import torch
import yaml
from test_runtime_models import manifest

from arbor_train.errors import ConfigError, OutputExistsError
from arbor_train.export import export
from arbor_train.runtime import BundleError, load_bundle, write_manifest
from arbor_train.train import resume_path

MARKER = Path(os.environ.get("TMPDIR", "/tmp")) / "arbor_trust_marker"


class Payload:
    """What a hostile checkpoint carries: unpickling it (weights_only=False) would create MARKER."""

    def __reduce__(self):
        return (os.system, (f"touch {MARKER}",))


def test_a_checkpoint_that_holds_code_is_refused_not_run(tmp_path):
    """Before: resume=<file> unpickled with weights_only=False, so the file ran `touch`."""
    MARKER.unlink(missing_ok=True)
    bad = tmp_path / "evil.ckpt"
    torch.save({"global_step": 3, "state_dict": {}, "x": Payload()}, bad)
    with pytest.raises(ConfigError, match=r"resume=.*evil.ckpt: not a checkpoint this toolkit reads .*refused, not run"):
        resume_path({"resume": str(bad)}, tmp_path)
    assert not MARKER.exists()
    # the newest checkpoint of a run folder (resume=auto) is read the same way
    (tmp_path / "checkpoints").mkdir()
    torch.save({"global_step": 3, "x": Payload()}, tmp_path / "checkpoints" / "step-000003.ckpt")
    with pytest.raises(ConfigError, match="resume=auto"):
        resume_path({"resume": "auto"}, tmp_path)
    assert not MARKER.exists()
    # garbage is refused the same way, naming the file
    (tmp_path / "junk.ckpt").write_bytes(b"\x00not a checkpoint")
    with pytest.raises(ConfigError, match="junk.ckpt: not a checkpoint"):
        resume_path({"resume": str(tmp_path / "junk.ckpt")}, tmp_path)
    # a plain checkpoint still resumes
    torch.save({"global_step": 7, "state_dict": {"w": torch.zeros(2)}}, tmp_path / "ok.ckpt")
    assert resume_path({"resume": str(tmp_path / "ok.ckpt")}, tmp_path) == (str(tmp_path / "ok.ckpt"), 7)


@pytest.mark.parametrize("field, value", [
    ("tokenizer", "../outside"), ("adapter", "/etc"), ("merged", "../../x"), ("tokenizer", ""), ("adapter", "link"),
])
def test_a_manifest_naming_files_outside_its_bundle_is_refused(tmp_path, field, value):
    bundle = tmp_path / "b"
    bundle.mkdir()
    (tmp_path / "outside").mkdir()
    (bundle / "link").symlink_to(tmp_path / "outside")  # a link inside that leads outside
    good = manifest("reranker", "cross_encoder", "x", {"name": "cross_encoder_pair", "version": "1"})
    write_manifest(bundle, good)
    assert load_bundle(bundle).kind == "cross_encoder"
    data = {"format": "arbormem-bundle", "format_version": 1, **good, field: value}
    (bundle / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(BundleError, match=f"field '{field}' is .*not a folder inside the bundle"):
        load_bundle(bundle)


def fake_run(tmp_path: Path) -> Path:
    """A finished training run's final/ folder, as export reads it (no model is loaded: merged=false)."""
    final = tmp_path / "run" / "final"
    for d in ("adapter", "tokenizer"):
        (final / d).mkdir(parents=True)
        (final / d / "weights.bin").write_bytes(b"w")
    (final / "role.json").write_text(json.dumps({"role": "reranker"}))
    (final / "metrics.json").write_text(json.dumps({"data_fingerprint": "sha256:t", "metrics": {}}))
    (final / "config.yaml").write_text(yaml.safe_dump({"model": {"family": "encoder", "ref": "x", "name": "n"},
                                                       "seed": 0, "task": {"max_length": 8}}))
    return final.parent


def test_export_replaces_only_a_bundle_and_never_a_users_folder(tmp_path):
    """Before: overwrite=true deleted whatever folder `out` named, and `<out>.tmp` was deleted unconditionally."""
    run = fake_run(tmp_path)
    mine = tmp_path / "notes"
    mine.mkdir()
    (mine / "thesis.txt").write_text("years of work")
    with pytest.raises(OutputExistsError, match="is not a bundle .* left as it is"):
        export(run, mine, merged=False, overwrite=True, log_artifact=False)
    assert (mine / "thesis.txt").read_text() == "years of work"
    tmp = tmp_path / "bundle.tmp"
    tmp.mkdir()
    (tmp / "keep.txt").write_text("mine")
    out = export(run, tmp_path / "bundle", merged=False, log_artifact=False)
    assert load_bundle(out).role == "reranker" and (tmp / "keep.txt").read_text() == "mine"
    first = json.loads((out / "manifest.json").read_text())["created_at"]
    again = export(run, out, merged=False, overwrite=True, log_artifact=False)  # a bundle is replaced
    assert load_bundle(again).role == "reranker" and first
    assert sorted(p.name for p in tmp_path.iterdir()) == \
        sorted(["bundle", "bundle.tmp", "notes", "run"])  # no temp folder of ours left behind


def test_the_answer_cache_key_names_the_endpoint_and_the_weights(tmp_path):
    """Before: the key held the model's name only, so one endpoint's answers were served for another's, and old
    answers after a local model's weights changed."""
    import time

    from eval.answers import Answers

    from arbor_train.runtime.llm import OpenAIEndpoint, weights_id

    msgs = [{"role": "user", "content": "Where is Maria going?"}]
    a = Answers(OpenAIEndpoint("http://127.0.0.1:8001/v1", "qwen"), 16)
    b = Answers(OpenAIEndpoint("http://127.0.0.1:8002/v1", "qwen"), 16)
    assert a._key(msgs) != b._key(msgs)
    assert a._key(msgs) == Answers(OpenAIEndpoint("http://127.0.0.1:8001/v1/", "qwen"), 16)._key(msgs)
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"weights v1")
    (model / "notes.txt").write_text("not a weight file")
    before = weights_id(model)
    assert before == weights_id(model)
    (model / "notes.txt").write_text("edited")
    assert weights_id(model) == before  # only weight and config files count
    time.sleep(0.01)
    (model / "model.safetensors").write_bytes(b"weights v2")
    assert weights_id(model) != before
    assert weights_id("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
