"""A sweep's result: its units (one evaluated ablation each) and the curves, summaries and tests read from them.

Each :class:`UnitResult` is one point (an ablation spec evaluated on the task); :class:`SweepResult` holds them all
with the shared unablated baseline and reads the paper's numbers off the curves (:mod:`lens_heads.stats.curves`):
"% of heads zeroable within 1 point" (the authors' rule or the censored one) and the normalised AUC, both on the
realised-% axis, Table 2's entry, and intervals over items (:mod:`lens_heads.sweep.intervals`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

import pandas as pd

from lens_heads.ablation import specs
from lens_heads.evaluation.results import EvalResult, paired_difference
from lens_heads.plumbing.errors import InputError
from lens_heads.plumbing.io import slug
from lens_heads.stats import curves, inference
from lens_heads.stats.curves import ALL, RANDOM, SCORES_AND_RANDOM, CurveKey, check_selection, selects
from lens_heads.sweep.intervals import heads_per_row, sweep_intervals
from lens_heads.sweep.old_units import is_legacy, legacy_spec


@dataclass
class UnitResult:
    """One evaluated point of the sweep: the JSON of the (resolved) ablation spec it evaluated
    (:meth:`lens_heads.ablation.specs.AblationSpec.to_dict` as it reads back from JSON, whose ``kind`` names the
    ablation) and what it gave.
    ``mode``, ``score``, ``target_fraction`` and ``threshold`` are read off the spec."""

    spec: dict
    realised_fraction: float
    result: EvalResult
    head_share: list[list[float]] | None = None  # [layer][head]: share of inputs for which the head was zeroed
    wall_s: float = float("nan")
    # per item of ``result.items``: [rows, (row, layer, head) triples zeroed], so that a bootstrap over items
    # resamples the realised share with the outcomes (None: not recorded, the share is then held fixed)
    item_zeroed: list[list[int]] | None = None

    @property
    def mode(self) -> str:
        """Its spec's kind, one of lens_heads.ablation.specs.UNIT_MODES."""
        return self.spec["kind"]

    @property
    def score(self) -> str | None:
        """What ranked its heads (:func:`lens_heads.ablation.specs.ranked_by`)."""
        return specs.ranked_by(self.spec)

    @property
    def target_fraction(self) -> float:
        return specs.target_fraction(self.spec)

    @property
    def threshold(self) -> float | None:
        return self.spec.get("threshold")

    @property
    def key(self) -> str:
        return unit_key(self.mode, self.score, self.target_fraction)

    @property
    def curve(self) -> CurveKey | None:
        """The curve this unit is a point of (None for the baseline, a point of every curve)."""
        return None if self.mode == "baseline" else CurveKey(self.mode, None if self.mode == RANDOM else self.score)

    def to_dict(self) -> dict:
        return dict(key=self.key, spec=self.spec, realised_fraction=self.realised_fraction, wall_s=self.wall_s,
                    head_share=self.head_share, item_zeroed=self.item_zeroed, result=self.result.to_dict())

    @classmethod
    def from_dict(cls, d: dict, filed: dict | None = None) -> "UnitResult":
        """The unit :meth:`to_dict` wrote, or one of the earlier format (``mode``, ``score``, ``target_fraction``,
        ``threshold`` instead of its spec: :func:`lens_heads.sweep.old_units.legacy_spec`, with
        ``filed``, the spec JSON a run folder filed it under, where known)."""
        spec = legacy_spec(d, filed) if is_legacy(d) else d["spec"]
        return cls(spec=spec, realised_fraction=d["realised_fraction"], result=EvalResult.from_dict(d["result"]),
                   head_share=d.get("head_share"), wall_s=d.get("wall_s") or float("nan"),
                   item_zeroed=d.get("item_zeroed"))


def calibration_key(score: str, fraction: float) -> str:
    """How calibration.json (and ``SweepResult.meta["unablated_shares"]``) name a (score, target fraction)."""
    return f"{score}|{fraction:.6f}"


