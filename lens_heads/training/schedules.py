"""Learning-rate schedules: linear warm-up to ``lr``, then a decay to ``min_lr`` at the last step, cosine (the
Inheritune authors' nanoGPT schedule) or linear (the fine-tune's, with ``min_lr`` 0)."""

from __future__ import annotations

import math
from typing import Protocol

SCHEDULES = ("cosine", "linear")


class Schedule(Protocol):
    """What a schedule reads of its settings (:class:`lens_heads.training.config.TrainConfig` has them all)."""

    @property
    def lr(self) -> float: ...

    @property
    def min_lr(self) -> float: ...

    @property
    def steps(self) -> int: ...

    @property
    def warmup_steps(self) -> int: ...

    @property
    def schedule(self) -> str: ...


def lr_at(step: int, cfg: Schedule) -> float:
    """Learning rate of (0-based) step ``step`` under ``cfg.schedule``.

    (The authors' nanoGPT loop warms up as ``lr * step / warmup``, so its step 0 does not move the weights; here
    step 0 already takes ``lr / warmup``. Otherwise the same schedule.)"""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if cfg.schedule == "linear":
        left = max(0.0, (cfg.steps - step) / max(1, cfg.steps - cfg.warmup_steps))
        return cfg.min_lr + (cfg.lr - cfg.min_lr) * left
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.min_lr + 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))) * (cfg.lr - cfg.min_lr)
