"""A ranking of heads from attribution patching on a few calibration items: a cheap pruning guide.

Attribution patching (:func:`lens_heads.experiments.effects.head_effects` with ``method="attribution"``) estimates
every head's effect on a task from one forward and one backward pass per batch of rows; :func:`attribution_ranking`
orders the heads by the size of that estimate on calibration items (smallest first), and
:meth:`AttributionRanking.ranking` hands the order to :func:`lens_heads.sweep.rankings.ranking_sweep`, which
zeroes heads in that order on held-out items (:func:`held_out`) beside the scores' curves, the ablation oracle and
random.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from lens_heads.evaluation.eval_settings import EvalSettings
from lens_heads.experiments.effects import HeadEffects, head_effects
from lens_heads.plumbing.errors import InputError
from lens_heads.plumbing.values import keywords
from lens_heads.sweep.rankings import Head, Ranking


@dataclass
class AttributionRanking:
    """Heads ordered by their attribution-patching effect on calibration items (smallest first), with its cost."""

    effects: HeadEffects
    wall_s: float
    cpu_s: float

    @property
    def order(self) -> list[Head]:
        return self.effects.order()

    def ranking(self, name: str = "attribution", ablation: str = "zero") -> Ranking:
        return Ranking(name, order=tuple(self.order), ablation=ablation)

    def cost(self) -> dict:
        return dict(wall_s=self.wall_s, cpu_s=self.cpu_s, items=len(self.effects),
                    forward_passes=self.effects.meta.get("forward_passes"),
                    backward_passes=self.effects.meta.get("backward_passes"))


@keywords(EvalSettings)  # the signature names the settings' fields taken as keywords
def attribution_ranking(model, calibration, *, metric: str = "kl", settings: EvalSettings | None = None,
                        progress: bool = True, **options) -> AttributionRanking:
    """Rank ``model``'s heads by attribution patching on the ``calibration`` items: the size (mean |per-item
    effect|) of each head's linearised ``metric`` (``"kl"`` by default: it reads no gold answer), smallest first.
    The other settings are :func:`head_effects`'s."""
    if len(calibration) == 0:
        raise InputError("attribution_ranking: calibration has no items, and attribution needs items to rank the "
                         "heads on: give a task with items (lens_heads.load_task(name, n=20))")
    wall, cpu = time.perf_counter(), time.process_time()
    effects = head_effects(model, calibration, method="attribution", metric=metric, settings=settings,
                           progress=progress, **options)
    return AttributionRanking(effects, wall_s=time.perf_counter() - wall, cpu_s=time.process_time() - cpu)


def held_out(task, calibration):
    """The items of ``task`` that ``calibration`` does not hold (by id), in ``task``'s order."""
    ids = {it.id for it in calibration}
    kept = [it for it in task if it.id not in ids]
    if not kept:
        raise InputError(f"held_out: every item of the task ({len(task)}) is a calibration item, so none is left to "
                         "evaluate on: load the task with more items than the calibration (n=...)")
    return replace(task, items=kept)
