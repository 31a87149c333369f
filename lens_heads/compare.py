"""Comparing sweeps across models and tasks: does a score that spares accuracy on one (model, task) spare it on
another?

Given several sweeps, one per (model, task) (:class:`lens_heads.sweep.SweepResult`, or the tables that
``analyses/sweep.py`` records, read back with :func:`read_sweep`):

- the **rank** of every curve (the scores and ``"random"``) by its normalised AUC within its (model, task): 1 is
  the best (highest accuracy AUC; lowest KL AUC with ``metric="kl"``), tied curves share their average rank;
- the **Spearman correlation** of the rankings between every pair of (model, task): the Pearson correlation of
  the two vectors of average ranks;
- the **top-k overlap**: how many of the k best curves of one (model, task) are among the k best of the other.

Ranks, correlations and overlaps are taken over the curves that every sweep has (the others are listed in
``dropped``), so every rank is out of the same number of curves.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from lens_heads.curves import normalised_auc, zeroable_within
from lens_heads.sweep import SweepResult, load_sweep

METRICS = {"accuracy": "normalised AUC of accuracy (%), higher is better",
           "kl": "normalised AUC of the paired KL(unablated || ablated) (nats), lower is better"}


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
        (:func:`lens_heads.curves.zeroable_within`), as :meth:`SweepResult.zeroable_within`."""
        base = 100 * self.baseline_accuracy
        return {s: zeroable_within(100 * g["realised_fraction"], 100 * g["accuracy"], base, points, rule=rule)
                for s, g in self._curves()}

    def table2(self, points: float = 1.0) -> dict:
        """The paper's Table 2 entry for this model and task (:meth:`SweepResult.table2` on the recorded points)."""
        return SweepResult.table2(self, points)

    def _curves(self):
        """(curve, its rows in order of target fraction) for every curve of per-input zeroing, named by its
        ``score`` column. Tables without a ``curve`` column (recorded before curves were typed) hold no static
        curves; their ``mode`` marks the fraction-0 rows ``"baseline"``."""
        rows = self.table[self.table["mode"] != "static"]
        rows = rows.sort_values("target_fraction", kind="stable")
        return [(str(s), g) for s, g in rows.groupby("score", sort=False)]


