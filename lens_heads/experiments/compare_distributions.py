"""Score distributions across models: how far apart two models' head scores lie on the same inputs, per score,
pooled, per relative depth and per layer; whether the same heads rank alike and are zeroed alike.

Every model is scored on the same items (``score_heads`` on one task; the rows of an item, one per choice, belong
to it). For each score and each model against the ``reference`` model:

- **Distances** between the two score distributions: Wasserstein-1 (in the score's units) and the Kolmogorov-Smirnov
  statistic (the largest gap between the CDFs, in [0, 1]), on every (row, layer, head) value pooled (view
  ``"pooled"``), on the layers of each relative-depth bin (``"depth"``: layer ``l`` of ``L`` falls in bin
  ``floor((l + 0.5) / L * depth_bins)``, so models of different depths compare their early, middle and late layers)
  and layer by layer (``"layer"``: only between models with the same number of layers).
- A distance between two finite samples is positive even between identical models, so each comes with the distance
  that swapping the two models' values within items leaves (the **null level**: the mean over permutations) and
  the **excess** over it. The excess has a 95% percentile-bootstrap interval over items (each replicate resamples
  the items and also measures one swap of its own: each drawn item's values change models with probability 1/2,
  all its copies alike; the replicate's excess is its distance minus that swapped distance), and the distance a
  one-sided permutation p-value (each item's values swapped between the two models at random). The verdict is the
  one calling rule's (:mod:`lens_heads.stats.calling`, Benjamini-Hochberg within each view's rows): ``"higher"``
  says the two distributions differ.
- **Versus**: for two models compared with the reference (a fine-tuned copy and another model), the difference of
  their excess distances, paired over the same items (both bootstraps resample the same items), with a two-sided
  permutation test that swaps the two models' values within items; called by the same rule.
- **Heads** (only between models of one layer x head shape): Spearman correlation of the per-head mean scores, and
  at each target ``share`` the Jaccard overlap of the (row, layer, head) triples each model's own threshold zeroes
  (rows aligned: the same rows per item) and of the heads with the most inactive mean (the static view), with
  bootstrap intervals over items (thresholds held at the full sample's). Two independent draws of a share ``p``
  overlap by ``p / (2 - p)`` on average (``chance``). Descriptive: no test.

Scores of different models live on different scales where they are raw norms (FTVVN, AVVN, LTHON, AHON: the norms
of each model's own value and output vectors); the (LN) scores and the attention scores (AWFT, AEQD) are comparable
across models.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import combinations
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
from jaxtyping import Float, Int
from tqdm.auto import tqdm

from lens_heads.experiments.distribution_settings import VIEWS, DistributionSettings
from lens_heads.experiments.head_overlap import head_agreement
from lens_heads.heads.scoring import HeadScores
from lens_heads.models.nonfinite import refuse_nonfinite_values
from lens_heads.plumbing.errors import InputError
from lens_heads.plumbing.values import keywords, laid_over
from lens_heads.stats import calling, inference
from lens_heads.stats.distances import PooledValues, counts, greater_p_value, replicate_swaps, swap_draws

STATISTICS = ("wasserstein", "ks")
NULL = ("swap: each item's values exchanged between the two models at random (a paired permutation over items); "
        "the null level is the mean distance over the permutations")
EXCESS = ("percentile bootstrap over items (lens_heads.stats.inference.bootstrap_items); in each replicate every "
          "drawn item's values also swap models with probability 1/2 (all its copies alike, seeded by the replicate's "
          "draw), and the replicate's excess is its distance minus that swapped distance")


@dataclass
class DistributionComparison:
    """Distances between score distributions (:attr:`distances`), the comparison of two models' distances from
    the reference (:attr:`versus`), per-head agreement (:attr:`heads`) and the curves of the CDF figure."""

    distances: pd.DataFrame
    versus: pd.DataFrame
    heads: pd.DataFrame
    cdfs: dict = field(repr=False)  # {view: {level: {score: {model: (x, q)}}}}: each model's quantile curve
    meta: dict = field(default_factory=dict)

    def to_dataframe(self) -> pd.DataFrame:
        """The distances table (one row per score, model pair, view, level and statistic)."""
        return self.distances

    def summary(self, view: str = "pooled", statistic: str = "ks") -> pd.DataFrame:
        """One row per score and compared model: distance, excess with its interval, p-value and verdict."""
        d = self.distances
        return d[(d["view"] == view) & (d["statistic"] == statistic)].reset_index(drop=True)


@keywords(DistributionSettings)  # the signature names the settings' fields taken as keywords
def compare_distributions(score_sets: Mapping[str, HeadScores], *, reference: str | None = None,
                          names: Sequence[str] | None = None, settings: DistributionSettings | None = None,
                          progress: bool = False, **options) -> DistributionComparison:
    """Compare the head-score distributions of several models scored on the same items (module docstring).

    ``score_sets``: model name -> its :class:`HeadScores` (from ``score_heads`` on the same task, or on the same
    list of inputs). ``reference``: the model every other is compared with (default: the first). ``names``: the
    scores (default: those all sets have). ``settings``
    (:class:`lens_heads.experiments.distribution_settings.DistributionSettings`, or its fields as keywords laid over
    it): ``views`` (``"auto"``: pooled and depth for every pair, per layer and per head where the shapes allow; or a
    list from :data:`VIEWS`; asking for ``"layer"`` or ``"head"`` between models of different shapes is refused),
    ``depth_bins``, ``shares``, ``n_resamples`` (bootstrap replicates and permutations, seeded by ``seed``),
    ``confidence``, ``cdf_points``; ``meta["settings"]`` records it whole.
    """
    settings = laid_over(DistributionSettings, settings, options, argument="settings", what="comparison settings")
    views, depth_bins, shares, cdf_points = settings.views, settings.depth_bins, settings.shares, settings.cdf_points
    n_resamples, seed, confidence = settings.n_resamples, settings.seed, settings.confidence
    models = list(score_sets)
    reference = _checked_reference(models, reference)
    n_items, items = _check_items(score_sets)
    names = _check_names(score_sets, names)
    for model_name, scores in score_sets.items():  # a NaN score would sit in a quantile, an interval, a p-value
        for name in names:
            refuse_nonfinite_values(scores.score(name), f"compare_distributions: {model_name}'s {name} scores",
                                    "score the model again (score_heads refuses a forward that goes NaN)")
    others = [m for m in models if m != reference]
    shapes = {m: tuple(s.values.shape[1:3]) for m, s in score_sets.items()}
    chosen = _check_views(views, reference, others, shapes)
    pairs = [(reference, m) for m in others]
    levels = _levels(shapes, reference, chosen, depth_bins)
    draws = swap_draws(n_items, n_resamples, seed)  # the permutations, shared by every score and level
    rows, versus_rows, head_rows = [], [], []
    cdfs: dict = {}
    bar = tqdm(names, desc="comparing distributions", unit="score", disable=not progress)
    for name in bar:
        values = {m: score_sets[m].score(name).double().numpy() for m in models}
        pooled = _pooled(values, items, levels, n_items, depth_bins)
        for (view, level), curves in _curves(values, levels, depth_bins, cdf_points).items():
            cdfs.setdefault(view, {}).setdefault(level, {})[name] = curves
        boot = _bootstrap(pooled, levels, pairs, n_items, n_resamples, seed, confidence)
        level_rows, level_versus = _compare_levels(name, pooled, levels, pairs, boot, draws, n_items, confidence)
        rows += level_rows
        versus_rows += level_versus
        for a, b in pairs:
            if _compares_heads(a, b, chosen, shapes):
                head_rows += head_agreement(name, a, b, score_sets, items, n_items, shares, n_resamples, seed,
                                            confidence)
    meta = _meta(score_sets, reference=reference, names=names, chosen=chosen, pairs=pairs, levels=levels,
                 shapes=shapes, n_items=n_items, depth_bins=depth_bins, shares=shares, n_resamples=n_resamples,
                 seed=seed, confidence=confidence)
    meta["settings"] = settings.to_dict()
    return DistributionComparison(_called(rows), _called(versus_rows), pd.DataFrame(head_rows), cdfs, meta)


def _pooled(values: dict[str, np.ndarray], items: dict[str, np.ndarray], levels: dict[tuple[str, int], list[str]],
            n_items: int, depth_bins: int) -> dict[tuple[str, int], PooledValues]:
    """Per (view, level): the values of its models, each with the item it belongs to."""
    return {key: PooledValues.of([(_select(values[m], *key, depth_bins), _row_items(items[m], values[m], *key,
                                                                                  depth_bins)) for m in members],
                                 n_items) for key, members in levels.items()}


def _curves(values: dict[str, np.ndarray], levels: dict, depth_bins: int, cdf_points: int) -> dict:
    """Per (view, level): each of its models' quantile curve of one score, for the CDF figure."""
    return {(view, level): {m: _quantile_curve(_select(values[m], view, level, depth_bins).reshape(-1), cdf_points)
                            for m in members}
            for (view, level), members in levels.items()}


