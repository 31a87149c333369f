"""A plain language-model training loop for a HookedTransformer (nanoGPT's loop, hooked model).

The namespace ``lh.train``: the loop (`lens_heads.training.loop`: `train`, `TrainResult`, the losses), its
settings, schedule and optimiser (`lens_heads.training.config`), the token windows it reads
(`lens_heads.training.windows`), its checkpoints (`lens_heads.training.checkpoints`) and the callback that tracks
attention rank as a model trains (`lens_heads.collapse.rank_tracker`).
"""

from lens_heads.collapse.rank_tracker import RankTracker
from lens_heads.training.checkpoints import (
    latest_checkpoint,
    load_model_state,
    load_optimizer_state,
    model_state_bytes,
    optimizer_state,
    save_checkpoint,
)
from lens_heads.training.config import EMBEDDINGS, TrainConfig, decays, lr_at, make_optimizer
from lens_heads.training.loop import Callback, Objective, TrainResult, lm_loss, run_key, train, validation_loss
from lens_heads.training.windows import batch_at, eval_windows

__all__ = [
    # the loop
    "train", "TrainResult", "Callback", "Objective", "lm_loss", "validation_loss", "run_key",
    # its settings, schedule and optimiser
    "TrainConfig", "lr_at", "make_optimizer", "decays", "EMBEDDINGS",
    # the token windows it reads
    "batch_at", "eval_windows",
    # checkpoints
    "save_checkpoint", "latest_checkpoint", "model_state_bytes", "load_model_state", "optimizer_state",
    "load_optimizer_state",
    # attention rank during training
    "RankTracker",
]
