"""Learning-rate schedules for conf/scheduler/*.yaml: `_partial_` builders finished by
RoleModule.configure_optimizers with the optimizer and the run's total optimizer steps."""

from __future__ import annotations

import math

import torch


def _warmup_steps(total_steps: int, warmup_ratio: float) -> int:
    if not 0 <= warmup_ratio < 1:
        from .errors import ConfigError

        raise ConfigError(f"option scheduler.warmup_ratio must be in [0, 1), got {warmup_ratio}")
    return int(warmup_ratio * total_steps)


def linear_warmup_decay(optimizer: torch.optim.Optimizer, total_steps: int, warmup_ratio: float = 0.06):
    """Linear warm-up over `warmup_ratio` of the steps, then linear decay to zero at `total_steps`."""
    total, warm = max(1, int(total_steps)), _warmup_steps(total_steps, warmup_ratio)

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        return max(0.0, (total - step) / max(1, total - warm))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def cosine_warmup_decay(optimizer: torch.optim.Optimizer, total_steps: int, warmup_ratio: float = 0.06,
                        min_lr_ratio: float = 0.0):
    """Linear warm-up, then cosine decay from the optimizer's lr to `min_lr_ratio` x lr at `total_steps`."""
    total, warm = max(1, int(total_steps)), _warmup_steps(total_steps, warmup_ratio)

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        t = min(1.0, (step - warm) / max(1, total - warm))
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
