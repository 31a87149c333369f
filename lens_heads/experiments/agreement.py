"""Does a score find the heads that do nothing? Each head score's agreement with the measured head effects.

A score says which heads are inactive (low values for '<' scores, high for '>' ones, ``lens_heads.heads.scores.DIRECTION``);
:class:`lens_heads.experiments.effects.HeadEffects` says how much removing each head changes the task (its *size*: mean absolute
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
import pandas as pd
import torch

from lens_heads.plumbing.errors import InputError
from lens_heads.stats.inference import BOOTSTRAP, bootstrap_items, kendall, spearman

KS = (0.05, 0.10, 0.20, 0.30)


# ---------------------------------------------------------------- rank statistics


def precision_at_k(activity: np.ndarray, size: np.ndarray, k: int) -> float:
    """Share of the ``k`` least active heads (by ``activity``) among the ``k`` with the smallest ``size``."""
    called = np.argsort(activity.reshape(-1), kind="stable")[:k]
    truth = np.argsort(size.reshape(-1), kind="stable")[:k]
    return len(set(called.tolist()) & set(truth.tolist())) / k


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
    """Agreement of each score in ``scores`` (a :class:`lens_heads.heads.scoring.HeadScores` of the same items, in the
    same order, as ``effects``) with the effect sizes of ``effects`` under ``metric`` (default: its own)."""
    names = list(scores.names if names is None else names)
    x = item_scores(scores)
    if x.shape[0] != len(effects) or tuple(x.shape[1:3]) != tuple(effects.values.shape[1:3]):
        raise InputError(f"the scores cover {x.shape[0]} items x {tuple(x.shape[1:3])} heads, the effects "
                         f"{len(effects)} items x {tuple(effects.values.shape[1:3])} heads: score the same task "
                         "(score_heads(model, task)) that head_effects measured")
    if n_boot < 1:
        raise InputError(f"n_boot must be >= 1, got {n_boot}")
    effect = np.abs(effects.effect(metric).numpy())  # [item, layer, head]
    n, L, H = effect.shape
    heads = L * H
    counts = [max(1, int(round(k * heads))) for k in ks]
    columns = ["spearman", "kendall"] + [f"precision_at_{round(100 * k)}pct" for k in ks]
    rows = []
    for name in names:
        sign = -1.0 if scores.direction[name] == ">" else 1.0
        activity = sign * x[..., scores.all_names.index(name)]  # [item, layer, head]
        per_input_s = np.array([spearman(a.reshape(-1), e.reshape(-1)) for a, e in zip(activity, effect)])
        per_input_k = np.array([kendall(a.reshape(-1), e.reshape(-1)) for a, e in zip(activity, effect)])

        def statistics(idx):
            out = []
            for rows_ in idx:
                a, s = activity[rows_].mean(0).reshape(-1), effect[rows_].mean(0).reshape(-1)
                out.append([spearman(a, s), kendall(a, s)] + [precision_at_k(a, s, k) for k in counts] +
                           [_nanmean(per_input_s[rows_]), _nanmean(per_input_k[rows_])])
            return np.array(out).T

        boot = bootstrap_items(statistics, n, n_resamples=n_boot, seed=seed)
        row = dict(score=name, direction=scores.direction[name])
        for c, column in enumerate(columns + ["spearman_per_input", "kendall_per_input"]):
            row[column], row[f"{column}_low"], row[f"{column}_high"] = boot.estimates[c], boot.low[c], boot.high[c]
        rows.append(row)
    meta = dict(effects_method=effects.method, metric=metric or effects.metric, n_items=n, heads=heads,
                ks=list(ks), k_heads=counts, precision_chance={f"precision_at_{round(100 * k)}pct": c / heads
                                                               for k, c in zip(ks, counts)},
                n_boot=n_boot, seed=seed, interval=BOOTSTRAP + ", 95%",
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


def _nanmean(values: np.ndarray) -> float:
    return float(np.nanmean(values)) if np.isfinite(values).any() else float("nan")
