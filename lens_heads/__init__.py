"""lens_heads: find inactive attention heads and lazy layers, prove it by ablation, build smaller models.

The heads workflow is at the top level, by topic: models and data, head scores, evaluation and ablation, sweeps and
their statistics, layers, smaller models, the explorer (``import lens_heads as lh``; ``lh.score_heads``). The
attention-collapse side's training is in namespaces: ``lh.inheritune`` (inherit, grow, stack, the baselines,
``run_inheritune``), ``lh.training`` (the loop ``train``, ``TrainConfig``, ``RankTracker``), ``lh.gpt2`` (the authors'
GPT-2) and ``lh.corpus`` (the offline corpus). Everything else is imported from its module
(``from lens_heads.heads.scores import SCORES``).
"""

from lens_heads import training
from lens_heads.ablation.hooks import mean_z, static_zeroing, threshold_zeroing, zero_heads
from lens_heads.ablation.kv_cache import kv_account
from lens_heads.ablation.prune import PrunedModel, first_layers, prune, prune_arguments
from lens_heads.ablation.random_draws import random_zeroing
from lens_heads.ablation.removed_layers import remove_layers
from lens_heads.collapse.rank import RankProfile, approx_rank, attention_rank
from lens_heads.collapse.rank_settings import RankSettings
from lens_heads.data.benchmark_files import TaskDataUnavailableError
from lens_heads.data.custom_tasks import TaskFileError, task_from_records
from lens_heads.data.items import Item, Task
from lens_heads.data.tasks import load_task, register_task_source
from lens_heads.evaluation.ablation_interface import Ablation, UnitAblation
from lens_heads.evaluation.eval_settings import EvalSettings
from lens_heads.evaluation.evaluate import evaluate, evaluate_each
from lens_heads.evaluation.results import EvalResult, paired_difference
from lens_heads.experiments.compare_distributions import DistributionComparison, compare_distributions
from lens_heads.experiments.distribution_settings import DistributionSettings
from lens_heads.experiments.effects import HeadEffects, head_effects
from lens_heads.experiments.healing import Healed, heal, removal_arms, truncation
from lens_heads.experiments.layer_ranking import LayerScores, layer_scores
from lens_heads.growth import gpt2, inheritune
from lens_heads.heads.distributions import thresholds
from lens_heads.heads.scores import SCORE_NAMES
from lens_heads.heads.scoring import HeadScores, score_heads
from lens_heads.heads.thresholds_file import Thresholds, load_thresholds, save_thresholds
from lens_heads.models.embedded import DEFAULT_MODEL, ModelUnavailableError
from lens_heads.models.loading import load_model, model_meta, tiny_model, weight_basis
from lens_heads.plumbing.errors import InputError, NonFiniteError
from lens_heads.plumbing.io import OutputFolderError
from lens_heads.sweep.compare import SweepComparison, compare_sweeps, read_sweep, read_sweep_record
from lens_heads.sweep.intervals import sweep_intervals
from lens_heads.sweep.plan import SweepPlan
from lens_heads.sweep.rankings import ranking_sweep
from lens_heads.sweep.result import SweepResult
from lens_heads.sweep.run import run_sweep
from lens_heads.sweep.unit_store import load_sweep, read_sweep_folder
from lens_heads.training import corpus
from lens_heads.viz.explorer import Explorer, explore

__all__ = [
    # errors
    "InputError", "NonFiniteError", "OutputFolderError",
    # models and data
    "DEFAULT_MODEL", "ModelUnavailableError", "load_model", "model_meta", "tiny_model", "weight_basis",
    "Item", "Task", "TaskDataUnavailableError", "load_task", "TaskFileError", "task_from_records",
    # head scores
    "SCORE_NAMES", "HeadScores", "score_heads", "thresholds", "Thresholds", "load_thresholds", "save_thresholds",
    # evaluation and ablation
    "EvalResult", "EvalSettings", "evaluate", "evaluate_each", "paired_difference",
    "random_zeroing", "static_zeroing", "threshold_zeroing", "zero_heads", "mean_z", "remove_layers",
    "Ablation", "UnitAblation",  # what every ablation is to the evaluator: a new kind subclasses one
    # sweeps, effects and their statistics
    "SweepPlan", "SweepResult", "read_sweep_folder", "read_sweep_record", "run_sweep", "sweep_intervals",
    "ranking_sweep",
    "SweepComparison", "compare_sweeps", "HeadEffects", "head_effects",
    "load_sweep", "read_sweep",  # the old names of read_sweep_folder and read_sweep_record
    # score distributions across models
    "DistributionComparison", "DistributionSettings", "compare_distributions",
    # layers
    "RankProfile", "RankSettings", "approx_rank", "attention_rank", "LayerScores", "layer_scores",
    # smaller models
    "PrunedModel", "prune", "prune_arguments", "first_layers", "kv_account",
    "Healed", "heal", "removal_arms", "truncation",
    # the explorer
    "Explorer", "explore",
    # namespaces of the attention-collapse side
    "inheritune", "training", "gpt2", "corpus",
]



def _lm_eval_task(name: str, **options) -> Task:
    """``lh.load_task("lm_eval:<task>")``: lm-eval's tasks, read by the harness (:mod:`lens_heads.harness.tasks`),
    imported on first use: it needs the ``lens_heads[harness]`` extra, which the core never imports."""
    from lens_heads.harness.tasks import PREFIX, lm_eval_task

    assert name.startswith(PREFIX)
    return lm_eval_task(name, **options)


# the package wires the harness's task source into the data layer's registry (the data layer names no layer above)
register_task_source("lm_eval:", _lm_eval_task)

# names that were top-level before the namespaces: where each is now
_MOVED = {
    **{name: "inheritune" for name in ("InherituneConfig", "InherituneResult", "grow", "inherit",
                                        "inherit_first_layers", "inherit_later_layers", "run_inheritune", "stack")},
    **{name: "training" for name in ("RankTracker", "TrainConfig")},
    **{name: "gpt2" for name in ("GPT2Options", "gpt2_config", "gpt2_model")},
    **{name: "corpus" for name in ("TokenCorpus", "gpt2_tokenizer", "load_corpus")},
}


# names that were renamed: where the thing is now
_RENAMED = {"train": "the namespace is lens_heads.training; the loop is lens_heads.training.train"}


def __getattr__(name: str):
    if name in _RENAMED:
        raise AttributeError(f"lens_heads.{name} was renamed: {_RENAMED[name]}")
    if name in _MOVED:
        raise AttributeError(f"lens_heads.{name} moved to its namespace: use lens_heads.{_MOVED[name]}.{name}")
    raise AttributeError(f"module 'lens_heads' has no attribute {name!r}")
