"""Rankings of heads as pruning guides: zero the first heads of a ranking and measure the task on held-out items.

A :class:`Ranking` lists every ``(layer, head)`` of the model, the head to zero first at the front: one order for
every input (the ablation oracle's :meth:`HeadEffects.order`, an attribution ranking from
:mod:`lens_heads.experiments.attribution`, a score's means) or one per input (each input's own attribution,
:meth:`HeadEffects.input_orders`).

:func:`ranking_sweep` zeroes (or mean-ablates) the first ``round(p x layers x heads)`` heads of each ranking at each
target share ``p``, for every input of a task (a static curve) or, for a per-input ranking, each input's own first
heads (a per-input curve), beside one unablated baseline; every unit is kept and reused like a sweep's.
:func:`join_heldout` puts a recorded sweep's curves, restricted to the same items, beside these curves on one
baseline, so that every curve is paired with every other (:meth:`lens_heads.sweep.result.SweepResult.intervals`
with ``mode="all"``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from tqdm.auto import tqdm

from lens_heads.ablation.specs import AblationSpec, InputAblation, StaticAblation, Unablated
from lens_heads.evaluation.eval_settings import EvalSettings, eval_settings
from lens_heads.plumbing.errors import InputError
from lens_heads.plumbing.signals import stops_cleanly
from lens_heads.plumbing.values import keywords
from lens_heads.sweep.plan import DEFAULT_FRACTIONS
from lens_heads.sweep.result import SweepResult
from lens_heads.sweep.run import run_unit
from lens_heads.sweep.unit_store import UnitStore, run_fingerprint

Head = tuple[int, int]


# ---------------------------------------------------------------- rankings


@dataclass(frozen=True)
class Ranking:
    """A named order of heads to zero: one ``order`` for every input (a static curve), or ``per_input`` orders
    (input ``i`` of the evaluated task zeroes the front of its own order: a per-input curve). ``ablation``: ``"zero"``
    or ``"mean"`` (mean ablation with the means given to :func:`ranking_sweep`)."""

    name: str
    order: tuple[Head, ...] | None = None
    per_input: tuple[tuple[Head, ...], ...] | None = None
    ablation: str = "zero"

    def __post_init__(self):
        if (self.order is None) == (self.per_input is None):
            raise InputError(f"Ranking {self.name!r}: give one order for every input (order=...) or one per input "
                             "(per_input=...), not both")
        if self.order is not None:
            object.__setattr__(self, "order", _heads(self.order))
        else:
            object.__setattr__(self, "per_input", tuple(_heads(o) for o in self.per_input))


def check_head_order(order: Sequence[Head], n_layers: int, n_heads: int, what: str = "order") -> tuple[Head, ...]:
    """The ``(layer, head)`` pairs of ``order``; refused, naming what is wrong, unless it lists each of the model's
    heads exactly once."""
    array = np.asarray(order)
    if array.ndim != 2 or array.shape[1] != 2:
        raise InputError(f"{what} has shape {array.shape}: give [{n_layers * n_heads}, 2] (layer, head) pairs")
    heads = [(int(layer), int(head)) for layer, head in array]
    if len(heads) != n_layers * n_heads:
        raise InputError(f"{what} lists {len(heads)} heads: give each of the model's {n_layers} x {n_heads} = "
                         f"{n_layers * n_heads} heads once (HeadEffects.order())")
    outside = [h for h in heads if not (0 <= h[0] < n_layers and 0 <= h[1] < n_heads)]
    if outside:
        raise InputError(f"{what} names heads the model does not have: {outside[:5]} (layers 0..{n_layers - 1}, "
                         f"heads 0..{n_heads - 1})")
    seen, repeated = set(), []
    for h in heads:
        if h in seen:
            repeated.append(h)
        seen.add(h)
    if repeated:
        raise InputError(f"{what} repeats heads {repeated[:5]} (and so misses as many): give each of the model's "
                         "heads once")
    return tuple(heads)


# ---------------------------------------------------------------- zeroing in the order of rankings


@keywords(EvalSettings)  # the signature names the settings' fields taken as keywords
@stops_cleanly("ranking sweep")  # SIGTERM/SIGINT: finished units stay in out_dir
def ranking_sweep(model, task, rankings: Sequence[Ranking], *, fractions=DEFAULT_FRACTIONS, means=None,
                  out_dir=None, marker: str = "rankings.json", key: dict | None = None,
                  settings: EvalSettings | None = None, progress: bool = True, **options) -> SweepResult:
    """Evaluate ``task`` with the first ``round(p x layers x heads)`` heads of each ranking zeroed (or
    mean-ablated) at each target share ``p`` of ``fractions``, beside one unablated baseline.

    A ranking with one ``order`` gives a static curve named by the ranking (every input loses the same heads);
    one with ``per_input`` orders (one per item of ``task``, in its order) a per-input curve. ``means``
    (:func:`lens_heads.ablation.hooks.mean_z` of calibration inputs) serve the rankings with ``ablation="mean"``.
    ``out_dir``: each finished unit is kept there under the run's fingerprint (model, items, settings, ``key``,
    the means) and its spec (which names its heads), and reused on a rerun. ``settings``
    (:class:`lens_heads.evaluation.eval_settings.EvalSettings`, or its fields as keywords laid over it): every
    unit's evaluation, recorded whole in ``meta["settings"]``."""
    L, H = model.cfg.n_layers, model.cfg.n_heads
    plan = [Unablated()] + _specs(rankings, fractions, len(task), L, H)
    if any(r.ablation == "mean" for r in rankings) and means is None:
        raise InputError("a ranking with ablation='mean' needs means=: compute them on calibration inputs "
                         "(lens_heads.experiments.effects.task_means(model, calibration))")
    evaluation = eval_settings(settings, options)
    keyed = dict(key or {})
    if means is not None:  # the substituted values are part of what a stored unit means
        keyed["means"] = hashlib.sha256(means.detach().cpu().float().numpy().tobytes()).hexdigest()[:16]
    fingerprint = run_fingerprint(model, task, primary=evaluation.primary, **keyed, **evaluation.rows())
    store = UnitStore(out_dir, fingerprint, marker=marker)
    units = []
    bar = tqdm(plan, desc=f"rankings on {getattr(task, 'name', 'task')}", unit="unit", disable=not progress)
    for spec in bar:
        unit = store.load(spec)
        if unit is None:
            unit = run_unit(model, task, spec, means=means if spec.ablation == "mean" else None,
                            settings=evaluation, progress=False)
            unit.head_share = None  # the spec names the heads
            store.save(spec, unit)
        units.append(unit)
    static = [r.name for r in rankings if r.order is not None]
    meta = dict(fingerprint=fingerprint, fractions=sorted({float(p) for p in fractions} | {0.0}), scores=[],
                static_scores=static, per_input_scores=[r.name for r in rankings if r.per_input is not None],
                rankings={r.name: r.ablation for r in rankings}, out_dir=store.describe(), **evaluation.rows(),
                settings=evaluation.to_dict())
    return SweepResult(baseline=units[0].result, units=units, meta=meta)