def read_sweep(path: str | Path) -> SweepResult | RecordedSweep:
    """A sweep from a ``run_sweep`` output folder (a :class:`SweepResult` with every unit) or from a
    ``sweep_<task>.json`` written by ``analyses/sweep.py`` (a :class:`RecordedSweep` of its curve points)."""
    path = Path(path)
    if path.is_dir():
        return load_sweep(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: give a run_sweep output folder or a sweep_<task>.json")
    try:
        d = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON ({e}): give a sweep_<task>.json written by analyses/sweep.py")
    if not isinstance(d, dict) or not {"table", "sweep_meta", "baseline"} <= set(d):
        raise ValueError(f"{path} is not a sweep record (it lacks 'table', 'sweep_meta' or 'baseline'): give a "
                         "sweep_<task>.json written by analyses/sweep.py or a run_sweep output folder")
    meta = {**d["sweep_meta"], "model": d.get("model"), "task": d.get("task")}
    return RecordedSweep(table=pd.DataFrame(d["table"]), meta=meta, baseline_accuracy=d["baseline"]["accuracy"],
                         chance=d["baseline"]["chance"], source=str(path))


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

    def to_dataframe(self) -> pd.DataFrame:
        """One row per (model, task, curve): its normalised AUC and its rank within the (model, task)."""
        return pd.DataFrame([dict(model=m, task=t, curve=c, normalised_auc=self.auc[i][j], rank=self.rank[i][j])
                             for i, (m, t) in enumerate(zip(self.models, self.tasks))
                             for j, c in enumerate(self.curves)])

    def rank_table(self) -> pd.DataFrame:
        """Ranks, curves x (model / task), curves ordered by their mean rank (best first)."""
        df = pd.DataFrame(np.array(self.rank).T, index=list(self.curves), columns=list(self.labels))
        df = df.loc[df.mean(axis=1).sort_values(kind="stable").index]
        df.index.name = "curve"
        return df

    def spearman_table(self) -> pd.DataFrame:
        """Spearman correlation of the rankings, (model / task) x (model / task)."""
        r = np.array(self.rank, dtype=float)
        m = np.array([[_pearson(a, b) for b in r] for a in r])
        return pd.DataFrame(m, index=list(self.labels), columns=list(self.labels))

    def pairs(self) -> pd.DataFrame:
        """One row per pair of (model, task): Spearman correlation, top-k overlap and the shared top-k curves."""
        rows = []
        for i in range(len(self.labels)):
            for j in range(i + 1, len(self.labels)):
                a, b = self.top(i), self.top(j)
                shared = [c for c in a if c in b]
                rows.append(dict(model_a=self.models[i], task_a=self.tasks[i], model_b=self.models[j],
                                 task_b=self.tasks[j], spearman=_pearson(self.rank[i], self.rank[j]),
                                 n_curves=len(self.curves), top_k=self.top_k, top_k_overlap=len(shared),
                                 shared_top_k=", ".join(shared), top_k_a=", ".join(a), top_k_b=", ".join(b)))
        return pd.DataFrame(rows)

    def top(self, i: int) -> list[str]:
        """The ``top_k`` best curves of sweep ``i``, best first (ties in the order of ``curves``)."""
        order = sorted(range(len(self.curves)), key=lambda j: self.rank[i][j])
        return [self.curves[j] for j in order[: self.top_k]]


def compare_sweeps(sweeps: Sequence[SweepResult | RecordedSweep], *, metric: str = "accuracy",
                   top_k: int = 5) -> SweepComparison:
    """Rank every curve (``"random"`` included) by normalised AUC per (model, task), and compare the rankings of
    every pair of (model, task) by Spearman correlation and top-``top_k`` overlap (see the module docstring).

    ``metric``: ``"accuracy"`` (the paper's ranking) or ``"kl"`` (the low-variance companion)."""
    _check_metric(metric)
    if isinstance(sweeps, (SweepResult, RecordedSweep)) or len(sweeps) < 2:
        raise ValueError("compare_sweeps needs at least two sweeps (one per model and task), got "
                         f"{1 if isinstance(sweeps, (SweepResult, RecordedSweep)) else len(sweeps)}")
    if top_k < 1:
        raise ValueError(f"top_k must be at least 1, got {top_k}")
    described = [_describe(s) for s in sweeps]
    keys = [(d["model"], d["task"]) for d in described]
    repeated = sorted({k for k in keys if keys.count(k) > 1})
    if repeated:
        raise ValueError(f"two sweeps of the same (model, task): {', '.join(f'{m} / {t}' for m, t in repeated)}; "
                         "give one sweep per (model, task)")
    aucs = [{c: v for c, v in s.normalised_auc(metric=metric).items() if not math.isnan(v)} for s in sweeps]
    curves = [c for c in aucs[0] if all(c in a for a in aucs[1:])]
    labels = tuple(f"{m} / {t}" for m, t in keys)
    if len(curves) < 2:
        have = "; ".join(f"{label}: {', '.join(a) or 'none'}" for label, a in zip(labels, aucs))
        raise ValueError(f"the sweeps have {len(curves)} curve(s) with an AUC in common, ranking needs at least two "
                         f"({have}): sweep the same scores on every (model, task)")
    sign = -1.0 if metric == "accuracy" else 1.0  # rank 1 = best
    auc = tuple(tuple(a[c] for c in curves) for a in aucs)
    rank = tuple(tuple(average_ranks([sign * v for v in row]).tolist()) for row in auc)
    dropped = {label: [c for c in a if c not in curves] for label, a in zip(labels, aucs)}
    return SweepComparison(labels=labels, models=tuple(k[0] for k in keys), tasks=tuple(k[1] for k in keys),
                           curves=tuple(curves), auc=auc, rank=rank, metric=metric, top_k=min(top_k, len(curves)),
                           sweeps=tuple(described), dropped={k: v for k, v in dropped.items() if v})


def average_ranks(values: Sequence[float]) -> np.ndarray:
    """Ranks 1..n of ``values`` (smallest first); tied values share the mean of the ranks they span."""
    v = np.asarray(values, dtype=float)
    order = np.argsort(v, kind="stable")
    ranks = np.empty(len(v))
    start = 0
    while start < len(v):
        end = start
        while end + 1 < len(v) and v[order[end + 1]] == v[order[start]]:
            end += 1
        ranks[order[start:end + 1]] = (start + end) / 2 + 1
        start = end + 1
    return ranks


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman correlation of two samples: the Pearson correlation of their average ranks (NaN when either
    sample is constant)."""
    return _pearson(average_ranks(a), average_ranks(b))


def _pearson(a, b) -> float:
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    a, b = a - a.mean(), b - b.mean()
    denom = math.sqrt(float(a @ a) * float(b @ b))
    return float(a @ b / denom) if denom > 0 else float("nan")


def _check_metric(metric: str) -> str:
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}: choose one of {', '.join(METRICS)}")
    return metric


def _describe(sweep) -> dict:
    """Model, task and sample of a sweep, from its fingerprint; the baseline beside chance."""
    fp = (getattr(sweep, "meta", None) or {}).get("fingerprint")
    if not isinstance(sweep, (SweepResult, RecordedSweep)) or not fp:
        raise ValueError(f"a {type(sweep).__name__} without a fingerprint can't be placed by model and task: give "
                         "SweepResults from run_sweep or read_sweep")
    model, task = fp.get("model") or {}, fp.get("task") or {}
    if isinstance(sweep, SweepResult):
        baseline, chance, source = sweep.baseline.accuracy, sweep.baseline.chance, sweep.meta.get("out_dir")
    else:
        baseline, chance, source = sweep.baseline_accuracy, sweep.chance, sweep.source
    return dict(model=str(model.get("name")), task=str(task.get("task")), split=task.get("split"),
                shots=task.get("shots"), format=task.get("format"), n=task.get("n"), seed=task.get("seed"),
                weight_basis=model.get("weight_basis"), calibration=fp.get("calibration"),
                protocol=fp.get("protocol"), baseline_accuracy=baseline, chance=chance, source=source)
