"""Intervals for a sweep's summaries, paired across its curves, and paired tests between two curves.

A sweep's summaries (:mod:`lens_heads.stats.curves`: the normalised AUC of accuracy and of the paired KL, the KL at a
share of heads zeroed, "% of heads zeroable within 1 point" by both rules, and each curve's rank) are functions of
the evaluated items: every point's accuracy and KL is a mean over items, and so is its realised share of heads
zeroed (triples zeroed over the items' rows). :func:`sweep_intervals` resamples the items once per bootstrap
replicate for every curve (:func:`lens_heads.stats.inference.bootstrap_items`), recomputes every summary and rank from the
resampled items with the same functions as the point estimates, and gives percentile intervals. Differences
between curves are taken replicate by replicate (paired), and tested by a paired permutation test that swaps each
item's outcomes under the two curves (:func:`lens_heads.stats.inference.permutation_p_value`).

Units recorded without per-item zeroing counts hold their realised share at its full-sample value in the
bootstrap (``meta`` says so) and are refused by the permutation test, which must test the quantity whose interval
is reported. Verdicts follow the one calling rule (:mod:`lens_heads.stats.calling`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import pandas as pd
from jaxtyping import Float, Int

from lens_heads.evaluation.results import paired_values
from lens_heads.plumbing.errors import InputError
from lens_heads.stats import calling, curves
from lens_heads.stats import inference as stats

SUMMARIES = {
    "accuracy_auc": "normalised AUC of accuracy over realised % zeroed (%), higher is better",
    "kl_auc": "normalised AUC of the paired KL(unablated || ablated) over realised % zeroed (nats), lower is better",
    "zeroable_authors": "% of heads zeroable within {points:g} point(s), authors' rule (last crossing, 0 if none)",
    "zeroable_censored": "% of heads zeroable within {points:g} point(s), censored rule (end of range if no drop)",
}
TESTED = ("accuracy_auc", "kl_auc", "zeroable_authors")  # the summaries a sweep tests curve against curve
HIGHER_IS_BETTER = {"accuracy_auc": True, "kl_auc": False, "zeroable_authors": True, "zeroable_censored": True}
RANKED = ("accuracy_auc", "kl_auc")


def kl_at(share: float) -> str:
    """The summary name of the paired KL interpolated at ``share`` % of heads zeroed."""
    return f"kl_at_{share:g}pct"


# ---------------------------------------------------------------- per-item data of the curves


@dataclass(frozen=True)
class CurveItems:
    """One curve's per-item outcomes at each of its points, the unablated baseline first, in target order."""

    name: str
    target: Float[np.ndarray, "point"]
    correct: Float[np.ndarray, "point item"]
    kl: Float[np.ndarray, "point item"]
    zeroed: Float[np.ndarray, "point item"] | None  # triples zeroed per item; None: realised shares held fixed
    realised: Float[np.ndarray, "point"]  # % over all items

    def resampled(self, idx: Int[np.ndarray, "rep item"], rows: np.ndarray, n_heads: int):
        """(x = realised %, accuracy %, mean KL), each [point, rep], on the items ``idx`` picks."""
        accuracy = 100 * self.correct[:, idx].mean(-1)
        kl = self.kl[:, idx].mean(-1)
        if self.zeroed is None:
            x = np.broadcast_to(self.realised[:, None], accuracy.shape)
        else:
            x = 100 * self.zeroed[:, idx].sum(-1) / (rows[idx].sum(-1) * n_heads)
        return x, accuracy, kl

    def paired_with(self, other: "CurveItems") -> "CurveItems":
        """Both curves' items side by side (slot ``i`` this curve's item ``i``, ``n + i`` the other's), for a
        permutation test: each slot keeps its own zeroing count, so either side of a permutation has the realised
        share of the items it holds, and the unpermuted sides are the two curves as the bootstrap sees them. The two
        must share their points' targets and record per-item zeroing counts (without them a curve's realised share
        on a permuted half of the items is unknown, and holding it fixed would test another statistic)."""
        if self.target.shape != other.target.shape or not np.allclose(self.target, other.target):
            raise InputError(f"{self.name!r} and {other.name!r} were measured at different target shares "
                             f"({self.target.tolist()} vs {other.target.tolist()}): a paired test needs the same")
        missing = [c.name for c in (self, other) if c.zeroed is None]
        if missing:
            raise InputError(untestable_message(missing))
        assert self.zeroed is not None and other.zeroed is not None
        return CurveItems(self.name, self.target, np.concatenate([self.correct, other.correct], 1),
                          np.concatenate([self.kl, other.kl], 1), np.concatenate([self.zeroed, other.zeroed], 1),
                          self.realised)