def _specs(rankings: Sequence[Ranking], fractions, n_items: int, n_layers: int, n_heads: int) -> list:
    """Per target share and ranking, the spec that zeroes the ranking's first heads."""
    curves = [(r.name, r.order is None) for r in rankings]  # a static and a per-input curve may share a name
    if len(set(curves)) != len(curves):
        raise InputError(f"rankings of the same kind (static or per-input) must have distinct names, got "
                         f"{[r.name for r in rankings]}")
    fractions = sorted({float(p) for p in fractions} | {0.0})
    if not (0.0 <= fractions[0] and fractions[-1] < 1.0):
        raise InputError(f"ranking_sweep: fractions must lie in [0, 1), got {fractions}")
    for r in rankings:
        if r.order is not None:
            check_head_order(r.order, n_layers, n_heads, what=f"ranking {r.name!r}")
            continue
        assert r.per_input is not None  # a Ranking holds exactly one of order and per_input
        if len(r.per_input) != n_items:
            raise InputError(f"ranking {r.name!r} has {len(r.per_input)} per-input orders for a task of {n_items} "
                             "items: give one per item, in the task's order")
        for i, order in enumerate(r.per_input):
            check_head_order(order, n_layers, n_heads, what=f"ranking {r.name!r} of input {i}")
    specs: list[AblationSpec] = []
    for p in fractions[1:]:
        k = int(round(p * n_layers * n_heads))
        for r in rankings:
            if r.order is not None:
                specs.append(StaticAblation(heads=r.order[:k], score=r.name, fraction=p, ablation=r.ablation))
            else:
                assert r.per_input is not None  # a Ranking holds exactly one of order and per_input
                specs.append(InputAblation(heads=tuple(o[:k] for o in r.per_input), score=r.name, fraction=p,
                                           ablation=r.ablation))
    return specs


def _heads(order) -> tuple[Head, ...]:
    return tuple((int(layer), int(head)) for layer, head in order)


# ---------------------------------------------------------------- a recorded sweep beside the rankings


def join_heldout(recorded: SweepResult, measured: SweepResult, *, atol: float = 1e-3) -> SweepResult:
    """``recorded``'s curves restricted to ``measured``'s items (:meth:`SweepResult.on_items`) beside
    ``measured``'s curves, on ``recorded``'s baseline: one sweep in which every curve is paired with every other.
    Only the recorded points at ``measured``'s target shares are kept (paired tests compare curves point by point).

    The two baselines must be the same evaluation: the same items with every choice's log-likelihood within
    ``atol`` (batching moves them by ~1e-5) and the same answers; otherwise the curves were not measured alike."""
    ids = [it.id for it in measured.baseline.items]
    sub = recorded.on_items(ids)
    diff = 0.0
    for a, b in zip(sub.baseline.items, measured.baseline.items):
        gap = np.max(np.abs(np.asarray(a.logprobs) - np.asarray(b.logprobs))) if len(a.logprobs) == len(
            b.logprobs) else np.inf
        if not gap <= atol or a.correct(sub.baseline.primary) != b.correct(measured.baseline.primary):
            raise InputError(f"item {a.id}: the recorded and the measured baselines differ (log-likelihoods "
                             f"{a.logprobs} vs {b.logprobs}): the sweep was recorded with another model, protocol or "
                             "scoring than these rankings; measure both alike")
        diff = max(diff, float(gap))
    clash = {u.curve for u in sub.units if u.curve} & {u.curve for u in measured.units if u.curve}
    if clash:
        raise InputError(f"curves {sorted(k.label for k in clash)} are in both sweeps: name the rankings differently")
    targets = {u.target_fraction for u in measured.units}
    units = [u for u in sub.units if u.target_fraction in targets] + [u for u in measured.units if u.mode != "baseline"]
    meta = dict(sub.meta, rankings=measured.meta, baseline_max_abs_logprob_diff=diff, fractions=sorted(targets),
                static_scores=list(sub.meta.get("static_scores", [])) + list(measured.meta["static_scores"]))
    return SweepResult(baseline=sub.baseline, units=units, meta=meta)
