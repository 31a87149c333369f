"""Units recorded before a unit stored its ablation spec whole: the spec JSON their separate fields give.

An earlier unit kept ``mode`` (its spec's kind), ``score`` (what ranked its heads), ``target_fraction`` and
``threshold``, not the spec. :func:`legacy_spec` builds the spec's JSON from them, and from the spec the unit was
filed under where a run folder's key holds it. No field is guessed: a field the old record never held is left out
and named in the spec's ``"unrecorded"`` list (e.g. a calibrated static unit's head set, a random unit's seed, the
``ablation`` of a unit read without its key), so a reader can tell a recorded value from a missing one.
"""

from __future__ import annotations

from dataclasses import fields, replace

from lens_heads.ablation.specs import SPECS, LayerRemoval, ThresholdAblation
from lens_heads.ablation.specs import from_dict as spec_from_dict
from lens_heads.plumbing.cache import canonical
from lens_heads.plumbing.errors import InputError

UNRECORDED = "unrecorded"  # the spec's fields an old record never held


def is_legacy(unit: dict) -> bool:
    """Whether ``unit`` (a unit's JSON) is of the format before units stored their spec."""
    return "spec" not in unit and "mode" in unit


def legacy_spec(unit: dict, filed: dict | None = None, known: dict | None = None) -> dict:
    """The spec JSON of old-format ``unit``: ``filed`` (the spec JSON its run folder filed it under, in any format
    :func:`lens_heads.ablation.specs.from_dict` reads) with the threshold the unit resolved; without it, the kind,
    score, fraction and threshold the unit holds plus ``known`` (spec fields a units file's meta records, such as a
    random unit's seed). Fields still missing are named in ``"unrecorded"``."""
    kind = unit["mode"]
    if kind not in SPECS:
        raise InputError(f"unit {unit.get('key')!r} has an unknown mode {kind!r}: not one of {list(SPECS)}")
    if filed is not None:
        spec = spec_from_dict(filed)
        if spec.kind != kind:
            raise InputError(f"unit {unit.get('key')!r} is a {kind!r} unit filed under a {spec.kind!r} spec")
        if isinstance(spec, ThresholdAblation) and spec.threshold is None and unit.get("threshold") is not None:
            spec = replace(spec, threshold=float(unit["threshold"]))
        out = canonical(spec.to_dict())
        missing = [spec.calibrated] if spec.calibrated is not None and out[spec.calibrated] is None else []
        return _with_unrecorded({k: v for k, v in out.items() if k not in missing}, missing)
    names = [f.name for f in fields(SPECS[kind])]
    have = dict(known or {})
    if kind == LayerRemoval.kind:
        have.update(_layers_from_name(unit), ablation="zero")  # the only ablation LayerRemoval admits
    else:
        have.update({k: v for k, v in (("score", unit.get("score")), ("fraction", unit.get("target_fraction")),
                                       ("threshold", unit.get("threshold"))) if k in names})
    out = {"kind": kind, **{k: have[k] for k in names if k in have}}
    return _with_unrecorded(out, [k for k in names if k not in have])


def _with_unrecorded(spec: dict, missing: list[str]) -> dict:
    return {**spec, UNRECORDED: missing} if missing else spec


def _layers_from_name(unit: dict) -> dict:
    """A layer unit's fields its curve name gives: ``"layers 3,4 · attention"`` names its layers; a ranking's name
    (``"Block Influence · attention"``) does not, and the number of layers alone is not the spec."""
    name, _, part = str(unit.get("score")).rpartition(" · ")
    listed = name.removeprefix("layers ")
    if name.startswith("layers ") and all(s.isdigit() for s in listed.split(",")):
        return dict(layers=[int(s) for s in listed.split(",")], part=part, order=None)
    raise InputError(f"the layer unit {unit.get('key')!r} names its ranking ({name!r}) but not its layers: read it "
                     "from its run folder, whose key holds its spec (read_sweep_folder)")