def untestable_message(curves: Sequence[str]) -> str:
    """Why curves recorded without per-item zeroing counts get no permutation test, and what to do."""
    return (f"{list(curves)} recorded no per-item zeroing counts (units written before lens_heads kept them), so a "
            "permutation test cannot keep each curve's realised share of heads zeroed: re-record the sweep (run_sweep "
            "with a new out_dir, or delete the old units there) to test it; its intervals stay available")


def curve_items(sweep, mode: str = curves.SCORES_AND_RANDOM) -> tuple[list[CurveItems], np.ndarray, int]:
    """The curves of ``mode`` (``"threshold+random"``: the score curves and random) of a :class:`lens_heads.sweep.result.SweepResult` as
    per-item arrays, the rows each item ran (one per choice for cloze tasks) and the heads per row (layers x
    heads)."""
    base = sweep.baseline
    ids = [it.id for it in base.items]
    rows = np.array([len(it.logprobs) for it in base.items], dtype=float)
    out = []
    for name, units in sweep.curves(mode).items():
        units = sorted(units, key=lambda u: u.target_fraction)
        correct, kl, zeroed = [], [], []
        for u in units:
            by_id = {it.id: it for it in u.result.items}
            if set(by_id) != set(ids):
                raise InputError(f"unit {u.key} was evaluated on other items than the baseline: resample needs the "
                                 "same items at every point")
            values = paired_values([(by_id[i], it) for i, it in zip(ids, base.items)], base.primary)
            correct.append([float(by_id[i].correct(base.primary)) for i in ids])
            kl.append(values["kl"])
            zeroed.append(_zeroed(u, len(ids)))
        have = all(z is not None for z in zeroed)
        out.append(CurveItems(name, np.array([u.target_fraction for u in units]), np.array(correct), np.array(kl),
                              np.array(zeroed) if have else None,
                              np.array([100 * u.realised_fraction for u in units])))
    return out, _recorded_rows(sweep, mode, rows), heads_per_row(sweep) if any(c.zeroed is not None for c in out) else 0


def _recorded_rows(sweep, mode: str, rows: np.ndarray) -> np.ndarray:
    """The rows each item's zeroing was counted over, as the units record them (``item_zeroed``: [rows, triples]),
    which is the denominator of their realised share; the baseline's choices where no unit records it. A forward
    pass may run fewer rows than an item has choices, so the choices are not the denominator to use."""
    recorded = {tuple(r for r, _ in u.item_zeroed) for units in sweep.curves(mode).values() for u in units
                if u.mode != "baseline" and u.item_zeroed is not None}
    if len(recorded) > 1:
        raise InputError("the sweep's units record different rows per item: their realised shares do not share a "
                         "denominator")
    return np.array(recorded.pop(), dtype=float) if recorded else rows


def _zeroed(unit, n: int) -> np.ndarray | None:
    if unit.mode == "baseline":
        return np.zeros(n)
    return None if unit.item_zeroed is None else np.array([z for _, z in unit.item_zeroed], dtype=float)


def heads_per_row(sweep) -> int:
    """Layers x heads of the sweep's model: the (row, layer, head) triples a row can have zeroed."""
    model = (sweep.meta.get("fingerprint") or {}).get("model") or {}
    if not model.get("n_layers") or not model.get("n_heads"):
        share = next((u.head_share for u in sweep.units if u.head_share), None)
        if share is None:
            raise InputError("the sweep records neither its model's shape nor a unit's head shares")
        return len(share) * len(share[0])
    return int(model["n_layers"]) * int(model["n_heads"])


