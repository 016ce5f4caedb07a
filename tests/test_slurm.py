"""The slurm/ scripts and the submitit launcher, submitted to a real SLURM cluster on this machine
(slurmctld + slurmd + munged on loopback, started by the `slurm_cluster` fixture in conftest.py)."""

import filecmp
import json
import re
import shlex
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

from arbor_train.paths import REPO_ROOT

pytestmark = pytest.mark.slurm

# The test node has no GPUs and 2 CPUs; these command-line options override the scripts' #SBATCH lines,
# exactly as a user's -p/-A/--gpus-per-node overrides would.
LOCAL = ["--gpus-per-node=0", "--cpus-per-task=1", "--time=00:15:00"]


@pytest.fixture(scope="module")
def env(slurm_cluster, tmp_path_factory):
    """What a user's shell holds when they submit: the cluster, this venv on PATH, an output root."""
    out = tmp_path_factory.mktemp("outputs")
    e = dict(slurm_cluster.env, ARBOR_OUTPUT_ROOT=str(out), WANDB_MODE="offline", HF_HUB_OFFLINE="1",
             PATH=f"{Path(sys.executable).parent}:{slurm_cluster.env['PATH']}")
    e.pop("SLURM_JOB_ID", None)
    return e


def sbatch(env, *args) -> int:
    res = subprocess.run(["sbatch", "--parsable", *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return int(res.stdout.strip().split(";")[0])


def log_of(env, job: int, name: str) -> str:
    p = Path(env["ARBOR_OUTPUT_ROOT"]) / f"{name}-{job}.out"
    return p.read_text(errors="replace") if p.exists() else "(no log)"


def finished(cluster, env, job: int, name: str, timeout: float = 600) -> None:
    state = cluster.wait(job, timeout=timeout)
    assert state == "COMPLETED", f"job {job} ended {state}:\n{log_of(env, job, name)[-4000:]}"


def train_args(env, data, *extra) -> list[str]:
    return [*LOCAL, f"--output={env['ARBOR_OUTPUT_ROOT']}/train-%j.out", "slurm/train.sbatch",
            "model=tiny_encoder", f"data.train_dir={data}", "task.compare_baselines=false",
            "trainer.enable_progress_bar=false", *extra]


def test_training_job_writes_checkpoints_metrics_and_an_offline_wandb_run(slurm_cluster, env, smoke_data):
    job = sbatch(env, *train_args(env, smoke_data, "trainer.max_steps=12", "callbacks.model_checkpoint.every_n_train_steps=6"))
    finished(slurm_cluster, env, job, "train")
    run = Path(env["ARBOR_OUTPUT_ROOT"]) / "runs" / "train" / f"slurm-{job}"   # the run dir carries the job id
    assert sorted(p.name for p in (run / "checkpoints").glob("step-*.ckpt")) == ["step-000006.ckpt", "step-000012.ckpt"]
    m = json.loads((run / "final" / "metrics.json").read_text())
    assert m["global_step"] == 12 and m["world_size"] == 1 and m["slurm"]["job_id"] == str(job)
    assert {"acc@1", "mrr"} <= set(m["metrics"]) and m["resumed_from"] is None
    assert list((run / "wandb").glob("offline-run-*/run-*.wandb")), "an offline W&B run in the run dir"
    assert (run / "final" / "adapter" / "adapter_config.json").exists()


def test_two_task_ddp_job_gets_its_ranks_from_srun_and_shards_the_data(slurm_cluster, env, smoke_data, tmp_path):
    """srun's two tasks are the two DDP ranks, and they train on disjoint shares of one epoch whose union is
    the same epoch in one process (debug=batches logs every rank's batches)."""
    from test_train import assert_ranks_share_one_epoch, batch_log, tcfg

    from arbor_train.train import train

    train(tcfg(tmp_path / "one", smoke_data, "debug=batches", "trainer.max_steps=-1", "trainer.max_epochs=1"))
    one = batch_log(tmp_path / "one" / "batch_hashes" / "rank-0.jsonl")
    job = sbatch(env, "--ntasks-per-node=2", *train_args(env, smoke_data, "trainer=ddp", "trainer.accelerator=cpu",
                                                          "debug=batches", "trainer.max_steps=-1",
                                                          "trainer.max_epochs=1"))
    finished(slurm_cluster, env, job, "train")
    run = Path(env["ARBOR_OUTPUT_ROOT"]) / "runs" / "train" / f"slurm-{job}"
    m = json.loads((run / "final" / "metrics.json").read_text())
    assert m["world_size"] == 2 and m["global_step"] == (len(one) + 1) // 2
    assert_ranks_share_one_epoch([batch_log(run / "batch_hashes" / f"rank-{r}.jsonl") for r in range(2)], one)


def test_generation_array_and_dependent_merge_equal_a_single_process_run(slurm_cluster, env, tmp_path):
    out = tmp_path / "gen" / "smoke"
    res = subprocess.run(["bash", "slurm/generate.sh", str(out), "2", "preset=smoke", "seed=3", "--", *LOCAL,
                          f"--output={env['ARBOR_OUTPUT_ROOT']}/gen-%j.out"],
                         cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    array, merge = map(int, re.search(r"array (\d+) \(2 tasks\) -> merge (\d+)", res.stdout).groups())
    finished(slurm_cluster, env, merge, "gen", timeout=600)
    for task in (0, 1):
        assert slurm_cluster.state(f"{array}_{task}") == "COMPLETED"
    assert sorted(p.name for p in (tmp_path / "gen" / "smoke.shards").iterdir()) == [
        "shard-00000-of-00002", "shard-00001-of-00002"]
    single = tmp_path / "single"
    subprocess.run([sys.executable, "-m", "data_gen.branchmem", "preset=smoke", "seed=3", f"out_dir={single}",
                    "workers=1", "progress=false"], cwd=REPO_ROOT, env=env, check=True, capture_output=True)
    files = sorted(str(p.relative_to(single)) for p in (single / "jsonl").glob("*.jsonl"))
    assert files and filecmp.cmpfiles(single, out, files, shallow=False)[0] == files
    s1, s2 = (json.loads((d / "stats.json").read_text()) for d in (single, out))
    assert s1["counts"] == s2["counts"] and s1["sessions"] == s2["sessions"]


def test_evaluation_job(slurm_cluster, env, smoke_data):
    job = sbatch(env, *LOCAL, f"--output={env['ARBOR_OUTPUT_ROOT']}/eval-%j.out", "slurm/eval.sbatch",
                 f"data_dir={smoke_data}", "method=bm25", "budget=1024")
    finished(slurm_cluster, env, job, "eval")
    res = json.loads((Path(env["ARBOR_OUTPUT_ROOT"]) / "runs" / "eval" / f"slurm-{job}" / "results.json").read_text())
    assert res["results"]["method"] == "bm25" and res["results"]["budget"] == 1024 and res["results"]["questions"] > 0


def test_submitit_launcher_runs_a_two_point_multirun_as_slurm_jobs(slurm_cluster, env, smoke_data, tmp_path):
    sweep = tmp_path / "sweep"
    res = subprocess.run([sys.executable, "-m", "eval.run", "-m", "hydra/launcher=slurm", "hydra.launcher.cpus_per_task=1",
                          "hydra.launcher.timeout_min=15", f"hydra.sweep.dir={sweep}", f"data_dir={smoke_data}",
                          "method=arbormem", "budget=512,1024", "wandb.enabled=false"],
                         cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    budgets = {}
    for f in sweep.glob("*/results.json"):
        budgets[json.loads(f.read_text())["results"]["budget"]] = f.parent.name
    assert budgets == {512: "0", 1024: "1"}
    tasks = sorted(p.name for p in (sweep / ".submitit").iterdir() if "_" in p.name and not p.name.startswith("."))
    assert len(tasks) == 2 and {t.split("_")[1] for t in tasks} == {"0", "1"}, "one SLURM array task per point"
    for t in tasks:
        assert list((sweep / ".submitit" / t).glob("*_result.pkl")), f"task {t} returned its result through submitit"


def _wait_for(cond, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


@pytest.mark.parametrize("how", ["scontrol_requeue", "usr1_before_time_limit"])
def test_preempted_training_job_is_requeued_and_resumes_from_its_checkpoint(slurm_cluster, env, smoke_data, how):
    """scontrol requeue: the job is killed and requeued, and resumes from its last periodic checkpoint.
    USR1 (what --signal=SIGUSR1@120 sends before the time limit): Lightning writes hpc_ckpt_*.ckpt and
    requeues the job itself; the requeued job resumes from that checkpoint."""
    steps = 3000
    job = sbatch(env, *train_args(env, smoke_data, f"trainer.max_steps={steps}", "callbacks.model_checkpoint.every_n_train_steps=100",
                                  "logger=csv"))
    run = Path(env["ARBOR_OUTPUT_ROOT"]) / "runs" / "train" / f"slurm-{job}"
    _wait_for(lambda: list((run / "checkpoints").glob("step-*.ckpt")), 300, "the first periodic checkpoint")
    time.sleep(1.0)
    if how == "scontrol_requeue":
        slurm_cluster.requeue(job)
    else:
        subprocess.run(["scancel", "--signal=USR1", str(job)], env=env, check=True)
        _wait_for(lambda: list(run.glob("hpc_ckpt_*.ckpt")), 120, "Lightning's hpc checkpoint")
    finished(slurm_cluster, env, job, "train", timeout=900)
    m = json.loads((run / "final" / "metrics.json").read_text())
    assert m["slurm"]["restart_count"] == "1" and m["global_step"] == steps
    assert m["resumed_at_step"] > 0, "resumed from a checkpoint, not from step 0"
    if how == "usr1_before_time_limit":
        assert Path(m["resumed_from"]).name.startswith("hpc_ckpt_")
    else:
        assert Path(m["resumed_from"]).parent.name == "checkpoints"
    saved = torch.load(m["resumed_from"], map_location="cpu", weights_only=False)
    assert saved["global_step"] == m["resumed_at_step"]


def test_one_override_sends_a_pipeline_training_stage_to_slurm(slurm_cluster, env, tmp_path):
    from test_pipeline import TINY

    out = tmp_path / "pipe"
    launcher = (f"sbatch --wait --gpus-per-node=0 --cpus-per-task=1 --time=00:15:00 "
                f"--output={env['ARBOR_OUTPUT_ROOT']}/pipe-%j.out slurm/train.sbatch")
    res = subprocess.run([sys.executable, "-m", "eval.pipeline", f"out={out}", *TINY,
                          f"train.extractor.launcher='{launcher}'"],
                         cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    stage = json.loads((out / "train_extractor" / "stage.json").read_text())
    assert stage["argv"][:2] == ["sbatch", "--wait"] and stage["returncode"] == 0
    m = json.loads((out / "train_extractor" / "run" / "final" / "metrics.json").read_text())
    assert m["slurm"]["job_id"] and m["global_step"] == 2
    assert (out / "bundles" / "extractor" / "manifest.json").exists() and (out / "report" / "report.md").exists()


# ---------------------------------------------------------------------- the tutorial's commands at smoke size
TUTORIAL = REPO_ROOT / "docs" / "tutorials" / "slurm.md"
SITE_OPTIONS = ("--partition", "--account", "--nodes", "--gpus-per-node", "--cpus-per-task", "--mem", "--time")
# a GPU experiment on this GPU-less node: the same experiment, a tiny model on the CPU, two steps of smoke data
CPU_STANDIN = ["model=tiny_decoder", "trainer.accelerator=cpu", "trainer.precision=32-true", "trainer.max_steps=2",
               "task.gen_examples=0", "trainer.enable_progress_bar=false"]


def tutorial_commands() -> list[list[str]]:
    text = TUTORIAL.read_text()
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            argv = shlex.split(line, comments=True)
            if argv:
                out.append(argv)
    return out


def local_site(opts: list[str]) -> tuple[list[str], int]:
    """The tutorial's sbatch options with the site's (partition, account, nodes, GPUs, CPUs, memory, time)
    replaced by this one-node cluster's; tasks per node capped at 2 (the node's CPUs). Returns (options, tasks)."""
    out, tasks, i = [], 1, 0
    while i < len(opts):
        o = opts[i]
        if o in ("-p", "-A"):
            i += 2
            continue
        name, _, value = o.partition("=")
        if name == "--ntasks-per-node":
            tasks = min(int(value), 2)
        elif name not in SITE_OPTIONS:
            out.append(o)
        i += 1
    return [*LOCAL, "--nodes=1", f"--ntasks-per-node={tasks}", *out], tasks


def test_every_command_of_the_slurm_tutorial_runs_on_the_local_cluster(slurm_cluster, env, smoke_data, tmp_path):
    """Each command of docs/tutorials/slurm.md, submitted to the loopback cluster as written, except: the
    site options become this node's (one node, at most 2 tasks, no GPUs), data is the smoke set, and a GPU
    experiment runs its own config on a tiny CPU model (DDP over the same tasks where it asks for FSDP, which
    needs an accelerator). Every job must complete."""
    from hydra import compose, initialize_config_dir

    from arbor_train.paths import CONF_DIR

    cmds = tutorial_commands()
    kinds = Counter()
    for k, argv in enumerate(cmds):
        if argv[0] == "sbatch":
            at = next(i for i, a in enumerate(argv) if a.endswith(".sbatch"))
            script, overrides = argv[at], argv[at + 1:]
            opts, tasks = local_site(argv[1:at])
            log = f"--output={env['ARBOR_OUTPUT_ROOT']}/tut{k}-%j.out"
            if script == "slurm/train.sbatch":
                with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
                    c = compose(config_name="train", overrides=overrides)
                extra = [*CPU_STANDIN, f"data.train_dir={smoke_data}", "data.val_dir=null"]
                if "fsdp" in str(c.trainer.strategy) and not any(o.startswith("trainer=") for o in overrides):
                    extra.append("trainer=ddp")
                overrides = [o for o in overrides if not o.startswith("model.ref=")] + extra
            elif script == "slurm/eval.sbatch":
                overrides = [*overrides, f"data_dir={smoke_data}", "max_sessions=1", "wandb.enabled=false"]
            job = sbatch(env, *opts, log, script, *overrides)
            finished(slurm_cluster, env, job, f"tut{k}")
            kinds[script] += 1
            if script == "slurm/train.sbatch":
                run = Path(env["ARBOR_OUTPUT_ROOT"]) / "runs" / "train" / f"slurm-{job}" / "final" / "metrics.json"
                assert json.loads(run.read_text())["world_size"] == tasks, argv
        elif argv[:2] == ["bash", "slurm/generate.sh"]:
            sep = argv.index("--")
            opts, _ = local_site(argv[sep + 1:])
            over = ["preset=smoke" if a.startswith("preset=") else a for a in argv[4:sep]]
            out = tmp_path / f"gen{k}"
            res = subprocess.run(["bash", "slurm/generate.sh", str(out), "2", *over, "--", *opts,
                                  f"--output={env['ARBOR_OUTPUT_ROOT']}/tut{k}-%j.out"],
                                 cwd=REPO_ROOT, env=env, capture_output=True, text=True)
            assert res.returncode == 0, res.stderr
            merge = int(re.search(r"-> merge (\d+)", res.stdout).group(1))
            finished(slurm_cluster, env, merge, f"tut{k}")
            assert (out / "stats.json").exists()
            kinds["generate.sh"] += 1
        elif argv[:4] == ["python", "-m", "eval.run", "-m"]:
            over = ["hydra.launcher.partition=debug" if a.startswith("hydra.launcher.partition=") else a
                    for a in argv[4:]]
            sweep = tmp_path / f"sweep{k}"
            res = subprocess.run([sys.executable, "-m", "eval.run", "-m", *over, "hydra.launcher.cpus_per_task=1",
                                  "hydra.launcher.timeout_min=15", f"hydra.sweep.dir={sweep}", f"data_dir={smoke_data}",
                                  "max_sessions=1", "wandb.enabled=false"],
                                 cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=1200)
            assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
            points = 1
            for a in argv[4:]:
                if "=" in a and "," in a.split("=", 1)[1] and not a.startswith("hydra"):
                    points *= len(a.split("=", 1)[1].split(","))
            assert len(list(sweep.glob("*/results.json"))) == points
            kinds["eval.run -m"] += 1
        else:
            raise AssertionError(f"docs/tutorials/slurm.md: a command this test does not know how to run: {argv}")
    assert kinds["slurm/train.sbatch"] >= 3 and kinds["slurm/eval.sbatch"] and kinds["generate.sh"] \
        and kinds["eval.run -m"], kinds