def _compare_levels(name: str, pooled: dict, levels: dict, pairs: list, boot: dict, draws: np.ndarray,
                    n_items: int, confidence: float) -> tuple[list[dict], list[dict]]:
    """One score's distance rows and versus rows at every level of every view."""
    rows, versus_rows = [], []
    for (view, level), members in levels.items():
        data = pooled[(view, level)]
        distance_rows, measured = _distance_rows(name, view, level, data, members, pairs, boot, draws, n_items,
                                                 confidence)
        rows += distance_rows
        for (ref, m1), (_, m2) in combinations([p for p in pairs if p[1] in members], 2):
            versus_rows += _versus(name, view, level, data, members, measured, ref, m1, m2, boot, draws,
                                   confidence)
    return rows, versus_rows


def _distance_rows(name: str, view: str, level: int, data: PooledValues, members: list[str], pairs: list,
                   boot: dict, draws: np.ndarray, n_items: int, confidence: float) -> tuple[list[dict], dict]:
    """Each pair's distances at one level with their null level, excess interval and p-value; and, per compared
    model, its observed distances and permutation nulls (what :func:`_versus` compares)."""
    rows, measured = [], {}
    for a, b in pairs:
        if b not in members:
            continue
        ia, ib = members.index(a), members.index(b)
        observed = data.distances({ia: (1.0, 0.0), ib: (0.0, 1.0)})
        null = _swapped(data, ia, ib, draws)
        measured[(view, level, b)] = ([float(o[0]) for o in observed], null)
        for k, statistic in enumerate(STATISTICS):
            excess = observed[k][0] - null[k].mean()
            iv = inference.percentile_interval(excess, boot[(view, level, a, b)][k], confidence)
            rows.append(dict(score=name, a=a, b=b, view=view, level=level, statistic=statistic,
                             distance=float(observed[k][0]), null_level=float(null[k].mean()),
                             difference=iv.estimate, low=iv.low, high=iv.high,
                             p_value=greater_p_value(observed[k][0], null[k]), higher_is_better=None,
                             n_items=n_items, n_values_a=int((data.side == ia).sum()),
                             n_values_b=int((data.side == ib).sum())))
    return rows, measured