def unit_key(mode: str, score: str | None, fraction: float) -> str:
    """A unit's readable name: ``threshold__ahon-ln__0.1000``."""
    return f"{mode}__{slug(score or 'none')}__{fraction:.4f}"


@dataclass
class SweepResult:
    """All units of a sweep. Accuracy and realised fractions are in [0, 1] in the table; the curve summaries
    (``zeroable_within``, ``normalised_auc``) speak percent, as the paper does."""

    baseline: EvalResult
    units: list[UnitResult]
    meta: dict = field(default_factory=dict)
    # intervals() by its settings: a comparison ranks by two metrics and tabulates Table 2 from one bootstrap
    _intervals: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def keyed_curves(self, mode: str = SCORES_AND_RANDOM) -> dict[CurveKey, list[UnitResult]]:
        """Per curve of ``mode`` (a curve mode such as ``"threshold"`` or ``"random"``; ``"threshold+random"``, the
        paper's figure; ``"all"``: every curve), its units sorted by realised share, starting with the shared
        unablated baseline at 0; scores in the sweep's order, random last."""
        check_selection(mode)
        base = next(u for u in self.units if u.mode == "baseline")
        out: dict[CurveKey, list[UnitResult]] = {}
        for u in self.units:
            curve = u.curve
            if curve is not None and selects(mode, u.mode):
                out.setdefault(curve, [base]).append(u)
        listed = self.meta.get("scores", [])
        order = ([k for s in listed for k in out if k.score == s] + [k for k in out if k.score not in listed and
                                                                      k.mode != RANDOM] +
                 [k for k in out if k.mode == RANDOM])
        return {k: sorted(out[k], key=lambda u: (u.realised_fraction, u.target_fraction)) for k in order}

    def curves(self, mode: str = SCORES_AND_RANDOM) -> dict[str, list[UnitResult]]:
        """:meth:`keyed_curves` named by score (``"random"`` for the random baseline); with ``mode="all"`` by
        label, which tells a score's static and per-input curves apart (``"AHON (LN) (static)"``)."""
        return {(k.label if mode == ALL else k.name): units for k, units in self.keyed_curves(mode).items()}

    def on_items(self, ids: Sequence[str]) -> "SweepResult":
        """The sweep on some of its items (by id, in the order given): every unit keeps those items' records, and
        its realised share is recomputed from their per-item zeroing counts (a unit recorded without them is
        refused: its share on the subset is unknown). Per-input zeroing decides per item, so this is what
        evaluating only those items would give; head shares are dropped (they were counted over all items)."""
        ids = list(ids)
        units = []
        for u in self.units:
            where = {it.id: k for k, it in enumerate(u.result.items)}
            missing = [i for i in ids if i not in where]
            if missing:
                raise InputError(f"unit {u.key} has no items {missing[:3]}: give ids of items the sweep evaluated")
            picked = [where[i] for i in ids]
            zeroed = None if u.item_zeroed is None else [u.item_zeroed[k] for k in picked]
            if u.mode != "baseline" and zeroed is None:
                raise InputError(f"unit {u.key} was recorded without per-item zeroing counts: its realised share on "
                                 "some of its items is unknown")
            share = 0.0 if zeroed is None else (sum(z for _, z in zeroed) /
                                                (sum(r for r, _ in zeroed) * heads_per_row(self)))
            units.append(replace(u, result=replace(u.result, items=[u.result.items[k] for k in picked]),
                                 item_zeroed=zeroed, realised_fraction=share, head_share=None))
        base = next(u for u in units if u.mode == "baseline")
        return SweepResult(baseline=base.result, units=units, meta=dict(self.meta, items=len(ids)))

    def zeroable_within(self, points: float = 1.0, *, mode: str = SCORES_AND_RANDOM, rule: str = "authors"
                        ) -> dict[str, float]:
        """Per score (and ``"random"``): % of heads zeroable within ``points`` accuracy points of the baseline, by
        ``rule`` (:func:`lens_heads.stats.curves.zeroable_within`; both rules walk each curve in order of realised
        share)."""
        base = 100 * self.baseline.accuracy
        return {s: curves.zeroable_within(*self._curve(us, "accuracy"), base, points, rule=rule)
                for s, us in self.curves(mode).items()}

    def headline(self, points: float = 1.0) -> dict:
        """The numbers every record of a sweep states (the sweep script's and the report's): the baseline with its
        Wilson interval and chance, % zeroable within ``points`` by both rules, the paper's Table 2 entry and the
        normalised AUCs of accuracy (%) and of the paired KL (nats)."""
        b, tag = self.baseline, f"{points:g}_point"
        low, high = b.ci95
        return {"baseline": dict(accuracy=float(b.accuracy), ci95=[float(low), float(high)], n=int(b.n),
                                 chance=float(b.chance), ci_method="wilson 95%"),
                f"zeroable_within_{tag}_pct": self.zeroable_within(points),
                "zeroable_rule": f"authors: last crossing of baseline - {points:g} in order of realised share, 0 if none",
                f"zeroable_within_{tag}_censored_pct": self.zeroable_within(points, rule="censored"),
                "table2": self.table2(points), "normalised_auc_pct": self.normalised_auc(),
                "normalised_auc_kl": self.normalised_auc(metric="kl")}

    def ends_above(self, points: float = 1.0, *, mode: str = SCORES_AND_RANDOM) -> dict[str, bool]:
        """Per score: whether its curve ends at or above ``baseline - points`` (its censored share is "≥")."""
        base = 100 * self.baseline.accuracy
        return {s: curves.ends_above(*self._curve(us, "accuracy"), base, points) for s, us in self.curves(mode).items()}

    def table2(self, points: float = 1.0, intervals=None) -> dict:
        """The paper's Table 2 entry for this model and task: % zeroable within ``points`` (authors' rule) of AWFT
        beside the best of every other curve, random included. With ``intervals`` (:meth:`intervals`): both shares'
        95% intervals and the paired difference AWFT - best with its interval, p-value and verdict."""
        fp = self.meta.get("fingerprint", {})
        entry = dict(model=fp.get("model", {}).get("name"), task=fp.get("task", {}).get("task"),
                     **curves.table2_entry(self.zeroable_within(points, rule="authors")))
        if intervals is not None and "AWFT" in intervals.curves:
            awft, best = intervals.interval("AWFT", "zeroable_authors"), intervals.interval(entry["best_score"],
                                                                                           "zeroable_authors")
            d = intervals.difference("AWFT", entry["best_score"], "zeroable_authors")
            entry.update(awft_low=awft.low, awft_high=awft.high, best_low=best.low, best_high=best.high,
                         difference=d["difference"], difference_low=d["low"], difference_high=d["high"],
                         p_value=d["p_value"], verdict=d["verdict"], test_note=d["test_note"])
        return entry

    def target_check(self, tolerance: float = 2.0):
        """Per threshold unit, how far the realised share of heads zeroed lands from its target, and why: ``ties``
        (the threshold already misses on the unablated scores, whose CDF steps where many values are equal) or
        ``cascade`` (later layers are scored on the ablated stream, which moves their scores across the
        threshold); the larger of the two gaps names the cause. Shares in percent; ``within`` is |miss| <=
        ``tolerance`` points."""
        unablated = self.meta.get("unablated_shares") or {}
        rows = []
        for u in self.units:
            if u.mode != "threshold":
                continue
            assert u.score is not None  # a threshold unit is a ThresholdAblation's, which has a score
            target, realised = 100 * u.target_fraction, 100 * u.realised_fraction
            before = 100 * unablated.get(calibration_key(u.score, u.target_fraction), float("nan"))
            ties, cascade = before - target, realised - before
            within = abs(realised - target) <= tolerance
            cause = ("" if within else "unknown" if math.isnan(before) else
                     "ties" if abs(ties) >= abs(cascade) else "cascade")
            rows.append(dict(score=u.score, target_pct=target, unablated_pct=before, realised_pct=realised,
                             miss_points=realised - target, ties_points=ties, cascade_points=cascade,
                             within=within, cause=cause))
        return pd.DataFrame(rows)

    def intervals(self, points: float = 1.0, *, shares: Sequence[float] | None = None, n_resamples: int = 2000,
                  seed: int = 0, confidence: float = 0.95, mode: str = SCORES_AND_RANDOM):
        """95% percentile-bootstrap intervals over items for every curve's summaries (accuracy and KL AUC, KL at
        each target share, % zeroable within ``points`` by both rules) and ranks, paired across the curves of
        ``mode`` (``"all"``: every curve, named by label) (:func:`lens_heads.sweep.intervals.
        sweep_intervals`); ``.difference`` and ``.versus`` test curves against each other. Computed once per setting
        (the units are not meant to change after the sweep)."""
        key = (points, None if shares is None else tuple(shares), n_resamples, seed, confidence, mode)
        if key not in self._intervals:
            self._intervals[key] = sweep_intervals(self, points=points, shares=shares, n_resamples=n_resamples,
                                                   seed=seed, confidence=confidence, mode=mode)
        return self._intervals[key]

    def difference(self, a: str, b: str, summary: str = "kl_auc", *, points: float = 1.0, n_resamples: int = 2000,
                   seed: int = 0) -> dict:
        """Curve ``a`` minus curve ``b`` in ``summary`` (``"accuracy_auc"``, ``"kl_auc"``, ``"zeroable_authors"``,
        ``"zeroable_censored"``, ``"kl_at_<share>pct"``) on the same items: paired bootstrap interval, permutation
        p-value and the calling rule's verdict (:mod:`lens_heads.stats.calling`). For many comparisons, compute
        :meth:`intervals` once."""
        return self.intervals(points, n_resamples=n_resamples, seed=seed).difference(a, b, summary)

    def normalised_auc(self, *, mode: str = SCORES_AND_RANDOM, metric: str = "accuracy") -> dict[str, float]:
        """Per score (and ``"random"``): normalised AUC over realised % zeroed of accuracy (%, the paper's
        ranking, higher is better) or, with ``metric="kl"``, of the paired KL(unablated || ablated) of the answer
        distributions (nats, lower is better: a low-variance companion where accuracy differences are noise)."""
        return {s: curves.normalised_auc(*self._curve(us, metric)) for s, us in self.curves(mode).items()}

    def at_share(self, share: float, *, metric: str = "kl", mode: str = SCORES_AND_RANDOM) -> dict[str, float]:
        """Per score: ``metric`` (``"accuracy"`` in %, or the paired ``"kl"``) linearly interpolated where a
        ``share`` (a fraction in [0, 1], as every share lens_heads takes) of the heads is zeroed, NaN where the curve
        doesn't reach that share. Curves end at different realised shares, and an AUC normalised over a shorter range
        looks better: this compares the scores at the same share."""
        curves.check_share(share, "at_share(share=...)")
        return {s: curves.value_at(*self._curve(us, metric), 100 * share) for s, us in self.curves(mode).items()}

    def _curve(self, units: list[UnitResult], metric: str) -> tuple[list[float], list[float]]:
        """x = realised % zeroed, y = ``metric`` of each unit."""
        return [100 * u.realised_fraction for u in units], [self._metric(u, metric) for u in units]

    def _metric(self, u: UnitResult, metric: str) -> float:
        if metric == "accuracy":
            return 100 * u.result.accuracy
        if metric == "kl":
            return paired_difference(u.result, self.baseline).kl.mean
        raise InputError(f"metric must be 'accuracy' or 'kl', got {metric!r}")

    def to_dataframe(self):
        """One row per curve point: the baseline appears at fraction 0 of every curve. A curve is named by
        ``curve`` (its display label: ``"AHON (LN)"``, ``"random"``, ``"AHON (LN) (static)"``), ``score`` (the bare
        score name, ``"random"`` for the random curve) and ``mode`` (``"threshold"``, ``"random"``, ``"static"``,
        ``"per_input"``);
        paired columns compare with the baseline on the same items; ``gold_logprob_change`` and ``kl`` are the
        low-variance companions."""
        return pd.DataFrame([self._row(key, u) for mode in ("threshold", RANDOM, "static", "per_input")
                             for key, units in self.keyed_curves(mode).items() for u in units])

    def _row(self, key: CurveKey, u: UnitResult) -> dict:
        r = u.result
        low, high = r.ci95
        pd_ = paired_difference(r, self.baseline)
        return dict(curve=key.label, score=key.name, mode=key.mode,
                    target_fraction=u.target_fraction, threshold=u.threshold, realised_fraction=u.realised_fraction,
                    accuracy=r.accuracy, ci_low=low, ci_high=high,
                    paired_diff=pd_.mean, paired_low=pd_.ci95[0], paired_high=pd_.ci95[1],
                    gold_logprob_change=pd_.gold_logprob_change.mean,
                    gold_logprob_low=pd_.gold_logprob_change.ci95[0], gold_logprob_high=pd_.gold_logprob_change.ci95[1],
                    kl=pd_.kl.mean, kl_low=pd_.kl.ci95[0], kl_high=pd_.kl.ci95[1],
                    **{f"accuracy_{m}": a for m, a in r.accuracies.items()}, n=r.n, chance=r.chance)


    def summary(self, points: float = 1.0, share: float = 0.1, intervals=None):
        """Per score (random included), ranked by the paper's accuracy AUC: % zeroable within ``points`` by the
        authors' rule and by the censored rule (with whether the curve ends within ``points`` of the baseline, so
        that its censored share is only a lower bound), the normalised AUC of accuracy and its rank, the normalised
        AUC of the paired KL and its rank, and the KL where a ``share`` (fraction) of heads is zeroed (:meth:`at_share`). With ``intervals``
        (:meth:`intervals`), each number has ``_low`` and ``_high`` columns beside it."""
        zeroable, auc, kl = self.zeroable_within(points), self.normalised_auc(), self.normalised_auc(metric="kl")
        censored, above = self.zeroable_within(points, rule="censored"), self.ends_above(points)
        kl_at = self.at_share(share)
        ranking = sorted(auc, key=lambda s: -auc[s] if not math.isnan(auc[s]) else math.inf)
        # the one rank rule (ties averaged, NaN last), as the rank intervals resample it
        auc_rank = dict(zip(auc, inference.ranks(list(auc.values()), higher_is_better=True)))
        kl_rank = dict(zip(kl, inference.ranks(list(kl.values()), higher_is_better=False)))
        columns: dict[str, tuple[str, Mapping[str, float]]]  # values per score (ranks are ints)
        columns = {f"zeroable_within_{points:g}_point_pct": ("zeroable_authors", zeroable),
                   f"zeroable_within_{points:g}_point_censored_pct": ("zeroable_censored", censored),
                   "normalised_auc_pct": ("accuracy_auc", auc),
                   "auc_rank": ("rank_accuracy_auc", auc_rank),
                   "normalised_auc_kl": ("kl_auc", kl),
                   "kl_rank": ("rank_kl_auc", kl_rank),
                   f"kl_at_{100 * share:g}pct": (f"kl_at_{100 * share:g}pct", kl_at)}
        rows = []
        for s in ranking:
            row = {"score": s, f"ends_within_{points:g}_point": above[s]}
            for column, (quantity, values) in columns.items():
                row[column] = values[s]
                if intervals is not None and quantity in intervals.quantities:
                    i = intervals.interval(s, quantity)
                    row[f"{column}_low"], row[f"{column}_high"] = i.low, i.high
            rows.append(row)
        return pd.DataFrame(rows)
