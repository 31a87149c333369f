"""Intervals and paired tests over items, through ``scipy.stats``: the one place lens_heads computes them.

Every summary of an evaluation (an AUC, a share of heads, a rank, a correlation) is a function of the items that
were evaluated, so its uncertainty is the items'. :func:`bootstrap_items` is a percentile bootstrap that resamples
the items once per replicate for every quantity computed from them (``scipy.stats.bootstrap`` with paired
resampling), so that differences between curves measured on the same items are paired. :func:`permutation_p_value`
tests a paired difference by swapping each item's two outcomes at random (``scipy.stats.permutation_test``).
Rank statistics are scipy's too (``spearmanr``, ``kendalltau`` tau-b, ``rankdata`` average ranks).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
from jaxtyping import Float, Int
from scipy import stats

from lens_heads.plumbing.errors import InputError

CONFIDENCE = 0.95
N_RESAMPLES = 2000
BOOTSTRAP = "percentile bootstrap over items (scipy.stats.bootstrap, paired resampling)"
PERMUTATION = "paired permutation test over items, two-sided (scipy.stats.permutation_test, permutation_type='samples')"

# statistic(idx) -> values: idx[b] is replicate b's resampled item indices; values[k, b] its k-th quantity
Statistic = Callable[[Int[np.ndarray, "replicate item"]], Float[np.ndarray, "k replicate"]]


@dataclass(frozen=True)
class Interval:
    """An estimate with its interval."""

    estimate: float
    low: float
    high: float

    def excludes(self, value: float = 0.0) -> bool:
        """Whether ``value`` lies outside the interval (a claim the data support); False where it is undefined."""
        return bool(self.low > value or self.high < value)

    def format(self, spec: str = ".2f") -> str:
        """``x [lo, hi]``."""
        return f"{self.estimate:{spec}} [{self.low:{spec}}, {self.high:{spec}}]"


@dataclass(frozen=True)
class Bootstrap:
    """Estimates of ``k`` quantities on all items, their bootstrap replicates and percentile intervals."""

    estimates: Float[np.ndarray, "k"]
    replicates: Float[np.ndarray, "k replicate"]
    low: Float[np.ndarray, "k"]
    high: Float[np.ndarray, "k"]
    n_items: int
    n_resamples: int
    seed: int
    confidence: float

    def meta(self) -> dict:
        return dict(method=BOOTSTRAP, n_items=self.n_items, n_resamples=self.n_resamples, seed=self.seed,
                    confidence=self.confidence)


def check_items(n_items: int) -> None:
    if n_items < 2:
        raise InputError(f"a bootstrap over items needs at least 2 items to resample, got {n_items}: evaluate more "
                         "items (n=...)")


def bootstrap_items(statistic: Statistic, n_items: int, *, n_resamples: int = N_RESAMPLES, seed: int = 0,
                    confidence: float = CONFIDENCE) -> Bootstrap:
    """Percentile bootstrap of the quantities ``statistic`` computes from a set of items: each replicate resamples
    the ``n_items`` items with replacement once, for every quantity. Equal ``seed`` and ``n_items`` give equal
    resamples, so two bootstraps of the same items (in the same order) are paired replicate by replicate."""
    check_items(n_items)
    if n_resamples < 1:
        raise InputError(f"n_resamples must be at least 1, got {n_resamples}")
    if not 0 < confidence < 1:
        raise InputError(f"confidence must lie in (0, 1), got {confidence}")
    items = np.arange(n_items)
    estimates = np.asarray(statistic(items[None]), dtype=float)[:, 0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # NaN replicates (a curve that misses a share) stay NaN
        res = stats.bootstrap((items,), lambda idx, axis=-1: statistic(np.atleast_2d(idx)), vectorized=True,
                              paired=True, method="percentile", n_resamples=n_resamples,
                              confidence_level=confidence, rng=np.random.default_rng(seed))
    replicates = np.asarray(res.bootstrap_distribution, dtype=float).reshape(len(estimates), -1)
    low, high = (np.asarray(v, dtype=float).reshape(-1) for v in res.confidence_interval)
    return Bootstrap(estimates, replicates, low, high, n_items, n_resamples, seed, confidence)


def mean_intervals(x: Float[np.ndarray, "row item"], *, n_resamples: int = N_RESAMPLES, seed: int = 0,
                   confidence: float = CONFIDENCE) -> Bootstrap:
    """The mean over items of each row of ``x`` with its percentile-bootstrap interval; equal ``seed`` and item
    count resample the same items, so intervals of different rows and calls are paired."""
    return bootstrap_items(lambda idx: x[:, idx].mean(-1), x.shape[1], n_resamples=n_resamples, seed=seed,
                           confidence=confidence)


def percentile_interval(estimate: float, replicates: np.ndarray, confidence: float = CONFIDENCE) -> Interval:
    """The percentile interval of a quantity derived from bootstrap replicates (a difference of two of them): the
    same interval ``scipy.stats.bootstrap(method='percentile')`` gives for that quantity on the same resamples."""
    alpha = (1 - confidence) / 2
    replicates = np.asarray(replicates, dtype=float)
    defined = replicates.size > 0 and np.isfinite(replicates).all()  # else undefined in some replicate: no interval
    low, high = np.percentile(replicates, [100 * alpha, 100 * (1 - alpha)]) if defined else (np.nan, np.nan)
    return Interval(float(estimate), float(low), float(high))


def permutation_p_value(statistic: Callable[[np.ndarray, np.ndarray], np.ndarray], n_items: int, *,
                        n_resamples: int = N_RESAMPLES, seed: int = 0) -> float:
    """Two-sided p-value of a paired difference: ``statistic(a, b)`` gets, per permutation (rows), the slot of
    each item on side a and side b, where slot ``i`` is item ``i``'s outcome under the first condition and
    ``n_items + i`` under the second, and returns the difference; each item's two slots are swapped at random."""
    check_items(n_items)
    items = np.arange(n_items)
    res = stats.permutation_test((items, items + n_items),
                                 lambda a, b, axis=-1: statistic(np.atleast_2d(a), np.atleast_2d(b)),
                                 permutation_type="samples", vectorized=True, n_resamples=n_resamples,
                                 alternative="two-sided", rng=np.random.default_rng(seed))
    return float(res.pvalue)


