"""Whether two models of one layer x head shape rank and zero the same heads (the ``"head"`` view of
:func:`lens_heads.experiments.compare_distributions.compare_distributions`): the Spearman correlation of their
per-head mean scores, and at each share the Jaccard overlaps of the (row, layer, head) triples each model's own
threshold zeroes and of their static head sets, with bootstrap intervals over items. Descriptive: no test."""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import torch
from jaxtyping import Float
from scipy import stats

from lens_heads.heads.distributions import thresholds as score_thresholds
from lens_heads.heads.scores import inactive
from lens_heads.heads.scoring import HeadScores
from lens_heads.stats import inference
from lens_heads.stats.distances import counts


def head_agreement(name: str, a: str, b: str, score_sets: Mapping[str, HeadScores], items: dict, n_items: int,
                   shares: Sequence[float], n_resamples: int, seed: int, confidence: float) -> list[dict]:
    """Spearman of the per-head means, and the Jaccard overlaps of the zeroed triples and static head sets, with
    bootstrap intervals over items."""
    sa, sb = score_sets[a], score_sets[b]
    va, vb = (s.score(name).double().numpy() for s in (sa, sb))
    direction = sa.direction[name]
    n_heads = va.shape[1] * va.shape[2]
    sums = [_item_sums(v.reshape(v.shape[0], -1), items[m], n_items) for v, m in ((va, a), (vb, b))]
    rows_aligned = np.array_equal(items[a], items[b])
    quantities: list[tuple[str, float | None]] = [("spearman_heads", None)]
    zeroed = []
    for p in shares:
        if rows_aligned:
            za, zb = (inactive(torch.from_numpy(v), direction, score_thresholds(s, name, [p])[p]).numpy()
                      for v, s in ((va, sa), (vb, sb)))
            both, either = ((za & zb).sum((1, 2)), (za | zb).sum((1, 2)))
            zeroed.append(tuple(np.bincount(items[a], weights=x, minlength=n_items) for x in (both, either)))
            quantities.append(("jaccard_rows", p))
        quantities.append(("jaccard_static", p))

    def statistic(idx: np.ndarray) -> np.ndarray:
        c = counts(idx, n_items).astype(float)
        means = [(c @ total) / (c @ n)[:, None] for total, n in sums]
        out, z = [_spearman_rows(*means)], iter(zeroed)
        for quantity, p in quantities[1:]:
            if quantity == "jaccard_rows":
                both, either = next(z)
                out.append((c @ both) / np.maximum(c @ either, 1e-300))
            else:
                k = int(round(p * n_heads))
                out.append(_jaccard_rows(*(_top(m, direction, k) for m in means)))
        return np.stack(out)

    boot = inference.bootstrap_items(statistic, n_items, n_resamples=n_resamples, seed=seed, confidence=confidence)
    return [dict(score=name, a=a, b=b, quantity=quantity, share=p, estimate=float(boot.estimates[k]),
                 low=float(boot.low[k]), high=float(boot.high[k]),
                 chance=float("nan") if p is None else p / (2 - p), n_items=n_items)
            for k, (quantity, p) in enumerate(quantities)]


def _item_sums(values: Float[np.ndarray, "row head"], items: np.ndarray, n_items: int
               ) -> tuple[Float[np.ndarray, "item head"], np.ndarray]:
    """Per item: the sum of its rows' values per head, and its number of rows."""
    total = np.zeros((n_items, values.shape[1]))
    np.add.at(total, items, values)
    return total, np.bincount(items, minlength=n_items).astype(float)


def _spearman_rows(x: Float[np.ndarray, "r n"], y: Float[np.ndarray, "r n"]) -> Float[np.ndarray, "k"]:
    """Spearman's correlation of each row of ``x`` with the same row of ``y`` (average ranks for ties)."""
    rx, ry = (stats.rankdata(v, axis=1, method="average") for v in (x, y))
    rx, ry = rx - rx.mean(1, keepdims=True), ry - ry.mean(1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (rx * ry).sum(1) / np.sqrt((rx ** 2).sum(1) * (ry ** 2).sum(1))


def _top(means: Float[np.ndarray, "r head"], direction: str, k: int) -> np.ndarray:
    """Per row, a mask of the ``k`` most inactive heads (:func:`lens_heads.heads.scores.most_inactive`'s order)."""
    order = np.argsort(means if direction == "<" else -means, axis=1, kind="stable")[:, :k]
    mask = np.zeros(means.shape, dtype=bool)
    np.put_along_axis(mask, order, True, axis=1)
    return mask


def _jaccard_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    union = (x | y).sum(1)
    return np.where(union > 0, (x & y).sum(1) / np.maximum(union, 1), np.nan)
