"""Repository locations (the toolkit is installed editable: `pip install -e .`), and the run id resolver.

Every entry point imports this module before Hydra composes, so `${arbor.run_id:}` is always registered.
"""

import os
import time
from pathlib import Path

from omegaconf import OmegaConf

REPO_ROOT = Path(__file__).resolve().parent.parent
CONF_DIR = REPO_ROOT / "conf"


def run_id() -> str:
    """`slurm-<job id>` (array tasks: `slurm-<array job>_<task>`) inside a SLURM job, else a timestamp.

    A requeued job keeps its id, so it lands in the same run directory and finds its checkpoints there.
    """
    env = os.environ
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        return f"slurm-{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    if env.get("SLURM_JOB_ID"):
        return f"slurm-{env['SLURM_JOB_ID']}"
    return time.strftime("%Y-%m-%d_%H-%M-%S")


OmegaConf.register_new_resolver("arbor.run_id", run_id, replace=True, use_cache=True)
OmegaConf.register_new_resolver("arbor.repo_root", lambda: str(REPO_ROOT), replace=True)
