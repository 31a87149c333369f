"""Whole-layer removal: what a task loses when layers are removed one ranking's way, against other rankings.

- :func:`removal_plan`: the :class:`lens_heads.ablation.specs.LayerRemoval` units of one curve, the first ``k``
  layers of a ranking for each ``k``; :func:`head_plan` zeroes ``k x n_heads`` heads of a head ranking instead (the
  same number of heads as ``k`` layers of attention: equal compute removed); :func:`random_orders` are the seeded
  random rankings every removal is compared with.
- :func:`evaluate_specs`: every unit evaluated on a task, the units sharing their forwards (the unhooked trunk below
  the first removed layer runs once per batch, :func:`lens_heads.evaluation.evaluate.evaluate_each`) and kept in
  ``out_dir`` as they finish, so an interrupted run resumes.
- :class:`RemovalCurves`: per curve and ``k``, the per-item paired values against the unablated run on the same
  items (change of correctness, of the gold answer's log-likelihood, and KL(unablated || removed) between the
  answer distributions), their means with percentile-bootstrap intervals over items, and paired comparisons of two
  curves (bootstrap interval of the difference, permutation p-value: :mod:`lens_heads.stats.inference`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
from jaxtyping import Float
from tqdm.auto import tqdm

from lens_heads.ablation.removed_layers import check_layer_order, check_layers
from lens_heads.ablation.specs import AblationSpec, LayerRemoval, StaticAblation, Unablated
from lens_heads.evaluation.eval_settings import EvalSettings, eval_settings
from lens_heads.evaluation.evaluate import evaluate_each
from lens_heads.evaluation.packed_weights import shared_layouts
from lens_heads.evaluation.results import EvalResult, paired_values
from lens_heads.plumbing.errors import InputError
from lens_heads.plumbing.signals import stops_cleanly
from lens_heads.plumbing.values import keywords
from lens_heads.stats import calling, inference
from lens_heads.stats.curves import SCORES_AND_RANDOM
from lens_heads.sweep.rankings import check_head_order
from lens_heads.sweep.result import UnitResult
from lens_heads.sweep.run import unit_result
from lens_heads.sweep.unit_store import UnitStore, run_fingerprint

METRICS = {  # per-item paired value: what it is, and whether higher is better
    "accuracy_change": ("change of correctness, removed - unablated (accuracy points / 100)", True),
    "gold_logprob_change": ("change of the gold answer's log-likelihood, removed - unablated (nats)", True),
    "kl": ("KL(unablated || removed) between the answer distributions (nats)", False),
}
MARKER = "layers.json"


# ---------------------------------------------------------------- what to evaluate


def removal_plan(model, order: Sequence[int], counts: Sequence[int], *, part: str = "attention",
                 label: str) -> list[LayerRemoval]:
    """One curve: for each ``k`` in ``counts``, remove the first ``k`` layers of ``order`` (a ranking of every
    layer, the first removed first), their ``part``; the curve is named ``label``."""
    order = check_layer_order(order, model.cfg.n_layers)
    return [LayerRemoval(check_layers(order[:k], model.cfg.n_layers, what=f"the first {k} layers of {label!r}"),
                         part=part, order=label) for k in _check_counts(counts, model.cfg.n_layers)]


def ranking_plans(model, orders: Mapping[str, Sequence[int]], counts: Sequence[int], *, part: str = "attention"
                  ) -> dict[str, list[LayerRemoval]]:
    """One :func:`removal_plan` per ranking (``orders``: each ranking's order by its name, random orders among them),
    keyed by the curve it makes (``"<name> · <part>"``): the plans the report's layers stage and
    ``analyses/layers.py`` evaluate."""
    return {f"{name} · {part}": removal_plan(model, order, counts, part=part, label=name)
            for name, order in orders.items()}


def head_plan(model, head_order: Sequence[tuple[int, int]], counts: Sequence[int], *, label: str
              ) -> list[StaticAblation]:
    """For each ``k`` in ``counts``, zero the first ``k x n_heads`` heads of ``head_order`` (every ``(layer,
    head)`` once, the first zeroed first) for every input: as many heads as ``k`` layers of attention hold."""
    L, H = model.cfg.n_layers, model.cfg.n_heads
    head_order = check_head_order(head_order, L, H, what="head_order")
    return [StaticAblation(heads=head_order[:k * H], score=label, fraction=k / L)
            for k in _check_counts(counts, L)]


def random_orders(n_layers: int, seeds: Sequence[int]) -> dict[str, list[int]]:
    """The random baselines of a removal: per seed, every layer in the order of a permutation drawn from
    ``numpy.random.default_rng(seed)``, named ``"random (seed <seed>)"`` (the report and ``analyses/layers.py`` draw
    the same orders)."""
    return {f"random (seed {s})": [int(x) for x in np.random.default_rng(s).permutation(n_layers)] for s in seeds}


def _check_counts(counts: Sequence[int], n_layers: int) -> list[int]:
    if isinstance(counts, (str, bytes, int)) or not hasattr(counts, "__iter__"):
        raise InputError(f"counts takes a list of layer counts, got {counts!r}: write counts=[{counts!r}]")
    counts = sorted({int(k) for k in counts})
    if not counts or counts[0] < 1 or counts[-1] >= n_layers:
        raise InputError(f"counts {counts}: give numbers of layers to remove from 1 to {n_layers - 1}")
    return counts


# ---------------------------------------------------------------- evaluating them


@keywords(EvalSettings)  # the signature names the settings' fields taken as keywords
@stops_cleanly("layer removals")  # SIGTERM/SIGINT: finished units stay in out_dir
def evaluate_specs(model, task, specs: Sequence[AblationSpec], *, out_dir=None, chunk: int = 12,
                   settings: EvalSettings | None = None, progress: bool = True,
                   **options) -> dict[AblationSpec, UnitResult]:
    """Every spec (built for ``model``, static: no calibration) evaluated on ``task``, and the unablated baseline
    (always included). ``chunk`` specs at a time share each batch's forward below their first hooked layer; each
    finished unit is kept in ``out_dir`` under the run's fingerprint (model, items, scoring, rows) and its spec.
    Layer removals that differ only in the ranking that named them (``order``) are one measurement. ``settings``
    (or its fields as keywords): :func:`lens_heads.evaluation.evaluate`'s."""
    specs = list(dict.fromkeys([Unablated(), *specs]))
    if chunk < 1:
        raise InputError(f"chunk must be at least 1, got {chunk}")
    evaluation = eval_settings(settings, options)
    store = UnitStore(out_dir, run_fingerprint(model, task, primary=evaluation.primary, **evaluation.rows()),
                      marker=MARKER)
    measured = {spec: replace(spec, order=None) if isinstance(spec, LayerRemoval) else spec for spec in specs}
    units = {spec: unit for spec in dict.fromkeys(measured.values()) if (unit := store.load(spec)) is not None}
    todo = sorted([s for s in dict.fromkeys(measured.values()) if s not in units],
                  key=lambda s: -min(_layers_hooked(s), default=-1))
    bar = tqdm(total=len(todo), desc=f"layer removals on {getattr(task, 'name', 'task')}", unit="unit",
               disable=not progress)
    with shared_layouts():  # the weights laid out once for all the chunks, not once per chunk
        for start in range(0, len(todo), chunk):
            part = todo[start:start + chunk]
            built = [spec.build(model) for spec in part]
            began = time.perf_counter()
            results = evaluate_each(model, task, [[b] if b is not None else [] for b in built], settings=evaluation,
                                    progress=False)
            wall = (time.perf_counter() - began) / len(part)
            for spec, ablation, result in zip(part, built, results):
                units[spec] = unit_result(spec, ablation, result, wall)
                store.save(spec, units[spec])
            bar.update(len(part))
    bar.close()
    return {spec: units[measured[spec]] for spec in specs}


def _layers_hooked(spec: AblationSpec) -> list[int]:
    if isinstance(spec, LayerRemoval):
        return list(spec.layers)
    return [layer for layer, _ in getattr(spec, "heads", None) or ()]


# ---------------------------------------------------------------- the curves, paired against the baseline


@dataclass
class RemovalCurves:
    """Per curve (label), its units by ``k`` (layers removed, or heads / n_heads) and each unit's per-item paired
    values against ``baseline`` (items matched by id)."""

    baseline: EvalResult
    curves: dict[str, dict[int, UnitResult]]
    n_heads: int
    meta: dict = field(default_factory=dict)
    averaged: dict[str, tuple[str, ...]] = field(default_factory=dict)  # label -> the curves it averages

    @classmethod
    def from_units(cls, units: dict[AblationSpec, UnitResult], n_heads: int, meta: dict | None = None
                   ) -> "RemovalCurves":
        base = next(u for s, u in units.items() if isinstance(s, Unablated))
        curves: dict[str, dict[int, UnitResult]] = {}
        for spec, unit in units.items():
            if not isinstance(spec, Unablated):
                name = spec.ranked_by
                if name is None:
                    raise InputError(f"{spec} names no curve: give a static head set a score (its curve's name)")
                curves.setdefault(name, {})[removed_count(spec, n_heads)] = unit
        return cls(base.result, {c: dict(sorted(ks.items())) for c, ks in curves.items()}, n_heads, meta or {})

    def values(self, curve: str, metric: str) -> Float[np.ndarray, "k item"]:
        """Per-item paired ``metric`` (:data:`METRICS`, or ``"correct"``) at each ``k`` of ``curve``."""
        ids = [it.id for it in self.baseline.items]
        rows: list[list[float] | np.ndarray] = []
        for unit in self._curve(curve).values():
            by_id = {it.id: it for it in unit.result.items}
            if set(by_id) != set(ids):
                raise InputError(f"{curve!r} was evaluated on other items than the baseline")
            pairs = [(by_id[i], it) for i, it in zip(ids, self.baseline.items)]
            if metric == "correct":
                rows.append([float(a.correct(self.baseline.primary)) for a, _ in pairs])
            else:
                key = {"accuracy_change": "accuracy", "gold_logprob_change": "gold_logprob", "kl": "kl"}[metric]
                rows.append(paired_values(pairs, self.baseline.primary)[key])
        return np.asarray(rows, dtype=float)

    def counts(self, curve: str) -> list[int]:
        return list(self._curve(curve))

    def mean_of(self, curves: Sequence[str], label: str) -> "RemovalCurves":
        """Add the curve ``label``: per item and ``k`` the mean of ``curves`` (random orders of several seeds as one
        curve, the expectation over orders). Returns the same object."""
        counts = [tuple(self.counts(c)) for c in curves]
        if len(set(counts)) != 1:
            raise InputError(f"{list(curves)} were measured at different counts {counts}: a mean needs the same")
        self.averaged[label] = tuple(curves)
        return self

    def per_item(self, curve: str, metric: str) -> Float[np.ndarray, "k item"]:
        """:meth:`values`, or for a curve made by :meth:`mean_of`, the mean of its members'."""
        members = self.averaged.get(curve)
        if members:
            return np.mean([self.values(c, metric) for c in members], axis=0)
        return self.values(curve, metric)

    def names(self) -> list[str]:
        return list(self.curves) + list(self.averaged)

    def _curve(self, curve: str) -> dict[int, UnitResult]:
        members = self.averaged.get(curve)
        if members:
            return self.curves[members[0]]
        if curve not in self.curves:
            raise InputError(f"unknown curve {curve!r}: choose one of {self.names()}")
        return self.curves[curve]

    def to_dataframe(self, *, n_resamples: int = inference.N_RESAMPLES, seed: int = 0) -> pd.DataFrame:
        """One row per (curve, k): accuracy and each paired metric's mean with its 95% percentile-bootstrap
        interval over items; the removed layers (or heads) and the realised share of heads removed."""
        rows = []
        for curve in self.names():
            counts = self.counts(curve)
            stacked = np.concatenate([self.per_item(curve, m) for m in ("correct", *METRICS)])
            boot = inference.mean_intervals(stacked, n_resamples=n_resamples, seed=seed)
            members = self.averaged.get(curve)
            for i, k in enumerate(counts):
                unit = self._curve(curve)[k]
                row = dict(curve=curve, k=k, realised_fraction=unit.realised_fraction,
                           removed=None if members else _removed(unit), n=self.baseline.n,
                           baseline_accuracy=self.baseline.accuracy, chance=self.baseline.chance)
                for j, metric in enumerate(("accuracy", *METRICS)):
                    q = j * len(counts) + i
                    row[metric], row[f"{metric}_low"], row[f"{metric}_high"] = (boot.estimates[q], boot.low[q],
                                                                                boot.high[q])
                rows.append(row)
        return pd.DataFrame(rows)

    def difference(self, a: str, b: str, metric: str = "kl", *, n_resamples: int = inference.N_RESAMPLES,
                   seed: int = 0) -> pd.DataFrame:
        """Curve ``a`` minus curve ``b`` in ``metric`` on the same items, at each ``k`` both have and as the mean
        over those ``k`` (``k = "mean"``): paired bootstrap interval, permutation p-value and the calling rule's
        verdict over these rows (:func:`lens_heads.stats.calling.paired_tests`)."""
        if metric not in METRICS:
            raise InputError(f"unknown metric {metric!r}: choose one of {list(METRICS)}")
        shared = [k for k in self.counts(a) if k in self.counts(b)]
        if not shared:
            raise InputError(f"{a!r} and {b!r} share no number of layers removed")
        pick = lambda c: self.per_item(c, metric)[[self.counts(c).index(k) for k in shared]]  # noqa: E731
        x, y = pick(a), pick(b)
        x, y = np.vstack([x, x.mean(0)]), np.vstack([y, y.mean(0)])
        return calling.paired_tests(x, y, [*shared, "mean"], METRICS[metric][1], a=a, b=b, metric=metric,
                                    n_resamples=n_resamples, seed=seed)


def zeroed_by_layer(sweep, mode: str = SCORES_AND_RANDOM) -> pd.DataFrame:
    """Per unit of a head-zeroing sweep (:class:`lens_heads.sweep.result.SweepResult`) of ``mode``
    (``"threshold+random"``: the score curves and random) and layer: the share of the layer's (input, head) pairs it zeroed, from the
    units' recorded ``head_share``."""
    rows = []
    for units in sweep.curves(mode).values():
        for u in units:
            if u.mode == "baseline" or u.head_share is None:
                continue
            share = np.asarray(u.head_share, dtype=float).mean(1)
            rows += [dict(curve=u.curve.label, target_fraction=u.target_fraction, layer=layer, share=float(v))
                     for layer, v in enumerate(share)]
    return pd.DataFrame(rows)


def removed_count(spec: AblationSpec, n_heads: int) -> int:
    """``k`` of a unit: layers removed, or heads zeroed / heads per layer."""
    if isinstance(spec, LayerRemoval):
        return len(spec.layers)
    return int(round(len(spec.heads) / n_heads))  # type: ignore[attr-defined]  # a head set's (head_plan)


def _removed(unit: UnitResult) -> str:
    share = np.asarray(unit.head_share or [])
    if share.size == 0:
        return ""
    layers = [layer for layer in range(share.shape[0]) if share[layer].all()]
    return " ".join(map(str, layers)) if layers and share.sum() == len(layers) * share.shape[1] else \
        f"{int(share.sum())} heads"


def removal_curves(model, task, plans: Mapping[str, Sequence[AblationSpec]], *, out_dir=None, **settings
                   ) -> RemovalCurves:
    """Evaluate every plan's units (:func:`evaluate_specs`, resumable in ``out_dir``) and pair them with the
    baseline as :class:`RemovalCurves` (``plans``: by curve label, from :func:`removal_plan`/:func:`head_plan`)."""
    specs = [spec for plan in plans.values() for spec in plan]
    units = evaluate_specs(model, task, specs, out_dir=out_dir, **settings)
    meta = dict(task=task.meta() if hasattr(task, "meta") else {}, out_dir=str(Path(out_dir)) if out_dir else None,
                plans={label: [s.to_dict() for s in plan] for label, plan in plans.items()})
    return RemovalCurves.from_units(units, model.cfg.n_heads, meta)
