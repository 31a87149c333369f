"""How many items would the calling rule need to call a recorded difference? A bootstrap power analysis.

The recorded items stand for the population (the bootstrap's premise): a study of ``n`` items is simulated by
drawing ``n`` of them with replacement, and on each such draw the rule of :mod:`lens_heads.stats.calling` is run
as the records run it: the percentile-bootstrap interval over the draw's items
(:func:`lens_heads.stats.inference.bootstrap_items`) and the paired permutation p-value
(:func:`lens_heads.stats.inference.permutation_p_value`). The power at ``n`` is the share of draws in which the
difference is called in the direction it has on all the recorded items; :func:`items_needed` finds the smallest
``n`` whose power reaches the target (80% by default) by doubling, then bisecting.

The p-value is not adjusted for the other tests of a table (Benjamini-Hochberg raises the bar of each test by up to
the family's size), so the ``n`` found is a lower bound on what a table's verdict needs. Power simulated on the
recorded items carries their sampling error: an observed difference near 0 gives a large and uncertain ``n``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd

from lens_heads.plumbing.errors import InputError
from lens_heads.stats import calling, inference

TARGET = 0.8
METHOD = ("bootstrap power: n items drawn with replacement from the recorded ones, the calling rule's two tests "
          "(percentile bootstrap interval, paired permutation p, unadjusted alpha) on each draw; power = share of "
          "draws called in the recorded direction; smallest n reaching the target by doubling then bisection")

# difference(sa, sb) -> [rows]: per row, the statistic of the items in slots ``sa`` minus that of slots ``sb``,
# slot i being item i under condition A and n_items + i under B (as inference.permutation_p_value takes it)
PairedDifference = Callable[[np.ndarray, np.ndarray], np.ndarray]


@dataclass(frozen=True)
class Power:
    """The smallest number of items at which the rule calls the difference with the target power (None: not within
    ``n_max``), and the power found at each size tried."""

    observed: float
    n_recorded: int
    n_needed: int | None
    target: float
    n_max: int
    sizes: tuple[int, ...]
    rates: tuple[float, ...]
    n_draws: int
    n_resamples: int
    seed: int

    @property
    def power_at_recorded(self) -> float:
        """The power at the recorded number of items, where it was tried (NaN otherwise)."""
        return dict(zip(self.sizes, self.rates)).get(self.n_recorded, float("nan"))

    def to_dataframe(self) -> pd.DataFrame:
        """One row per size tried: its power."""
        return pd.DataFrame(dict(n=self.sizes, power=self.rates))

    def to_dict(self) -> dict:
        return dict(observed=self.observed, n_recorded=self.n_recorded, n_needed=self.n_needed, target=self.target,
                    n_max=self.n_max, power_at_recorded=self.power_at_recorded, n_draws=self.n_draws,
                    n_resamples=self.n_resamples, seed=self.seed, method=METHOD,
                    tried=";".join(f"{n}:{r:.2f}" for n, r in sorted(zip(self.sizes, self.rates))))


def _local(draw: np.ndarray, n_items: int) -> Callable[[np.ndarray], np.ndarray]:
    """Slots of a draw's own paired layout (i: its item i under A, n + i under B) as slots of the recorded items."""
    n = draw.size
    return lambda slots: np.where(slots < n, draw[slots % n], draw[slots % n] + n_items)


def called_on(difference: PairedDifference, draw: np.ndarray, n_items: int, *, n_resamples: int, seed: int,
              confidence: float = inference.CONFIDENCE, alpha: float = calling.ALPHA) -> str:
    """The rule's call (:func:`lens_heads.stats.calling.call`) on the recorded items ``draw`` (indices, repeats
    allowed) as one study: its bootstrap interval and its permutation p-value."""
    n = draw.size
    to_global = _local(draw, n_items)
    boot = inference.bootstrap_items(lambda idx: difference(to_global(idx), to_global(idx + n))[None], n,
                                     n_resamples=n_resamples, seed=seed, confidence=confidence)
    p = inference.permutation_p_value(lambda sa, sb: difference(to_global(sa), to_global(sb)), n,
                                      n_resamples=n_resamples, seed=seed)
    return calling.call(float(boot.low[0]), float(boot.high[0]), p, alpha)


