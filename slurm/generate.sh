#!/bin/bash
# Submit a BranchMemEval-style generation as a SLURM job array plus a dependent merge job.
#   bash slurm/generate.sh <out_dir> <shards> [hydra overrides, e.g. preset=train seed=0] [-- sbatch options]
# Prints the two job ids. Shards go to <out_dir>.shards/, the merged set to <out_dir>.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $# -lt 2 ]]; then
  echo "usage: bash slurm/generate.sh <out_dir> <shards> [overrides] [-- sbatch options]" >&2; exit 2
fi
out="$1"; shards="$2"; shift 2
if ! [[ "${shards}" =~ ^[1-9][0-9]*$ ]]; then
  echo "slurm/generate.sh: <shards> must be a positive integer, got '${shards}'" >&2; exit 2
fi
overrides=(); sbatch_opts=()
while [[ $# -gt 0 ]]; do
  if [[ "$1" == "--" ]]; then shift; sbatch_opts=("$@"); break; fi
  overrides+=("$1"); shift
done
array=$(sbatch --parsable "${sbatch_opts[@]}" --array="0-$((shards - 1))" slurm/generate.sbatch \
  "${overrides[@]}" out_dir="${out}.shards")
array="${array%%;*}"
merge=$(sbatch --parsable "${sbatch_opts[@]}" --dependency=afterok:"${array}" --kill-on-invalid-dep=yes \
  slurm/merge.sbatch "${overrides[@]}" out_dir="${out}" "merge_from=[${out}.shards]")
echo "generation array ${array} (${shards} tasks) -> merge ${merge%%;*}: ${out}"
