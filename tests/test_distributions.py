"""Thresholds, CDF, per-layer summaries and cross-data rank correlation, checked by explicit computations."""

import math

import numpy as np
import pytest
import torch

from lens_heads.heads.distributions import (
    layer_summary,
    pooled_cdf,
    rank_correlation,
    spearman,
    thresholds,
)
from lens_heads.heads.scores import DIRECTION, SCORE_NAMES, inactive
from lens_heads.heads.scoring import HeadScores
from lens_heads.plumbing.errors import InputError

FRACTIONS = (0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3)


def fake_scores(n=7, L=5, H=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return HeadScores(values=torch.rand(n, L, H, 12, generator=g), names=list(SCORE_NAMES), direction=dict(DIRECTION),
                      meta={})


def linear_quantile(sorted_values, q):
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (pos - lo) * (sorted_values[hi] - sorted_values[lo])


@pytest.mark.parametrize("name", ["AHON (LN)", "AWFT"])
def test_thresholds_put_the_target_share_on_the_inactive_side(name):
    s = fake_scores()
    pooled = sorted(s.score(name).reshape(-1).tolist())
    N = len(pooled)
    t = thresholds(s, name, FRACTIONS)
    assert list(t) == list(FRACTIONS)
    for p, threshold in t.items():
        q = p if DIRECTION[name] == "<" else 1 - p
        assert threshold == pytest.approx(linear_quantile(pooled, q), abs=1e-12)
        share = inactive(s.score(name), DIRECTION[name], threshold).float().mean().item()
        assert abs(share - p) <= 1 / N + 1e-9
        assert pooled_cdf(s, name).inactive_fraction(threshold) == pytest.approx(share)
    assert inactive(s.score(name), DIRECTION[name], t[0]).sum() == 0  # p = 0 zeroes nothing


def test_awft_threshold_reads_the_upper_tail():
    values = torch.arange(100, dtype=torch.float32).reshape(100, 1, 1, 1).expand(100, 1, 1, 12).clone()
    s = HeadScores(values=values, names=list(SCORE_NAMES), direction=dict(DIRECTION), meta={})
    assert thresholds(s, "AWFT", [0.1])[0.1] == pytest.approx(89.1)  # (1 - 0.1) * 99
    assert thresholds(s, "AHON", [0.1])[0.1] == pytest.approx(9.9)


def test_cdf_and_bad_inputs():
    s = fake_scores()
    cdf = pooled_cdf(s, "AEQD")
    x = s.score("AEQD").reshape(-1).numpy()
    for probe in (0.1, 0.5, 0.9):
        assert cdf(probe) == pytest.approx((x <= probe).mean())
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        thresholds(s, "AEQD", [1.5])
    with pytest.raises(InputError, match="no score"):
        thresholds(s, "NOPE", [0.1])
    s.values[0, 0, 0, SCORE_NAMES.index("AEQD")] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        thresholds(s, "AEQD", [0.1])


def test_layer_summary_matches_numpy():
    s = fake_scores()
    df = layer_summary(s, ["AVVN"])
    assert len(df) == 5
    for layer in range(5):
        v = s.score("AVVN")[:, layer].reshape(-1).double().numpy()
        row = df[df["layer"] == layer].iloc[0]
        assert row["mean"] == pytest.approx(v.mean()) and row["std"] == pytest.approx(v.std(ddof=1))
        assert row["q50"] == pytest.approx(np.median(v)) and row["max"] == pytest.approx(v.max())
        assert row["n"] == 7 * 6


def test_spearman_matches_the_no_ties_formula():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=40), rng.normal(size=40)
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    d2 = ((ra - rb) ** 2).sum()
    assert spearman(a, b) == pytest.approx(1 - 6 * d2 / (40 * (40 ** 2 - 1)))
    assert spearman(a, a ** 3) == pytest.approx(1.0)
    assert spearman(a, -a) == pytest.approx(-1.0)


def test_stability_of_identical_and_reversed_data():
    a = fake_scores(seed=1)
    same = HeadScores(values=a.values.flip(0).clone(), names=a.names, direction=a.direction, meta={})  # same means
    reversed_ = HeadScores(values=-a.values, names=a.names, direction=a.direction, meta={})
    assert rank_correlation(a, same, "AHON") == pytest.approx(1.0)
    assert rank_correlation(a, reversed_, "AHON") == pytest.approx(-1.0)