def power_at(difference: PairedDifference, n_items: int, n: int, *, direction: str, n_draws: int = 100,
             n_resamples: int = 200, seed: int = 0, confidence: float = inference.CONFIDENCE,
             alpha: float = calling.ALPHA) -> float:
    """Share of ``n_draws`` studies of ``n`` items (drawn with replacement from the ``n_items`` recorded) in which
    the rule calls the difference ``direction`` (``"higher"``/``"lower"``)."""
    if n < 2:
        raise InputError(f"a study needs at least 2 items, got n={n}")
    rng = np.random.default_rng(seed)
    hits = 0
    for d in range(n_draws):
        draw = rng.integers(0, n_items, size=n)
        hits += called_on(difference, draw, n_items, n_resamples=n_resamples, seed=seed + 1 + d,
                          confidence=confidence, alpha=alpha) == direction
    return hits / n_draws


def items_needed(difference: PairedDifference, n_items: int, *, target: float = TARGET, n_max: int | None = None,
                 n_min: int = 8, n_draws: int = 100, n_resamples: int = 200, seed: int = 0, bisect_steps: int = 4,
                 confidence: float = inference.CONFIDENCE, alpha: float = calling.ALPHA,
                 progress: Callable[[int, float], None] | None = None) -> Power:
    """The smallest number of items whose power (:func:`power_at`) reaches ``target``, for the difference
    ``difference`` recorded on ``n_items`` items: sizes double from ``n_min`` until the power reaches the target
    (or ``n_max``, default 64 times the recorded items, is passed: ``n_needed`` None), then ``bisect_steps``
    bisections between the last size short of it and the first that reaches it. Power grows with ``n`` only up to
    the draws' noise (±``sqrt(p(1-p)/n_draws)``), so ``n_needed`` is as precise as that allows. The recorded
    items' own size is always tried (``power_at_recorded``)."""
    if not 0 < target < 1:
        raise InputError(f"target power must lie in (0, 1), got {target}")
    inference.check_items(n_items)
    n_max = n_max or 64 * n_items
    items = np.arange(n_items)
    observed = float(np.asarray(difference(items[None], items[None] + n_items)).reshape(-1)[0])
    if not np.isfinite(observed):
        raise InputError("the recorded difference is undefined (NaN): there is nothing to power")
    direction = calling.HIGHER if observed > 0 else calling.LOWER
    tried: dict[int, float] = {}

    def rate(n: int) -> float:
        if n not in tried:
            tried[n] = power_at(difference, n_items, n, direction=direction, n_draws=n_draws,
                                n_resamples=n_resamples, seed=seed, confidence=confidence, alpha=alpha)
            if progress is not None:
                progress(n, tried[n])
        return tried[n]

    rate(n_items)
    needed: int | None = None
    if observed != 0:
        low, n = 0, max(2, n_min)
        while n <= n_max and rate(n) < target:
            low, n = n, 2 * n
        if n <= n_max or rate(n_max) >= target:
            high = min(n, n_max)
            for _ in range(bisect_steps):
                if high - low <= 1:
                    break
                mid = (low + high) // 2
                if mid >= 2 and rate(mid) >= target:
                    high = mid
                else:
                    low = mid
            needed = high
    sizes = tuple(sorted(tried))
    return Power(observed=observed, n_recorded=n_items, n_needed=needed, target=target, n_max=n_max, sizes=sizes,
                 rates=tuple(tried[n] for n in sizes), n_draws=n_draws, n_resamples=n_resamples, seed=seed)


def analytic_items(effect: float, sd: float, *, target: float = TARGET, alpha: float = calling.ALPHA) -> float:
    """The normal approximation's items for a paired mean difference ``effect`` with per-item standard deviation
    ``sd`` at two-sided level ``alpha``: ((z_{1-alpha/2} + z_target) sd / effect)^2."""
    from scipy import stats

    return float(((stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(target)) * sd / effect) ** 2)
