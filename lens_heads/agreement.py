"""Does a score find the heads that do nothing? Each head score's agreement with the measured head effects.

A score says which heads are inactive (low values for '<' scores, high for '>' ones, ``lens_heads.scores.DIRECTION``);
:class:`lens_heads.effects.HeadEffects` says how much removing each head changes the task (its *size*: mean absolute
per-item effect). Per score, over the layers x heads:

- **Spearman and Kendall (tau-b) rank correlation** between the score's *activity* (the score, negated for '>'
  scores, so larger = more active) and the effect size. Positive: the score calls inactive the heads whose removal
  changes little. On the means over items (the static view), and per input (each item's scores against that item's
  absolute effects, then the mean over items).
- **precision@k** for k = 5, 10, 20, 30% of the heads: of the k heads the score calls most inactive (mean over
  items), the share among the k with the smallest effect size. A random ranking expects k / heads (the chance level).

A task scored row by row (one row per choice for cloze tasks) gives each item the mean of its rows' scores.
Intervals: percentile bootstrap over items (the items are resampled, both the mean scores and the effect sizes are
recomputed), 95%. Ties share their average rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

KS = (0.05, 0.10, 0.20, 0.30)


# ---------------------------------------------------------------- rank statistics (pure numpy)


def ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 0..n-1 along the last axis, ties sharing their average rank."""
    x = np.asarray(x, dtype=float)
    if x.ndim > 1:
        return np.stack([ranks(row) for row in x.reshape(-1, x.shape[-1])]).reshape(x.shape)
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    first = np.cumsum(counts) - counts
    return (first + (counts - 1) / 2.0)[inverse]


