"""Intervals and paired tests of sweep summaries, on synthetic sweeps whose true differences are known."""

import math
from dataclasses import replace

import numpy as np
import pytest
from scipy import stats as sps

from lens_heads.plumbing.errors import InputError
from lens_heads.stats import curves
from lens_heads.stats import inference as stats
from lens_heads.sweep.result import SweepResult
from synthetic_sweeps import TARGETS, kl_of, synthetic_sweep


def expected_kl_auc(levels) -> float:
    x = [0.0] + [100 * p for p in TARGETS]
    y = [0.0] + [np.mean([kl_of(lv * p / 0.1) for lv in levels]) for p in TARGETS]
    return curves.normalised_auc(x, y)


def test_point_estimates_equal_the_sweep_summaries_and_shares_resample_with_the_items():
    sweep = synthetic_sweep(np.random.default_rng(0), 40, {"A": (0.1, 0.5), "B": (0.3, 1.5), "random": (1, 3)},
                            zeroed=True)
    iv = sweep.intervals(n_resamples=200)
    for curve in ("A", "B", "random"):
        assert iv.interval(curve, "kl_auc").estimate == pytest.approx(sweep.normalised_auc(metric="kl")[curve])
        assert iv.interval(curve, "accuracy_auc").estimate == pytest.approx(sweep.normalised_auc()[curve])
        for rule, name in (("authors", "zeroable_authors"), ("censored", "zeroable_censored")):
            assert iv.interval(curve, name).estimate == pytest.approx(sweep.zeroable_within(rule=rule)[curve])
        assert iv.interval(curve, "kl_at_20pct").estimate == pytest.approx(sweep.at_share(0.2)[curve], nan_ok=True)
        for q in ("kl_auc", "rank_kl_auc"):
            i = iv.interval(curve, q)
            assert i.low <= i.estimate <= i.high
    assert iv.meta["realised_share"].startswith("resampled")
    # one replicate recomputed by hand: the realised share of the resampled items, the mean KL on them
    items, rows, heads = iv.data
    idx = np.random.default_rng(5).integers(0, 40, (1, 40))
    x, _, kl = items[0].resampled(idx, rows, heads)
    zeroed = np.array([[z for _, z in u.item_zeroed] for u in sweep.curves()["A"][1:]])
    assert x[1:, 0] == pytest.approx(100 * zeroed[:, idx[0]].sum(1) / (2 * 40 * heads))
    assert kl[1:, 0] == pytest.approx([np.mean([kl_of(-(it.logprobs[0])) for it in np.array(u.result.items)[idx[0]]])
                                       for u in sweep.curves()["A"][1:]])
    # ranks: lower KL is better, so A (smallest drops) ranks first in the estimate
    assert iv.interval("A", "rank_kl_auc").estimate == 1 and iv.interval("random", "rank_kl_auc").estimate == 3


@pytest.mark.slow
def test_the_paired_interval_covers_the_true_difference_in_about_95_percent_of_seeds():
    levels = {"A": (0.1, 0.9), "B": (0.3, 1.2)}
    truth = expected_kl_auc(levels["A"]) - expected_kl_auc(levels["B"])
    covered = []
    for seed in range(100):
        sweep = synthetic_sweep(np.random.default_rng(seed), 60, levels)
        d = sweep.intervals(n_resamples=300, seed=seed).difference("A", "B", "kl_auc", n_permutations=50)
        covered.append(d["low"] <= truth <= d["high"])
    assert 0.88 <= np.mean(covered) <= 0.995


@pytest.mark.slow
def test_curves_of_one_distribution_give_uniform_p_values_and_identical_curves_no_difference():
    p_values = []
    for seed in range(100):
        sweep = synthetic_sweep(np.random.default_rng(100 + seed), 40, {"A": (0.2, 1.0), "B": (0.2, 1.0)})
        p_values.append(sweep.intervals(n_resamples=20, seed=seed).difference("A", "B", "kl_auc",
                                                                              n_permutations=199)["p_value"])
    assert sps.kstest(p_values, "uniform").pvalue > 0.001
    assert 0.0 <= np.mean(np.array(p_values) < 0.05) <= 0.12

    rng = np.random.default_rng(7)
    sweep = synthetic_sweep(rng, 30, {"A": (0.2, 1.0)})
    twin = [replace(u, spec={**u.spec, "score": "A2"}) for u in sweep.units if u.score == "A"]
    sweep = SweepResult(sweep.baseline, sweep.units + twin, dict(sweep.meta, scores=["A", "A2"]))
    d = sweep.difference("A", "A2", "kl_auc", n_resamples=100)
    assert (d["difference"], d["low"], d["high"], d["verdict"]) == (0.0, 0.0, 0.0, "cannot tell apart")
    assert d["p_value"] == 1.0


