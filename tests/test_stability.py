"""Score stability across tasks: the statistics against hand computations and scipy on tiny cases."""

import numpy as np
import pytest
import torch
from scipy import stats

from lens_heads.heads.scoring import HeadScores
from lens_heads.heads.stability import (
    CLAIM_STATISTICS,
    item_values,
    jaccard,
    most_inactive_mask,
    spearman_rows,
    stability,
)
from lens_heads.plumbing.errors import InputError
from lens_heads.stats.calling import CANNOT_TELL

NAMES = ["AHON (LN)", "AWFT"]
DIRECTION = {"AHON (LN)": "<", "AWFT": ">"}


def head_scores(values, row_items=None):
    """HeadScores of [row, layer, head, score] values for NAMES."""
    meta = {"data": {"row_items": list(row_items)}} if row_items is not None else {}
    return HeadScores(values=torch.as_tensor(values, dtype=torch.float64), names=list(NAMES), direction=dict(DIRECTION),
                      meta=meta)


def test_spearman_rows_is_scipys_spearman_ties_included():
    rng = np.random.default_rng(0)
    a = rng.integers(0, 5, size=(3, 20)).astype(float)  # many ties
    b = a + rng.integers(0, 3, size=(3, 20))
    got = spearman_rows(a, b)
    for r in range(3):  # the same average ranks and Pearson: equal to float64 rounding
        assert got[r] == pytest.approx(stats.spearmanr(a[r], b[r]).statistic, abs=1e-12)
    assert np.isnan(spearman_rows(np.ones(4), np.arange(4.0)))  # a constant side has no correlation


def test_most_inactive_respects_direction_and_jaccard_counts_by_hand():
    means = np.array([0.5, 0.1, 0.9, 0.3, 0.7])
    assert most_inactive_mask(means, "<", 2).tolist() == [False, True, False, True, False]  # 0.1 and 0.3
    assert most_inactive_mask(means, ">", 2).tolist() == [False, False, True, False, True]  # 0.9 and 0.7
    a = np.array([True, True, False, False])
    b = np.array([False, True, True, False])
    assert jaccard(a, b) == pytest.approx(1 / 3)  # {1} of {0, 1, 2}
    assert np.isnan(jaccard(np.zeros(3, bool), np.zeros(3, bool)))
    with pytest.raises(InputError, match="direction"):
        most_inactive_mask(means, "=", 1)


def test_item_values_average_each_items_rows():
    values = np.arange(5 * 1 * 2 * 2, dtype=float).reshape(5, 1, 2, 2)
    got = item_values(head_scores(values, row_items=[7, 7, 3, 3, 3]), NAMES)
    assert got.shape == (2, 1, 2, 2)
    np.testing.assert_allclose(got[0], values[:2].mean(0))  # item 7 first: it appears first
    np.testing.assert_allclose(got[1], values[2:].mean(0))
    np.testing.assert_allclose(item_values(head_scores(values), NAMES), values)  # no row_items: a row is an item


def tiny_tasks():
    """Two tasks, 2 layers x 3 heads, 2 items each; AHON (LN) values chosen so the hand ranks below hold."""
    ahon_a = np.array([[1, 2, 3], [4, 5, 6]], float)      # per-head means on task a (both items equal)
    ahon_b = np.array([[2, 1, 3], [4, 6, 5]], float)      # two swaps within layers
    awft_a = np.array([[6, 5, 4], [3, 2, 1]], float)
    awft_b = np.array([[1, 2, 3], [4, 5, 6]], float)      # reversed
    def task(ahon, awft, spread):
        v = np.stack([ahon, awft], -1)[None].repeat(2, 0)
        v[0] -= spread
        v[1] += spread  # item means stay the per-head values above
        return head_scores(v)
    return {"a": task(ahon_a, awft_a, 0.1), "b": task(ahon_b, awft_b, 0.2)}


