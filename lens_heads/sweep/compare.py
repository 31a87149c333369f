"""Comparing sweeps across models and tasks: does a score that spares accuracy on one (model, task) spare it on
another?

Given several sweeps, one per (model, task) (:class:`lens_heads.sweep.result.SweepResult`, or the tables that
``analyses/sweep.py`` records, read back with :func:`read_sweep_record`):

- the **rank** of every curve (the scores and ``"random"``) by its normalised AUC within its (model, task): 1 is
  the best (highest accuracy AUC; lowest KL AUC with ``metric="kl"``), tied curves share their average rank;
- the **Spearman correlation** of the rankings between every pair of (model, task): the Pearson correlation of
  the two vectors of average ranks;
- the **top-k overlap**: how many of the k best curves of one (model, task) are among the k best of the other,
  and its intersection over union (shared / in either top k), as the paper reports it.

Ranks, correlations and overlaps are taken over the curves that every sweep has (the others are listed in
``dropped``), so every rank is out of the same number of curves.

The same model and task may come twice under different settings (the chat template, the split: their label says
which); :func:`compare_settings` then takes each curve's summaries and ranks under the two settings apart with paired
intervals, and :func:`zeroed_head_overlap` compares the heads the two zeroed.

Intervals: each sweep with per-item records (a ``run_sweep`` folder, or a recorded sweep with its units file) is
bootstrapped over its items (:mod:`lens_heads.sweep.intervals`), the curves re-ranked in every replicate, and the
Spearman correlation of two rankings taken replicate by replicate. Every sweep is resampled with the same seed, so
sweeps of the same items in the same order (two models on one task) are paired; sweeps of different items are
resampled independently in effect. A sweep recorded without per-item records has no intervals (``no_intervals``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from lens_heads.plumbing.errors import InputError
from lens_heads.stats import calling
from lens_heads.stats import inference as stats
from lens_heads.stats.curves import normalised_auc, zeroable_within
from lens_heads.sweep.intervals import paired_statistic, replicate_ranks
from lens_heads.sweep.result import SweepResult
from lens_heads.sweep.unit_store import read_sweep_folder, read_units

METRICS = {"accuracy": "normalised AUC of accuracy (%), higher is better",
           "kl": "normalised AUC of the paired KL(unablated || ablated) (nats), lower is better"}
UNITS_SUFFIX = "_units.json.gz"  # beside sweep_<task>.json: every unit with its per-item records
SUMMARY = {"accuracy": "accuracy_auc", "kl": "kl_auc"}  # the sweep_intervals summary each metric ranks by


# ---------------------------------------------------------------- a sweep as recorded by the analysis


@dataclass(frozen=True)
class RecordedSweep:
    """A sweep read back from the JSON that ``analyses/sweep.py`` writes: its curve points
    (:meth:`SweepResult.to_dataframe` rows) and its meta (with the fingerprint), without per-item records."""

    table: pd.DataFrame
    meta: dict
    baseline_accuracy: float
    chance: float
    source: str = ""

    def normalised_auc(self, *, metric: str = "accuracy") -> dict[str, float]:
        """Per curve of per-input zeroing (``"random"`` included, static pruning left out): the normalised AUC
        over realised % zeroed of accuracy (%) or of the paired KL, as :meth:`SweepResult.normalised_auc`."""
        column, scale = {"accuracy": ("accuracy", 100.0), "kl": ("kl", 1.0)}[_check_metric(metric)]
        return {s: normalised_auc(100 * g["realised_fraction"], scale * g[column]) for s, g in self._curves()}

    def zeroable_within(self, points: float = 1.0, *, rule: str = "authors") -> dict[str, float]:
        """Per curve: % of heads zeroable within ``points`` accuracy points of the baseline, by ``rule``
        (:func:`lens_heads.stats.curves.zeroable_within`), as :meth:`SweepResult.zeroable_within`."""
        base = 100 * self.baseline_accuracy
        return {s: zeroable_within(100 * g["realised_fraction"], 100 * g["accuracy"], base, points, rule=rule)
                for s, g in self._curves()}

    def table2(self, points: float = 1.0, intervals=None) -> dict:
        """The paper's Table 2 entry for this model and task (:meth:`SweepResult.table2` on the recorded points;
        no intervals without per-item records)."""
        return SweepResult.table2(self, points)  # type: ignore[arg-type]  # duck-typed: meta and zeroable_within

    def _curves(self):
        """(curve, its rows in order of target fraction) for every curve of per-input zeroing, named by its
        ``score`` column. Tables without a ``curve`` column (recorded before curves were typed) hold no static
        curves; their ``mode`` marks the fraction-0 rows ``"baseline"``."""
        rows = self.table[self.table["mode"] != "static"]
        rows = rows.sort_values("target_fraction", kind="stable")
        return [(str(s), g) for s, g in rows.groupby("score", sort=False)]


def read_sweep_record(path: str | Path) -> SweepResult | RecordedSweep:
    """A recorded sweep: a ``sweep_<task>.json`` written by ``analyses/sweep.py`` (a :class:`SweepResult` where its
    units file ``sweep_<task>_units.json.gz`` lies beside it, else a :class:`RecordedSweep` of its curve points), or
    a units file itself; a ``run_sweep`` output folder is read by
    :func:`lens_heads.sweep.unit_store.read_sweep_folder` (a :class:`SweepResult` with every unit).
    ``lens_heads.read_sweep`` is this function under its earlier name."""
    path = Path(path)
    if path.is_dir():
        return read_sweep_folder(path)
    units = path if path.name.endswith(UNITS_SUFFIX) else path.with_name(path.stem + UNITS_SUFFIX)
    if units.is_file():
        return read_units(units)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: give a run_sweep output folder or a sweep_<task>.json")
    try:
        d = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise InputError(f"{path} is not valid JSON ({e}): give a sweep_<task>.json written by analyses/sweep.py")
    if not isinstance(d, dict) or not {"table", "sweep_meta", "baseline"} <= set(d):
        raise InputError(f"{path} is not a sweep record (it lacks 'table', 'sweep_meta' or 'baseline'): give a "
                         "sweep_<task>.json written by analyses/sweep.py or a run_sweep output folder")
    meta = {**d["sweep_meta"], "model": d.get("model"), "task": d.get("task")}
    return RecordedSweep(table=pd.DataFrame(d["table"]), meta=meta, baseline_accuracy=d["baseline"]["accuracy"],
                         chance=d["baseline"]["chance"], source=str(path))


read_sweep = read_sweep_record  # the alias scripts written for earlier releases call


# ---------------------------------------------------------------- the comparison


@dataclass(frozen=True)
class SweepComparison:
    """Ranks of the curves per (model, task) and their agreement between every pair of (model, task).

    ``auc[i][j]`` and ``rank[i][j]`` belong to sweep ``labels[i]`` and curve ``curves[j]``."""

    labels: tuple[str, ...]  # "model / task", one per sweep in the order given
    models: tuple[str, ...]
    tasks: tuple[str, ...]
    curves: tuple[str, ...]
    auc: tuple[tuple[float, ...], ...]
    rank: tuple[tuple[float, ...], ...]
    metric: str
    top_k: int
    sweeps: tuple[dict, ...]  # what went in: model, task, sample, seed, weight basis, baseline, chance, source
    dropped: dict = field(default_factory=dict)  # per label: curves that not every sweep has
    rank_low: tuple[tuple[float, ...], ...] = ()  # percentile bootstrap interval of each rank (NaN: no intervals)
    rank_high: tuple[tuple[float, ...], ...] = ()
    rank_replicates: tuple = field(default=(), repr=False, compare=False)  # per sweep: [curve, replicate] or None
    intervals: dict = field(default_factory=dict)  # the bootstrap's settings, and the sweeps without intervals

    def to_dataframe(self) -> pd.DataFrame:
        """One row per (model, task, curve): its normalised AUC and its rank within the (model, task)."""
        return pd.DataFrame([dict(model=m, task=t, curve=c, normalised_auc=self.auc[i][j], rank=self.rank[i][j],
                                  rank_low=self.rank_low[i][j], rank_high=self.rank_high[i][j])
                             for i, (m, t) in enumerate(zip(self.models, self.tasks))
                             for j, c in enumerate(self.curves)])

    def rank_table(self, which: str = "rank") -> pd.DataFrame:
        """Ranks (``which="rank_low"``/``"rank_high"``: their interval's ends), curves x (model / task), curves
        ordered by their mean rank (best first)."""
        values = {"rank": self.rank, "rank_low": self.rank_low, "rank_high": self.rank_high}[which]
        order = pd.Series(np.array(self.rank).mean(0), index=list(self.curves)).sort_values(kind="stable").index
        df = pd.DataFrame(np.array(values, dtype=float).T, index=list(self.curves), columns=list(self.labels))
        df = df.loc[order]
        df.index.name = "curve"
        return df

    def spearman_table(self) -> pd.DataFrame:
        """Spearman correlation of the rankings, (model / task) x (model / task)."""
        m = np.array([[stats.spearman(a, b) for b in self.rank] for a in self.rank])
        return pd.DataFrame(m, index=list(self.labels), columns=list(self.labels))

    def spearman_interval(self, i: int, j: int) -> stats.Interval:
        """The Spearman correlation of sweeps ``i`` and ``j``'s rankings with its bootstrap interval (NaN ends where
        either sweep has no per-item records)."""
        estimate = stats.spearman(self.rank[i], self.rank[j])
        a, b = self.rank_replicates[i], self.rank_replicates[j]
        if a is None or b is None:
            return stats.Interval(estimate, float("nan"), float("nan"))
        per_replicate = stats.spearman_columns(a, b)
        return stats.percentile_interval(estimate, per_replicate,
                                         self.intervals.get("confidence", stats.CONFIDENCE))

    def pairs(self) -> pd.DataFrame:
        """One row per pair of (model, task): Spearman correlation, top-k overlap (count and intersection over union)
        and the shared top-k curves."""
        rows = []
        for i in range(len(self.labels)):
            for j in range(i + 1, len(self.labels)):
                a, b = self.top(i), self.top(j)
                shared = [c for c in a if c in b]
                rho = self.spearman_interval(i, j)
                rows.append(dict(model_a=self.models[i], task_a=self.tasks[i], model_b=self.models[j],
                                 task_b=self.tasks[j], spearman=rho.estimate, spearman_low=rho.low,
                                 spearman_high=rho.high, n_curves=len(self.curves), top_k=self.top_k,
                                 top_k_overlap=len(shared), top_k_iou=top_k_iou(a, b),
                                 shared_top_k=", ".join(shared), top_k_a=", ".join(a), top_k_b=", ".join(b)))
        return pd.DataFrame(rows)

    def top(self, i: int) -> list[str]:
        """The ``top_k`` best curves of sweep ``i``, best first (ties in the order of ``curves``)."""
        order = sorted(range(len(self.curves)), key=lambda j: self.rank[i][j])
        return [self.curves[j] for j in order[: self.top_k]]


def top_k_iou(a: Sequence[str], b: Sequence[str]) -> float:
    """Intersection over union of two top-k sets (the paper's overlap measure): shared / in either."""
    union = set(a) | set(b)
    return len(set(a) & set(b)) / len(union) if union else float("nan")


def compare_sweeps(sweeps: Sequence[SweepResult | RecordedSweep], *, metric: str = "accuracy",
                   top_k: int = 5, n_resamples: int = stats.N_RESAMPLES, seed: int = 0) -> SweepComparison:
    """Rank every curve (``"random"`` included) by normalised AUC per (model, task), and compare the rankings of
    every pair of (model, task) by Spearman correlation and top-``top_k`` overlap, each rank and correlation with
    its bootstrap interval over items (``n_resamples``, ``seed``; see the module docstring).

    ``metric``: ``"accuracy"`` (the paper's ranking) or ``"kl"`` (the low-variance companion)."""
    _check_metric(metric)
    if isinstance(sweeps, (SweepResult, RecordedSweep)) or len(sweeps) < 2:
        raise InputError("compare_sweeps needs at least two sweeps (one per model and task), got "
                         f"{1 if isinstance(sweeps, (SweepResult, RecordedSweep)) else len(sweeps)}")
    if top_k < 1:
        raise InputError(f"top_k must be at least 1, got {top_k}")
    described = [_describe(s) for s in sweeps]
    keys = [(d["model"], d["task"], d["setting"]) for d in described]
    repeated = sorted({k for k in keys if keys.count(k) > 1})
    if repeated:
        raise InputError(f"two sweeps of the same (model, task, setting): "
                         f"{', '.join(f'{m} / {t} ({s})' for m, t, s in repeated)}; give one sweep per (model, task) "
                         "and setting")
    one_setting = len({k[:2] for k in keys}) == len(keys)
    grid = common_grid(sweeps)
    sweeps = [on_grid(s, grid) for s in sweeps]
    aucs = [{c: v for c, v in s.normalised_auc(metric=metric).items() if not math.isnan(v)} for s in sweeps]
    curves = [c for c in aucs[0] if all(c in a for a in aucs[1:])]
    labels = tuple(f"{m} / {t}" if one_setting else f"{m} / {t} ({s})" for m, t, s in keys)
    if len(curves) < 2:
        have = "; ".join(f"{label}: {', '.join(a) or 'none'}" for label, a in zip(labels, aucs))
        raise InputError(f"the sweeps have {len(curves)} curve(s) with an AUC in common, ranking needs at least two "
                         f"({have}): sweep the same scores on every (model, task)")
    auc = tuple(tuple(a[c] for c in curves) for a in aucs)
    rank = tuple(tuple(stats.ranks(row, higher_is_better=metric == "accuracy").tolist()) for row in auc)
    replicates = [_rank_replicates(s, curves, metric, n_resamples, seed) for s in sweeps]
    confidence = stats.CONFIDENCE
    ends = [_rank_ends(r, len(curves), confidence) for r in replicates]
    dropped = {label: [c for c in a if c not in curves] for label, a in zip(labels, aucs)}
    intervals = dict(method=stats.BOOTSTRAP, n_resamples=n_resamples, seed=seed, confidence=confidence,
                     no_intervals=[label for label, r in zip(labels, replicates) if r is None],
                     grid=[100 * p for p in grid])
    return SweepComparison(labels=labels, models=tuple(k[0] for k in keys), tasks=tuple(k[1] for k in keys),
                           curves=tuple(curves), auc=auc, rank=rank, metric=metric, top_k=min(top_k, len(curves)),
                           sweeps=tuple(described), dropped={k: v for k, v in dropped.items() if v},
                           rank_low=tuple(low for low, _ in ends), rank_high=tuple(high for _, high in ends),
                           rank_replicates=tuple(replicates), intervals=intervals)


def compare_by_metric(sweeps: Sequence[SweepResult | RecordedSweep], *, top_k: int = 5,
                      n_resamples: int = stats.N_RESAMPLES, seed: int = 0) -> dict[str, SweepComparison]:
    """:func:`compare_sweeps` under each ranking of :data:`METRICS` (accuracy, then the paired KL), by metric: the
    comparison the report and ``analyses/compare_sweeps.py`` both show."""
    return {m: compare_sweeps(sweeps, metric=m, top_k=top_k, n_resamples=n_resamples, seed=seed) for m in METRICS}


def common_grid(sweeps: Sequence[SweepResult | RecordedSweep]) -> list[float]:
    """The target fractions (0 included) that every sweep measured: AUCs over different grids don't compare."""
    grids = [_targets(s) for s in sweeps]
    grid = sorted(set.intersection(*grids))
    if len([p for p in grid if p > 0]) < 1:
        raise InputError(f"the sweeps share no target share of heads ({[sorted(g) for g in grids]}): sweep a common "
                         "grid of fractions")
    return grid


def on_grid(sweep, grid: Sequence[float]):
    """``sweep`` with only the points at target fractions in ``grid``."""
    keep = {round(p, 9) for p in grid}
    if _targets(sweep) <= keep:
        return sweep
    if isinstance(sweep, SweepResult):
        units = [u for u in sweep.units if round(u.target_fraction, 9) in keep]
        return SweepResult(sweep.baseline, units, dict(sweep.meta, fractions=sorted(keep)))
    table = sweep.table[sweep.table["target_fraction"].round(9).isin(keep)]
    return RecordedSweep(table, sweep.meta, sweep.baseline_accuracy, sweep.chance, sweep.source)


def _targets(sweep) -> set[float]:
    if isinstance(sweep, SweepResult):
        return {round(u.target_fraction, 9) for u in sweep.units}
    return {round(float(p), 9) for p in sweep.table["target_fraction"]}


def _rank_replicates(sweep, curves: list[str], metric: str, n_resamples: int, seed: int) -> np.ndarray | None:
    """[curve, replicate]: the ranks of ``curves`` among themselves in each bootstrap replicate of ``sweep``'s
    items (None for a sweep recorded without per-item records)."""
    if not isinstance(sweep, SweepResult):
        return None
    iv = sweep.intervals(n_resamples=n_resamples, seed=seed)
    values = iv.replicates[iv.quantities.index(SUMMARY[metric]), [iv.curves.index(c) for c in curves]]
    return replicate_ranks(values, higher_is_better=metric == "accuracy")


def _rank_ends(replicates: np.ndarray | None, n: int, confidence: float) -> tuple[tuple[float, ...], ...]:
    if replicates is None:
        return (float("nan"),) * n, (float("nan"),) * n
    ivs = [stats.percentile_interval(float("nan"), r, confidence) for r in replicates]
    return tuple(i.low for i in ivs), tuple(i.high for i in ivs)


def _check_metric(metric: str) -> str:
    if metric not in METRICS:
        raise InputError(f"unknown metric {metric!r}: choose one of {', '.join(METRICS)}")
    return metric


def _describe(sweep) -> dict:
    """Model, task and sample of a sweep, from its fingerprint; the baseline beside chance."""
    fp = (getattr(sweep, "meta", None) or {}).get("fingerprint")
    if not isinstance(sweep, (SweepResult, RecordedSweep)) or not fp:
        raise InputError(f"a {type(sweep).__name__} without a fingerprint can't be placed by model and task: give "
                         "SweepResults from run_sweep or read_sweep_record")
    model, task = fp.get("model") or {}, fp.get("task") or {}
    if isinstance(sweep, SweepResult):
        baseline, chance = sweep.baseline.accuracy, sweep.baseline.chance
        source = sweep.meta.get("source") or sweep.meta.get("out_dir")
    else:
        baseline, chance, source = sweep.baseline_accuracy, sweep.chance, sweep.source
    return dict(model=str(model.get("name")), task=str(task.get("task")), setting=setting_of(sweep),
                split=task.get("split"),
                shots=task.get("shots"), format=task.get("format"), n=task.get("n"), seed=task.get("seed"),
                weight_basis=model.get("weight_basis"), calibration=fp.get("calibration"),
                protocol=fp.get("protocol"), baseline_accuracy=baseline, chance=chance, source=source)


# ---------------------------------------------------------------- one model and task under two settings

CHAT_NAMES = {False: "no chat template", True: "chat template", "single_turn": "chat template, one turn"}


def setting_of(sweep) -> str:
    """What tells a sweep from another of the same model and task: its split, chat template and, where it is not
    the default per-item draw, how its random baseline drew (fingerprint)."""
    fp = (getattr(sweep, "meta", None) or {}).get("fingerprint") or {}
    chat = fp.get("apply_chat_template", False)
    drawn = f", random drawn {fp['random_draw'].replace('_', ' ')}" if fp.get("random_draw", "per_item") != "per_item" \
        else ""
    return f"{(fp.get('task') or {}).get('split')}, {CHAT_NAMES.get(chat, str(chat))}{drawn}"


def compare_settings(a: SweepResult, b: SweepResult, *, n_resamples: int = stats.N_RESAMPLES, seed: int = 0
                     ) -> pd.DataFrame:
    """One model and task swept under two settings on the same items: per curve, its normalised AUC of accuracy and
    of the KL and its rank by each under ``a`` and under ``b``, and the paired difference b - a with its percentile
    interval (both sweeps bootstrapped with the same resampled items, replicate by replicate, on their common grid
    of target shares) and, for the AUCs, a paired permutation test that swaps each item's outcomes under the two
    settings; called by the one rule over the table (:mod:`lens_heads.stats.calling`). A rank depends on every
    curve at once, so its change has an interval and no test: "not tested"."""
    for s in (a, b):
        if not isinstance(s, SweepResult):
            raise InputError("compare_settings needs per-item records: give run_sweep results, or sweep_<task>.json "
                             "files with their units file beside them (read_sweep_record)")
    if [it.id for it in a.baseline.items] != [it.id for it in b.baseline.items]:
        raise InputError("compare_settings pairs the two sweeps item by item: sweep the same items (task, split, n, "
                         "seed) under both settings")
    grid = common_grid([a, b])
    ia, ib = (on_grid(s, grid).intervals(n_resamples=n_resamples, seed=seed) for s in (a, b))
    rows = []
    for quantity in ("accuracy_auc", "kl_auc", "rank_accuracy_auc", "rank_kl_auc"):
        for curve in (c for c in ia.curves if c in ib.curves):
            qa, ca, qb, cb = (ia.quantities.index(quantity), ia.curves.index(curve), ib.quantities.index(quantity),
                              ib.curves.index(curve))
            iv = stats.percentile_interval(ib.estimates[qb, cb] - ia.estimates[qa, ca],
                                           ib.replicates[qb, cb] - ia.replicates[qa, ca], ia.meta["confidence"])
            p = float("nan") if quantity.startswith("rank_") else _settings_p_value(ia, ib, ca, cb, qb, n_resamples)
            rows.append(dict(quantity=quantity, curve=curve, a=float(ia.estimates[qa, ca]),
                             b=float(ib.estimates[qb, cb]), difference=iv.estimate, low=iv.low, high=iv.high,
                             p_value=p, higher_is_better=None))
    table = calling.call_table(pd.DataFrame(rows))
    table["verdict"] = [f"{v} under b" if v in (calling.HIGHER, calling.LOWER) else v for v in table["verdict"]]
    return table.assign(setting_a=setting_of(a), setting_b=setting_of(b), grid_pct=str(
        [100 * p for p in grid]), n_items=len(a.baseline.items), n_resamples=n_resamples, seed=seed,
        calling_rule=calling.RULE)


def _settings_p_value(ia, ib, ca: int, cb: int, q: int, n_resamples: int) -> float:
    """The paired permutation p of curve b-minus-a in summary ``q`` across two settings' intervals (same items)."""
    (items_a, rows_a, heads), (items_b, rows_b, _) = ia.data, ib.data
    statistic = paired_statistic(items_b[cb], items_a[ca], rows_b, rows_a, heads, q, points=ib.meta["points"],
                                 shares=ib.meta["shares"])
    return stats.permutation_p_value(statistic, len(rows_a), n_resamples=n_resamples, seed=ia.meta["seed"])


def zeroed_head_overlap(a: SweepResult, b: SweepResult, majority: float = 0.5) -> pd.DataFrame:
    """Which heads two sweeps of the same model zero, per curve (threshold and static units) and target share: the
    heads zeroed on at least ``majority`` of each sweep's rows (all rows, for the static view), how many of them
    the two share and their Jaccard overlap, and the Spearman correlation of every head's share of rows zeroed.
    Descriptive: no interval (the units keep each head's share of rows, not which items it was zeroed on)."""
    by_key = {(u.mode, u.score, round(u.target_fraction, 9)): u for u in b.units if u.head_share is not None}
    rows = []
    for u in a.units:
        other = by_key.get((u.mode, u.score, round(u.target_fraction, 9)))
        if u.mode not in ("threshold", "static") or u.head_share is None or other is None:
            continue
        sa, sb = np.asarray(u.head_share, dtype=float).ravel(), np.asarray(other.head_share, dtype=float).ravel()
        ha, hb = sa >= majority, sb >= majority
        union = int((ha | hb).sum())
        rows.append(dict(mode=u.mode, score=u.score, target_pct=100 * u.target_fraction, heads_a=int(ha.sum()),
                         heads_b=int(hb.sum()), shared=int((ha & hb).sum()),
                         jaccard=float((ha & hb).sum() / union) if union else float("nan"),
                         spearman_head_share=stats.spearman(sa, sb), majority=majority))
    return pd.DataFrame(rows)
