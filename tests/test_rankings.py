"""Rankings as pruning guides: the attribution order is the hand-written first-order effects sorted, the static and
per-input specs zero exactly the heads they name (against zero_heads item by item), a sweep restricted to some
of its items is the sweep of those items, and a recorded sweep joins the rankings only on the same baseline."""

import numpy as np
import pytest

from conftest import LOGLIK_TOL, text_model, tiny_tokenizer
from lens_heads.ablation.hooks import zero_heads
from lens_heads.data.items import Task
from lens_heads.data.tasks import load_task
from lens_heads.evaluation.evaluate import evaluate
from lens_heads.experiments.attribution import attribution_ranking, held_out
from lens_heads.experiments.effects import task_means
from lens_heads.sweep.rankings import Ranking, join_heldout, ranking_sweep
from lens_heads.sweep.run import run_sweep
from test_effects import hand_linearised, hand_logprobs, metrics_by_hand, one_layer, toy_task


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def hand_attribution_kl(model, task):
    """Per item and head of the one attention-only layer without norms: the KL between the intact answer
    distribution and the one with the head's hand-written first-order change of every choice's log-likelihood."""
    base = hand_logprobs(model, task)
    out = np.zeros((len(task), model.cfg.n_heads))
    for head in range(model.cfg.n_heads):
        linearised = hand_linearised(model, task, head)
        out[:, head] = metrics_by_hand([b + c for b, c in zip(base, linearised)], base, task)[:, 1]
    return out


@pytest.mark.floats
def test_attribution_ranking_sorts_the_hand_written_first_order_kl(tokenizer):
    model = one_layer(tokenizer, norm=None, seed=4)  # its heads' sizes are >= 10% of the largest apart
    task = toy_task()
    ranking = attribution_ranking(model, task, progress=False, batch_size=2)
    size = np.abs(hand_attribution_kl(model, task)).mean(0)
    assert np.diff(np.sort(size)).min() > 0.01 * size.max()  # heads differ: the order is not decided by ties
    assert [size[h] for _, h in ranking.order] == sorted(size.tolist())
    assert sorted(ranking.order) == [(0, h) for h in range(model.cfg.n_heads)]
    per_item = np.abs(hand_attribution_kl(model, task))
    for i, order in enumerate(ranking.effects.input_orders()):
        assert [per_item[i, h] for _, h in order] == pytest.approx(sorted(per_item[i].tolist()), abs=1e-9)
    assert ranking.cost()["items"] == len(task) and ranking.cost()["cpu_s"] > 0


def per_item_reference(model, task, heads_of, **kw):
    """Each item evaluated alone with ``heads_of(i)`` zeroed by zero_heads: what per-input zeroing must give."""
    records = []
    for i, item in enumerate(task):
        one = Task(name=task.name, split=task.split, shots=0, format=task.format, items=[item], n_total=1, seed=0)
        records += evaluate(model, one, hooks=zero_heads(heads_of(i), **kw), progress=False).items
    return records


@pytest.mark.floats
def test_static_and_per_input_units_zero_exactly_the_named_heads(tokenizer, tmp_path):
    from lens_heads.models.loading import tiny_model

    model = tiny_model("llama", seed=3, d_vocab=len(tokenizer), tokenizer=tokenizer)
    task = toy_task()
    L, H = model.cfg.n_layers, model.cfg.n_heads
    heads = [(layer, head) for layer in range(L) for head in range(H)]
    rng = np.random.default_rng(0)
    order = [heads[i] for i in rng.permutation(len(heads))]
    per_input = [[heads[i] for i in rng.permutation(len(heads))] for _ in task]
    means = task_means(model, task)
    rankings = [Ranking("fixed", order=order), Ranking("fixed, mean", order=order, ablation="mean"),
                Ranking("own", per_input=per_input)]
    sweep = ranking_sweep(model, task, rankings, fractions=(0.25, 0.5), means=means, out_dir=tmp_path,
                          progress=False)
    curves = sweep.keyed_curves("all")
    assert {k.label for k in curves} == {"fixed (static)", "fixed, mean (static)", "own (per input)"}
    for key, units in curves.items():
        for unit in units[1:]:
            k = round(unit.target_fraction * L * H)
            assert unit.realised_fraction == pytest.approx(k / (L * H))
            if key.score == "own":
                expected = per_item_reference(model, task, lambda i: per_input[i][:k])
            elif key.score == "fixed":
                expected = evaluate(model, task, hooks=zero_heads(order[:k]), progress=False).items
            else:
                expected = evaluate(model, task, hooks=zero_heads(order[:k], ablation="mean", means=means),
                                    progress=False).items
            for got, want in zip(unit.result.items, expected):  # other batches: float32 rounding
                np.testing.assert_allclose(got.logprobs, want.logprobs, **LOGLIK_TOL)
            assert any(not np.allclose(g.logprobs, b.logprobs, atol=1e-4)
                       for g, b in zip(unit.result.items, sweep.baseline.items))  # the zeroing did something
    again = ranking_sweep(model, task, rankings, fractions=(0.25, 0.5), means=means, out_dir=tmp_path,
                          progress=False)
    assert [u.result.items for u in again.units] == [u.result.items for u in sweep.units]


