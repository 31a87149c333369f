"""The one rule by which lens_heads calls A different from B, and the words it says it in.

A paired comparison of A and B on the same items has two tests: the percentile-bootstrap interval of the difference
A − B (items resampled, :func:`lens_heads.stats.inference.bootstrap_items`) and the paired permutation test's
two-sided p-value (each item's two outcomes swapped, :func:`lens_heads.stats.inference.permutation_p_value`),
Benjamini-Hochberg adjusted over the table the comparison appears in. A difference is **called** only where both
call it: the interval excludes 0 and the adjusted p is below :data:`ALPHA`. Where exactly one of them calls it, the
verdict is that the two tests disagree (no claim); where neither does, that the data cannot tell A and B apart; a
comparison without a p-value (nothing to permute, or a quantity no permutation test was run for) is not tested.

Every table of differences (:func:`call_table`), every report line and every rendered sentence (:func:`sentence`)
takes its verdict and its wording from here, so no two places can call the same difference by different rules.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pandas as pd
from jaxtyping import Float

from lens_heads.stats import inference
from lens_heads.stats.inference import Interval, adjusted_p_values

ALPHA = 0.05
RULE = (f"a difference is called only where its paired 95% bootstrap interval excludes 0 and its paired permutation "
        f"p-value, Benjamini-Hochberg adjusted within its table, is below {ALPHA:g}; where one of the two calls it "
        "and the other does not, the two tests disagree; otherwise the data cannot tell the two apart")

HIGHER, LOWER = "higher", "lower"
CANNOT_TELL = "cannot tell apart"
DISAGREE = "the two tests disagree"
NOT_TESTED = "not tested"
UNCALLED = (CANNOT_TELL, DISAGREE, NOT_TESTED)


def call(low: float, high: float, p_adjusted: float, alpha: float = ALPHA) -> str:
    """The rule on one difference A − B: ``"higher"``/``"lower"`` (called, by its sign), :data:`CANNOT_TELL`,
    :data:`DISAGREE` or :data:`NOT_TESTED` (no p-value or no interval)."""
    if any(v is None or not math.isfinite(v) for v in (low, high, p_adjusted)):
        return NOT_TESTED
    by_interval = low > 0 or high < 0
    by_p = p_adjusted < alpha
    if by_interval and by_p:
        return HIGHER if low > 0 else LOWER
    return DISAGREE if by_interval or by_p else CANNOT_TELL


def verdict(low: float, high: float, p_adjusted: float, *, higher_is_better: bool | None, a: str = "a",
            b: str = "b", alpha: float = ALPHA) -> str:
    """:func:`call` in words: ``"<a> better"``/``"<b> better"`` where a direction is better, else ``"higher"``/
    ``"lower"`` (of A − B); the uncalled verdicts as :func:`call` says them."""
    called = call(low, high, p_adjusted, alpha)
    if called in UNCALLED or higher_is_better is None:
        return called
    return f"{a} better" if (called == HIGHER) == higher_is_better else f"{b} better"


def call_table(table: pd.DataFrame, *, alpha: float = ALPHA) -> pd.DataFrame:
    """``table`` (one comparison a row: ``difference``, ``low``, ``high``, ``p_value``, ``higher_is_better`` (True,
    False or None: no better direction); ``a`` and ``b`` name the sides where it has them) with ``p_adjusted``
    (Benjamini-Hochberg over its rows: the table is the family) and ``verdict`` by the rule. Tables put together
    from others are called again as a whole."""
    out = table.copy()
    if not len(out):
        return out.assign(p_adjusted=pd.Series(dtype=float), verdict=pd.Series(dtype=str))
    out["p_adjusted"] = adjusted_p_values(out["p_value"].to_numpy(dtype=float))
    out["verdict"] = [verdict(r["low"], r["high"], r["p_adjusted"], higher_is_better=_direction(r["higher_is_better"]),
                              a=str(r.get("a", "a")), b=str(r.get("b", "b")), alpha=alpha)
                      for r in out.to_dict("records")]
    return out


def paired_tests(x: Float[np.ndarray, "row item"], y: Float[np.ndarray, "row item"], labels: Sequence,
                 higher_is_better: bool | None, *, n_resamples: int = inference.N_RESAMPLES, seed: int = 0,
                 **describe) -> pd.DataFrame:
    """Per row, mean(x - y) over the same items with its paired bootstrap interval and a paired permutation p-value
    (each item's two values swapped at random), called by the rule over these rows (``describe``: columns every row
    carries, e.g. ``a=``/``b=`` naming the sides)."""
    boot = inference.mean_intervals(x - y, n_resamples=n_resamples, seed=seed)
    out = []
    for r, label in enumerate(labels):
        both = np.concatenate([x[r], y[r]])
        p = inference.permutation_p_value(lambda sa, sb: both[sa].mean(-1) - both[sb].mean(-1), x.shape[1],
                                          n_resamples=n_resamples, seed=seed)
        out.append(dict(describe, k=label, difference=float(boot.estimates[r]), low=float(boot.low[r]),
                        high=float(boot.high[r]), p_value=p, higher_is_better=higher_is_better, n=x.shape[1],
                        method=inference.BOOTSTRAP))
    return call_table(pd.DataFrame(out))


def _direction(value) -> bool | None:
    """A table's ``higher_is_better`` cell: a bool, or None/NaN (pandas turns None into NaN in a mixed column)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return bool(value)


def sentence(row: dict, what: str, spec: str = ".2f", *, lower_is_better: bool = False) -> str:
    """One comparison of a :func:`call_table` row in words: the verdict, the difference A − B with its interval,
    and the p-values it rests on. ``lower_is_better``: the quantity is a cost (a KL), said as "costs less than"."""
    a, b = row["a"], row["b"]
    diff = Interval(row["difference"], row["low"], row["high"]).format(spec)
    p = _p_text(row)
    v = row["verdict"]
    if v == CANNOT_TELL:
        return f"the data cannot tell {a} and {b} apart by {what}: difference {diff} ({p})."
    if v == DISAGREE:
        holds = "excludes" if row["low"] > 0 or row["high"] < 0 else "holds"
        return (f"the two tests disagree on {a} against {b} by {what}, so no difference is claimed: the interval of "
                f"the difference {diff} {holds} 0, {p}.")
    if v == NOT_TESTED:
        return f"{a} against {b} by {what} is not tested: difference {diff}; {_untested_because(row)}."
    if v in (HIGHER, LOWER):  # a change with no better direction (a setting against another)
        return f"{a} is {v} than {b} by {what}: difference ({a} − {b}) {diff} ({p})."
    winner = a if v == f"{a} better" else b
    loser = b if winner == a else a
    verb = "costs less than" if lower_is_better else "beats"
    return f"{winner} {verb} {loser} by {what}: difference ({a} − {b}) {diff} ({p})."


def _untested_because(row: dict) -> str:
    """Why a comparison has no verdict: its recorded note, else which of the two tests is missing."""
    note = row.get("test_note")
    if isinstance(note, str) and note:
        return note
    p = row.get("p_value")
    if p is None or not math.isfinite(p):
        return "no permutation p-value"
    return "no bootstrap interval"


def _p_text(row: dict) -> str:
    p, adjusted = row.get("p_value", float("nan")), row.get("p_adjusted", float("nan"))
    if adjusted is None or not math.isfinite(adjusted) or math.isclose(adjusted, p):
        return f"p = {p:.2g}"
    return f"p = {p:.2g}, {adjusted:.2g} adjusted"