def _compares_heads(a: str, b: str, chosen: list[str], shapes: dict) -> bool:
    """Whether the pair gets the per-head view: asked for, and both models of one layer x head shape."""
    return "head" in chosen and shapes[a] == shapes[b]


def _meta(score_sets: Mapping[str, HeadScores], *, reference: str, names: list[str], chosen: list[str],
          pairs: list, levels: dict, shapes: dict, n_items: int, depth_bins: int, shares: Sequence[float],
          n_resamples: int, seed: int, confidence: float) -> dict:
    """What was compared and how: the models and their data, the views each pair got, the tests and intervals."""
    models = list(score_sets)
    return dict(models={m: score_sets[m].meta.get("model", {}) for m in models},
                data={m: {k: v for k, v in score_sets[m].meta.get("data", {}).items() if k != "row_items"}
                      for m in models},
                reference=reference, names=list(names), views=list(chosen), depth_bins=depth_bins,
                shares=list(shares), n_items=n_items, shapes={m: list(s) for m, s in shapes.items()},
                views_by_pair={f"{a} vs {b}": sorted({v for (v, _), mem in levels.items() if b in mem}, key=VIEWS.index)
                               + (["head"] if _compares_heads(a, b, chosen, shapes) else []) for a, b in pairs},
                null=NULL, interval=EXCESS, n_resamples=n_resamples, seed=seed, confidence=confidence,
                p_value="one-sided (distance at least the observed one), (1 + count) / (1 + permutations); versus: "
                        "two-sided on the difference of distances",
                heads_interval="percentile bootstrap over items; thresholds and static head counts held at the full "
                               "sample's", chance="p / (2 - p): two independent draws of a share p",
                calling_rule=calling.RULE)


# ---------------------------------------------------------------- inputs


def _checked_reference(models: list[str], reference: str | None) -> str:
    """The reference model (default: the first), among at least two models."""
    if len(models) < 2:
        raise InputError(f"compare_distributions needs at least two models' scores, got {len(models)}")
    reference = models[0] if reference is None else reference
    if reference not in models:
        raise InputError(f"reference {reference!r} is not among the models {models}")
    return reference


