"""What a sweep evaluates, as one frozen value: the scores and target shares, the random baseline and its draw, the
static pruning view and any further ablation specs.

``run_sweep(model, task, plan=SweepPlan(...))`` takes it whole, and the same names as keywords stay the friendly front
door that builds it (``run_sweep(model, task, scores=["AWFT"], seed=1)``; given together, the keywords override the
value's fields, as :func:`lens_heads.evaluation.eval_settings.eval_settings` does for the evaluation settings). The
value is checked when it is made, before any work, and a sweep's ``meta["plan"]`` records it whole.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from lens_heads.ablation.hooks import DRAWS
from lens_heads.ablation.specs import AblationSpec, RandomAblation, StaticAblation, ThresholdAblation, Unablated
from lens_heads.ablation.specs import from_dict as spec_from_dict
from lens_heads.heads.scores import EXTRA_NAMES, SCORE_NAMES
from lens_heads.plumbing.errors import InputError
from lens_heads.plumbing.values import laid_over

DEFAULT_FRACTIONS = (0.0, 0.05, 0.10, 0.15, 0.20, 0.25, 0.30)


@dataclass(frozen=True)
class SweepPlan:
    """The units of a sweep. ``scores``: the threshold curves (None: every score of
    ``lens_heads.heads.scores.SCORE_NAMES``, or a thresholds file's; the extras of ``EXTRA_NAMES`` may be named).
    ``fractions``: the target shares (0, the shared unablated baseline, is always added). ``random_baseline``: the
    random curve, drawn from ``seed`` once per item (``random="per_item"``) or once per forward row (``"per_row"``,
    the authors'). ``static_scores``: the static pruning view of these scores. ``specs``: further ablation specs
    (e.g. :class:`lens_heads.ablation.specs.LayerRemoval`), each a unit."""

    scores: tuple[str, ...] | None = None
    fractions: tuple[float, ...] = DEFAULT_FRACTIONS
    seed: int = 0
    random_baseline: bool = True
    static_scores: tuple[str, ...] = ()
    specs: tuple[AblationSpec, ...] = ()
    random: str = "per_item"

    def __post_init__(self):
        for name in ("scores", "static_scores", "fractions"):
            value = getattr(self, name)
            if isinstance(value, (str, int, float)):
                raise InputError(f"{name} takes a list, got {value!r}: write {name}=[{value!r}]")
        if self.scores is not None:
            object.__setattr__(self, "scores", tuple(self.scores))
        object.__setattr__(self, "static_scores", tuple(self.static_scores))
        unknown = [s for s in (self.scores or ()) + self.static_scores if s not in SCORE_NAMES + EXTRA_NAMES]
        if unknown:
            raise InputError(f"unknown scores {unknown}: choose from {SCORE_NAMES} or the extras {EXTRA_NAMES}")
        fractions = tuple(sorted({float(p) for p in self.fractions} | {0.0}))
        if any(not 0.0 <= p < 1.0 for p in fractions):
            raise InputError(f"target fractions must lie in [0, 1), got {list(fractions)}")
        object.__setattr__(self, "fractions", fractions)
        if self.random not in DRAWS:
            raise InputError(f"random must be one of {DRAWS}, got {self.random!r}")
        object.__setattr__(self, "specs", _check_specs(self.specs))

    def with_scores(self, scores: Sequence[str]) -> "SweepPlan":
        """The plan with ``scores`` where it names none (a thresholds file's, or every score)."""
        return self if self.scores is not None else dataclasses.replace(self, scores=tuple(scores))

    def units(self) -> list[AblationSpec]:
        """The units, in order: the baseline, then per target share the random ablation, each score's threshold
        ablation and each static score's most inactive heads; the further specs last."""
        plan: list[AblationSpec] = [Unablated()]
        for p in self.fractions:
            if p == 0:
                continue
            plan += [RandomAblation(p, self.seed, draw=self.random)] if self.random_baseline else []
            plan += [ThresholdAblation(s, p) for s in self.scores or ()]
            plan += [StaticAblation(score=s, fraction=p) for s in self.static_scores]
        return plan + [spec for spec in self.specs if spec not in plan]

    def to_dict(self) -> dict[str, Any]:
        """The plan as plain JSON values (what a sweep's ``meta["plan"]`` holds)."""
        return dict(scores=None if self.scores is None else list(self.scores), fractions=list(self.fractions),
                    seed=self.seed, random_baseline=self.random_baseline, static_scores=list(self.static_scores),
                    specs=[spec.to_dict() for spec in self.specs], random=self.random)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "SweepPlan":
        """The plan :meth:`to_dict` wrote."""
        return cls(**{**data, "specs": tuple(spec_from_dict(s) for s in data.get("specs", ()))})


FIELDS = tuple(f.name for f in dataclasses.fields(SweepPlan))


def sweep_plan(plan: SweepPlan | None = None, options: dict | None = None) -> SweepPlan:
    """``plan`` (default: ``SweepPlan()``) with the plan's fields among the keyword ``options`` laid over it; those
    keywords are taken out of ``options``, leaving the others (the evaluation settings) to their reader."""
    return laid_over(SweepPlan, plan, options, argument="plan", what="plan's fields", take=True)


def _check_specs(specs) -> tuple[AblationSpec, ...]:
    if isinstance(specs, AblationSpec) or not hasattr(specs, "__iter__"):
        raise InputError(f"specs takes a list of ablation specs, got {specs!r}: write specs=[{specs!r}]")
    specs = list(specs)
    bad = [spec for spec in specs if not isinstance(spec, AblationSpec)]
    if bad:
        raise InputError(f"specs must be ablation specs (lens_heads.ablation.specs), got {bad[:3]}")
    return tuple(dict.fromkeys(specs))
