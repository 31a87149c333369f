"""A unit stores its ablation spec whole; units of the earlier format (mode, score, target_fraction, threshold) are
read into the spec their record gives, naming what it never held."""

import json

import pytest

from lens_heads.ablation.specs import InputAblation, LayerRemoval, StaticAblation, ThresholdAblation
from lens_heads.evaluation.results import EvalResult, ItemRecord
from lens_heads.plumbing.errors import InputError
from lens_heads.sweep.result import UnitResult

RESULT = EvalResult(task="t", format="cloze", chance=0.5, items=[
    ItemRecord(id="q0", gold=0, logprobs=[-0.5, -1.5], n_tokens=[1, 1], n_chars=[1, 1])])


def old_unit(mode, score, fraction, threshold=None) -> dict:
    """A unit's JSON as format 3 wrote it (written out by hand, not by the code under test)."""
    slugged = {"AHON (LN)": "AHON_LN", None: "none"}.get(score, score)
    return {"key": f"{mode}__{slugged}__{fraction:.4f}", "mode": mode, "score": score, "target_fraction": fraction,
            "threshold": threshold, "realised_fraction": 0.25, "wall_s": 1.5, "head_share": None,
            "item_zeroed": [[2, 3]], "result": RESULT.to_dict()}


def test_a_unit_writes_its_resolved_spec_whole_and_reads_its_fields_off_it():
    spec = ThresholdAblation("AHON (LN)", 0.1, threshold=0.75)
    unit = UnitResult(spec=spec.to_dict(), realised_fraction=0.125, result=RESULT, item_zeroed=[[2, 3]], wall_s=2.0)
    written = unit.to_dict()
    assert written == {"key": "threshold__AHON_LN__0.1000",
                       "spec": {"kind": "threshold", "ablation": "zero", "score": "AHON (LN)", "fraction": 0.1,
                                "threshold": 0.75},
                       "realised_fraction": 0.125, "wall_s": 2.0, "head_share": None, "item_zeroed": [[2, 3]],
                       "result": RESULT.to_dict()}
    assert (unit.mode, unit.score, unit.target_fraction, unit.threshold) == ("threshold", "AHON (LN)", 0.1, 0.75)
    assert UnitResult.from_dict(json.loads(json.dumps(written))).to_dict() == written
    layers = UnitResult(spec=LayerRemoval([3, 5], order="Block Influence").to_dict(), realised_fraction=0.1,
                        result=RESULT)
    assert (layers.mode, layers.score, layers.target_fraction, layers.threshold) == (
        "layers", "Block Influence · attention", 2.0, None)


@pytest.mark.parametrize("old, filed, spec", [
    (old_unit("threshold", "AHON (LN)", 0.1, 0.75), None,
     {"kind": "threshold", "score": "AHON (LN)", "fraction": 0.1, "threshold": 0.75, "unrecorded": ["ablation"]}),
    (old_unit("threshold", "AHON (LN)", 0.1, 0.75), {"kind": "threshold", "mode": "zero", "score": "AHON (LN)",
                                                      "fraction": 0.1, "threshold": None},  # a format-1 key
     {"kind": "threshold", "ablation": "zero", "score": "AHON (LN)", "fraction": 0.1, "threshold": 0.75}),
    (old_unit("static", "AWFT", 0.2), None,
     {"kind": "static", "score": "AWFT", "fraction": 0.2, "unrecorded": ["ablation", "heads"]}),
    (old_unit("static", "AWFT", 0.2), {"kind": "static", "ablation": "mean", "heads": None, "score": "AWFT",
                                       "fraction": 0.2},
     {"kind": "static", "ablation": "mean", "score": "AWFT", "fraction": 0.2, "unrecorded": ["heads"]}),
    (old_unit("random", None, 0.3), None,
     {"kind": "random", "fraction": 0.3, "unrecorded": ["ablation", "seed", "draw"]}),
    (old_unit("per_input", "attribution", 0.1), None,
     {"kind": "per_input", "score": "attribution", "fraction": 0.1, "unrecorded": ["ablation", "heads"]}),
    (old_unit("baseline", None, 0.0), None, {"kind": "baseline", "unrecorded": ["ablation"]}),
    ({**old_unit("layers", None, 2.0), "score": "layers 3,5 · block", "key": "layers__layers_3_5_block__2.0000"}, None,
     {"kind": "layers", "ablation": "zero", "layers": [3, 5], "part": "block", "order": None}),
    ({**old_unit("layers", None, 2.0), "score": "Block Influence · attention",
      "key": "layers__Block_Influence_attention__2.0000"},
     {"kind": "layers", "ablation": "zero", "layers": [3, 5], "part": "attention", "order": "Block Influence"},
     {"kind": "layers", "ablation": "zero", "layers": [3, 5], "part": "attention", "order": "Block Influence"}),
])
def test_an_old_unit_reads_as_the_spec_its_record_gives(old, filed, spec):
    unit = UnitResult.from_dict(old, filed=filed)
    assert unit.spec == spec
    assert (unit.mode, unit.score, unit.target_fraction, unit.threshold, unit.key) == (
        old["mode"], old["score"], old["target_fraction"], old["threshold"], old["key"])
    assert (unit.realised_fraction, unit.wall_s, unit.item_zeroed) == (0.25, 1.5, [[2, 3]])
    assert unit.result.to_dict() == RESULT.to_dict()


def test_an_old_unit_filed_under_another_kind_or_naming_only_its_ranking_is_refused():
    with pytest.raises(InputError, match="filed under"):
        UnitResult.from_dict(old_unit("static", "AWFT", 0.2), filed=ThresholdAblation("AWFT", 0.2).to_dict())
    with pytest.raises(InputError, match="names its ranking"):
        UnitResult.from_dict({**old_unit("layers", None, 2.0), "score": "Block Influence · attention"})


def test_the_specs_written_by_hand_are_the_ones_the_spec_classes_write():
    """The migrated specs above are the spec classes' JSON where every field is known."""
    assert StaticAblation(score="AWFT", fraction=0.2, ablation="mean").to_dict() == {
        "kind": "static", "ablation": "mean", "heads": None, "score": "AWFT", "fraction": 0.2}
    assert InputAblation(heads=[[(0, 1)]], score="attribution", fraction=0.1).to_dict() == {
        "kind": "per_input", "ablation": "zero", "heads": (((0, 1),),), "score": "attribution", "fraction": 0.1}
