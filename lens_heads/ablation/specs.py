"""Ablations as data: frozen, JSON-serialisable descriptions of one ablation that build their hooks.

A spec says what to ablate, not how to hook it:

- :class:`Unablated`: nothing (the baseline every curve starts from).
- :class:`ThresholdAblation`: per input, the heads on the inactive side of a threshold on ``score``; the threshold is
  the one that ablates ``fraction`` of the calibration's pooled values (``threshold`` once resolved).
- :class:`RandomAblation`: each (input, layer, head) with probability ``fraction``, drawn from ``seed``, once per item
  (``draw="per_item"``) or once per forward row (``"per_row"``, the authors').
- :class:`StaticAblation`: a fixed head set for every input: ``heads`` given, or the ``fraction`` most inactive heads
  of ``score`` by its mean over the calibration.
- :class:`LayerRemoval`: whole layers for every input, their attention or their whole block
  (:mod:`lens_heads.ablation.removed_layers`).
- :class:`InputAblation`: each input its own fixed head set (the front of a per-input ranking).

Each has ``ablation``: ``"zero"`` or ``"mean"`` (what replaces an ablated head's output). A spec that needs calibration is :meth:`resolved <AblationSpec.resolve>`
against a calibration (an object with ``threshold(score, fraction)`` and ``most_inactive(score, fraction)``, such as
:class:`ScoreCalibration`), then :meth:`built <AblationSpec.build>` into a :class:`lens_heads.ablation.hooks.HeadAblation`.
``to_dict``/:func:`from_dict` round-trip through JSON; a sweep's plan is a list of specs, and each stored unit is
keyed by its spec.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import ClassVar, Mapping

from torch import Tensor

from lens_heads.ablation.hooks import ABLATIONS, DRAWS, HeadAblation, input_zeroing, static_zeroing, threshold_zeroing
from lens_heads.ablation.random_draws import random_zeroing
from lens_heads.ablation.removed_layers import PARTS, RemovedLayers, remove_layers
from lens_heads.heads.distributions import thresholds
from lens_heads.heads.scores import most_inactive
from lens_heads.plumbing.errors import InputError
from lens_heads.stats.curves import CurveKey


@dataclass(frozen=True)
class AblationSpec:
    """What every spec has: its ``kind`` (the name :func:`from_dict` reads) and ``ablation``."""

    kind: ClassVar[str] = ""
    calibrated: ClassVar[str | None] = None  # the field a calibration fills in, where it is None
    ablation: str = field(default="zero", kw_only=True)

    def __post_init__(self):
        if self.ablation not in ABLATIONS:
            raise InputError(f"ablation must be one of {ABLATIONS}, got {self.ablation!r}")

    @property
    def target_fraction(self) -> float:
        return target_fraction({"kind": self.kind, **vars(self)})

    @property
    def ranked_by(self) -> str | None:
        """The score that chooses the heads (None for the baseline and random ablation)."""
        return ranked_by({"kind": self.kind, **vars(self)})

    @property
    def curve(self) -> CurveKey | None:
        """The curve this ablation is a point of (None for the baseline, a point of every curve)."""
        return None

    def resolve(self, calibration) -> "AblationSpec":
        """The spec with what calibration decides filled in (itself where nothing is left to decide)."""
        if self.calibrated is None or getattr(self, self.calibrated) is not None:
            return self
        return replace(self, **{self.calibrated: self._calibrate(calibration)})

    def _calibrate(self, calibration):
        raise NotImplementedError

    def _decided(self):
        """The calibrated field's value, or a clear error where it was never resolved."""
        value = getattr(self, self.calibrated)
        if value is None:
            raise InputError(f"{self} has no {self.calibrated} yet: resolve it with a calibration first "
                             "(spec.resolve(...))")
        return value

    def build(self, model, *, means: Tensor | None = None) -> HeadAblation | RemovedLayers | None:
        """The hooks object for ``model`` (``means`` from :func:`lens_heads.ablation.hooks.mean_z` for ``ablation="mean"``)."""
        raise NotImplementedError

    def to_dict(self) -> dict:
        """The spec as JSON (:func:`from_dict` reads it back)."""
        return {"kind": self.kind, **asdict(self)}