def _check_items(score_sets: Mapping[str, HeadScores]) -> tuple[int, dict[str, np.ndarray]]:
    """The number of items and, per model, the item of each scored row; the same items for every model."""
    items, described = {}, {}
    for m, s in score_sets.items():
        if not isinstance(s, HeadScores):
            raise InputError(f"{m!r}: give HeadScores (lens_heads.score_heads), got {type(s).__name__}")
        if len(s) == 0:
            raise InputError(f"{m!r} has no scored inputs")
        data = s.meta.get("data", {}) or {}
        row_items = data.get("row_items")
        items[m] = np.asarray(row_items if row_items is not None else np.arange(len(s)), dtype=np.int64)
        if items[m].size != len(s):
            raise InputError(f"{m!r}: {len(s)} scored rows but {items[m].size} row items in its meta")
        described[m] = {k: data.get(k) for k in ("task", "split", "shots", "format", "n", "seed")}
    sizes = {m: int(v.max()) + 1 for m, v in items.items()}
    if len(set(sizes.values())) > 1 or len({str(d) for d in described.values()}) > 1:
        raise InputError("the models were not scored on the same items: "
                         + "; ".join(f"{m}: {sizes[m]} items of {described[m]}" for m in score_sets)
                         + ". Score every model on the same task (same split, n and seed) or the same inputs")
    n_items = next(iter(sizes.values()))
    if n_items < 2:
        raise InputError("a bootstrap over items needs at least 2 items: score more inputs")
    return n_items, items


def _check_names(score_sets: Mapping[str, HeadScores], names) -> list[str]:
    common = [n for n in next(iter(score_sets.values())).all_names
              if all(n in s.all_names for s in score_sets.values())]
    if names is None:
        return common
    if isinstance(names, str):
        raise InputError(f"names takes a list, got {names!r}: write names=[{names!r}]")
    missing = [n for n in names if n not in common]
    if missing:
        raise InputError(f"scores {missing} are not in every model's HeadScores: choose from {common}")
    return list(names)


def _check_views(views, reference: str, others: list[str], shapes: dict) -> list[str]:
    if views == "auto":
        return list(VIEWS)
    if isinstance(views, str):
        views = [views]
    unknown = [v for v in views if v not in VIEWS]
    if unknown:
        raise InputError(f"unknown views {unknown}: choose from {VIEWS} or 'auto'")
    for view, part, what in (("layer", slice(0, 1), "number of layers"), ("head", slice(0, 2), "layer x head shape")):
        if view in views:
            differ = [m for m in others if shapes[m][part] != shapes[reference][part]]
            if differ:
                raise InputError(
                    f"view {view!r} compares models of one {what}, but {', '.join(differ)} differ from "
                    f"{reference} ({', '.join(f'{m}: {shapes[m][0]} x {shapes[m][1]}' for m in [reference, *differ])}"
                    "): compare them 'pooled' or by 'depth', or leave views='auto'")
    return [v for v in VIEWS if v in views]


def _levels(shapes: dict, reference: str, views: list[str], depth_bins: int) -> dict[tuple[str, int], list[str]]:
    """Per (view, level): the models that have it, the reference first."""
    models = [reference] + [m for m in shapes if m != reference]
    out: dict[tuple[str, int], list[str]] = {}
    if "pooled" in views:
        out[("pooled", 0)] = models
    if "depth" in views:
        for k in range(depth_bins):
            out[("depth", k)] = [m for m in models if (_depth_bin(shapes[m][0], depth_bins) == k).any()]
    if "layer" in views:
        same = [m for m in models if shapes[m][0] == shapes[reference][0]]
        if len(same) > 1:
            out.update({("layer", layer): same for layer in range(shapes[reference][0])})
    return {key: members for key, members in out.items() if reference in members and len(members) > 1}


def _depth_bin(n_layers: int, depth_bins: int) -> Int[np.ndarray, "layer"]:
    """The relative-depth bin of each layer: ``floor((l + 0.5) / n_layers * depth_bins)``."""
    return np.floor((np.arange(n_layers) + 0.5) / n_layers * depth_bins).astype(int)


def _select(values: Float[np.ndarray, "row layer head"], view: str, level: int, depth_bins: int) -> np.ndarray:
    """The [row, layer', head] values a view's level holds."""
    if view == "pooled":
        return values
    if view == "depth":
        return values[:, _depth_bin(values.shape[1], depth_bins) == level]
    return values[:, level:level + 1]