@pytest.mark.floats
def test_a_sweep_on_some_of_its_items_is_the_sweep_of_those_items(tmp_path):
    """Per-input zeroing decides per item, so the threshold and random units restricted to some items are those
    items' own evaluation, with the realised share of their zeroing; a recorded sweep joins rankings measured on
    the same items."""
    from lens_heads.heads.scoring import score_heads

    model = text_model(n_layers=2)
    task = load_task("piqa", n=6, seed=2)
    calibration = load_task("piqa", n=2, seed=2)
    rest = held_out(task, calibration)
    assert [it.id for it in rest] == [it.id for it in task if it.id not in {c.id for c in calibration}]
    scores = score_heads(model, task, progress=False)
    settings = dict(scores=["AHON (LN)"], fractions=(0, 0.25, 0.5), calibration=scores, random_baseline=False,
                    batch_size=4, progress=False)
    whole = run_sweep(model, task, **settings)
    sub = whole.on_items([it.id for it in rest])
    alone = run_sweep(model, rest, **settings)
    for a, b in zip(sub.units, alone.units):
        assert a.key == b.key and a.result.accuracy == b.result.accuracy
        assert a.realised_fraction == pytest.approx(b.realised_fraction)
        for x, y in zip(a.result.items, b.result.items):
            assert x.id == y.id
            np.testing.assert_allclose(x.logprobs, y.logprobs, **LOGLIK_TOL)
    assert any(u.realised_fraction > 0 for u in sub.units)

    order = [(layer, head) for layer in range(2) for head in range(model.cfg.n_heads)][::-1]
    measured = ranking_sweep(model, rest, [Ranking("reversed", order=order)], fractions=(0.25,), progress=False)
    joined = join_heldout(whole, measured)
    assert set(joined.curves("all")) == {"AHON (LN)", "reversed (static)"}
    for units in joined.curves("all").values():  # the recorded curve keeps the measured shares only
        assert [u.target_fraction for u in units] == [0.0, 0.25]
    intervals = joined.intervals(mode="all", n_resamples=50)
    assert set(intervals.curves) == {"AHON (LN)", "reversed (static)"}
    from lens_heads.models.loading import tiny_model

    another = tiny_model("llama", seed=1, n_layers=2, d_vocab=model.cfg.d_vocab, tokenizer=model.tokenizer,
                         default_prepend_bos=True, n_ctx=model.cfg.n_ctx)
    other = ranking_sweep(another, rest, [Ranking("r", order=order)], fractions=(0.25,), progress=False)
    with pytest.raises(ValueError, match="baselines differ"):
        join_heldout(whole, other)


def test_bad_input_says_what_to_do(tokenizer):
    from lens_heads.models.loading import tiny_model

    model = tiny_model("llama", seed=3, d_vocab=len(tokenizer), tokenizer=tokenizer)
    task = toy_task()
    empty = Task(name="empty", split="test", shots=0, format="cloze", items=[], n_total=0, seed=0)
    with pytest.raises(ValueError, match="calibration has no items"):
        attribution_ranking(model, empty)
    with pytest.raises(ValueError, match="none is left"):
        held_out(task, task)
    heads = [(layer, head) for layer in range(model.cfg.n_layers) for head in range(model.cfg.n_heads)]
    with pytest.raises(ValueError, match=r"lists 3 heads: give each of the model's"):
        ranking_sweep(model, task, [Ranking("short", order=heads[:3])], progress=False)
    with pytest.raises(ValueError, match=r"repeats heads \[\(0, 0\)\]"):
        ranking_sweep(model, task, [Ranking("twice", order=[heads[0]] + heads[:-1])], progress=False)
    with pytest.raises(ValueError, match="does not have"):
        ranking_sweep(model, task, [Ranking("far", order=heads[:-1] + [(99, 0)])], progress=False)
    with pytest.raises(ValueError, match="one per item"):
        ranking_sweep(model, task, [Ranking("own", per_input=[heads])], progress=False)
    with pytest.raises(ValueError, match="needs means="):
        ranking_sweep(model, task, [Ranking("m", order=heads, ablation="mean")], progress=False)
    with pytest.raises(ValueError, match="must have distinct names"):
        ranking_sweep(model, task, [Ranking("a", order=heads), Ranking("a", order=heads)], progress=False)
    with pytest.raises(ValueError, match="not both"):
        Ranking("both", order=heads, per_input=[heads])