def test_a_real_difference_is_claimed_and_a_table_against_random_and_the_best():
    sweep = synthetic_sweep(np.random.default_rng(1), 80, {"A": (0.05, 0.1), "B": (0.1, 0.2), "random": (1, 3)})
    iv = sweep.intervals(n_resamples=300)
    d = iv.difference("A", "random", "kl_auc", n_permutations=199)
    assert d["verdict"] == "A better" and d["high"] < 0 and d["p_value"] <= 0.01  # the smallest p 199 permutations give
    table = iv.versus("random", ["kl_auc"], n_permutations=99)
    assert list(table["a"]) == ["A", "B"] and (table["verdict"] != "cannot tell apart").all()
    assert (table["p_adjusted"] >= table["p_value"]).all()
    best = iv.versus("best", ["kl_auc"], n_permutations=99)
    assert set(best["b"]) == {iv.best("kl_auc")} == {"A"}


def test_bad_requests_are_explained():
    sweep = synthetic_sweep(np.random.default_rng(2), 10, {"A": (0.1, 0.2), "random": (1, 2)})
    iv = sweep.intervals(n_resamples=20)
    with pytest.raises(ValueError, match="unknown summary 'auc'"):
        iv.difference("A", "random", "auc")
    with pytest.raises(ValueError, match="unknown curve 'AHON'"):
        iv.difference("AHON", "random", "kl_auc")
    with pytest.raises(ValueError, match="at least 2 items"):
        synthetic_sweep(np.random.default_rng(2), 1, {"A": (0.1, 0.2)}).intervals()


def test_rank_statistics_are_scipys_with_ties_and_constants():
    x = np.array([3.0, 1.0, 2.0, 2.0, 5.0])
    y = np.array([1.0, 0.0, 4.0, 2.0, 3.0])
    assert stats.average_ranks(x).tolist() == [4.0, 1.0, 2.5, 2.5, 5.0]
    rx, ry = stats.average_ranks(x), stats.average_ranks(y)
    assert stats.spearman(x, y) == pytest.approx(np.corrcoef(rx, ry)[0, 1])
    concordant = sum(np.sign(x[i] - x[j]) * np.sign(y[i] - y[j]) for i in range(5) for j in range(i + 1, 5))
    pairs_x = sum(x[i] != x[j] for i in range(5) for j in range(i + 1, 5))
    assert stats.kendall(x, y) == pytest.approx(concordant / math.sqrt(pairs_x * 10))
    assert math.isnan(stats.spearman(np.ones(4), np.arange(4.0)))


def test_realised_shares_use_the_rows_the_units_recorded_not_the_choices():
    """Each item has two choices, but its zeroing is counted over the rows the forward ran (recorded in
    ``item_zeroed``, here one): the full-sample estimates must equal the sweep's own summaries."""
    sweep = synthetic_sweep(np.random.default_rng(3), 30, {"A": (0.1, 0.5), "random": (1, 3)}, zeroed=True)
    for u in sweep.units:
        if u.item_zeroed is not None:
            u.item_zeroed = [[1, z] for _, z in u.item_zeroed]
            u.realised_fraction = sum(z for _, z in u.item_zeroed) / (30 * 10)
    iv = sweep.intervals(n_resamples=50)
    for curve in ("A", "random"):
        for rule, name in (("authors", "zeroable_authors"), ("censored", "zeroable_censored")):
            assert iv.interval(curve, name).estimate == pytest.approx(sweep.zeroable_within(rule=rule)[curve])
        assert iv.interval(curve, "kl_auc").estimate == pytest.approx(sweep.normalised_auc(metric="kl")[curve])


def test_a_curve_mode_selects_only_its_own_curves():
    sweep = synthetic_sweep(np.random.default_rng(0), 10, {"A": (0.1, 0.5), "B": (0.3, 1.5), "random": (1, 3)})
    modes = {u.mode for u in sweep.units}
    assert {"threshold", "random"} <= modes
    assert set(sweep.curves("threshold")) == {"A", "B"}
    assert set(sweep.curves("random")) == {"random"}
    assert list(sweep.curves()) == list(sweep.curves("threshold+random")) == ["A", "B", "random"]
    assert set(sweep.to_dataframe()["curve"]) == {"A", "B", "random"}
    for units in sweep.curves("threshold").values():
        assert all(u.mode in ("baseline", "threshold") for u in units)
    with pytest.raises(InputError, match="threshold\\+random"):
        sweep.curves("thresholds")
