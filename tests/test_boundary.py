"""One boundary: bad input to a public function raises lens_heads.InputError (a ValueError) that names the
argument and what to give instead, before any work; one case per way it was known to fail."""

from __future__ import annotations

import pytest

import lens_heads as lh
from conftest import text_model
from lens_heads.ablation.hooks import mean_z
from lens_heads.collapse.rank import attention_rank
from lens_heads.collapse.rank_tracker import RankTracker
from lens_heads.data.items import Item, Task
from lens_heads.evaluation.generate import generate
from lens_heads.growth.gpt2 import gpt2_config, gpt2_model
from lens_heads.growth.inheritune_config import InherituneConfig
from lens_heads.growth.widen import widen
from lens_heads.training.config import TrainConfig
from lens_heads.training.distill import DistillConfig


@pytest.fixture(scope="module")
def model():
    return text_model(n_layers=2)


def greedy_task() -> Task:
    items = [Item(id=f"g{i}", contexts=(f"Count: {i}, {i + 1},",), continuations=(f" {i + 2}",), gold=0)
             for i in range(2)]
    return Task(name="lambada", split="test", shots=0, format="greedy", items=items, n_total=2, seed=0)


def cloze_task() -> Task:
    items = [Item(id="c0", contexts=("The sky is",) * 2, continuations=(" blue", " green"), gold=0)]
    return Task(name="toy", split="test", shots=0, format="cloze", items=items, n_total=1, seed=0)


CASES = {
    "zero_heads: a head the layer lacks": (lambda m: lh.evaluate(m, cloze_task(), hooks=lh.zero_heads([(0, 99)]),
                                                                 progress=False),
                                           r"layer 0 has 4 heads, so heads \[99\] include some it does not have"),
    "zero_heads: a negative layer": (lambda m: lh.zero_heads([(-1, 0)]), r"\(layer, head\) = \(-1, 0\) is negative"),
    "evaluate: a task name": (lambda m: lh.evaluate(m, "arc_easy"), r"got 'arc_easy': load it first"),
    "run_sweep: one fraction": (lambda m: lh.run_sweep(m, greedy_task(), fractions=0.1),
                                r"fractions takes a list, got 0.1: write fractions=\[0.1\]"),
    "run_sweep: scores as one string": (lambda m: lh.run_sweep(m, greedy_task(), scores="AHON (LN)"),
                                        r"scores takes a list, got 'AHON \(LN\)'"),
    "generate: a token id beyond the vocabulary": (lambda m: generate(m, [10 ** 9]),
                                                   r"token ids outside the model's vocabulary .*: the prompt: 1000000000"),
    "attention_rank: batch_size 0": (lambda m: attention_rank(m, ["a b c"], batch_size=0),
                                     r"batch_size must be a whole number >= 1, got 0"),
    "static_zeroing: a head the model lacks": (lambda m: lh.static_zeroing(m, [(0, 99)]),
                                               r"head \(0, 99\) is outside the model's 2 layers x 4 heads"),
    "static_zeroing: a layer the model lacks": (lambda m: lh.static_zeroing(m, [(5, 0)]),
                                                r"head \(5, 0\) is outside the model's 2 layers x 4 heads"),
    "run_sweep: a negative share": (lambda m: lh.run_sweep(m, greedy_task(), fractions=(0, -0.1)),
                                    r"target fractions must lie in \[0, 1\), got \[-0.1, 0.0\]"),
    "head_effects attribution: a task of single continuations": (
        lambda m: lh.head_effects(m, greedy_task(), method="attribution", progress=False), r"method='ablation'"),
    "head_effects: a task with no items": (lambda m: lh.head_effects(m, Task(
        name="empty", split="test", shots=0, format="cloze", items=[], n_total=0, seed=0), progress=False),
                                            r"the task has no items: load it with a positive n"),
    "load_model: no name": (lambda m: lh.load_model(None), r"load_model needs a model name or folder, got None"),
    "TrainConfig: log_every 0": (lambda m: TrainConfig(log_every=0), r"TrainConfig\(log_every=0\): give a number"),
    "RankTracker: every 0": (lambda m: RankTracker(tokens=None, every=0), r"RankTracker\(every=0\): track every 1"),
    "InherituneConfig: grow_by 0": (lambda m: InherituneConfig(grow_by=0), r"grow_by=0 must be at least 1"),
    "InherituneConfig: an unknown grow_from": (lambda m: InherituneConfig(grow_from="students"),
                                               r"grow_from='students' must be one of"),
    "DistillConfig: temperature 0": (lambda m: DistillConfig(temperature=0.0),
                                     r"distillation temperature must be > 0, got 0.0"),
    "widen: a source that does not halve the width": (lambda m: widen(gpt2_model(gpt2_config(
        1, d_model=16, n_heads=2, n_ctx=8, d_vocab=11), seed=0), d_model=64, n_heads=4),
        r"a half-width source must have half the target's width: the target has d_model 64, so the source needs 32"),
    "ReportConfig: n 0": (lambda m: __import__("lens_heads.report.config", fromlist=["x"]).ReportConfig(n=0),
                          r"ReportConfig\(n=...\): expected a positive whole number, got 0"),
    "at_share: percent": (lambda m: lh.SweepResult.at_share(None, 10), r"fraction in \[0, 1\]"),
    # an empty text still makes a row (its BOS), whose scores would describe the BOS alone
    "score_heads: an empty string": (lambda m: lh.score_heads(m, [""], progress=False), r"input 0 of 1 is empty text"),
    "score_heads: a blank text among others": (lambda m: lh.score_heads(m, ["The sky is blue.", " \n"],
                                                                        progress=False), r"input 1 of 2 is empty"),
    "attention_rank: an empty string": (lambda m: attention_rank(m, ["a b c", "", "d e"]), r"input 1 of 3 is empty"),
    "mean_z: an empty calibration text": (lambda m: mean_z(m, ["a b", ""]), r"input 1 of 2 is empty"),
    "generate: an empty prompt": (lambda m: generate(m, ""), r"prompt is empty text.*token ids"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_raises_the_one_error_type_naming_what_to_do(model, case):
    call, words = CASES[case]
    with pytest.raises(lh.InputError, match=words):
        call(model)
