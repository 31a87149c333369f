"""The paper's Table 2 over several sweeps (models x tasks): AWFT's % of heads zeroable within 1 point beside the
best other curve's, with the Average row and, where the sweeps kept per-item records, intervals and paired tests."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pandas as pd

from lens_heads.plumbing.errors import InputError
from lens_heads.stats import calling, inference
from lens_heads.sweep.intervals import untestable_message
from lens_heads.sweep.result import SweepResult


def table2(sweeps: Sequence[SweepResult], points: float = 1.0, *, n_resamples: int | None = None, seed: int = 0,
           average: bool = True):
    """The paper's Table 2 over several sweeps (models x tasks): per sweep, AWFT's % zeroable within ``points``
    beside the best other curve's (random included), authors' rule; with ``n_resamples``, intervals and the paired
    test of AWFT against the best for every sweep with per-item records (:meth:`SweepResult.table2`). ``average``:
    the paper's last row, ``model="Average"``: the mean of each column over the sweeps (the best curve may differ
    from row to row), with 95% intervals where every sweep has per-item records (the mean of the sweeps'
    bootstrap replicates, which resample each sweep's own items) and the paired test of the mean difference.

    The table is one family, as the calling rule states: every row's p-value (the Average row's included) is
    Benjamini-Hochberg adjusted within it (``p_adjusted``) and its verdict decided from its own interval and that
    adjusted p."""
    ivs = [sweep.intervals(points, n_resamples=n_resamples, seed=seed)
           if n_resamples and isinstance(sweep, SweepResult) else None for sweep in sweeps]
    rows = [sweep.table2(points, intervals=iv) for sweep, iv in zip(sweeps, ivs)]
    keys = [(r["model"], r["task"]) for r in rows]
    if len(set(keys)) != len(keys):
        raise InputError(f"two sweeps of the same model and task in {keys}: give one sweep per (model, task)")
    if average and rows:
        rows.append(average_row(rows, ivs))
    return adjusted_within(pd.DataFrame(rows))


def adjusted_within(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with ``p_adjusted``, its rows' p-values Benjamini-Hochberg adjusted together, and each tested row's
    verdict decided again by the calling rule from its interval and adjusted p (AWFT against that row's best)."""
    if "p_value" not in table:
        return table
    out = table.copy()
    out["p_adjusted"] = inference.adjusted_p_values(out["p_value"].to_numpy(dtype=float))
    for i in out.index[np.isfinite(out["p_adjusted"].to_numpy(dtype=float))]:
        r = out.loc[i]
        out.at[i, "verdict"] = calling.verdict(r["difference_low"], r["difference_high"], r["p_adjusted"],
                                               higher_is_better=True, a="AWFT", b=r["best_score"] or "best")
    return out


def average_row(rows: list[dict], intervals: Sequence | None = None) -> dict:
    """Table 2's Average row: the mean over ``rows`` of AWFT's and of the best curve's % zeroable, and of their
    difference; with every row's ``intervals``, the percentile intervals of those means from the mean of the rows'
    bootstrap replicates (replicate r of each sweep averaged), and the mean difference's permutation p-value (every
    sweep's items swapped independently) with the calling rule's verdict, the row its own test."""
    awft, best = [r["awft_pct"] for r in rows], [r["best_pct"] for r in rows]
    row: dict[str, Any]
    row = dict(model="Average", task=f"{len(rows)} sweeps", awft_pct=float(np.mean(awft)), best_score="",
               best_pct=float(np.mean(best)), difference=float(np.mean(np.subtract(awft, best))))
    if intervals is None or any(iv is None or "AWFT" not in iv.curves for iv in intervals):
        return row
    reps: dict[str, list[np.ndarray]] = {"awft": [], "best": []}
    for r, iv in zip(rows, intervals):
        q = iv.quantities.index("zeroable_authors")
        reps["awft"].append(iv.replicates[q, iv.curves.index("AWFT")])
        reps["best"].append(iv.replicates[q, iv.curves.index(r["best_score"])])
    if len({len(x) for x in reps["awft"]}) != 1:
        return row  # sweeps resampled a different number of times: no common replicates to average
    mean = {k: np.mean(np.stack(v), 0) for k, v in reps.items()}
    confidence = intervals[0].meta.get("confidence", inference.CONFIDENCE)
    for name, estimate, replicates in (("awft", row["awft_pct"], mean["awft"]), ("best", row["best_pct"], mean["best"]),
                                       ("difference", row["difference"], mean["awft"] - mean["best"])):
        i = inference.percentile_interval(estimate, replicates, confidence)
        row[f"{name}_low"], row[f"{name}_high"] = i.low, i.high
    return {**row, **_average_test(row, rows, intervals)}


def _average_test(row: dict, rows: list[dict], intervals: Sequence) -> dict:
    """The paired permutation test of the Average row's difference AWFT - best, called by the rule."""
    untestable = [f"{r['task']}: {c}" for r, iv in zip(rows, intervals) for c in iv.untestable("AWFT", r["best_score"])]
    if untestable:
        return dict(p_value=float("nan"), verdict=calling.NOT_TESTED, test_note=untestable_message(untestable))
    p = inference.grouped_permutation_p_value(
        [iv.permuted_difference("AWFT", r["best_score"], "zeroable_authors") for r, iv in zip(rows, intervals)],
        [len(iv.data[1]) for iv in intervals], n_resamples=intervals[0].meta["n_resamples"],
        seed=intervals[0].meta["seed"])
    verdict = calling.verdict(row["difference_low"], row["difference_high"], p, higher_is_better=True, a="AWFT",
                              b="best")
    return dict(p_value=p, verdict=verdict, test_note="")
