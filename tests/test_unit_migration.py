"""A unit stores its ablation spec whole; units of the earlier format (mode, score, target_fraction, threshold) are
read, and migrated by scripts/migrate_units.py, into the spec their record gives, naming what it never held."""

import gzip
import importlib.util
import json
import math
from pathlib import Path

import pytest

from lens_heads.ablation.specs import InputAblation, LayerRemoval, StaticAblation, ThresholdAblation
from lens_heads.evaluation.results import EvalResult, ItemRecord
from lens_heads.experiments.sweep_result import UnitResult
from lens_heads.experiments.unit_store import FORMAT_VERSION, read_sweep_folder, read_units
from lens_heads.plumbing.errors import InputError

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


def migration_script():
    where = Path(__file__).resolve().parents[1] / "scripts" / "migrate_units.py"
    spec = importlib.util.spec_from_file_location("migrate_units", where)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_the_migration_script_rewrites_an_old_run_folder_from_its_keys_once(tmp_path, capsys):
    fingerprint = {"run": "old"}
    (tmp_path / "sweep.json").write_text(json.dumps({"key": fingerprint}))
    files = {"baseline__none__0.0000-a.json": ({"kind": "baseline", "ablation": "zero"},
                                               old_unit("baseline", None, 0.0)),
             "threshold__AWFT__0.1000-b.json": ({"kind": "threshold", "ablation": "mean", "score": "AWFT",
                                                 "fraction": 0.1, "threshold": None},
                                                old_unit("threshold", "AWFT", 0.1, 0.5))}
    for name, (filed, value) in files.items():
        (tmp_path / name).write_text(json.dumps({"key": {"run": fingerprint, "ablation": filed}, "value": value}))
    before = read_sweep_folder(tmp_path)
    migration_script().main([str(tmp_path)])
    assert "2 unit file(s) given their spec" in capsys.readouterr().out
    values = {name: json.loads((tmp_path / name).read_text())["value"] for name in files}
    assert values["threshold__AWFT__0.1000-b.json"]["spec"] == {"kind": "threshold", "ablation": "mean",
                                                               "score": "AWFT", "fraction": 0.1, "threshold": 0.5}
    assert values["baseline__none__0.0000-a.json"]["spec"] == {"kind": "baseline", "ablation": "zero"}
    assert not any("mode" in v for v in values.values())
    migration_script().main([str(tmp_path)])
    assert "unchanged" in capsys.readouterr().out
    after = read_sweep_folder(tmp_path)
    assert [u.to_dict() for u in after.units] == [u.to_dict() for u in before.units]


def test_the_migration_script_rewrites_an_old_units_file_once(tmp_path, capsys):
    script = migration_script()
    meta = {"seed": 7, "random_draw": "per_row", "rankings": {"attribution": "mean"}, "specs": []}
    old = [old_unit("baseline", None, 0.0), old_unit("random", None, 0.1), old_unit("threshold", "AWFT", 0.1, 0.5),
           old_unit("static", "attribution", 0.1)]
    path = tmp_path / "sweep_t_units.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"format": 3, "meta": meta, "units": old}).encode()))
    script.main([str(path)])
    assert "format 3 -> 4, 4 of 4 units" in capsys.readouterr().out
    data = json.loads(gzip.decompress(path.read_bytes()))
    assert data["format"] == FORMAT_VERSION == 4 and data["meta"] == meta
    rest = {k: v for k, v in old[0].items() if k not in ("key", "mode", "score", "target_fraction", "threshold")}
    assert data["units"] == [
        {"key": "baseline__none__0.0000", "spec": {"kind": "baseline", "unrecorded": ["ablation"]}, **rest},
        {"key": "random__none__0.1000", "spec": {"kind": "random", "fraction": 0.1, "seed": 7, "draw": "per_row",
                                                 "unrecorded": ["ablation"]}, **rest},
        {"key": "threshold__AWFT__0.1000", "spec": {"kind": "threshold", "score": "AWFT", "fraction": 0.1,
                                                    "threshold": 0.5, "unrecorded": ["ablation"]}, **rest},
        {"key": "static__attribution__0.1000", "spec": {"kind": "static", "ablation": "mean", "score": "attribution",
                                                        "fraction": 0.1, "unrecorded": ["heads"]}, **rest}]
    once = path.read_bytes()
    script.main([str(path)])
    assert "unchanged" in capsys.readouterr().out and path.read_bytes() == once
    sweep = read_units(path)
    assert [(u.mode, u.score, u.target_fraction) for u in sweep.units] == [
        (u["mode"], u["score"], u["target_fraction"]) for u in old]
    assert math.isclose(sweep.units[2].threshold, 0.5)


def test_a_torn_units_file_is_named_and_left_untouched(tmp_path, capsys):
    """A units file cut short mid-write (its gzip stream, or its JSON inside a whole stream): exit 1, the file named
    and its bytes as they were; a torn unit file in a run folder is named, the others migrated."""
    script = migration_script()
    whole = gzip.compress(json.dumps({"format": 3, "meta": {}, "units": [old_unit("baseline", None, 0.0)]}).encode())
    torn_gzip, torn_json = tmp_path / "a_units.json.gz", tmp_path / "b_units.json.gz"
    torn_gzip.write_bytes(whole[: len(whole) // 2])
    torn_json.write_bytes(gzip.compress(b'{"format": 3, "meta": {}, "units": [{"key": "base'))
    before = {p: p.read_bytes() for p in (torn_gzip, torn_json)}
    assert script.main([str(torn_gzip), str(torn_json)]) == 1
    err = capsys.readouterr().err
    for path in (torn_gzip, torn_json):
        assert f"{path}: torn or not a gzipped units file" in err and "left untouched" in err
        assert path.read_bytes() == before[path]
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "baseline__none__0.0000-a.json").write_text(json.dumps(
        {"key": {"run": {}, "ablation": {"kind": "baseline", "ablation": "zero"}},
         "value": old_unit("baseline", None, 0.0)}))
    (folder / "threshold__AWFT__0.1000-b.json").write_text('{"key": {"run": {}}, "val')
    assert script.main([str(folder)]) == 1
    err = capsys.readouterr().err
    assert "1 unit file(s) given their spec; 1 file(s) torn or not units, left untouched: " \
           "threshold__AWFT__0.1000-b.json" in err
    assert (folder / "threshold__AWFT__0.1000-b.json").read_text() == '{"key": {"run": {}}, "val'
