"""The inactive-heads sweep: how much accuracy each head score loses as it zeroes more heads, against random zeroing.

For each score and target fraction p (the paper's protocol, as its authors' code runs it):

1. **Thresholds** from the *unablated* pooled CDF of the score over exactly the forward rows the evaluation runs
   (``calibration="rows"``: for cloze tasks one row per choice, context + continuation), read by
   :func:`lens_heads.heads.distributions.thresholds`; ``calibration="prompts"`` or given inputs stay available.
2. **Per-input threshold zeroing** (:func:`lens_heads.ablation.hooks.threshold_zeroing`) during a full evaluation of the
   task; the x axis is the *realised* share of heads zeroed (it can still miss p: later layers are scored on the
   ablated stream, and ties in a score make the CDF step).
3. **Random baseline**: each (row, layer, head) zeroed with probability p (one draw per question, shared by its
   choices). p = 0 is the unablated baseline, evaluated once and shared by all curves.
4. Optionally the **static pruning view**: rank heads by their mean score over the calibration inputs and zero the
   most inactive ``round(p x layers x heads)`` heads for every input, as removing them for good would.

The plan is a list of ablation specs (:mod:`lens_heads.ablation.specs`), one per unit. Rows and tokens follow a
named protocol (:mod:`lens_heads.data.rows`: ``"lm-eval"`` by default, ``"tl"``), recorded in the result. Each finished
unit is written at once to ``out_dir``, keyed by the run's fingerprint and its spec (:mod:`lens_heads.plumbing.cache`); a
rerun with the same model, data, protocol, seed and calibration skips the finished units. Headline numbers (from
:mod:`lens_heads.stats.curves`): "% of heads zeroable within 1 point" (the authors' rule or the censored one) and the
normalised AUC, both on the realised-% axis, and the paper's Table 2 (:func:`table2`).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from lens_heads.ablation.hooks import DRAWS
from lens_heads.ablation.specs import (
    UNIT_MODES,
    AblationSpec,
    RandomAblation,
    ScoreCalibration,
    StaticAblation,
    ThresholdAblation,
    Unablated,
)
from lens_heads.data.chat import resolve_chat_template
from lens_heads.data.rows import DEFAULT_PROTOCOL, check_protocol, context_tokens
from lens_heads.evaluation.evaluate import EvalResult, evaluate, paired_difference
from lens_heads.experiments.sweep_intervals import heads_per_row, sweep_intervals
from lens_heads.heads.distributions import pooled_cdf
from lens_heads.heads.scores import EXTRA_NAMES, SCORE_NAMES
from lens_heads.heads.scoring import HeadScores, score_heads
from lens_heads.heads.thresholds_file import Thresholds
from lens_heads.models.loading import model_meta
from lens_heads.plumbing import distributed
from lens_heads.plumbing.cache import Cache, claim_folder, load_keyed, read_json, save_keyed
from lens_heads.plumbing.errors import InputError
from lens_heads.plumbing.io import atomic_write_bytes, slug
from lens_heads.stats import curves, inference
from lens_heads.stats.curves import ALL, RANDOM, CurveKey

DEFAULT_FRACTIONS = (0.0, 0.05, 0.10, 0.15, 0.20, 0.25, 0.30)
FORMAT_VERSION = 3
MARKER = "sweep.json"


# ---------------------------------------------------------------- results


@dataclass
class UnitResult:
    """One evaluated point of the sweep."""

    mode: str  # its spec's kind, one of lens_heads.ablation.specs.UNIT_MODES
    score: str | None
    target_fraction: float
    threshold: float | None
    realised_fraction: float
    result: EvalResult
    head_share: list[list[float]] | None = None  # [layer][head]: share of inputs for which the head was zeroed
    wall_s: float = float("nan")
    # per item of ``result.items``: [rows, (row, layer, head) triples zeroed], so that a bootstrap over items
    # resamples the realised share with the outcomes (None: not recorded, the share is then held fixed)
    item_zeroed: list[list[int]] | None = None

    @property
    def key(self) -> str:
        return unit_key(self.mode, self.score, self.target_fraction)

    @property
    def curve(self) -> CurveKey | None:
        """The curve this unit is a point of (None for the baseline, a point of every curve)."""
        return None if self.mode == "baseline" else CurveKey(self.mode, None if self.mode == RANDOM else self.score)

    def to_dict(self) -> dict:
        return dict(key=self.key, mode=self.mode, score=self.score, target_fraction=self.target_fraction,
                    threshold=self.threshold, realised_fraction=self.realised_fraction, wall_s=self.wall_s,
                    head_share=self.head_share, item_zeroed=self.item_zeroed, result=self.result.to_dict())

    @classmethod
    def from_dict(cls, d: dict) -> "UnitResult":
        return cls(mode=d["mode"], score=d["score"], target_fraction=d["target_fraction"], threshold=d["threshold"],
                   realised_fraction=d["realised_fraction"], result=EvalResult.from_dict(d["result"]),
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

    def keyed_curves(self, mode: str = "threshold") -> dict[CurveKey, list[UnitResult]]:
        """Per curve of ``mode`` (``"threshold"`` includes the random curve; ``"all"``: every curve), its units
        sorted by realised share, starting with the shared unablated baseline at 0; scores in the sweep's order,
        random last."""
        base = next(u for u in self.units if u.mode == "baseline")
        out: dict[CurveKey, list[UnitResult]] = {}
        for u in self.units:
            if u.mode == mode or (mode == "threshold" and u.mode == RANDOM) or (mode == ALL and u.curve is not None):
                curve = u.curve
                if curve is None:
                    raise InputError(f"mode={mode!r}: the unablated baseline is a point of every curve, not a curve")
                out.setdefault(curve, [base]).append(u)
        listed = self.meta.get("scores", [])
        order = ([k for s in listed for k in out if k.score == s] + [k for k in out if k.score not in listed and
                                                                      k.mode != RANDOM] +
                 [k for k in out if k.mode == RANDOM])
        return {k: sorted(out[k], key=lambda u: (u.realised_fraction, u.target_fraction)) for k in order}

    def curves(self, mode: str = "threshold") -> dict[str, list[UnitResult]]:
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

    def zeroable_within(self, points: float = 1.0, *, mode: str = "threshold", rule: str = "authors"
                        ) -> dict[str, float]:
        """Per score (and ``"random"``): % of heads zeroable within ``points`` accuracy points of the baseline, by
        ``rule`` (:func:`lens_heads.stats.curves.zeroable_within`; both rules walk each curve in order of realised
        share)."""
        base = 100 * self.baseline.accuracy
        return {s: curves.zeroable_within(*self._curve(us, "accuracy"), base, points, rule=rule)
                for s, us in self.curves(mode).items()}

    def ends_above(self, points: float = 1.0, *, mode: str = "threshold") -> dict[str, bool]:
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
                  seed: int = 0, confidence: float = 0.95, mode: str = "threshold"):
        """95% percentile-bootstrap intervals over items for every curve's summaries (accuracy and KL AUC, KL at
        each target share, % zeroable within ``points`` by both rules) and ranks, paired across the curves of
        ``mode`` (``"all"``: every curve, named by label) (:func:`lens_heads.experiments.sweep_intervals.
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

    def normalised_auc(self, *, mode: str = "threshold", metric: str = "accuracy") -> dict[str, float]:
        """Per score (and ``"random"``): normalised AUC over realised % zeroed of accuracy (%, the paper's
        ranking, higher is better) or, with ``metric="kl"``, of the paired KL(unablated || ablated) of the answer
        distributions (nats, lower is better: a low-variance companion where accuracy differences are noise)."""
        return {s: curves.normalised_auc(*self._curve(us, metric)) for s, us in self.curves(mode).items()}

    def at_share(self, share: float, *, metric: str = "kl", mode: str = "threshold") -> dict[str, float]:
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
        return pd.DataFrame([self._row(key, u) for mode in ("threshold", "static", "per_input")
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


def table2(sweeps: Sequence[SweepResult], points: float = 1.0, *, n_resamples: int | None = None, seed: int = 0,
           average: bool = True):
    """The paper's Table 2 over several sweeps (models x tasks): per sweep, AWFT's % zeroable within ``points``
    beside the best other curve's (random included), authors' rule; with ``n_resamples``, intervals and the paired
    test of AWFT against the best for every sweep with per-item records (:meth:`SweepResult.table2`). ``average``:
    the paper's last row, ``model="Average"``: the mean of each column over the sweeps (the best curve may differ
    from row to row), with 95% intervals where every sweep has per-item records (the mean of the sweeps'
    bootstrap replicates, which resample each sweep's own items)."""
    ivs = [sweep.intervals(points, n_resamples=n_resamples, seed=seed)
           if n_resamples and isinstance(sweep, SweepResult) else None for sweep in sweeps]
    rows = [sweep.table2(points, intervals=iv) for sweep, iv in zip(sweeps, ivs)]
    keys = [(r["model"], r["task"]) for r in rows]
    if len(set(keys)) != len(keys):
        raise InputError(f"two sweeps of the same model and task in {keys}: give one sweep per (model, task)")
    if average and rows:
        rows.append(average_row(rows, ivs))
    return pd.DataFrame(rows)


def average_row(rows: list[dict], intervals: Sequence | None = None) -> dict:
    """Table 2's Average row: the mean over ``rows`` of AWFT's and of the best curve's % zeroable, and of their
    difference; with every row's ``intervals``, the percentile intervals of those means from the mean of the rows'
    bootstrap replicates (replicate r of each sweep averaged)."""
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
    return row


# ---------------------------------------------------------------- the sweep

CALIBRATIONS = ("rows", "prompts")


@distributed.local()  # each unit is evaluated whole by the worker that owns it
def run_sweep(model, task, *, scores: Sequence[str] | None = None, fractions: Sequence[float] = DEFAULT_FRACTIONS,
              calibration="rows", out_dir=None, seed: int = 0, batch_size: int | str = 8,
              random_baseline: bool = True, static_scores: Sequence[str] = (), progress: bool = True,
              primary: str = "sum", protocol: str = DEFAULT_PROTOCOL,
              apply_chat_template: bool | str = False, specs: Sequence[AblationSpec] = (),
              thresholds: Thresholds | None = None, random: str = "per_item") -> SweepResult | None:
    """Evaluate ``task`` with heads zeroed per input by each score at each target fraction, plus the random
    baseline (``random_baseline``), the static pruning view for ``static_scores`` and any further ablation
    ``specs`` (e.g. :class:`lens_heads.ablation.specs.LayerRemoval`: ``result.curves("layers")``), each a unit.

    ``calibration``: where thresholds and static rankings come from: ``"rows"`` (the authors' protocol: an
    unablated scoring pass over exactly the forward rows the evaluation runs), ``"prompts"`` (each item's context
    alone, as its rows begin), a :class:`lens_heads.heads.scoring.HeadScores` already computed, or any inputs
    ``score_heads`` accepts. ``protocol``/``apply_chat_template``: the evaluation's rows (:mod:`lens_heads.data.rows`;
    the meta records the chat setting given and what it resolved to, ``chat_template``, and the task's split).
    ``out_dir``: where each finished unit is written (and found again on a rerun). ``seed``: the random baseline's.
    ``random``: how the random baseline draws, once per item (``"per_item"``: all choices of a question lose the same
    heads, and their shared prefix runs once) or once per forward row (``"per_row"``, the authors' baseline; kept in
    the run's fingerprint and each unit's key, so a folder never mixes the two).
    ``batch_size``: rows per forward pass, or ``"auto"``. ``thresholds``: zero at given thresholds instead of
    calibrating them (:func:`lens_heads.heads.thresholds_file.load_thresholds`, the authors' released file): refused
    for another model; ``scores`` default to the file's, and every target fraction must be one the file has.
    ``scores`` may name the extras (``lens_heads.heads.scores.EXTRA_NAMES``: LTHON (HN), the full-head-output
    scores).

    Several workers (:mod:`lens_heads.plumbing.distributed`) share the units: torchrun ranks gather them all, so every rank
    returns the whole result (only rank 0 should write it); the tasks of a job array each run their share into the
    shared ``out_dir`` and return None unless every unit is finished there, and a plain run afterwards merges them.
    """
    if thresholds is not None:
        thresholds.check_model(model)
        scores = thresholds.scores if scores is None else scores
    scores, fractions = _check_settings(scores, fractions, static_scores, calibration, protocol)
    if random not in DRAWS:
        raise InputError(f"random must be one of {DRAWS}, got {random!r}")
    chat = resolve_chat_template(model, apply_chat_template)
    if thresholds is not None:
        for s, p in [(s, p) for s in scores for p in fractions]:
            thresholds.threshold(s, p)  # refuses a score or a target share the file lacks, before any work
    rows = dict(protocol=protocol, apply_chat_template=chat)
    fingerprint = _fingerprint(model, task, seed, primary, calibration, protocol, chat, thresholds, random)
    distributed.check_agree(fingerprint, "sweep fingerprint (model, data, seed, scoring, calibration)")
    plan = sweep_plan(scores, fractions, seed=seed, random_baseline=random_baseline, static_scores=static_scores,
                      random=random)
    plan += [spec for spec in _check_specs(specs) if spec not in plan]
    store = UnitStore(out_dir, fingerprint)
    progress = progress and distributed.is_main()
    extras = [s for s in dict.fromkeys(list(scores) + list(static_scores)) if s not in SCORE_NAMES]
    calib = Calibration(model, task, calibration, store, batch_size, progress, rows, extras, thresholds)
    settings = dict(batch_size=batch_size, progress=progress, primary=primary, **rows)
    workers = distributed.unit_workers()
    units, n_run = _run_units(model, task, plan, store, calib, set(workers.share(len(plan))), settings,
                              desc=f"sweep {getattr(task, 'name', '')} units")
    if len(units) < len(plan):
        return None
    unablated = {calibration_key(s.score, s.fraction): calib.unablated_share(s.score, s.fraction)
                 for s in plan if isinstance(s, ThresholdAblation)}
    meta = dict(fingerprint=fingerprint, fractions=fractions, scores=scores, static_scores=list(static_scores),
                random_baseline=random_baseline, random_draw=random, seed=seed, batch_size=batch_size,
                out_dir=store.describe(), calibration=calib.describe(), unablated_shares=unablated,
                units_reused=len(plan) - n_run,
                thresholds=None if thresholds is None else thresholds.describe(),
                units_run=n_run, workers=workers.to_dict(), specs=[spec.to_dict() for spec in _check_specs(specs)],
                protocol=protocol, apply_chat_template=apply_chat_template, chat_template=chat,
                split=getattr(task, "split", None), fewshot_split=getattr(task, "fewshot_split", None))
    return SweepResult(baseline=units[0].result, units=[units[i] for i in range(len(plan))], meta=meta)


def sweep_plan(scores: Sequence[str], fractions: Sequence[float], *, seed: int = 0, random_baseline: bool = True,
               static_scores: Sequence[str] = (), random: str = "per_item") -> list[AblationSpec]:
    """The units of a sweep, in order: the baseline, then per target fraction the random ablation (drawn
    ``random``: per item or per row), each score's threshold ablation and each static score's most inactive
    heads."""
    plan: list[AblationSpec] = [Unablated()]
    for p in fractions:
        if p == 0:
            continue
        plan += [RandomAblation(p, seed, draw=random)] if random_baseline else []
        plan += [ThresholdAblation(s, p) for s in scores]
        plan += [StaticAblation(score=s, fraction=p) for s in static_scores]
    return plan


def run_unit(model, task, spec: AblationSpec, *, means=None, **settings) -> UnitResult:
    """Evaluate ``task`` under one resolved ablation ``spec`` (``means``: what an ``ablation="mean"`` spec substitutes,
    from :func:`lens_heads.ablation.hooks.mean_z`; ``settings``: :func:`lens_heads.evaluation.evaluate`'s)."""
    ablation = spec.build(model, means=means)
    start = time.perf_counter()
    result = evaluate(model, task, hooks=[ablation] if ablation else [], **settings)
    return unit_result(spec, ablation, result, time.perf_counter() - start)


def unit_result(spec: AblationSpec, ablation, result: EvalResult, wall_s: float = float("nan")) -> UnitResult:
    """The unit of ``spec`` evaluated with its built ``ablation`` (None for the baseline) into ``result``."""
    return UnitResult(mode=spec.kind, score=spec.ranked_by, target_fraction=spec.target_fraction,
                      threshold=getattr(spec, "threshold", None),
                      realised_fraction=ablation.share_zeroed() if ablation else 0.0, result=result,
                      head_share=ablation.zeroed().float().mean(0).tolist() if ablation else None,
                      wall_s=wall_s, item_zeroed=_item_zeroed(ablation, result))


def _item_zeroed(ablation, result: EvalResult) -> list[list[int]] | None:
    """Per item of ``result`` (inputs are numbered by item, as ``evaluate`` numbers them): [rows, triples zeroed]."""
    by_input = ablation.zeroed_by_input() if ablation is not None and hasattr(ablation, "zeroed_by_input") else {}
    if len(by_input) != result.n:
        return None
    return [list(by_input[i]) for i in range(result.n)]


def _check_settings(scores, fractions, static_scores, calibration, protocol) -> tuple[list[str], list[float]]:
    for name, value in (("scores", scores), ("static_scores", static_scores), ("fractions", fractions)):
        if isinstance(value, (str, int, float)):
            raise InputError(f"{name} takes a list, got {value!r}: write {name}=[{value!r}]")
    scores = list(SCORE_NAMES if scores is None else scores)
    unknown = [s for s in list(scores) + list(static_scores) if s not in SCORE_NAMES + EXTRA_NAMES]
    if unknown:
        raise InputError(f"unknown scores {unknown}: choose from {SCORE_NAMES} or the extras {EXTRA_NAMES}")
    fractions = sorted({float(p) for p in fractions} | {0.0})
    if any(not 0.0 <= p < 1.0 for p in fractions):
        raise InputError(f"target fractions must lie in [0, 1), got {fractions}")
    check_protocol(protocol)
    if isinstance(calibration, str) and calibration not in CALIBRATIONS:
        raise InputError(f"unknown calibration {calibration!r}: choose 'rows' (the evaluated rows, the paper's), "
                         "'prompts', a HeadScores, or inputs to score")
    return scores, fractions


def _check_specs(specs) -> list[AblationSpec]:
    if isinstance(specs, AblationSpec) or not hasattr(specs, "__iter__"):
        raise InputError(f"specs takes a list of ablation specs, got {specs!r}: write specs=[{specs!r}]")
    specs = list(specs)
    bad = [spec for spec in specs if not isinstance(spec, AblationSpec)]
    if bad:
        raise InputError(f"specs must be ablation specs (lens_heads.ablation.specs), got {bad[:3]}")
    return list(dict.fromkeys(specs))


def _run_units(model, task, plan: list[AblationSpec], store: "UnitStore", calib, mine: set[int], settings: dict,
               desc: str) -> tuple[dict[int, UnitResult], int]:
    """Every unit of ``plan`` found in ``store`` or, where it is this worker's (``mine``), evaluated and stored;
    then the other workers' units (gathered, or read from the shared folder). Returns them by plan index, and how
    many units all workers ran."""
    units: dict[int, UnitResult] = {}
    n_run = 0
    bar = tqdm(plan, desc=desc, unit="unit", disable=not settings["progress"])
    for index, spec in enumerate(bar):
        stored = store.load(spec)
        if stored is not None:
            units[index] = stored
        elif index in mine:
            bar.set_postfix_str(f"{spec.kind} {spec.ranked_by or ''} {spec.target_fraction:g}".replace("  ", " "))
            units[index] = run_unit(model, task, spec.resolve(calib), **settings)
            store.save(spec, units[index])
            n_run += 1
    bar.close()
    gathered = distributed.all_gather((units, n_run))
    units = {index: unit for part, _ in gathered for index, unit in part.items()}
    if len(units) < len(plan):  # a job array task: the others may have finished meanwhile
        units.update({i: u for i, spec in enumerate(plan) if i not in units and (u := store.load(spec)) is not None})
    return units, sum(n for _, n in gathered)


class UnitStore:
    """The finished units of one run in ``out_dir`` (or nowhere: ``out_dir=None``), each stored under the run's
    ``fingerprint`` and its ablation spec (:mod:`lens_heads.plumbing.cache`); the folder is claimed for the run in
    ``out_dir/<marker>``, so another configuration's run can't mix in."""

    def __init__(self, out_dir, fingerprint: dict, marker: str = MARKER):
        self.out = Path(out_dir) if out_dir is not None else None
        self.fingerprint = fingerprint
        if self.out is not None:
            claim_folder(self.out, fingerprint, marker=marker)

    def path(self, spec: AblationSpec) -> Path:
        assert self.out is not None  # load and save read it only with an out_dir
        return Cache(self.out).path(unit_key(spec.kind, spec.ranked_by, spec.target_fraction), spec.to_dict(),
                                    ".json")

    def key(self, spec: AblationSpec) -> dict:
        return dict(run=self.fingerprint, ablation=spec.to_dict())

    def load(self, spec: AblationSpec) -> UnitResult | None:
        if self.out is None:
            return None
        stored = load_keyed(self.path(spec), self.key(spec))
        return None if stored is None else UnitResult.from_dict(stored)

    def save(self, spec: AblationSpec, unit: UnitResult) -> None:
        if self.out is not None:
            save_keyed(self.path(spec), self.key(spec), unit.to_dict())

    def describe(self) -> str | None:
        return str(self.out) if self.out is not None else None


class Calibration:
    """Thresholds and static head sets from the unablated scores (:class:`ScoreCalibration`), computed on first
    need and kept in ``out_dir/calibration.json`` under the run's fingerprint, so a resumed sweep uses exactly the
    thresholds of the first run without scoring again."""

    def __init__(self, model, task, calibration, store: UnitStore, batch_size: int | str, progress: bool, rows: dict,
                 extras=(), thresholds=None):
        self._model, self._task, self._calibration, self._rows = model, task, calibration, rows
        self._extras, self._thresholds = list(extras), thresholds
        self._batch_size, self._progress = batch_size, progress
        self._fingerprint = store.fingerprint
        self._path = store.out / "calibration.json" if store.out is not None else None
        self._scores = None
        self._stored = load_keyed(self._path, self._fingerprint) if self._path is not None else None

    def _head_scores(self):
        if self._scores is None:
            source = self._calibration
            if isinstance(source, HeadScores):
                self._scores = source
                return source
            if source == "rows":
                source = self._task
            elif source == "prompts":
                source = [context_tokens(self._model, item, **self._rows) for item in self._task]
            self._scores = score_heads(self._model, source, batch_size=self._batch_size, progress=self._progress,
                                       extras=self._extras, **self._rows)
        return self._scores

    def _lookup(self, kind: str, score: str, p: float, compute):
        key = calibration_key(score, p)
        if self._stored and key in self._stored.get(kind, {}):
            return self._stored[kind][key]
        value = compute()
        if self._stored is None:
            self._stored = {"inputs": None, "thresholds": {}, "static_heads": {}}
        self._stored.setdefault(kind, {})[key] = value
        self._stored["inputs"] = self.describe()
        if self._path is not None:
            save_keyed(self._path, self._fingerprint, self._stored)
        return value

    def threshold(self, score: str, p: float) -> float:
        if self._thresholds is not None:  # given (the authors' file): nothing to calibrate
            return self._thresholds.threshold(score, p)
        return float(self._lookup("thresholds", score, p,
                                  lambda: ScoreCalibration(self._head_scores()).threshold(score, p)))

    def unablated_share(self, score: str, p: float) -> float:
        """The share of (row, layer, head) values the threshold for ``p`` puts on the inactive side of the
        unablated scores: what ties alone leave of the target, before the ablation's cascade."""
        return float(self._lookup("unablated_shares", score, p, lambda: pooled_cdf(
            self._head_scores(), score).inactive_fraction(self.threshold(score, p))))

    def most_inactive(self, score: str, p: float) -> list[tuple[int, int]]:
        heads = self._lookup("static_heads", score, p, lambda: [
            list(h) for h in ScoreCalibration(self._head_scores()).most_inactive(score, p)])
        return [tuple(h) for h in heads]

    def describe(self) -> dict:
        if self._scores is not None:
            return {"data": self._scores.meta.get("data"), "n_inputs": len(self._scores)}
        if self._stored and self._stored.get("inputs"):
            return self._stored["inputs"]
        return {"source": calibration_id(self._calibration)}


def _fingerprint(model, task, seed: int, primary: str, calibration, protocol: str, chat_template: bool | str,
                 thresholds: Thresholds | None = None, random: str = "per_item") -> dict:
    calibration = calibration_id(calibration) if thresholds is None else \
        f"thresholds {thresholds.describe()} {thresholds.digest()}"
    # the per-row draw is named only where chosen, so the folders of runs made before it existed keep resuming
    drawn = {"random_draw": random} if random != "per_item" else {}
    return run_fingerprint(model, task, seed=seed, primary=primary, calibration=calibration,
                           protocol=protocol, apply_chat_template=chat_template, **drawn)  # resolved chat setting


def run_fingerprint(model, task, **settings) -> dict:
    """What must match for a stored unit of a resumable run to be reused: model, data (item ids) and ``settings``
    (plain JSON values: seed, scoring, calibration, rows, ...)."""
    m = model_meta(model)
    ids = hashlib.sha256("\n".join(item.id for item in task).encode()).hexdigest()[:16]
    meta = task.meta() if hasattr(task, "meta") else {}
    model = {k: m.get(k) for k in ("name", "source", "weight_basis", "dtype", "n_layers", "n_heads", "n_kv_heads",
                                   "d_model", "d_head")}
    if m.get("backend", "hooked") != "hooked":  # HookedTransformer runs stored before backends existed stay valid
        model["backend"] = m["backend"]
    return dict(version=FORMAT_VERSION, model=model,
                task={k: meta.get(k) for k in ("task", "split", "shots", "format", "n", "seed")}, item_ids=ids,
                **settings)


def calibration_id(calibration) -> str:
    if isinstance(calibration, str) and calibration in CALIBRATIONS:
        return {"rows": "evaluated rows", "prompts": "item prompts"}[calibration]
    values = getattr(calibration, "values", None)
    if values is not None:  # a HeadScores: its numbers are its identity
        return "scores " + hashlib.sha256(values.detach().cpu().float().numpy().tobytes()).hexdigest()[:16]
    return "inputs " + hashlib.sha256(repr(calibration).encode()).hexdigest()[:16]


# ---------------------------------------------------------------- a sweep's units in one file, and a run folder


def save_units(result: SweepResult, path) -> Path:
    """Every unit of ``result`` with its per-item records, gzipped JSON written atomically: what
    :func:`read_units` (and :func:`lens_heads.experiments.compare.read_sweep` beside a recorded ``sweep_<task>.json``) needs to
    recompute every summary and its interval without the run folder."""
    data = dict(format=FORMAT_VERSION, meta=result.meta, units=[u.to_dict() for u in result.units])
    return atomic_write_bytes(path, gzip.compress(json.dumps(data).encode("utf-8"), mtime=0))


def read_units(path) -> SweepResult:
    """The sweep :func:`save_units` wrote."""
    try:
        data = json.loads(gzip.decompress(Path(path).read_bytes()))
    except (OSError, ValueError) as e:
        raise InputError(f"{path} is not a units file written by save_units ({e})") from None
    units = [UnitResult.from_dict(u) for u in data["units"]]
    base = next((u for u in units if u.mode == "baseline"), None)
    if base is None:
        raise InputError(f"{path} has no baseline unit")
    return SweepResult(baseline=base.result, units=units, meta=dict(data["meta"], source=str(path)))


# ---------------------------------------------------------------- reading a run folder back


def load_sweep(out_dir) -> SweepResult:
    """The sweep kept in a ``run_sweep`` output folder, read back without a model: every unit stored under the
    folder's fingerprint (``sweep.json``); a sweep interrupted midway gives the units it finished. A unit file that
    can't be read is refused, naming it: the folder keeps no plan, so a unit left out would be a point silently
    missing from its curve."""
    out = Path(out_dir)
    stored = read_json(out / MARKER)
    if not isinstance(stored, dict) or "key" not in stored:
        raise FileNotFoundError(f"{out} holds no sweep (no readable {MARKER}): give the out_dir of run_sweep")
    fingerprint = stored["key"]
    units, unreadable = [], []
    for path in sorted(out.glob("*__*__*.json")):
        unit, why = _read_unit(path, fingerprint)
        if why:
            unreadable.append(f"{path.name} ({why})")
        elif unit is not None:  # None: another run's unit (a folder may hold runs under other markers)
            units.append(unit)
    if unreadable:
        raise InputError(f"{out}: {len(unreadable)} unit file(s) can't be read: {'; '.join(unreadable)}. Delete "
                         f"them and rerun run_sweep with out_dir={str(out)!r} and the same settings to recompute "
                         "those units (the others are reused)")
    base = [u for u in units if u.mode == "baseline"]
    if not base:
        raise InputError(f"{out} has no finished baseline unit yet: rerun run_sweep with out_dir={str(out)!r}")
    rank: dict[str | None, int] = {s: i for i, s in enumerate(SCORE_NAMES)}
    units.sort(key=lambda u: (u.target_fraction, UNIT_MODES.index(u.mode), rank.get(u.score, -1)))
    scores = sorted({u.score for u in units if u.mode == "threshold"}, key=lambda s: rank.get(s, len(rank)))
    static = sorted({u.score for u in units if u.mode == "static"}, key=lambda s: rank.get(s, len(rank)))
    calibration = load_keyed(out / "calibration.json", fingerprint)
    meta = dict(fingerprint=fingerprint, fractions=sorted({u.target_fraction for u in units}), scores=scores,
                static_scores=static, random_baseline=any(u.mode == "random" for u in units),
                random_draw=fingerprint.get("random_draw", "per_item"), seed=fingerprint.get("seed"), out_dir=str(out),
                calibration=calibration.get("inputs") if calibration else None,
                unablated_shares=calibration.get("unablated_shares", {}) if calibration else {},
                units_reused=len(units), units_run=0)
    return SweepResult(baseline=base[0].result, units=units, meta=meta)


def _read_unit(path: Path, fingerprint: dict) -> tuple[UnitResult | None, str]:
    """``(unit, "")`` for the unit stored in ``path`` under the run ``fingerprint``, ``(None, "")`` for another
    run's, ``(None, why)`` where it can't be read."""
    entry = read_json(path)
    if not isinstance(entry, dict) or not isinstance(entry.get("key"), dict) or "value" not in entry:
        return None, "not JSON, or torn" if entry is None else "not a stored unit"
    if entry["key"].get("run") != fingerprint:
        return None, ""
    try:
        unit = UnitResult.from_dict(entry["value"])
    except (KeyError, TypeError, ValueError) as e:
        return None, f"not a unit: {type(e).__name__}: {e}"
    if unit.mode not in UNIT_MODES:
        return None, f"unknown mode {unit.mode!r}, not one of {UNIT_MODES}"
    return unit, ""
