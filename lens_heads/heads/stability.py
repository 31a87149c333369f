"""Do the head scores pick the same heads on different tasks? Rank agreement and overlap of inactive heads.

The inactive-heads paper (§4) reads AHON (LN) as stable across data sets and AWFT as sensitive to them. Here each
score's per-head mean on one task is compared with its mean on another, for every pair of tasks:

- ``spearman_heads``: Spearman correlation over all (layer, head) means;
- ``spearman_within_layers``: Spearman over each layer's heads, averaged over the layers (the paper reads the
  scores layer by layer; a score can order layers alike on two tasks and their heads differently);
- ``spearman_layers``: Spearman over the per-layer means;
- ``jaccard``: overlap |A ∩ B| / |A ∪ B| of the ``fraction`` most inactive heads on each task, most inactive by the
  score's own direction (lowest for a "<" score, highest for AWFT's ">").

A head's value on a task is its mean over the task's items, each item the mean of its forward rows (one per choice
for cloze tasks), so every item weighs the same. Intervals are percentile bootstraps over items
(``scipy.stats.bootstrap``): each task's items are resampled independently, the same resample for every score, so
two scores' statistics are paired replicate by replicate. A claim that score A is more stable than score B is the
mean over task pairs of A's statistic minus B's, with that bootstrap interval and a paired permutation test over the
task pairs (each pair's two values swapped), called by :mod:`lens_heads.stats.calling`. Task pairs share tasks, so
they are not independent: the permutation test treats them as if they were, and the interval (over items) is the
part of the evidence that does not.
"""

from __future__ import annotations

import itertools
import warnings
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
from jaxtyping import Bool, Float
from scipy import stats

from lens_heads.heads.scores import SCORE_NAMES
from lens_heads.heads.scoring import HeadScores
from lens_heads.plumbing.errors import InputError
from lens_heads.stats import inference
from lens_heads.stats.calling import call_table

STATISTICS = ("spearman_heads", "spearman_within_layers", "spearman_layers", "jaccard")
# the claims' statistics: a layer-normalised (LN) score has the same mean in every layer by construction, so its
# per-layer means are noise and spearman_layers says nothing of it
CLAIM_STATISTICS = ("spearman_heads", "spearman_within_layers", "jaccard")
CLAIM = ("AHON (LN)", "AWFT")  # the paper's stable score and its data-sensitive one


def item_values(scores: HeadScores, names: Sequence[str] = SCORE_NAMES) -> Float[np.ndarray, "item layer head score"]:
    """Each item's value of each score per head: the mean over the item's forward rows (``meta["data"]["row_items"]``
    of a scored Task; without it every row is an item), items in order of first appearance."""
    x = np.stack([scores.score(name).double().numpy() for name in names], axis=-1)
    rows = scores.meta.get("data", {}).get("row_items") if isinstance(scores.meta, dict) else None
    if rows is None:
        return x
    if len(rows) != x.shape[0]:
        raise InputError(f"row_items names {len(rows)} rows but the scores have {x.shape[0]}: rescore the task")
    _, first, inverse = np.unique(np.asarray(rows), return_index=True, return_inverse=True)
    order = np.argsort(first)  # items in order of first appearance
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    group = rank[inverse.reshape(-1)]
    sums = np.zeros((order.size, *x.shape[1:]))
    np.add.at(sums, group, x)
    return sums / np.bincount(group, minlength=order.size).reshape(-1, 1, 1, 1)