def spearman(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Spearman's rank correlation along the last axis (NaN where either side is constant)."""
    return _pearson(ranks(x), ranks(y))


def kendall(x: np.ndarray, y: np.ndarray) -> float:
    """Kendall's tau-b of two 1-D arrays (ties handled; NaN where either side is constant)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    upper = np.triu_indices(len(x), 1)
    sx = np.sign(x[:, None] - x[None, :])[upper]
    sy = np.sign(y[:, None] - y[None, :])[upper]
    denom = np.sqrt(np.sum(sx * sx) * np.sum(sy * sy))
    return float(np.sum(sx * sy) / denom) if denom > 0 else float("nan")


def precision_at_k(activity: np.ndarray, size: np.ndarray, k: int) -> float:
    """Share of the ``k`` least active heads (by ``activity``) among the ``k`` with the smallest ``size``."""
    called = np.argsort(activity.reshape(-1), kind="stable")[:k]
    truth = np.argsort(size.reshape(-1), kind="stable")[:k]
    return len(set(called.tolist()) & set(truth.tolist())) / k


def _pearson(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a - a.mean(-1, keepdims=True)
    b = b - b.mean(-1, keepdims=True)
    denom = np.sqrt((a * a).sum(-1) * (b * b).sum(-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denom > 0, (a * b).sum(-1) / np.where(denom > 0, denom, 1.0), np.nan)


# ---------------------------------------------------------------- the agreement of every score


@dataclass
class Agreement:
    """One row per score: rank correlations with the effect size and precision@k, each with a bootstrap 95%
    interval; ``meta`` says which effects (method, metric), items, bootstrap size and seed."""

    table: "object"  # pandas.DataFrame
    meta: dict = field(default_factory=dict)

    def to_dataframe(self):
        return self.table.copy()


def score_agreement(scores, effects, *, metric: str | None = None, names: Sequence[str] | None = None,
                    ks: Sequence[float] = KS, n_boot: int = 1000, seed: int = 0) -> Agreement:
    """Agreement of each score in ``scores`` (a :class:`lens_heads.head_scores.HeadScores` of the same items, in the
    same order, as ``effects``) with the effect sizes of ``effects`` under ``metric`` (default: its own)."""
    import pandas as pd

    names = list(scores.names if names is None else names)
    x = item_scores(scores)
    if x.shape[0] != len(effects) or tuple(x.shape[1:3]) != tuple(effects.values.shape[1:3]):
        raise ValueError(f"the scores cover {x.shape[0]} items x {tuple(x.shape[1:3])} heads, the effects "
                         f"{len(effects)} items x {tuple(effects.values.shape[1:3])} heads: score the same task "
                         "(score_heads(model, task)) that head_effects measured")
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    effect = np.abs(effects.effect(metric).numpy())  # [item, layer, head]
    n, L, H = effect.shape
    heads = L * H
    counts = [max(1, int(round(k * heads))) for k in ks]
    rng = np.random.default_rng(seed)
    draws = [rng.integers(0, n, n) for _ in range(n_boot)]
    rows = []
    for name in names:
        sign = -1.0 if scores.direction[name] == ">" else 1.0
        activity = sign * x[..., scores.all_names.index(name)]  # [item, layer, head]

        def statistics(idx) -> list[float]:
            a = activity[idx].mean(0).reshape(-1)
            s = effect[idx].mean(0).reshape(-1)
            return [float(spearman(a, s)), kendall(a, s)] + [precision_at_k(a, s, k) for k in counts]

        point = statistics(np.arange(n))
        boot = np.array([statistics(idx) for idx in draws])
        per_input_s = spearman(activity.reshape(n, -1), effect.reshape(n, -1))
        per_input_k = np.array([kendall(activity[i].reshape(-1), effect[i].reshape(-1)) for i in range(n)])
        row = dict(score=name, direction=scores.direction[name])
        columns = ["spearman", "kendall"] + [f"precision_at_{round(100 * k)}pct" for k in ks]
        for c, column in enumerate(columns):
            row[column] = point[c]
            row[f"{column}_low"], row[f"{column}_high"] = _interval(boot[:, c])
        for column, values in (("spearman_per_input", per_input_s), ("kendall_per_input", per_input_k)):
            row[column] = float(np.nanmean(values)) if np.isfinite(values).any() else float("nan")
            means = np.array([np.nanmean(values[idx]) if np.isfinite(values[idx]).any() else np.nan
                              for idx in draws])
            row[f"{column}_low"], row[f"{column}_high"] = _interval(means)
        rows.append(row)
    meta = dict(effects_method=effects.method, metric=metric or effects.metric, n_items=n, heads=heads,
                ks=list(ks), k_heads=counts, precision_chance={f"precision_at_{round(100 * k)}pct": c / heads
                                                               for k, c in zip(ks, counts)},
                n_boot=n_boot, seed=seed, interval="percentile bootstrap over items, 95%",
                item_scores="mean over each item's forward rows" if (scores.meta.get("data") or {}).get("row_items")
                is not None else "one input per item",
                orientation="activity = score ('<' scores) or -score ('>' scores); positive correlation = the score "
                            "calls inactive the heads whose removal changes little")
    return Agreement(table=pd.DataFrame(rows), meta=meta)


def item_scores(scores) -> np.ndarray:
    """``[item, layer, head, score]``: each item's scores, the mean over its forward rows where a Task was scored
    row by row (``meta["data"]["row_items"]``, e.g. one row per choice), else the inputs as they are."""
    parts = [scores.values] + ([scores.extra_values] if scores.extra_values is not None else [])
    values = torch.cat(parts, -1).double().numpy()
    row_items = (scores.meta.get("data") or {}).get("row_items")
    if row_items is None:
        return values
    row_items = np.asarray(row_items)
    return np.stack([values[row_items == i].mean(0) for i in range(int(row_items.max()) + 1)])


def _interval(values: np.ndarray) -> tuple[float, float]:
    values = values[np.isfinite(values)]
    if values.size == 0:
        return float("nan"), float("nan")
    low, high = np.percentile(values, [2.5, 97.5])
    return float(low), float(high)