@dataclass(frozen=True)
class Unablated(AblationSpec):
    kind: ClassVar[str] = "baseline"

    def build(self, model, *, means: Tensor | None = None) -> None:
        return None


@dataclass(frozen=True)
class ThresholdAblation(AblationSpec):
    score: str
    fraction: float
    threshold: float | None = None

    kind: ClassVar[str] = "threshold"
    calibrated: ClassVar[str] = "threshold"

    @property
    def curve(self) -> CurveKey:
        return CurveKey("threshold", self.score)

    def _calibrate(self, calibration) -> float:
        return float(calibration.threshold(self.score, self.fraction))

    def build(self, model, *, means: Tensor | None = None) -> HeadAblation:
        return threshold_zeroing(model, self.score, self._decided(), ablation=self.ablation, means=means)


@dataclass(frozen=True)
class RandomAblation(AblationSpec):
    """Each (input, layer, head) ablated with probability ``fraction``: ``draw="per_item"`` draws once for all rows
    of an item, ``"per_row"`` once for every forward row (:func:`lens_heads.ablation.random_draws.random_zeroing`)."""

    fraction: float
    seed: int = 0
    draw: str = "per_item"

    kind: ClassVar[str] = "random"

    def __post_init__(self):
        super().__post_init__()
        if self.draw not in DRAWS:
            raise InputError(f"RandomAblation(draw={self.draw!r}): choose one of {DRAWS}")

    @property
    def curve(self) -> CurveKey:
        return CurveKey("random")

    def build(self, model, *, means: Tensor | None = None) -> HeadAblation:
        return random_zeroing(model, self.fraction, self.seed, draw=self.draw, ablation=self.ablation, means=means)


@dataclass(frozen=True)
class StaticAblation(AblationSpec):
    heads: tuple[tuple[int, int], ...] | None = None
    score: str | None = None  # what ranked the heads (a score, or a name such as an oracle's)
    fraction: float | None = None

    kind: ClassVar[str] = "static"
    calibrated: ClassVar[str] = "heads"

    def __post_init__(self):
        super().__post_init__()
        if self.heads is not None:  # JSON gives lists: keep the spec hashable and equal to its round trip
            object.__setattr__(self, "heads", tuple((int(layer), int(head)) for layer, head in self.heads))
        elif self.score is None or self.fraction is None:
            raise InputError("a static ablation needs heads=[(layer, head), ...], or a score and a fraction to take "
                             "its most inactive heads from a calibration")
        if self.fraction is not None and not 0.0 <= self.fraction < 1.0:  # a negative one zeroed nearly every head
            raise InputError(f"StaticAblation(fraction={self.fraction}): give a share of heads in [0, 1)")

    @property
    def curve(self) -> CurveKey:
        return CurveKey("static", self.score)

    def _calibrate(self, calibration) -> tuple[tuple[int, int], ...]:
        return tuple(calibration.most_inactive(self.score, self.fraction))

    def build(self, model, *, means: Tensor | None = None) -> HeadAblation:
        return static_zeroing(model, self._decided(), ablation=self.ablation, means=means)


@dataclass(frozen=True)
class LayerRemoval(AblationSpec):
    """Remove ``layers`` (their ``part``: ``"attention"`` or the whole ``"block"``) for every input. ``order`` names
    what ranked them (a curve of removals in one ranking's order shares it). Its :attr:`target_fraction` is the
    number of layers removed (a sweep's realised share is the share of heads they take out)."""

    layers: tuple[int, ...]
    part: str = "attention"
    order: str | None = None

    kind: ClassVar[str] = "layers"

    def __post_init__(self):
        if self.ablation != "zero":
            raise InputError(f"LayerRemoval(ablation={self.ablation!r}): a removed layer writes nothing "
                             "(ablation='zero')")
        if self.part not in PARTS:
            raise InputError(f"LayerRemoval(part={self.part!r}): choose one of {PARTS}")
        if isinstance(self.layers, (str, bytes, int)) or not hasattr(self.layers, "__iter__"):
            raise InputError(f"LayerRemoval(layers={self.layers!r}): give a list of layer indices")
        object.__setattr__(self, "layers", tuple(int(layer) for layer in self.layers))  # JSON gives lists

    @property
    def curve(self) -> CurveKey:
        return CurveKey("layers", str(self.ranked_by))

    def build(self, model, *, means: Tensor | None = None) -> RemovedLayers:
        if means is not None:
            raise InputError("LayerRemoval takes no means: a removed layer writes nothing")
        return remove_layers(model, self.layers, part=self.part)


