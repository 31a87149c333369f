"""The token windows a training run reads: each step's batch, drawn from a generator seeded by (seed, step,
micro-batch) so that a resumed run reads the same data, and the fixed validation windows."""

from __future__ import annotations

import numpy as np
import torch
from jaxtyping import Int
from torch import Tensor

from lens_heads.plumbing.errors import InputError
from lens_heads.training.config import TrainConfig


def batch_at(data: np.ndarray, step: int, micro: int, cfg: TrainConfig) -> Int[Tensor, "batch seq_plus_1"]:
    """The training windows of (step, micro-batch): random offsets drawn from a generator seeded by
    (seed, step, micro), so the data order is the same in a resumed run."""
    if len(data) <= cfg.seq_len + 1:
        raise InputError(f"the training split has {len(data)} tokens, fewer than seq_len + 1 = {cfg.seq_len + 1}")
    rng = np.random.default_rng([cfg.seed, step, micro])
    offsets = rng.integers(0, len(data) - cfg.seq_len - 1, size=cfg.batch_size)
    return torch.from_numpy(np.stack([np.asarray(data[o: o + cfg.seq_len + 1], dtype=np.int64) for o in offsets]))


def eval_windows(data: np.ndarray, n: int, seq_len: int) -> Int[Tensor, "n seq_plus_1"]:
    """``n`` fixed validation windows of ``seq_len + 1`` tokens, evenly spaced over the split."""
    if len(data) <= seq_len + 1:
        raise InputError(f"the validation split has {len(data)} tokens, fewer than seq_len + 1 = {seq_len + 1}")
    offsets = np.linspace(0, len(data) - seq_len - 1, num=n).astype(np.int64)
    return torch.from_numpy(np.stack([np.asarray(data[o: o + seq_len + 1], dtype=np.int64) for o in offsets]))