# ---------------------------------------------------------------- the summaries of one replicate


def summarise(data: CurveItems, idx: np.ndarray, rows: np.ndarray, n_heads: int, *, points: float,
              shares: Sequence[float]) -> Float[np.ndarray, "summary rep"]:
    """Every summary of one curve (in the order of :func:`summary_names`) on each resample of items in ``idx``,
    computed by the functions of :mod:`lens_heads.stats.curves` that give the point estimates."""
    x, accuracy, kl = data.resampled(idx, rows, n_heads)
    out = np.empty((4 + len(shares), idx.shape[0]))
    for b in range(idx.shape[0]):
        xb, ab, kb = x[:, b], accuracy[:, b], kl[:, b]
        base = ab[0]
        out[0, b] = curves.normalised_auc(xb, ab)
        out[1, b] = curves.normalised_auc(xb, kb)
        out[2, b] = curves.zeroable_within(xb, ab, base, points, rule="authors")
        out[3, b] = curves.zeroable_within(xb, ab, base, points, rule="censored")
        for s, share in enumerate(shares):
            out[4 + s, b] = curves.value_at(xb, kb, share)
    return out


def summary_names(shares: Sequence[float]) -> list[str]:
    return list(SUMMARIES) + [kl_at(s) for s in shares]


def replicate_ranks(values: Float[np.ndarray, "curve rep"], higher_is_better: bool) -> np.ndarray:
    """Per replicate (columns), the rank of each curve (rows) by the one rank rule (:func:`lens_heads.stats.
    inference.ranks`: 1 = best, ties averaged, NaN last)."""
    return stats.ranks(values, higher_is_better, axis=0)


# ---------------------------------------------------------------- the result


