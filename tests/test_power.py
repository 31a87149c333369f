"""The bootstrap power analysis against the normal approximation on a paired difference of known size."""

import numpy as np
import pytest

from lens_heads.plumbing.errors import InputError
from lens_heads.stats.power import analytic_items, items_needed, power_at


def paired_mean(a, b):
    """difference(sa, sb) of the mean of paired outcomes ``a`` (condition A) and ``b`` (condition B)."""
    both = np.concatenate([a, b])
    return lambda sa, sb: both[sa].mean(-1) - both[sb].mean(-1)


def test_items_needed_is_the_normal_approximations_n():
    rng = np.random.default_rng(1)
    d = rng.normal(0.3, 1.0, 600)  # per-item differences A - B
    diff = paired_mean(d, np.zeros_like(d))
    power = items_needed(diff, d.size, n_draws=100, n_resamples=200, seed=0, n_min=16)
    # the recorded items are the population: the analytic n of their own mean and sd
    expected = analytic_items(d.mean(), d.std())
    # tolerance: 100 draws give the power to +-0.04 near 80%, where it rises ~0.5% per item (~+-10% of n), and the
    # percentile interval and the 4-step bisection add a few items: 25% covers both
    assert power.n_needed == pytest.approx(expected, rel=0.25)
    assert power.observed == pytest.approx(d.mean(), abs=1e-12)
    assert power.power_at_recorded >= 0.95  # 600 items, ~7 times the needed n


def test_analytic_items_by_hand():
    # (1.959964 + 0.841621)^2 / 0.5^2 = 31.40
    assert analytic_items(0.5, 1.0) == pytest.approx((1.959964 + 0.841621) ** 2 / 0.25, rel=1e-5)


def test_no_difference_is_called_at_about_alpha_and_never_reaches_the_target():
    rng = np.random.default_rng(2)
    a = rng.normal(size=200)
    diff = paired_mean(a, a[::-1].copy())  # A and B the same values in another order: mean difference exactly 0
    with pytest.raises(InputError):
        power_at(diff, 200, 1, direction="higher")
    power = items_needed(diff, 200, n_draws=20, n_resamples=100, n_max=400)
    assert power.observed == pytest.approx(0, abs=1e-12) and power.n_needed is None


def test_bad_target_is_refused():
    with pytest.raises(InputError, match="target"):
        items_needed(paired_mean(np.ones(3), np.zeros(3)), 3, target=1.5)
