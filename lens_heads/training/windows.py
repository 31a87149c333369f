"""The token windows a training run reads from a corpus: each step's batch, drawn from a generator seeded by (seed,
step, micro-batch) so that a resumed run reads the same data, and the fixed validation windows. `CorpusWindows` is
a corpus as the training loop's data (`lens_heads.training.loop.TrainData`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch
from jaxtyping import Int
from torch import Tensor

from lens_heads.plumbing.errors import InputError
from lens_heads.training.config import TrainConfig
from lens_heads.training.objectives import NextToken, autocast, lm_loss

if TYPE_CHECKING:  # HookedTransformer is TransformerLens 3.9 only
    from transformer_lens import HookedTransformer


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


@torch.no_grad()
def validation_loss(model: HookedTransformer, val: np.ndarray, cfg: TrainConfig) -> float:
    """Mean language-model loss over ``eval_batches`` fixed batches of validation windows."""
    windows = eval_windows(val, cfg.eval_batches * cfg.batch_size, cfg.seq_len).to(model.cfg.device)
    losses = []
    for chunk in windows.split(cfg.batch_size):
        with autocast(model, cfg):
            losses.append(lm_loss(model, chunk).item())
    return float(np.mean(losses))


@torch.no_grad()
def window_losses(model: HookedTransformer, windows: Int[Tensor, "n seq_plus_1"], batch: int = 16) -> list[float]:
    """The mean next-token loss of each window (the items a paired comparison of two models resamples)."""
    out: list[float] = []
    for chunk in windows.to(model.cfg.device).split(batch):
        logits = model(chunk[:, :-1]).float()
        loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), chunk[:, 1:], reduction="none")
        out += loss.mean(-1).tolist()
    return out


@dataclass(frozen=True)
class CorpusWindows:
    """A corpus (``.train``/``.val`` token arrays, `lens_heads.training.corpus.TokenCorpus`) as training data for a
    HookedTransformer: `batch_at` windows, the next-token loss, and a validation loss that is always the
    language-model loss (whatever the objective), so runs compare."""

    corpus: object
    objective: NextToken = field(default_factory=NextToken)

    @property
    def meta(self) -> dict:
        return dict(getattr(self.corpus, "meta", {}))

    def check(self, model: HookedTransformer, cfg: TrainConfig) -> None:
        if cfg.seq_len > model.cfg.n_ctx:
            raise InputError(f"seq_len {cfg.seq_len} exceeds the model's context n_ctx={model.cfg.n_ctx}")
        if int(np.max(self.corpus.train[: 1 << 20])) >= model.cfg.d_vocab:  # type: ignore[attr-defined]
            raise InputError(f"the corpus has token ids >= the model's d_vocab={model.cfg.d_vocab}")

    def batch(self, step: int, micro: int, cfg: TrainConfig, device) -> Tensor:
        return batch_at(self.corpus.train, step, micro, cfg).to(device)  # type: ignore[attr-defined]

    def tokens(self, batch: Tensor) -> int:
        """Input tokens of a batch (a window's last token is only a target)."""
        return batch.shape[0] * (batch.shape[1] - 1)

    def validation_loss(self, model: HookedTransformer, cfg: TrainConfig) -> float:
        return validation_loss(model, self.corpus.val, cfg)  # type: ignore[attr-defined]