@dataclass(frozen=True)
class SweepIntervals:
    """Every curve's summaries with percentile intervals from one bootstrap over items, paired across curves.

    ``estimates``/``low``/``high``: [quantity, curve]; ``replicates``: [quantity, curve, replicate]; the quantities
    are ``summaries`` followed by the ranks ``rank_<summary>`` of :data:`RANKED`."""

    curves: tuple[str, ...]
    quantities: tuple[str, ...]
    estimates: np.ndarray
    low: np.ndarray
    high: np.ndarray
    replicates: np.ndarray
    meta: dict
    data: tuple = field(repr=False, compare=False, default=())  # (curve items, rows, heads) for the tests

    def interval(self, curve: str, quantity: str) -> stats.Interval:
        q, c = self._index(quantity, curve)
        return stats.Interval(float(self.estimates[q, c]), float(self.low[q, c]), float(self.high[q, c]))

    def to_dataframe(self) -> pd.DataFrame:
        """One row per curve: each quantity with ``_low`` and ``_high``."""
        rows = []
        for c, curve in enumerate(self.curves):
            row = {"curve": curve}
            for q, name in enumerate(self.quantities):
                row[name], row[f"{name}_low"], row[f"{name}_high"] = (self.estimates[q, c], self.low[q, c],
                                                                      self.high[q, c])
            rows.append(row)
        return pd.DataFrame(rows)

    def difference(self, a: str, b: str, summary: str, *, n_permutations: int | None = None) -> dict:
        """Curve ``a`` minus curve ``b`` in ``summary``: the paired bootstrap interval (the replicates' differences),
        a two-sided p-value from a paired permutation test of the same statistic over items, and the verdict of the
        calling rule (:mod:`lens_heads.stats.calling`) with this test as its own family; a table of several tests
        adjusts their p-values together (:meth:`versus`, :func:`lens_heads.stats.calling.call_table`). A curve
        recorded without per-item zeroing counts is not tested (``test_note`` says how to re-record it)."""
        return self.differences([(a, b, summary)], n_permutations=n_permutations).iloc[0].to_dict()

    def versus(self, reference: str = "random", summaries: Sequence[str] = ("accuracy_auc", "kl_auc"), *,
               n_permutations: int | None = None) -> pd.DataFrame:
        """Every other curve against ``reference`` (a curve name, or ``"best"``: per summary the curve with the best
        estimate) in each of ``summaries``, with paired intervals, permutation p-values, Benjamini-Hochberg adjusted
        p-values over the table's tests and the calling rule's verdicts."""
        pairs = []
        for summary in summaries:
            ref = self.best(summary) if reference == "best" else reference
            pairs += [(c, ref, summary) for c in self.curves if c != ref]
        return self.differences(pairs, n_permutations=n_permutations)

    def differences(self, pairs: Sequence[tuple[str, str, str]], *, n_permutations: int | None = None
                    ) -> pd.DataFrame:
        """One row per ``(a, b, summary)`` of ``pairs`` as :meth:`difference` gives it, the rows one family: their
        p-values adjusted together and called by the one rule."""
        return calling.call_table(pd.DataFrame([self._difference(a, b, summary, n_permutations)
                                                for a, b, summary in pairs]))

    def _difference(self, a: str, b: str, summary: str, n_permutations: int | None) -> dict:
        if summary.startswith("rank_") or summary not in self.quantities:
            raise InputError(f"unknown summary {summary!r}: choose one of "
                             f"{[q for q in self.quantities if not q.startswith('rank_')]}")
        q, ia = self._index(summary, a)
        _, ib = self._index(summary, b)
        interval = stats.percentile_interval(self.estimates[q, ia] - self.estimates[q, ib],
                                             self.replicates[q, ia] - self.replicates[q, ib], self.meta["confidence"])
        untestable = self.untestable(a, b)
        # nothing to test where a curve does not reach a share (no value there) or lacks per-item zeroing counts
        testable = np.isfinite(interval.estimate) and not untestable
        p = self._p_value(ia, ib, q, n_permutations or self.meta["n_resamples"]) if testable else float("nan")
        return dict(a=a, b=b, summary=summary, difference=interval.estimate, low=interval.low, high=interval.high,
                    p_value=p, higher_is_better=HIGHER_IS_BETTER.get(summary, False),  # a KL at a share: lower
                    test_note=untestable_message(untestable) if untestable else "")

    def best(self, summary: str) -> str:
        """The curve with the best estimate of ``summary`` (NaN last)."""
        q, _ = self._index(summary, self.curves[0])
        values = self.estimates[q]
        signed = np.where(np.isnan(values), -np.inf, values if HIGHER_IS_BETTER.get(summary, False) else -values)
        return self.curves[int(np.argmax(signed))]

    def untestable(self, *curves: str) -> list[str]:
        """Those of ``curves`` recorded without per-item zeroing counts: no permutation test can be run on them."""
        items = self.data[0]
        return [c for c in curves if items[self._index(self.quantities[0], c)[1]].zeroed is None]

    def _index(self, quantity: str, curve: str) -> tuple[int, int]:
        if quantity not in self.quantities:
            raise InputError(f"unknown summary {quantity!r}: choose one of {list(self.quantities)}")
        if curve not in self.curves:
            raise InputError(f"unknown curve {curve!r}: this sweep has {list(self.curves)}")
        return self.quantities.index(quantity), self.curves.index(curve)

    def permuted_difference(self, a: str, b: str, summary: str):
        """The statistic the permutation test of ``a`` against ``b`` in ``summary`` permutes
        (:func:`paired_statistic`); unpermuted, it is the bootstrap's estimate of the difference."""
        q, ia = self._index(summary, a)
        _, ib = self._index(summary, b)
        items, rows, n_heads = self.data
        return paired_statistic(items[ia], items[ib], rows, rows, n_heads, q, points=self.meta["points"],
                                shares=self.meta["shares"])

    def _p_value(self, ia: int, ib: int, q: int, n_permutations: int) -> float:
        difference = self.permuted_difference(self.curves[ia], self.curves[ib], self.quantities[q])
        n = len(self.data[1])
        observed = float(difference(np.arange(n)[None], np.arange(n, 2 * n)[None])[0])
        estimate = float(self.estimates[q, ia] - self.estimates[q, ib])
        if not np.isclose(observed, estimate, rtol=1e-9, atol=1e-9):  # the test must be of the reported quantity
            raise RuntimeError(f"the permutation test of {self.curves[ia]!r} vs {self.curves[ib]!r} in "
                               f"{self.quantities[q]} would test {observed} while the interval is of {estimate}")
        return stats.permutation_p_value(difference, n, n_resamples=n_permutations, seed=self.meta["seed"])


