"""Helpers that training subprocesses of the tests load by `_target_` (tests/ is put on PYTHONPATH)."""

import time

import lightning as L


class SlowAfter(L.Callback):
    """Sleeps after every training step from `step` on, so a test has time to kill the run after the
    checkpoint of that step (a tiny model trains hundreds of steps a second)."""

    def __init__(self, step: int, seconds: float = 0.5):
        self.step, self.seconds = step, seconds

    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.global_step >= self.step:
            time.sleep(self.seconds)
