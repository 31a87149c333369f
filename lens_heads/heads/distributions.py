"""How head scores are distributed: per-layer summaries, the pooled empirical CDF, thresholds at target fractions
of heads, and the rank correlation of a score's per-head means on two data sets (the stability of every score across
tasks, with intervals and tests: :mod:`lens_heads.heads.stability`).

Thresholds follow the paper: pool every (input, layer, head) value of the unablated run into one empirical CDF and
read the threshold at the target fraction p; for a ">" score (AWFT) read the (1 - p) quantile. Quantiles
interpolate linearly between order statistics (numpy's default). A head is inactive when its value is strictly on
the inactive side (``lens_heads.heads.scores.inactive``), so p = 0 zeroes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence, cast

import numpy as np
import pandas as pd

from lens_heads.heads.scoring import HeadScores
from lens_heads.plumbing.errors import InputError, NonFiniteError
from lens_heads.stats.inference import spearman

SUMMARY_QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)


def direction_of(scores: HeadScores, name: str) -> str:
    """'<' or '>': the side of a threshold where a head counts as inactive."""
    if name not in scores.direction:
        raise InputError(f"no score {name!r} here: choose one of {scores.all_names}")
    return scores.direction[name]


def _pooled(scores: HeadScores, name: str) -> np.ndarray:
    values = scores.score(name).double().reshape(-1).numpy()
    if values.size == 0:
        raise InputError("no scores to pool: score at least one input")
    if not np.isfinite(values).all():  # a NaN has no place in a quantile or a CDF
        raise NonFiniteError(f"{name} has {int((~np.isfinite(values)).sum())} non-finite values (NaN or infinite), so "
                             "no threshold or distribution is computed from them; drop those inputs first")
    return values


@dataclass(frozen=True)
class EmpiricalCDF:
    """The pooled (input, layer, head) values of one score, sorted."""

    name: str
    direction: str
    values: np.ndarray

    def __call__(self, x: float) -> float:
        """Fraction of values <= x."""
        return float(np.searchsorted(self.values, x, side="right") / self.values.size)

    def quantile(self, q: float) -> float:
        return float(np.quantile(self.values, q))

    def inactive_fraction(self, threshold: float) -> float:
        """Fraction of pooled values strictly on the inactive side of ``threshold``."""
        if self.direction == "<":
            return float(np.searchsorted(self.values, threshold, side="left") / self.values.size)
        return float(1 - np.searchsorted(self.values, threshold, side="right") / self.values.size)


def pooled_cdf(scores: HeadScores, name: str) -> EmpiricalCDF:
    """The empirical CDF of one score over all (input, layer, head) values."""
    return EmpiricalCDF(name, direction_of(scores, name), np.sort(_pooled(scores, name)))


def thresholds(scores: HeadScores, name: str, fractions: float | Iterable[float]) -> dict[float, float]:
    """Threshold per target fraction p so that about p of the pooled values are on the inactive side.

    The p quantile for '<' scores and the (1 - p) quantile for '>' scores (AWFT). Ties can make the realised
    fraction differ from p: report ``EmpiricalCDF.inactive_fraction`` (or the realised share of an ablation).
    """
    fractions = [cast(float, fractions)] if np.isscalar(fractions) else list(cast(Iterable[float], fractions))
    bad = [p for p in fractions if not 0 <= p <= 1]
    if bad:
        raise InputError(f"fractions must lie in [0, 1], got {bad}")
    cdf = pooled_cdf(scores, name)
    return {float(p): cdf.quantile(p if cdf.direction == "<" else 1 - p) for p in fractions}


def layer_summary(scores: HeadScores, names: Sequence[str] | None = None) -> pd.DataFrame:
    """Per score and layer: mean, std, min, quantiles and max over all (input, head) values."""
    rows = []
    for name in names or scores.names:
        x = scores.score(name).double().numpy()  # [input, layer, head]
        for layer in range(x.shape[1]):
            v = x[:, layer].reshape(-1)
            row = dict(score=name, layer=layer, n=v.size, mean=v.mean(), std=v.std(ddof=1) if v.size > 1 else 0.0,
                       min=v.min(), max=v.max())
            row.update({f"q{round(q * 100):02d}": np.quantile(v, q) for q in SUMMARY_QUANTILES})
            rows.append(row)
    return pd.DataFrame(rows)


def rank_correlation(a: HeadScores, b: HeadScores, name: str) -> float:
    """Spearman correlation across heads of one score's per-head mean on two data sets (same model)."""
    if a.values.shape[1:3] != b.values.shape[1:3]:
        raise InputError("the two score sets come from models of different shapes")
    return spearman(a.mean(name).numpy(), b.mean(name).numpy())
