"""lens_heads: find inactive attention heads and lazy layers, prove it by ablation, build smaller models.

The names below are the public API; each lives in a module of its own (``lens_heads.heads.scores``,
``lens_heads.ablation.hooks``, ``lens_heads.experiments.sweep``, ``lens_heads.collapse.rank``, ``lens_heads.collapse.inheritune``, ...).
"""

from lens_heads.ablation.hooks import random_zeroing, static_zeroing, threshold_zeroing, zero_heads
from lens_heads.ablation.kv_cache import kv_account
from lens_heads.ablation.prune import PrunedModel, first_layers, prune, prune_arguments
from lens_heads.collapse.corpus import TokenCorpus, gpt2_tokenizer, load_corpus
from lens_heads.collapse.gpt2 import GPT2Options, gpt2_config, gpt2_model
from lens_heads.collapse.heal import Healed, heal, removal_arms, truncation
from lens_heads.collapse.inheritune import (
                                   InherituneConfig,
                                   InherituneResult,
                                   grow,
                                   inherit,
                                   inherit_first_layers,
                                   inherit_later_layers,
                                   run_inheritune,
                                   stack,
)
from lens_heads.collapse.layers import LayerScores, layer_scores
from lens_heads.collapse.rank import RankProfile, approx_rank, attention_rank
from lens_heads.collapse.train import (  # train() itself: lens_heads.collapse.train.train (keeps the module reachable)
                                   RankTracker,
                                   TrainConfig,
)
from lens_heads.data.custom_tasks import TaskFileError, task_from_records
from lens_heads.data.tasks import Item, Task, TaskDataUnavailableError, load_task
from lens_heads.evaluation.evaluate import EvalResult, evaluate, evaluate_each, paired_difference
from lens_heads.experiments.compare import SweepComparison, compare_sweeps, read_sweep
from lens_heads.experiments.effects import HeadEffects, head_effects
from lens_heads.experiments.sweep import SweepResult, load_sweep, run_sweep
from lens_heads.heads.distributions import thresholds
from lens_heads.heads.scores import SCORE_NAMES
from lens_heads.heads.scoring import HeadScores, score_heads
from lens_heads.heads.thresholds_file import Thresholds, load_thresholds, save_thresholds
from lens_heads.models.loading import (
                                   DEFAULT_MODEL,
                                   ModelUnavailableError,
                                   load_model,
                                   model_meta,
                                   tiny_model,
                                   weight_basis,
)
from lens_heads.plumbing.errors import InputError
from lens_heads.viz.explorer import Explorer, explore

__all__ = [
    "InputError",
    "DEFAULT_MODEL", "ModelUnavailableError", "load_model", "model_meta", "tiny_model", "weight_basis",
    "Item", "Task", "TaskDataUnavailableError", "load_task", "TaskFileError", "task_from_records",
    "SCORE_NAMES", "HeadScores", "score_heads", "thresholds", "Thresholds", "load_thresholds", "save_thresholds", "Thresholds", "load_thresholds", "save_thresholds",
    "EvalResult", "evaluate", "evaluate_each", "paired_difference",
    "random_zeroing", "static_zeroing", "threshold_zeroing", "zero_heads",
    "PrunedModel", "prune", "prune_arguments", "first_layers", "kv_account",
    "SweepResult", "load_sweep", "run_sweep", "SweepComparison", "compare_sweeps", "read_sweep",
    "HeadEffects", "head_effects",
    "RankProfile", "approx_rank", "attention_rank", "LayerScores", "layer_scores", "Healed", "heal", "removal_arms",
    "truncation", "Explorer", "explore",
    "TokenCorpus", "gpt2_tokenizer", "load_corpus", "RankTracker", "TrainConfig",
    "GPT2Options", "gpt2_config", "gpt2_model",
    "InherituneConfig", "InherituneResult", "grow", "inherit", "inherit_first_layers", "inherit_later_layers",
    "run_inheritune", "stack",
]