def test_point_statistics_by_hand():
    result = stability(tiny_tasks(), names=NAMES, fraction=2 / 6, claims=(), n_resamples=50)
    pairs = result.to_dataframe("pairs").set_index("score")
    ahon, awft = pairs.loc["AHON (LN)"], pairs.loc["AWFT"]
    # AHON (LN) over 6 heads: rank differences 1, 1, 0, 0, 1, 1 -> 1 - 6*4/(6*35)
    assert ahon.spearman_heads == pytest.approx(1 - 6 * 4 / (6 * 35), abs=1e-12)
    # within layers (3 heads): layer 0 d = 1, 1, 0 -> 1 - 6*2/(3*8) = 0.5; layer 1 the same -> mean 0.5
    assert ahon.spearman_within_layers == pytest.approx(0.5, abs=1e-12)
    assert ahon.spearman_layers == pytest.approx(1.0, abs=1e-12)  # 2 layer means, in the same order
    # k = 2 lowest heads: a {(0,0), (0,1)}, b {(0,1), (0,0)} -> identical
    assert ahon.jaccard == pytest.approx(1.0) and result.k == 2
    assert awft.spearman_heads == pytest.approx(-1.0, abs=1e-12)
    assert awft.spearman_within_layers == pytest.approx(-1.0, abs=1e-12)
    # AWFT is ">": the 2 highest heads: a {(0,0), (0,1)}, b {(1,2), (1,1)} -> disjoint
    assert awft.jaccard == 0.0
    layers = result.to_dataframe("layers")
    assert layers[layers.score == "AHON (LN)"].spearman.tolist() == pytest.approx([0.5, 0.5], abs=1e-12)


def test_intervals_cover_the_estimate_and_resample_items():
    result = stability(tiny_tasks(), names=NAMES, fraction=2 / 6, claims=(), n_resamples=200)
    ok = np.isfinite(result.low)
    assert ok.any()
    assert (result.low[ok] <= result.estimates[ok] + 1e-12).all() and (result.estimates[ok] <= result.high[ok] + 1e-12).all()


def noisy_tasks(n_tasks=5, n_items=40, seed=0):
    """AHON (LN) has a fixed head profile plus small item noise on every task; AWFT a new profile per task."""
    rng = np.random.default_rng(seed)
    profile = rng.normal(size=(4, 5))
    sets = {}
    for t in range(n_tasks):
        ahon = profile + 0.3 * rng.normal(size=(n_items, 4, 5))
        awft = rng.normal(size=(4, 5)) + 0.3 * rng.normal(size=(n_items, 4, 5))
        sets[f"t{t}"] = head_scores(np.stack([ahon, awft], -1))
    return sets


def test_a_stable_score_is_called_more_stable_than_an_unstable_one():
    result = stability(noisy_tasks(), names=NAMES, fraction=0.2, n_resamples=1100)  # >= 2^10: exact permutations
    tests = result.to_dataframe("tests").set_index("statistic")
    assert list(tests.index) == list(CLAIM_STATISTICS)
    row = tests.loc["spearman_heads"]
    pairs = result.to_dataframe("pairs")
    by_hand = (pairs[pairs.score == "AHON (LN)"].spearman_heads.to_numpy()
               - pairs[pairs.score == "AWFT"].spearman_heads.to_numpy()).mean()
    assert row.difference == pytest.approx(by_hand, abs=1e-12) and row.n_pairs == 10
    assert row.low > 0 and row.verdict == "AHON (LN) better"
    # the exact sign-flip test over 10 pairs, all differences positive: p = 2 / 2^10
    assert row.p_value == pytest.approx(2 / 1024)


def test_equally_stable_scores_are_not_told_apart():
    sets = noisy_tasks()
    # AWFT's inactive side is ">": the negated values pick the same heads and rank them alike
    same = {t: head_scores(np.stack([s.values[..., 0], -s.values[..., 0]], -1)) for t, s in sets.items()}
    tests = stability(same, names=NAMES, fraction=0.2, n_resamples=200).to_dataframe("tests")
    assert (tests.difference.abs() < 1e-12).all() and (tests.verdict == CANNOT_TELL).all()


def test_bad_inputs_say_what_to_do():
    sets = tiny_tasks()
    with pytest.raises(InputError, match="at least two tasks"):
        stability({"a": sets["a"]}, names=NAMES)
    with pytest.raises(InputError, match="fraction"):
        stability(sets, names=NAMES, fraction=0)
    other = head_scores(np.zeros((2, 3, 3, 2)))
    with pytest.raises(InputError, match="different shapes"):
        stability({"a": sets["a"], "c": other}, names=NAMES)
    nan = head_scores(np.full((2, 2, 3, 2), np.nan))
    with pytest.raises(InputError, match="non-finite"):
        stability({"a": sets["a"], "n": nan}, names=NAMES)
