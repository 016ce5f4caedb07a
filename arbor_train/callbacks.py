"""Lightning callbacks and plugins that conf/callbacks and conf/trainer name by `_target_`."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import lightning as L
import torch


def slurm_plugins(auto_requeue: bool = True) -> list:
    """Inside a SLURM job: Lightning's SLURM environment (ranks from srun; on SIGUSR1 it writes an
    hpc checkpoint and requeues the job when `auto_requeue`). Outside SLURM: no plugin."""
    if "SLURM_JOB_ID" not in os.environ:
        return []
    import signal

    from lightning.pytorch.plugins.environments import SLURMEnvironment

    return [SLURMEnvironment(auto_requeue=auto_requeue, requeue_signal=signal.SIGUSR1)]


def tensor_digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().cpu().contiguous().numpy().tobytes()).hexdigest()[:16]


class BatchHashLog(L.Callback):
    """Writes, on every rank, one JSON line per training batch to `<out_dir>/rank-<r>.jsonl`: the global
    step, a hash of the whole batch's token ids and one hash per sequence (padding removed), so the
    ranks' shares of the data can be compared (debug=batches)."""

    def __init__(self, out_dir: str):
        self.out_dir = Path(out_dir)
        self._f = None

    def on_train_start(self, trainer, pl_module) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._f = open(self.out_dir / f"rank-{trainer.global_rank}.jsonl", "a", encoding="utf-8")

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        ids = batch["input_ids"]
        mask = batch.get("attention_mask")
        seqs = []
        if "seq_lens" in batch:    # packed: each row holds examples of these lengths end to end
            for row, lens in zip(ids, batch["seq_lens"]):
                k = 0
                for n in lens:
                    seqs.append(tensor_digest(row[k : k + int(n)]))
                    k += int(n)
        elif mask is not None and mask.dim() == 2:
            seqs = [tensor_digest(row[m.bool()]) for row, m in zip(ids, mask)]
        else:
            seqs = [tensor_digest(row) for row in ids]
        rec = {"step": trainer.global_step, "batch": tensor_digest(ids), "seqs": seqs}
        self._f.write(json.dumps(rec) + "\n")
        self._f.flush()

    def on_train_end(self, trainer, pl_module) -> None:
        if self._f:
            self._f.close()
            self._f = None
