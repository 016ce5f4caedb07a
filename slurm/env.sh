# Sourced by every slurm/*.sbatch script on the compute node, from the submit directory (the repo root).
# SITE: everything in this file is site-specific. sbatch exports the submitting shell's environment by
# default, so a virtual environment active at submit time is active here too; otherwise activate it below.

# module load cuda/12.4                       # SITE: your cluster's modules
if [[ -n "${ARBOR_VENV:-}" ]]; then            # SITE: or point ARBOR_VENV at the environment to use
  source "${ARBOR_VENV}/bin/activate"
fi
export ARBOR_REPO_ROOT="${ARBOR_REPO_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
export WANDB_MODE="${WANDB_MODE:-offline}"     # W&B offline unless the job was submitted with WANDB_MODE=online
export PYTHONUNBUFFERED=1                       # logs appear in slurm/logs/ as they happen
export OMP_NUM_THREADS="${SLURM_CPUS_PER_TASK:-1}"
echo "[arbor] job ${SLURM_JOB_ID} (restart ${SLURM_RESTART_COUNT:-0}) on $(hostname): $(command -v python)"
