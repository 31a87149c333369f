"""A training run's settings (`TrainConfig`, and the fine-tune's preset of it) and the AdamW optimiser they define,
with its weight-decay rule (`make_optimizer`, `decays`). The learning-rate schedules: `lens_heads.training.schedules`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

import torch

from lens_heads.plumbing.errors import InputError
from lens_heads.plumbing.settings import option
from lens_heads.training.schedules import SCHEDULES

if TYPE_CHECKING:  # HookedTransformer is TransformerLens 3.9 only
    from transformer_lens import HookedTransformer


@dataclass(frozen=True)
class TrainConfig:
    """Training hyper-parameters.

    The optimiser is the Inheritune authors' (AdamW, betas (0.9, 0.95), weight decay 0.1 on weight matrices only,
    gradient clip 1.0, linear warm-up then cosine decay to ``min_lr`` at the last step). The step counts and rates
    here are toy-scale defaults; the authors train 100K steps at lr 2e-4 (cosine to 1e-5, 2000 warm-up steps).
    ``decay_embeddings=True`` also decays the embeddings (TransformerLens ``W_E``, ``W_pos``), the rule before the
    authors' was adopted. ``schedule``: the decay after the warm-up, ``"cosine"`` or ``"linear"``
    (`lens_heads.training.schedules`). `TrainConfig.finetune` is the fine-tune's preset.
    """

    steps: int = option(1000, "optimizer steps")
    batch_size: int = option(16, "windows (or examples) per micro-batch")
    seq_len: int = option(128, "tokens per window")
    grad_accum: int = option(1, "micro-batches per step")
    lr: float = option(6e-4, "peak learning rate")
    min_lr: float = option(6e-5, "final learning rate")
    warmup_steps: int = option(100, "linear warm-up steps")
    weight_decay: float = option(0.1, "AdamW weight decay (weight matrices only)")
    beta1: float = option(0.9, "AdamW beta1")
    beta2: float = option(0.95, "AdamW beta2")
    grad_clip: float = option(1.0, "gradient norm clip")
    eval_every: int = option(100, "steps between validation losses (0: never)")
    eval_batches: int = option(8, "validation batches")
    log_every: int = option(10, "steps between training-loss records")
    checkpoint_every: int = option(100, "steps between checkpoints")
    keep_checkpoints: int = option(2, "checkpoints kept while the run is unfinished")
    seed: int = option(0, "batch-order seed")
    amp: bool = option(False, "bfloat16 autocast (CUDA only)")
    decay_embeddings: bool = option(False, "weight decay on embeddings too (not the authors')")
    schedule: str = option("cosine", "decay after the warm-up", choices=SCHEDULES)

    def __post_init__(self):
        for name in ("steps", "batch_size", "grad_accum"):
            if getattr(self, name) < 1:
                raise InputError(f"TrainConfig({name}={getattr(self, name)}): give a whole number >= 1")
        for name in ("log_every", "checkpoint_every"):  # eval_every=0 means never, these have no such meaning
            if getattr(self, name) < 1:
                raise InputError(f"TrainConfig({name}={getattr(self, name)}): give a number of steps >= 1")
        if self.eval_every < 0:
            raise InputError(f"TrainConfig(eval_every={self.eval_every}): give steps >= 1, or 0 for never")
        if not self.lr > 0 or self.warmup_steps < 0:
            raise InputError(f"TrainConfig: lr must be > 0 and warmup_steps >= 0, got {self.lr}, {self.warmup_steps}")
        if not 0 <= self.min_lr <= self.lr:  # the schedule decays from lr to min_lr: above lr it would climb
            raise InputError(f"TrainConfig(lr={self.lr}, min_lr={self.min_lr}): min_lr is where the schedule decays to, "
                             "so give 0 <= min_lr <= lr")
        if self.schedule not in SCHEDULES:
            raise InputError(f"TrainConfig(schedule={self.schedule!r}): choose one of {', '.join(SCHEDULES)}")

    @property
    def tokens_per_step(self) -> int:
        """Input tokens per step when the run reads token windows (`lens_heads.training.windows`)."""
        return self.batch_size * self.seq_len * self.grad_accum

    @classmethod
    def finetune(cls, steps: int = 150, batch_size: int = 8, lr: float = 3e-5, warmup_steps: int = 10,
                 weight_decay: float = 0.0, grad_clip: float = 1.0, eval_every: int = 25, seed: int = 0,
                 **others) -> TrainConfig:
        """The fine-tune's settings (`lens_heads.training.finetune`): a short run of a few hundred examples, AdamW
        with torch's betas (0.9, 0.999), linear warm-up then linear decay to 0, the training loss logged at every
        step and the held-out loss every ``eval_every`` steps. ``others``: any other field."""
        if eval_every < 1:
            raise InputError(f"TrainConfig.finetune(eval_every={eval_every}): give a whole number >= 1")
        return replace(cls(steps=steps, batch_size=batch_size, lr=lr, warmup_steps=warmup_steps,
                           weight_decay=weight_decay, grad_clip=grad_clip, eval_every=eval_every, seed=seed,
                           **FINETUNE), **others)


# what the fine-tune's preset sets besides its arguments
FINETUNE: dict[str, Any] = dict(min_lr=0.0, beta2=0.999, schedule="linear", log_every=1)
# fields added after run folders were claimed: left out of a run's key at their default, so those folders resume
LATER_FIELDS = {"schedule": "cosine"}


def config_key(cfg: TrainConfig) -> dict:
    """The settings as a run's key records them (`lens_heads.training.loop.run_key`)."""
    return {k: v for k, v in asdict(cfg).items() if not (k in LATER_FIELDS and v == LATER_FIELDS[k])}


EMBEDDINGS = ("W_E", "W_pos")


def decays(name: str, cfg: TrainConfig, ndim: int = 0) -> bool:
    """Whether parameter ``name`` (of ``ndim`` dimensions) gets weight decay, as the authors' nanoGPT
    ``configure_optimizers``. A TransformerLens parameter: the weight matrices of linear maps (``W_*``: attention,
    MLP and an untied unembedding), not embeddings (unless ``decay_embeddings``), LayerNorm weights or biases. A
    torch module's (a Hugging Face model's ``*.weight``): every matrix, embeddings included (nanoGPT's
    ``dim() >= 2``)."""
    last = name.rsplit(".", 1)[-1]
    if last == "weight":
        return ndim >= 2
    return last.startswith("W_") and (cfg.decay_embeddings or last not in EMBEDDINGS)


def make_optimizer(model: HookedTransformer | torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW over the trainable parameters, weight decay on `decays` ones only (frozen biases are left out)."""
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    decay = [p for n, p in trainable if decays(n, cfg, p.ndim)]
    no_decay = [p for n, p in trainable if not decays(n, cfg, p.ndim)]
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))