def _row_items(items: np.ndarray, values: np.ndarray, view: str, level: int, depth_bins: int
               ) -> Int[np.ndarray, "row layer head"]:
    """The item of every value :func:`_select` keeps."""
    selected = _select(values, view, level, depth_bins)
    return np.broadcast_to(items[:, None, None], selected.shape)


def _quantile_curve(values: np.ndarray, points: int) -> tuple[list[float], list[float]]:
    """``points`` points (x, F(x)) of a sample's empirical CDF, evenly spaced in probability (for drawing)."""
    q = np.linspace(0.0, 1.0, points)
    return np.quantile(values, q).tolist(), q.tolist()


# ---------------------------------------------------------------- distances, nulls and intervals


def _bootstrap(pooled: dict, levels: dict, pairs: list, n_items: int, n_resamples: int, seed: int,
               confidence: float) -> dict:
    """Per (view, level, a, b): the bootstrap replicates of the excess W1 and KS (``[2, replicate]``), every pair
    and level on the same resampled items."""
    keys = [(view, level, a, b) for (view, level), members in levels.items() for a, b in pairs if b in members]
    if not keys:  # per-head comparisons only
        return {}

    def statistic(idx: np.ndarray) -> np.ndarray:
        c = counts(idx, n_items).astype(float)
        swapped = c * replicate_swaps(idx, seed)
        kept = c - swapped
        out = []
        for view, level, a, b in keys:
            members = levels[(view, level)]
            data, ia, ib = pooled[(view, level)], members.index(a), members.index(b)
            w1, ks = data.distances({ia: (c, 0.0), ib: (0.0, c)})
            w1_swap, ks_swap = data.distances({ia: (kept, swapped), ib: (swapped, kept)})
            out += [w1 - w1_swap, ks - ks_swap]
        return np.stack(out)

    boot = inference.bootstrap_items(statistic, n_items, n_resamples=n_resamples, seed=seed, confidence=confidence)
    return {key: boot.replicates[2 * k:2 * k + 2] for k, key in enumerate(keys)}


def _swapped(data: PooledValues, ia: int, ib: int, draws: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(W1, KS) under each permutation: where ``draws[r, i]``, item ``i``'s values change models."""
    f = draws.astype(float)
    return data.distances({ia: (1.0 - f, f), ib: (f, 1.0 - f)})


def _versus(name: str, view: str, level: int, data: PooledValues, members: list[str], measured: dict, ref: str,
            m1: str, m2: str, boot: dict, draws: np.ndarray, confidence: float) -> list[dict]:
    """Excess distance of (ref, m2) minus that of (ref, m1), paired over items; the permutation swaps m1's and
    m2's values within items (the reference's stay)."""
    ir, i1, i2 = members.index(ref), members.index(m1), members.index(m2)
    f = draws.astype(float)
    to_m1 = data.distances({ir: (1.0, 0.0), i1: (0.0, 1.0 - f), i2: (0.0, f)})
    to_m2 = data.distances({ir: (1.0, 0.0), i1: (0.0, f), i2: (0.0, 1.0 - f)})
    rows = []
    for k, statistic in enumerate(STATISTICS):
        (obs1, null1), (obs2, null2) = measured[(view, level, m1)], measured[(view, level, m2)]
        excess = (obs2[k] - null2[k].mean()) - (obs1[k] - null1[k].mean())
        iv = inference.percentile_interval(excess, boot[(view, level, ref, m2)][k] - boot[(view, level, ref, m1)][k],
                                           confidence)
        observed, null = obs2[k] - obs1[k], to_m2[k] - to_m1[k]
        rows.append(dict(score=name, reference=ref, a=m1, b=m2, view=view, level=level, statistic=statistic,
                         distance_a=float(obs1[k]), distance_b=float(obs2[k]), difference=iv.estimate, low=iv.low,
                         high=iv.high, p_value=greater_p_value(abs(observed), np.abs(null)), higher_is_better=None,
                         n_items=data.n_items))
    return rows


def _called(rows: list[dict]) -> pd.DataFrame:
    """The rows called by the one rule, Benjamini-Hochberg within each view (a view's rows are one table)."""
    if not rows:
        return pd.DataFrame()
    table = pd.DataFrame(rows)
    return pd.concat([calling.call_table(part) for _, part in table.groupby("view", sort=False)], ignore_index=True)
