import copy
import os

import pytest

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Two interleaved trajectories with a parallel agenda (both people have a budget), an update, an
# artifact and events: the smallest conversation that exercises every layer of the runtime.
TURNS = [
    ("I'm planning Alice's trip to Lisbon in May. Alice's budget is $1200.", "Noted the Lisbon trip budget."),
    ("Separately, Bob is organizing the Porto conference agenda. Bob's budget is $5000.", "Noted Bob's budget."),
    ("Also, Bob's venue is Hotel Infante.", "Got it."),
    ("Back to the Lisbon trip: Alice's itinerary: Belem Tower, then Alfama, then LX Factory.", "Nice."),
    ("I ran 5 km this morning.", "Well done!"),
    ("Change Alice's budget to $1500.", "Updated."),
    ("I ran 8 km today.", "Great."),
    ("Bob's date is June 3.", "Noted."),
]


@pytest.fixture(scope="session")
def _runtime_cfg():
    from arbor_train.runtime import default_config

    return default_config()


@pytest.fixture
def runtime_cfg(_runtime_cfg):
    return copy.deepcopy(_runtime_cfg)


@pytest.fixture
def turns():
    return list(TURNS)


def pytest_collection_modifyitems(config, items):
    """`slow` tests (real pretrained models, long runs) run when ARBOR_SLOW=1 (as .ci/run sets) or -m slow."""
    if os.environ.get("ARBOR_SLOW") == "1" or "slow" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="slow tier: set ARBOR_SLOW=1 (as .ci/run does) to run it")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """A real single-node SLURM cluster on loopback (tests/slurm_cluster.py), up for the whole session.

    Skipped where slurm-wlm/munge are not installed, except with ARBOR_SLURM=1 (.ci/run installs them and
    sets it), where a missing cluster is a failure."""
    from slurm_cluster import LocalSlurm, available

    why = available()
    if why:
        if os.environ.get("ARBOR_SLURM") == "1":
            pytest.fail(f"ARBOR_SLURM=1 but {why}")
        pytest.skip(f"{why} (apt-get install slurm-wlm munge; .ci/run does)")
    cluster = LocalSlurm(tmp_path_factory.mktemp("slurm"))
    cluster.start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def smoke_data(tmp_path_factory):
    """The BranchMemEval smoke preset, generated once per test session (tests only read it)."""
    from hydra import compose, initialize_config_dir

    from arbor_train.paths import CONF_DIR
    from data_gen.branchmem.__main__ import run

    out = tmp_path_factory.mktemp("data") / "smoke"
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        run(compose(config_name="data_gen", overrides=["preset=smoke", f"out_dir={out}", "progress=false", "workers=1"]))
    return out


@pytest.fixture
def locomo_two(tmp_path):
    """Two LoCoMo conversations (26 and 30) copied into tmp_path/in, and their supervision (data_gen.locomo over
    the heuristic runtime, cross_session read policy) in tmp_path/sup: the 2-fold cross-validation smoke input."""
    import shutil
    from pathlib import Path

    from hydra import compose, initialize_config_dir

    from arbor_train.paths import CONF_DIR, REPO_ROOT
    from data_gen.locomo import run

    src = Path(REPO_ROOT).parent / "shared" / "data" / "locomo"
    if not src.exists():
        pytest.skip("../shared/data/locomo is not beside the repository")
    (tmp_path / "in").mkdir()
    for cid in ("26", "30"):
        shutil.copy(src / f"{cid}.json", tmp_path / "in" / f"{cid}.json")
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        run(compose(config_name="locomo", overrides=[
            f"input={tmp_path / 'in'}", f"out_dir={tmp_path / 'sup'}", "progress=false", "runtime/components=minilm",
            "runtime.reranker.kind=heuristic", "runtime/read_policy=cross_session"]))
    return tmp_path / "in", tmp_path / "sup"


@pytest.fixture
def branchmem_needs_here(tmp_path, monkeypatch, smoke_data):
    """Work in tmp_path, with the BranchMemEval sets a table config needs linked to the smoke set, so that a
    table's check of its inputs reads no repository output: call it with the loaded table (eval.tables.load)."""
    from pathlib import Path

    def link(table: dict) -> None:
        monkeypatch.chdir(tmp_path)
        for n in table["needs"]:
            if "branchmem" in n["path"]:
                Path(n["path"]).parent.mkdir(parents=True, exist_ok=True)
                Path(n["path"]).symlink_to(smoke_data)

    return link
