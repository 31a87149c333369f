"""A training run's settings (`TrainConfig`) and what they define: the learning-rate schedule (`lr_at`) and the
AdamW optimiser with its weight-decay rule (`make_optimizer`, `decays`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from lens_heads.plumbing.errors import InputError

if TYPE_CHECKING:  # HookedTransformer is TransformerLens 3.9 only
    from transformer_lens import HookedTransformer


@dataclass
class TrainConfig:
    """Training hyper-parameters.

    The optimiser is the Inheritune authors' (AdamW, betas (0.9, 0.95), weight decay 0.1 on weight matrices only,
    gradient clip 1.0, linear warm-up then cosine decay to ``min_lr`` at the last step). The step counts and rates
    here are toy-scale defaults; the authors train 100K steps at lr 2e-4 (cosine to 1e-5, 2000 warm-up steps).
    ``decay_embeddings=True`` also decays the embeddings (TransformerLens ``W_E``, ``W_pos``), the rule before the
    authors' was adopted.
    """

    steps: int = 1000
    batch_size: int = 16
    seq_len: int = 128
    grad_accum: int = 1
    lr: float = 6e-4
    min_lr: float = 6e-5
    warmup_steps: int = 100
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    eval_every: int = 100
    eval_batches: int = 8
    log_every: int = 10
    checkpoint_every: int = 100
    keep_checkpoints: int = 2
    seed: int = 0
    amp: bool = False  # bfloat16 autocast (CUDA only)
    decay_embeddings: bool = False

    def __post_init__(self):
        for name in ("log_every", "checkpoint_every"):  # eval_every=0 means never, these have no such meaning
            if getattr(self, name) < 1:
                raise InputError(f"TrainConfig({name}={getattr(self, name)}): give a number of steps >= 1")
        if self.eval_every < 0:
            raise InputError(f"TrainConfig(eval_every={self.eval_every}): give steps >= 1, or 0 for never")

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len * self.grad_accum


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate of (0-based) step ``step``: linear warmup to ``lr``, cosine decay to ``min_lr`` at the end.

    (The authors' nanoGPT loop warms up as ``lr * step / warmup``, so its step 0 does not move the weights; here
    step 0 already takes ``lr / warmup``. Otherwise the same schedule.)"""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.min_lr + 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))) * (cfg.lr - cfg.min_lr)


EMBEDDINGS = ("W_E", "W_pos")


def decays(name: str, cfg: TrainConfig) -> bool:
    """Whether parameter ``name`` gets weight decay: the weight matrices of linear maps (TransformerLens ``W_*``:
    attention, MLP and an untied unembedding), not embeddings, LayerNorm weights or biases, as the authors'
    nanoGPT ``configure_optimizers`` (Linear weights decay; Embedding, LayerNorm and biases do not)."""
    last = name.rsplit(".", 1)[-1]
    return last.startswith("W_") and (cfg.decay_embeddings or last not in EMBEDDINGS)


def make_optimizer(model: HookedTransformer, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW over the trainable parameters, weight decay on `decays` ones only (frozen biases are left out)."""
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    decay = [p for n, p in trainable if decays(n, cfg)]
    no_decay = [p for n, p in trainable if not decays(n, cfg)]
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))
