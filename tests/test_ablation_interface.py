"""One ablation interface (``lens_heads.evaluation.ablation_interface``): every ablation lens_heads builds is an
``Ablation`` (a sweep's unit a ``UnitAblation``), a new kind is one subclass that the evaluator runs like the pairs
it holds, objects of other classes with ``.hooks`` still run, and nothing past the interface asks an ablation what it
can do."""

import ast
import contextlib
from pathlib import Path

import numpy as np
import pytest

from conftest import LOGLIK_TOL, text_model
from lens_heads.ablation.hooks import input_zeroing, static_zeroing, threshold_zeroing, zero_heads
from lens_heads.ablation.random_draws import random_zeroing
from lens_heads.ablation.removed_layers import remove_layers
from lens_heads.ablation.stacked import stack_ablations
from lens_heads.data.custom_tasks import task_from_records
from lens_heads.evaluation.ablation_interface import Ablation, UnitAblation
from lens_heads.evaluation.evaluate import evaluate
from lens_heads.harness.model_args import build_hooks, parse_ablation

PACKAGE = Path(__file__).resolve().parents[1] / "lens_heads"
MEMBERS = ("hooks", "batch", "copies", "units", "reads_rows", "zeroed_by_input", "share_zeroed", "snapshot",
           "restore", "per_input", "counts_inputs", "cache_exact")  # the interface's members an object could be probed for
RECORDS = [dict(context=f"Question {q}: which one{' here' * q}?", choices=[f" option {c}" for c in "abc"], gold=q % 3)
           for q in range(4)]


@pytest.fixture(scope="module")
def model():
    return text_model(n_layers=2)


@pytest.fixture(scope="module")
def task():
    return task_from_records(RECORDS, name="cloze")


def test_every_ablation_lens_heads_builds_is_one(model, task):
    units = [static_zeroing(model, [(0, 1)]), threshold_zeroing(model, "AHON (LN)", 0.5),
             random_zeroing(model, 0.3), random_zeroing(model, 0.3, draw="per_row"),
             input_zeroing(model, [[(0, 0)]] * len(RECORDS)), remove_layers(model, [1], part="block")]
    for args in (dict(ablation="random:0.2"), dict(heads="1.1;"), dict(layers="1")):
        units.append(build_hooks(parse_ablation(**args), model, task)[0])
    for unit in units:
        assert isinstance(unit, UnitAblation), unit
    # whether generation may keep a key/value cache under it: all but the threshold zeroing act on each position alone
    assert [unit.cache_exact for unit in units] == [True, False, True, True, True, True, True, True, True]
    stacked = stack_ablations([None, units[0]])
    assert isinstance(stacked, Ablation) and not isinstance(stacked, UnitAblation)
    assert list(stacked.units) == [None, units[0]] and units[0].units is None


def test_a_new_kind_of_ablation_is_one_subclass_and_runs_as_its_pairs(model, task):
    class Pairs(Ablation):
        """Only ``hooks``: every other member keeps the base class's meaning."""

        def __init__(self, pairs):
            self.pairs = pairs

        @property
        def hooks(self):
            return self.pairs

    pairs = zero_heads([(0, 1), (1, 2)])
    own = evaluate(model, task, hooks=Pairs(pairs), batch_size=2, progress=False)
    plain = evaluate(model, task, hooks=pairs, batch_size=2, progress=False)
    for a, b in zip(own.items, plain.items, strict=True):
        np.testing.assert_allclose(a.logprobs, b.logprobs, **LOGLIK_TOL)
    assert len(own.meta["hooks"]) == 1 and "Pairs object" in own.meta["hooks"][0]  # no description: its repr


def test_an_object_of_another_class_with_hooks_is_told_each_batch(model, task):
    class Counter:
        """Not an Ablation: a ``.hooks`` list and a ``batch`` that records the input ids it is told."""

        def __init__(self):
            self.hooks = zero_heads([(0, 0)])
            self.seen: list[int] = []

        def batch(self, attention_mask, inputs=None, **kw):
            self.seen += list(inputs)
            return contextlib.nullcontext()

    counter = Counter()
    evaluate(model, task, hooks=[counter], batch_size=2, progress=False, _shared_prefixes=False)
    assert sorted(set(counter.seen)) == list(range(len(RECORDS)))  # every item told, rows of one item alike


def test_nothing_past_the_interface_probes_an_ablation():
    """hasattr/getattr on an interface member's name only in ``ablation_interface`` (its door for other classes)."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "ablation_interface.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                    node.func.id in ("hasattr", "getattr") and len(node.args) >= 2 and \
                    isinstance(node.args[1], ast.Constant) and node.args[1].value in MEMBERS:
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.func.id}(..., {node.args[1].value!r})")
    assert not found, found
