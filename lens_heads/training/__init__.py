"""Training language models: the one training loop, for a HookedTransformer on a corpus or a Hugging Face model on
solved items.

The namespace ``lh.training``: the loop (`lens_heads.training.loop`: `train`, `TrainResult`, what it reads), its
settings and optimiser (`lens_heads.training.config`, with the fine-tune's preset `TrainConfig.finetune`), the
learning-rate schedules (`lens_heads.training.schedules`), the objectives (`lens_heads.training.objectives`; the
distillation ones: `lens_heads.training.distill`), the token windows of a corpus (`lens_heads.training.windows`),
solved items as training data (`lens_heads.training.example_data`), the checkpoints a run resumes from
(`lens_heads.training.checkpoints`) and the callback that tracks attention rank as a model trains
(`lens_heads.collapse.rank_tracker`). The offline corpus is its own namespace, ``lh.corpus``.
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
from lens_heads.training.config import EMBEDDINGS, TrainConfig, decays, make_optimizer
from lens_heads.training.distill import Distillation, DistillConfig
from lens_heads.training.example_data import Example, ExampleData, examples
from lens_heads.training.loop import Callback, TrainData, TrainResult, run_key, train
from lens_heads.training.objectives import AnswerLoss, NextToken, Objective, answer_loss, lm_loss
from lens_heads.training.schedules import SCHEDULES, lr_at
from lens_heads.training.windows import CorpusWindows, batch_at, eval_windows, validation_loss

__all__ = [
    # the loop and what it reads
    "train", "TrainResult", "Callback", "TrainData", "CorpusWindows", "ExampleData", "run_key",
    # its settings, schedules and optimiser
    "TrainConfig", "lr_at", "SCHEDULES", "make_optimizer", "decays", "EMBEDDINGS",
    # the objectives
    "Objective", "NextToken", "lm_loss", "AnswerLoss", "answer_loss", "Distillation", "DistillConfig",
    # the token windows of a corpus, solved items
    "batch_at", "eval_windows", "validation_loss", "Example", "examples",
    # checkpoints
    "save_checkpoint", "latest_checkpoint", "model_state_bytes", "load_model_state", "optimizer_state",
    "load_optimizer_state",
    # attention rank during training
    "RankTracker",
]