def paired_statistic(a: CurveItems, b: CurveItems, rows_a: np.ndarray, rows_b: np.ndarray, n_heads: int, q: int, *,
                     points: float, shares: Sequence[float]):
    """``f(sa, sb)``: per permutation (rows of ``sa``/``sb``), summary ``q`` of the items in slots ``sa`` minus that
    of the items in slots ``sb``, slot ``i`` being curve ``a``'s item ``i`` and ``n + i`` curve ``b``'s
    (:meth:`CurveItems.paired_with`); ``rows_a``/``rows_b``: the rows each item's zeroing was counted over."""
    pair = a.paired_with(b)
    both_rows = np.concatenate([rows_a, rows_b])

    def difference(sa, sb):
        return (summarise(pair, sa, both_rows, n_heads, points=points, shares=shares)[q]
                - summarise(pair, sb, both_rows, n_heads, points=points, shares=shares)[q])

    return difference


def sweep_intervals(sweep, *, points: float = 1.0, shares: Sequence[float] | None = None,
                    n_resamples: int = stats.N_RESAMPLES, seed: int = 0, confidence: float = stats.CONFIDENCE,
                    mode: str = curves.SCORES_AND_RANDOM) -> SweepIntervals:
    """Intervals for every curve's summaries and ranks of a :class:`lens_heads.sweep.result.SweepResult` (see the module
    docstring). ``shares``: the shares of heads zeroed (fractions) at which the KL is read (default: the sweep's target
    shares)."""
    items, rows, n_heads = curve_items(sweep, mode)
    if not items:
        raise InputError(f"the sweep has no curve of mode {mode!r}")
    stats.check_items(len(rows))
    if shares is None:
        shares = [p for p in sweep.meta.get("fractions", []) if p > 0]
    for share in shares:
        curves.check_share(share, "intervals(shares=...)")
    shares = [100 * float(s) for s in shares]  # the curves' x axis: realised % of heads zeroed
    names = summary_names(shares)

    def statistic(idx):
        per_curve = np.stack([summarise(c, idx, rows, n_heads, points=points, shares=shares) for c in items], 1)
        ranks = [replicate_ranks(per_curve[names.index(s)], HIGHER_IS_BETTER[s]) for s in RANKED]
        return np.concatenate([per_curve, np.stack(ranks)], 0).reshape(-1, idx.shape[0])

    boot = stats.bootstrap_items(statistic, len(rows), n_resamples=n_resamples, seed=seed, confidence=confidence)
    quantities = tuple(names + [f"rank_{s}" for s in RANKED])
    shape = (len(quantities), len(items))
    meta = dict(boot.meta(), points=points, shares=shares, mode=mode, summaries={
        **{k: v.format(points=points) for k, v in SUMMARIES.items()},
        **{kl_at(s): f"paired KL at {s:g}% of heads zeroed (interpolated; NaN where a curve does not reach it)"
           for s in shares},
        **{f"rank_{s}": f"rank among the curves by {s}, 1 = best, ties averaged" for s in RANKED}},
        realised_share=("resampled with the items (per-item zeroing counts)" if all(c.zeroed is not None
                                                                                    for c in items)
                        else "held at the full-sample value for curves recorded without per-item zeroing counts"),
        paired_test=stats.PERMUTATION, calling_rule=calling.RULE)
    return SweepIntervals(curves=tuple(c.name for c in items), quantities=quantities,
                          estimates=boot.estimates.reshape(shape), low=boot.low.reshape(shape),
                          high=boot.high.reshape(shape), replicates=boot.replicates.reshape(*shape, -1), meta=meta,
                          data=(items, rows, n_heads))