def spearman_rows(a: Float[np.ndarray, "... n"], b: Float[np.ndarray, "... n"]) -> Float[np.ndarray, "..."]:
    """Spearman correlation of ``a`` and ``b`` along the last axis (average ranks for ties, as ``spearmanr``);
    NaN where either side is constant."""
    ra = stats.rankdata(a, axis=-1)
    rb = stats.rankdata(b, axis=-1)
    ra = ra - ra.mean(-1, keepdims=True)
    rb = rb - rb.mean(-1, keepdims=True)
    denominator = np.sqrt((ra ** 2).sum(-1) * (rb ** 2).sum(-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denominator > 0, (ra * rb).sum(-1) / np.where(denominator > 0, denominator, 1), np.nan)


def most_inactive_mask(means: Float[np.ndarray, "... n"], direction: str, k: int) -> Bool[np.ndarray, "... n"]:
    """The ``k`` most inactive of ``n`` heads along the last axis: lowest for ``"<"``, highest for ``">"``; equal
    values keep head order (as :func:`lens_heads.heads.scores.most_inactive`)."""
    if direction not in ("<", ">"):
        raise InputError(f"direction must be '<' or '>', got {direction!r}")
    order = np.argsort(means if direction == "<" else -means, axis=-1, kind="stable")[..., :k]
    mask = np.zeros(means.shape, dtype=bool)
    np.put_along_axis(mask, order, True, axis=-1)
    return mask


def jaccard(a: Bool[np.ndarray, "... n"], b: Bool[np.ndarray, "... n"]) -> Float[np.ndarray, "..."]:
    """|A ∩ B| / |A ∪ B| of two sets given as masks along the last axis; NaN where both are empty."""
    inter, union = (a & b).sum(-1), (a | b).sum(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(union > 0, inter / np.where(union > 0, union, 1), np.nan)


def pair_statistics(ma: Float[np.ndarray, "... score layer head"], mb: Float[np.ndarray, "... score layer head"],
                    directions: Sequence[str], k: int) -> tuple[Float[np.ndarray, "stat ... score"],
                                                              Float[np.ndarray, "... score layer"]]:
    """The :data:`STATISTICS` of one pair of tasks from each task's per-head means (leading axes: replicates), and
    the per-layer Spearman over each layer's heads."""
    flat_a, flat_b = ma.reshape(*ma.shape[:-2], -1), mb.reshape(*mb.shape[:-2], -1)
    per_layer = spearman_rows(ma, mb)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a layer whose heads are all equal is NaN, not a number
        within = per_layer.mean(-1)
    overlap = np.stack([jaccard(most_inactive_mask(flat_a[..., s, :], d, k), most_inactive_mask(flat_b[..., s, :], d, k))
                        for s, d in enumerate(directions)], axis=-1)
    out = np.stack([spearman_rows(flat_a, flat_b), within, spearman_rows(ma.mean(-1), mb.mean(-1)), overlap])
    return out, per_layer


@dataclass(frozen=True)
class ScoreStability:
    """Per score and pair of tasks, the :data:`STATISTICS` with their bootstrap intervals over items; per layer,
    Spearman over its heads; per score, the mean over task pairs; and the claims called by the rule (``tests``)."""

    names: tuple[str, ...]
    tasks: tuple[str, ...]
    n_items: tuple[int, ...]
    fraction: float
    k: int
    estimates: Float[np.ndarray, "stat score pair"]
    low: Float[np.ndarray, "stat score pair"]
    high: Float[np.ndarray, "stat score pair"]
    layer_estimates: Float[np.ndarray, "score pair layer"]
    layer_low: Float[np.ndarray, "score pair layer"]
    layer_high: Float[np.ndarray, "score pair layer"]
    mean_estimates: Float[np.ndarray, "stat score"]
    mean_low: Float[np.ndarray, "stat score"]
    mean_high: Float[np.ndarray, "stat score"]
    tests: pd.DataFrame
    n_resamples: int
    seed: int

    @property
    def pairs(self) -> list[tuple[str, str]]:
        return list(itertools.combinations(self.tasks, 2))

    def to_dataframe(self, kind: str = "pairs") -> pd.DataFrame:
        """``"pairs"``: one row per score and pair of tasks; ``"layers"``: per score, pair and layer;
        ``"scores"``: per score, each statistic's mean over the task pairs; ``"tests"``: the claims."""
        if kind == "tests":
            return self.tests.copy()
        n = dict(zip(self.tasks, self.n_items))
        rows = []
        if kind == "pairs":
            for (s, name), (p, (a, b)) in itertools.product(enumerate(self.names), enumerate(self.pairs)):
                row = dict(score=name, task_a=a, task_b=b, n_a=n[a], n_b=n[b])
                for i, stat in enumerate(STATISTICS):
                    row.update({stat: self.estimates[i, s, p], f"{stat}_low": self.low[i, s, p],
                                f"{stat}_high": self.high[i, s, p]})
                rows.append(dict(row, inactive_fraction=self.fraction, k=self.k))
        elif kind == "layers":
            for (s, name), (p, (a, b)) in itertools.product(enumerate(self.names), enumerate(self.pairs)):
                for layer in range(self.layer_estimates.shape[-1]):
                    rows.append(dict(score=name, task_a=a, task_b=b, layer=layer,
                                     spearman=self.layer_estimates[s, p, layer], low=self.layer_low[s, p, layer],
                                     high=self.layer_high[s, p, layer]))
        elif kind == "scores":
            for s, name in enumerate(self.names):
                row = dict(score=name, n_pairs=len(self.pairs))
                for i, stat in enumerate(STATISTICS):
                    row.update({stat: self.mean_estimates[i, s], f"{stat}_low": self.mean_low[i, s],
                                f"{stat}_high": self.mean_high[i, s]})
                rows.append(row)
        else:
            raise InputError(f"kind must be 'pairs', 'layers', 'scores' or 'tests', got {kind!r}")
        return pd.DataFrame(rows)

    def meta(self) -> dict:
        return dict(tasks=list(self.tasks), n_items=dict(zip(self.tasks, self.n_items)), fraction=self.fraction,
                    k=self.k, statistics=list(STATISTICS), n_resamples=self.n_resamples, seed=self.seed,
                    bootstrap="percentile bootstrap over items, each task's items resampled independently "
                              "(scipy.stats.bootstrap, paired=False), the same resample for every score",
                    permutation=f"{inference.PERMUTATION}; the units are the task pairs")


def stability(score_sets: Mapping[str, HeadScores], *, names: Sequence[str] = SCORE_NAMES, fraction: float = 0.1,
              claims: Sequence[tuple[str, str]] = (CLAIM,), n_resamples: int = inference.N_RESAMPLES, seed: int = 0,
              confidence: float = inference.CONFIDENCE, batch: int = 100) -> ScoreStability:
    """Stability of each score across the tasks of ``score_sets`` (task name -> one model's scores on it), with
    bootstrap intervals over items, and each claim ``(a, b)``, "a is more stable than b", called by the rule per
    statistic (see the module's doc). ``batch``: bootstrap replicates computed at once (memory)."""
    tasks = tuple(score_sets)
    if len(tasks) < 2:
        raise InputError("stability compares tasks pairwise: give at least two tasks")
    if not 0 < fraction <= 1:
        raise InputError(f"fraction must lie in (0, 1], got {fraction}")
    names = tuple(names)
    for a, b in claims:
        if a not in names or b not in names:
            raise InputError(f"claim {a!r} against {b!r} needs both among the scores compared: {names}")
    shapes = {t: tuple(s.values.shape[1:3]) for t, s in score_sets.items()}
    if len(set(shapes.values())) > 1:
        raise InputError(f"the tasks were scored on models of different shapes (layer, head): {shapes}")
    directions = [score_sets[tasks[0]].direction[name] for name in names]
    values = [item_values(score_sets[t], names).transpose(0, 3, 1, 2) for t in tasks]  # [item, score, layer, head]
    if any(not np.isfinite(v).all() for v in values):
        raise InputError("scores hold non-finite values: drop those inputs first")
    n_items = tuple(v.shape[0] for v in values)
    for t, n in zip(tasks, n_items):
        inference.check_items(n)
    n_layers, n_heads = shapes[tasks[0]]
    k = max(1, round(fraction * n_layers * n_heads))
    pairs = list(itertools.combinations(range(len(tasks)), 2))
    flat = [v.reshape(v.shape[0], -1) for v in values]
    n_stat, n_score = len(STATISTICS), len(names)

    def statistic(*idx: np.ndarray, axis: int = -1) -> np.ndarray:
        """All quantities [stat*score*pair + score*pair*layer, replicate] from one resample of every task's items."""
        means = []
        for f, i in zip(flat, idx):
            i = np.atleast_2d(i)
            counts = np.zeros((i.shape[0], f.shape[0]))
            np.add.at(counts, (np.arange(i.shape[0])[:, None], i), 1.0)
            means.append((counts @ f / i.shape[1]).reshape(i.shape[0], n_score, n_layers, n_heads))
        per_pair, per_layer = zip(*(pair_statistics(means[a], means[b], directions, k) for a, b in pairs))
        main = np.stack(per_pair, axis=-1)  # [stat, replicate, score, pair]
        layer = np.stack(per_layer, axis=-2)  # [replicate, score, pair, layer]
        return np.concatenate([main.transpose(0, 2, 3, 1).reshape(-1, main.shape[1]),
                               layer.transpose(1, 2, 3, 0).reshape(-1, layer.shape[0])])

    samples = tuple(np.arange(n) for n in n_items)
    estimates = statistic(*(s[None] for s in samples))[:, 0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an undefined replicate stays NaN and leaves no interval
        res = stats.bootstrap(samples, statistic, vectorized=True, paired=False, method="percentile",
                              n_resamples=n_resamples, batch=batch, confidence_level=confidence,
                              rng=np.random.default_rng(seed))
    replicates = np.asarray(res.bootstrap_distribution, dtype=float).reshape(len(estimates), -1)
    n_main = n_stat * n_score * len(pairs)
    shape_main, shape_layer = (n_stat, n_score, len(pairs)), (n_score, len(pairs), n_layers)
    main_rep = replicates[:n_main].reshape(*shape_main, -1)
    intervals = [_interval(e, r, confidence) for e, r in zip(estimates, replicates)]
    low = np.array([i.low for i in intervals])
    high = np.array([i.high for i in intervals])
    main_est = estimates[:n_main].reshape(shape_main)
    mean_est, mean_rep = main_est.mean(-1), main_rep.mean(2)
    mean_iv = [[_interval(mean_est[i, s], mean_rep[i, s], confidence) for s in range(n_score)] for i in range(n_stat)]
    tests = _claims(main_est, main_rep, names, claims, [(tasks[a], tasks[b]) for a, b in pairs], n_resamples, seed,
                    confidence)
    return ScoreStability(
        names=names, tasks=tasks, n_items=n_items, fraction=fraction, k=k,
        estimates=main_est, low=low[:n_main].reshape(shape_main), high=high[:n_main].reshape(shape_main),
        layer_estimates=estimates[n_main:].reshape(shape_layer), layer_low=low[n_main:].reshape(shape_layer),
        layer_high=high[n_main:].reshape(shape_layer), mean_estimates=mean_est,
        mean_low=np.array([[iv.low for iv in r] for r in mean_iv]),
        mean_high=np.array([[iv.high for iv in r] for r in mean_iv]), tests=tests, n_resamples=n_resamples, seed=seed)


def _interval(estimate: float, replicates: np.ndarray, confidence: float) -> inference.Interval:
    """The percentile interval, undefined (NaN) where the estimate or a replicate is: NaN never becomes a number."""
    if not np.isfinite(estimate):
        return inference.Interval(float(estimate), np.nan, np.nan)
    return inference.percentile_interval(estimate, replicates, confidence)


def _claims(est: np.ndarray, rep: np.ndarray, names: Sequence[str], claims: Sequence[tuple[str, str]],
            pairs: Sequence[tuple[str, str]], n_resamples: int, seed: int, confidence: float) -> pd.DataFrame:
    """Each claim "a more stable than b" per statistic: the mean over task pairs of a's statistic minus b's, its
    bootstrap interval over items and the paired permutation p-value over task pairs, called by the rule."""
    rows = []
    for a, b in claims:
        sa, sb = names.index(a), names.index(b)
        for stat in CLAIM_STATISTICS:
            i = STATISTICS.index(stat)
            x, y = est[i, sa], est[i, sb]
            iv = _interval(float(np.mean(x - y)), (rep[i, sa] - rep[i, sb]).mean(0), confidence)
            both = np.concatenate([x, y])
            p = (inference.permutation_p_value(lambda ia, ib: both[ia].mean(-1) - both[ib].mean(-1), len(x),
                                               n_resamples=n_resamples, seed=seed)
                 if np.isfinite(both).all() else float("nan"))
            rows.append(dict(statistic=stat, a=a, b=b, mean_a=float(np.mean(x)), mean_b=float(np.mean(y)),
                             difference=iv.estimate, low=iv.low, high=iv.high, p_value=p, higher_is_better=True,
                             n_pairs=len(pairs), pairs=";".join(f"{u}/{v}" for u, v in pairs),
                             method=f"interval: bootstrap over items; p: {inference.PERMUTATION} over task pairs"))
    return call_table(pd.DataFrame(rows))
