"""Every public name of ``lens_heads`` that turns a forward (or numbers given to it) into numbers refuses NaN with a
:class:`NonFiniteError` naming what went non-finite; every other public name is listed with why it computes none.
The two tables together must be ``lh.__all__``: a new public function fails here until it is classified and, if it
computes numbers, refuses a model with one NaN weight (the tiny 3-layer Llama of ``test_nonfinite``)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import lens_heads as lh
from lens_heads.plumbing.errors import NonFiniteError
from lens_heads.sweep.rankings import Ranking, ranking_sweep
from lens_heads.training.config import TrainConfig
from lens_heads.training.corpus import TokenCorpus
from test_nonfinite import NAN_LAYER, folders, models, three_choice_task  # noqa: F401  (fixtures)

PROMPTS = ["t10 t20 t30 t40 t50", "t11 t21 t31 t41"]
TRAIN = dict(steps=2, batch_size=2, seq_len=8, lr=1e-3, min_lr=1e-4, warmup_steps=0, eval_batches=1,
             checkpoint_every=1, log_every=1)


def corpus() -> TokenCorpus:
    cycle = np.array([13, 19, 24, 37, 43, 51, 68], dtype=np.uint16)  # inside the folder's 100-word vocabulary
    return TokenCorpus(train=np.tile(cycle, 40), val=np.tile(cycle, 10), meta={"name": "cycle"})


def nan_scores(intact):
    """The intact model's head scores with one NaN (as a score file of a broken run would hold)."""
    scores = lh.score_heads(intact, three_choice_task(2), progress=False)
    values = scores.values.clone()
    values[0, NAN_LAYER, 0, :] = float("nan")
    return dataclasses.replace(scores, values=values)


# name -> (what the message must name, the call on (intact, broken, folders, tmp_path))
REFUSES = {
    "score_heads": ("head scores", lambda i, b, f, t: lh.score_heads(b, three_choice_task(2), progress=False)),
    "evaluate": ("items", lambda i, b, f, t: lh.evaluate(b, three_choice_task(2), progress=False)),
    "evaluate_each": ("items", lambda i, b, f, t: lh.evaluate_each(b, three_choice_task(2), [()], progress=False)),
    "mean_z": ("hook_z", lambda i, b, f, t: lh.mean_z(b, PROMPTS)),
    "run_sweep": ("items", lambda i, b, f, t: lh.run_sweep(b, three_choice_task(2), fractions=[0.25],
                                                            scores=["AHON"], progress=False)),
    "ranking_sweep": ("items", lambda i, b, f, t: ranking_sweep(
        b, three_choice_task(2), [Ranking("r", order=tuple((l, h) for l in range(3) for h in range(4)))], fractions=[0.1], progress=False)),
    "head_effects": ("log-likelihoods|items", lambda i, b, f, t: lh.head_effects(b, three_choice_task(2),
                                                                                  progress=False)),
    "thresholds": ("AHON has 1 non-finite values", lambda i, b, f, t: lh.thresholds(nan_scores(i), "AHON", [0.3])),
    "compare_distributions": ("broken's AHON scores", lambda i, b, f, t: lh.compare_distributions(
        {"intact": lh.score_heads(i, three_choice_task(2), progress=False), "broken": nan_scores(i)},
        names=["AHON"], n_resamples=10, progress=False)),
    "approx_rank": ("approx_rank", lambda i, b, f, t: lh.approx_rank(torch.full((2, 3, 3), float("nan")))),
    "attention_rank": ("attention pattern at layer 2", lambda i, b, f, t: lh.attention_rank(b, PROMPTS,
                                                                                           progress=False)),
    "layer_scores": ("block influence", lambda i, b, f, t: lh.layer_scores(b, three_choice_task(2),
                                                                            progress=False)),
    "heal": ("validation loss", lambda i, b, f, t: lh.heal(f[1], [0], corpus(), TrainConfig(**TRAIN), out_dir=t,
                                                          device="cpu", progress=False)),
    "training": ("training step 0.*loss", lambda i, b, f, t: lh.training.train(b, corpus(), TrainConfig(**TRAIN,
                                                                                                   eval_every=0),
                                                                               progress=False)),
    "explore": ("head scores", lambda i, b, f, t: lh.explore(b, PROMPTS)),
}

# name -> why no number from a forward comes out of it
COMPUTES_NONE = {
    **dict.fromkeys(["InputError", "NonFiniteError", "OutputFolderError", "ModelUnavailableError",
                     "TaskDataUnavailableError", "TaskFileError"], "an error type"),
    **dict.fromkeys(["DEFAULT_MODEL", "SCORE_NAMES"], "a constant"),
    **dict.fromkeys(["Item", "Task", "HeadScores", "Thresholds", "EvalResult", "EvalSettings", "SweepPlan",
                     "SweepResult", "SweepComparison", "HeadEffects", "DistributionComparison",
                     "DistributionSettings", "RankProfile", "RankSettings", "LayerScores", "PrunedModel", "Healed",
                     "Explorer"], "a value type: made by the functions walked here, or by hand"),
    **dict.fromkeys(["load_model", "tiny_model", "model_meta", "weight_basis", "prune", "remove_layers"],
                    "a model or its description: its numbers come from the forwards walked here"),
    **dict.fromkeys(["load_task", "task_from_records"], "data"),
    **dict.fromkeys(["Ablation", "UnitAblation"], "the ablation interface: the evaluations that run one are walked here"),
    **dict.fromkeys(["random_zeroing", "static_zeroing", "threshold_zeroing", "zero_heads"],
                    "hooks: the evaluations that run them are walked here"),
    **dict.fromkeys(["load_thresholds", "save_thresholds", "read_sweep_folder", "read_sweep_record", "load_sweep",
                     "read_sweep"], "reads or writes files of results the walked functions made"),
    **dict.fromkeys(["paired_difference", "sweep_intervals", "compare_sweeps"],
                    "statistics of EvalResults, which evaluate never makes from a NaN"),
    **dict.fromkeys(["prune_arguments", "first_layers", "kv_account", "removal_arms", "truncation"],
                    "arithmetic on a config, a spec or layer scores"),
    **dict.fromkeys(["inheritune", "gpt2", "corpus"],
                    "a namespace: its runs train with lh.training.train and evaluate with lh.evaluate (walked)"),
}


def test_every_public_name_is_classified():
    assert not set(REFUSES) & set(COMPUTES_NONE)
    missing = set(lh.__all__) - set(REFUSES) - set(COMPUTES_NONE)
    stale = (set(REFUSES) | set(COMPUTES_NONE)) - set(lh.__all__)
    assert not missing, f"classify these public names here (and make them refuse NaN if they compute): {missing}"
    assert not stale, stale


@pytest.mark.parametrize("name", sorted(REFUSES))
def test_a_nan_weight_is_refused_by_name(name, models, folders, tmp_path):  # noqa: F811
    intact, broken = models
    what, call = REFUSES[name]
    with pytest.raises(NonFiniteError, match=what) as caught:
        call(intact, broken, folders, tmp_path)
    assert "NaN" in str(caught.value)


@pytest.mark.parametrize("cache", [True, False])  # against a key/value cache, and rerun at every step
def test_batched_generation_refuses_naming_the_prompt(models, cache):  # noqa: F811
    from lens_heads.evaluation.generate_batch import generate_batch

    _, broken = models
    prompts = [broken.tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    with pytest.raises(NonFiniteError, match=r"generation of prompt 0 .*NaN.*blocks\.1\."):
        generate_batch(broken, prompts, max_new_tokens=[3, 3], stops=[[], []], cache=cache)