def grouped_permutation_p_value(statistics: Sequence[Callable[[np.ndarray, np.ndarray], np.ndarray]],
                                n_items: Sequence[int], *, n_resamples: int = N_RESAMPLES, seed: int = 0) -> float:
    """Two-sided p-value of the mean over groups of paired differences (Table 2's Average over sweeps): group
    ``g``'s ``statistics[g]`` takes slots as :func:`permutation_p_value` gives them for its own ``n_items[g]``
    items; every item of every group has its two outcomes swapped at random, independently."""
    if len(statistics) != len(n_items) or not statistics:
        raise InputError(f"give one statistic per group ({len(statistics)} statistics, {len(n_items)} groups)")
    for n in n_items:
        check_items(n)
    total, offsets = int(sum(n_items)), np.cumsum([0, *n_items])

    def local(slots: np.ndarray, g: int) -> np.ndarray:
        """Group ``g``'s items' slots in its own numbering: global slot i (side a) or total + i (side b) of its
        item i becomes i or n_items[g] + i."""
        mine = slots[:, offsets[g]:offsets[g + 1]]
        return np.where(mine < total, mine - offsets[g], mine - total - offsets[g] + n_items[g])

    def mean_of_groups(sa: np.ndarray, sb: np.ndarray) -> np.ndarray:
        return np.mean([f(local(sa, g), local(sb, g)) for g, f in enumerate(statistics)], axis=0)

    return permutation_p_value(mean_of_groups, total, n_resamples=n_resamples, seed=seed)


def adjusted_p_values(p: np.ndarray | Sequence[float]) -> np.ndarray:
    """Benjamini-Hochberg adjusted p-values (``scipy.stats.false_discovery_control``) for a family of tests; NaN
    stays NaN."""
    p = np.asarray(p, dtype=float)
    out = np.full_like(p, np.nan)
    ok = np.isfinite(p)
    if ok.any():
        out[ok] = stats.false_discovery_control(p[ok])
    return out


def average_ranks(values: np.ndarray | Sequence[float], decimals: int = 9, axis: int = -1) -> np.ndarray:
    """Ranks 1..n along ``axis``, smallest first; ties share the mean of the ranks they span. Values equal to
    ``decimals`` places tie: two curves with the same accuracies give AUCs that differ in the last bits through their
    x values."""
    return stats.rankdata(np.round(np.asarray(values, dtype=float), decimals), method="average", axis=axis)


def ranks(values: np.ndarray | Sequence[float], higher_is_better: bool, axis: int = -1) -> np.ndarray:
    """The one rank rule of lens_heads: 1 = best, ties averaged (:func:`average_ranks`), undefined (NaN) values
    last, along ``axis``. Point estimates and every bootstrap replicate are ranked by it, so a rank lies inside its
    own interval."""
    values = np.asarray(values, dtype=float)
    return average_ranks(np.where(np.isnan(values), np.inf, -values if higher_is_better else values), axis=axis)


def spearman(a: np.ndarray | Sequence[float], b: np.ndarray | Sequence[float]) -> float:
    """Spearman's rank correlation (average ranks for ties); NaN when either side is constant."""
    a, b = np.asarray(a, dtype=float).reshape(-1), np.asarray(b, dtype=float).reshape(-1)
    if a.shape != b.shape or a.size < 2:
        raise InputError(f"need two equally long samples of at least 2 values, got {a.size} and {b.size}")
    return float(spearman_columns(a[:, None], b[:, None])[0])


def spearman_columns(a: Float[np.ndarray, "n k"], b: Float[np.ndarray, "n k"]) -> Float[np.ndarray, "k"]:
    """:func:`spearman` of every column pair ``a[:, r]``, ``b[:, r]`` at once (the Pearson correlation of their
    average ranks); NaN where either column is constant."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape or a.ndim != 2 or a.shape[0] < 2:
        raise InputError(f"need two equally shaped [n, k] arrays with n >= 2, got {a.shape} and {b.shape}")
    ra, rb = (stats.rankdata(x, method="average", axis=0) for x in (a, b))
    ra, rb = ra - ra.mean(axis=0), rb - rb.mean(axis=0)
    norm = np.sqrt((ra * ra).sum(axis=0) * (rb * rb).sum(axis=0))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(norm > 0, (ra * rb).sum(axis=0) / norm, np.nan)


def kendall(a: np.ndarray | Sequence[float], b: np.ndarray | Sequence[float]) -> float:
    """Kendall's tau-b (ties handled); NaN when either side is constant."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(stats.kendalltau(np.asarray(a, dtype=float), np.asarray(b, dtype=float)).statistic)