@dataclass(frozen=True)
class InputAblation(AblationSpec):
    """Each input its own fixed head set: ``heads[i]`` for input ``i`` of the evaluated task (the front of a
    per-input ranking named ``score``, at the target ``fraction``)."""

    heads: tuple[tuple[tuple[int, int], ...], ...]
    score: str
    fraction: float | None = None

    kind: ClassVar[str] = "per_input"

    def __post_init__(self):
        super().__post_init__()
        object.__setattr__(self, "heads", tuple(tuple((int(layer), int(head)) for layer, head in heads)
                                                for heads in self.heads))
        if self.fraction is not None and not 0.0 <= self.fraction < 1.0:
            raise InputError(f"InputAblation(fraction={self.fraction}): give a share of heads in [0, 1)")

    @property
    def curve(self) -> CurveKey:
        return CurveKey("per_input", self.score)

    def build(self, model, *, means: Tensor | None = None) -> HeadAblation:
        return input_zeroing(model, self.heads, ablation=self.ablation, means=means)


# The registry of spec kinds, in a sweep plan's order (the baseline, then per share random, threshold, static; the
# further specs after). A unit's ``mode`` is its spec's kind: UNIT_MODES is every mode a unit can have, and every
# kind but the baseline is one of the curve modes CurveKey accepts (lens_heads.stats.curves.CURVE_MODES, a layer
# below; tests/test_ablation_specs.py holds the two to the same modes).
SPECS: dict[str, type[AblationSpec]] = {cls.kind: cls for cls in (
    Unablated, RandomAblation, ThresholdAblation, StaticAblation, InputAblation, LayerRemoval)}
UNIT_MODES: tuple[str, ...] = tuple(SPECS)


def ranked_by(fields: Mapping) -> str | None:
    """What chose the ablated heads, read off a spec's JSON (its ``to_dict``): the score, or for a layer removal the
    ranking and the part (``"Block Influence · attention"``) or the layers removed; None for the baseline and random
    ablation. It reads the JSON, not a built spec, so that a unit's migrated spec missing a field (its
    ``"unrecorded"``) still names its curve."""
    if fields["kind"] == LayerRemoval.kind:
        order, part = fields.get("order"), fields["part"]
        return f"{order} · {part}" if order else f"layers {','.join(map(str, fields['layers']))} · {part}"
    return fields.get("score")


def target_fraction(fields: Mapping) -> float:
    """A spec's target, read off its JSON: the share of heads it aims at (0 for the baseline), or for a layer removal
    the number of layers removed."""
    if fields["kind"] == LayerRemoval.kind:
        return float(len(fields["layers"]))
    return float(fields.get("fraction") or 0.0)


def from_dict(d: dict) -> AblationSpec:
    """The spec :meth:`AblationSpec.to_dict` wrote, or the older JSON of runs of earlier versions (the ablation
    under ``"mode"``; a random draw left out where it was per item), which
    :func:`lens_heads.sweep.unit_store.refile_units` reads once to re-file their units."""
    fields = dict(d)
    kind = fields.pop("kind", None)
    if "mode" in fields:
        fields["ablation"] = fields.pop("mode")
    if kind not in SPECS:
        raise InputError(f"unknown ablation kind {kind!r}: choose one of {list(SPECS)}")
    return SPECS[kind](**fields)


class ScoreCalibration:
    """Thresholds and static head sets read off unablated head scores (:class:`lens_heads.heads.scoring.HeadScores`):
    the threshold that puts ``fraction`` of the pooled values on the inactive side, and the ``round(fraction x
    layers x heads)`` heads with the most inactive mean."""

    def __init__(self, scores):
        self.scores = scores

    def threshold(self, score: str, fraction: float) -> float:
        return float(thresholds(self.scores, score, [fraction])[fraction])

    def most_inactive(self, score: str, fraction: float) -> list[tuple[int, int]]:
        mean = self.scores.mean(score)
        return most_inactive(mean, self.scores.direction[score], int(round(fraction * mean.numel())))
