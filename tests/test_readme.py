"""The README's set-up commands are the ones CI runs, and every config it names exists."""

import re

from arbor_train.paths import CONF_DIR, REPO_ROOT


def readme_commands():
    text = (REPO_ROOT / "README.md").read_text()
    setup = text.split("## Set up on a fresh machine", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)\n```", setup, re.S)


def test_readme_has_exactly_two_setup_commands_and_ci_runs_the_test_one():
    cmds = readme_commands()
    assert len(cmds) == 2 and all("\n" not in c for c in cmds)
    ci = (REPO_ROOT / ".ci" / "run").read_text()
    assert cmds[1] in ci.splitlines(), ".ci/run must run the README test command verbatim"
    assert "pip install -q torch==2.13.0" in cmds[0] and "pip install -q torch==2.13.0" in cmds[1]


def test_files_named_by_the_readme_exist():
    text = (REPO_ROOT / "README.md").read_text()
    # every config group option a README command selects is a file in conf/
    groups = "experiment|trainer|optim|scheduler|debug|logger|task|model|preset|ablation|answer_model"
    chosen = set(re.findall(rf"(?<![.\w-])({groups})=([a-z0-9_]+)\b", text))
    assert ("experiment", "extractor_smollm2_cpu") in chosen and ("debug", "fast_dev_run") in chosen
    missing = [f"{g}={o}" for g, o in sorted(chosen) if not (CONF_DIR / g / f"{o}.yaml").exists()]
    assert not missing, f"the README selects config options that do not exist: {missing}"
    from PIL import Image

    from arbor_train.runtime import default_config

    # each runtime profile the README names composes, with the reranker / embedder it says it has
    described = {"default": ("heuristic", "hashing"), "minilm": ("cross_encoder_untuned", "sentence"),
                 "prompted_smollm2": ("prompted", "sentence"), "tuned": ("bundle", "sentence")}
    profiles = set(re.findall(r"`(default|minilm|prompted_smollm2|tuned)`", text))
    assert profiles == set(described)
    for profile in profiles:
        assert (CONF_DIR / "runtime" / f"{profile}.yaml").exists(), profile
        c = default_config(profile)
        assert (c["reranker"]["kind"], c["embedder"]["kind"]) == described[profile], profile
    # each picture it embeds is a PNG that decodes
    imgs = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert imgs
    for img in imgs:
        assert (REPO_ROOT / img).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", img
        with Image.open(REPO_ROOT / img) as im:
            im.load()
            assert im.width > 100 and im.height > 100, img
