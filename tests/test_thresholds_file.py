"""The authors' thresholds.json: read, written, refused for another model or score set, and swept with.

Expected thresholds are numpy quantiles of the pooled scores computed here; the authors' format is written out by
hand (made-up numbers in their layout)."""

import json
import re

import numpy as np
import pytest

from conftest import text_model
from lens_heads import InputError, load_thresholds, save_thresholds
from lens_heads.heads.thresholds_file import AUTHORS_FRACTIONS, Thresholds, model_key

SEVEN = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7]


@pytest.fixture(scope="module")
def model():
    return text_model(n_layers=2)


@pytest.fixture(scope="module")
def scored(model):
    from lens_heads.data.tasks import load_task
    from lens_heads.heads.scoring import score_heads

    return score_heads(model, load_task("piqa", n=3, seed=0), extras=["LTHON (HN)", "AHON (full)"], progress=False)


def _write(tmp_path, data, name="thresholds.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def test_an_authors_file_reads_with_their_names_mapped_to_ours(tmp_path):
    path = _write(tmp_path, {"mmlu": {"meta-llama_Llama-3.2-3B": {"Dormant": SEVEN[::-1],  # a '>' score: falls
                                                                  "HONOR": [2 * x for x in SEVEN],
                                                                  "HeadOutputMagnitudeNormalizedHeadLastToken": SEVEN,
                                                                  "FullHeadOutputNormalized": SEVEN}}})
    th = load_thresholds(path, "meta-llama/Llama-3.2-3B")  # a Hugging Face id finds the file's key
    assert (th.model, th.task) == ("meta-llama_Llama-3.2-3B", "mmlu")
    assert th.scores == ["AWFT", "AHON (LN)", "LTHON (HN)", "AHON (full, LN)"]
    assert th.fractions == (0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3)
    assert th.threshold("AHON (LN)", 0.1) == pytest.approx(0.6)  # the third of seven: p = 10%
    assert th.threshold("AWFT", 0.3) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="has no 'AEQD'.*its scores are AWFT, AHON \\(LN\\)"):
        th.threshold("AEQD", 0.1)
    with pytest.raises(ValueError, match="no threshold at target share 0.12"):
        th.threshold("AWFT", 0.12)


def test_files_for_another_model_task_or_score_set_are_refused(tmp_path, model):
    two = _write(tmp_path, {"mmlu": {"org_a": {"HONOR": SEVEN}}, "piqa": {"org_a": {"HONOR": SEVEN}}})
    with pytest.raises(ValueError, match="several tasks \\(mmlu, piqa\\): give task="):
        load_thresholds(two)
    with pytest.raises(ValueError, match="has no model 'org_b'; it holds org_a: thresholds of another model"):
        load_thresholds(two, "org/b", task="piqa")
    with pytest.raises(ValueError, match=f"has no model '{model_key(model)}'"):
        load_thresholds(two, model, task="mmlu")  # a loaded model is named by its own key
    other_scores = _write(tmp_path, {"mmlu": {"org_a": {"HONOR": SEVEN, "MyOwnScore": SEVEN}}}, "other.json")
    with pytest.raises(ValueError, match="\\['MyOwnScore'\\] that are not the authors' score set"):
        load_thresholds(other_scores)
    short = _write(tmp_path, {"mmlu": {"org_a": {"HONOR": SEVEN[:5]}}}, "short.json")
    with pytest.raises(ValueError, match="one number per target share"):
        load_thresholds(short)
    th = load_thresholds(two, task="mmlu")
    with pytest.raises(ValueError, match=f"for org_a \\(mmlu\\), not for {model_key(model)}"):
        th.check_model(model)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_thresholds(tmp_path / "missing.json")


@pytest.mark.parametrize("values, words", [
    ("[0.1, 0.2, NaN, 0.4, 0.5, 0.6, 0.7]", ["'HONOR' (AHON (LN))", "non-finite", "[0.1]"]),
    ("[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, Infinity]", ["'HONOR' (AHON (LN))", "non-finite", "[0.3]"]),
    ("[0.1, 0.2, 0.3, 0.25, 0.5, 0.6, 0.7]", ["'HONOR' (AHON (LN), inactive when < threshold)", "not fall",
                                              "from 0.3 at 0.1 to 0.25 at 0.15"]),
    ("[0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1]", ["'HONOR'", "not fall", "reversed"]),
])
def test_non_finite_or_non_monotone_thresholds_are_refused_naming_the_file_and_score(tmp_path, values, words):
    path = tmp_path / "thresholds.json"
    path.write_text('{"mmlu": {"org_a": {"Dormant": [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3], "HONOR": %s}}}' % values)
    with pytest.raises(InputError) as e:
        load_thresholds(path)
    for w in [str(path), "mmlu / org_a"] + words:
        assert w in str(e.value), (w, str(e.value))


def test_monotone_means_each_scores_own_direction(tmp_path):
    """The paper's directions: AWFT (Dormant) is inactive above its threshold, so its thresholds fall with the share;
    AHON (HONOR) below, so they rise. Ties (a flat stretch) and a step back within float32 rounding pass."""
    rising, falling = SEVEN, SEVEN[::-1]
    flat_and_rounded = [0.1, 0.1, 0.1, 0.3, 0.3 * (1 - 1e-7), 0.6, 0.7]
    ok = _write(tmp_path, {"t": {"m": {"Dormant": falling, "HONOR": rising, "Entropy": flat_and_rounded}}})
    assert load_thresholds(ok).values["AWFT"] == tuple(falling)
    for name, values in (("Dormant", rising), ("HONOR", falling)):
        bad = _write(tmp_path, {"t": {"m": {name: values}}}, f"{name}.json")
        with pytest.raises(InputError, match=f"{re.escape(str(bad))}.*'{name}'.*must not {'rise' if name == 'Dormant' else 'fall'}"):
            load_thresholds(bad)


def test_a_file_with_a_byte_order_mark_reads_and_one_not_in_utf8_is_refused(tmp_path):
    data = {"t": {"m": {"HONOR": SEVEN}}}
    plain = _write(tmp_path, data)
    marked = tmp_path / "marked.json"
    marked.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    assert load_thresholds(marked).values == load_thresholds(plain).values
    latin = tmp_path / "latin.json"
    latin.write_bytes(b'{"t\xe9": {"m": {"HONOR": [0, 1, 2, 3, 4, 5, 6]}}}')
    with pytest.raises(InputError, match=re.escape(f"{latin} is not UTF-8")):
        load_thresholds(latin)


def test_thresholds_written_here_read_back_as_the_pooled_quantiles(tmp_path, scored):
    path = save_thresholds(tmp_path / "ours.json", scored, task="piqa", model="org/tiny")
    raw = json.loads(path.read_text())
    assert list(raw) == ["piqa"] and list(raw["piqa"]) == ["org_tiny"]
    entry = raw["piqa"]["org_tiny"]
    assert {"Dormant", "HONOR", "UnnormalizedHONOR", "HeadOutputMagnitudeNormalizedHeadLastToken",
            "FullHeadOutput"} <= set(entry) and all(len(v) == 7 for v in entry.values())
    pooled = {name: scored.score(name).double().numpy().reshape(-1) for name in ("AHON (LN)", "AWFT", "LTHON (HN)")}
    for p, value in zip(AUTHORS_FRACTIONS, entry["HONOR"]):
        assert value == pytest.approx(np.quantile(pooled["AHON (LN)"], p))
    for p, value in zip(AUTHORS_FRACTIONS, entry["Dormant"]):  # a '>' score: the (1 - p) quantile
        assert value == pytest.approx(np.quantile(pooled["AWFT"], 1 - p))
    back = load_thresholds(path)
    assert back.threshold("LTHON (HN)", 0.2) == pytest.approx(np.quantile(pooled["LTHON (HN)"], 0.2))
    assert back.model == "org_tiny" and back.task == "piqa"


def test_a_sweep_zeroes_at_the_files_thresholds_and_refuses_another_models(tmp_path, model, scored):
    from lens_heads.ablation.hooks import threshold_zeroing
    from lens_heads.data.tasks import load_task
    from lens_heads.evaluation.evaluate import evaluate
    from lens_heads.sweep.run import run_sweep

    task = load_task("piqa", n=3, seed=0)
    chosen = float(np.quantile(scored.score("LTHON (HN)").numpy(), 0.4))  # a threshold no calibration here would pick
    th = Thresholds(model_key(model), "piqa", AUTHORS_FRACTIONS, {"LTHON (HN)": (0.0,) * 6 + (chosen,)})
    result = run_sweep(model, task, thresholds=th, fractions=(0, 0.3), random_baseline=False, batch_size=4,
                       progress=False, out_dir=tmp_path / "run")
    unit = next(u for u in result.units if u.mode == "threshold")
    assert (unit.score, unit.threshold) == ("LTHON (HN)", pytest.approx(chosen))
    zeroing = threshold_zeroing(model, "LTHON (HN)", chosen)  # the same zeroing built by hand
    by_hand = evaluate(model, task, hooks=[zeroing], batch_size=4, progress=False)
    assert unit.realised_fraction == pytest.approx(zeroing.share_zeroed()) and 0 < unit.realised_fraction < 1
    assert [it.logprobs for it in unit.result.items] == [it.logprobs for it in by_hand.items]
    assert result.meta["thresholds"].startswith("piqa / ")
    with pytest.raises(ValueError, match="has no 'AHON'"):
        run_sweep(model, task, thresholds=th, scores=["AHON"], fractions=(0, 0.3), progress=False)
    with pytest.raises(ValueError, match="no threshold at target share 0.5"):
        run_sweep(model, task, thresholds=th, fractions=(0, 0.5), progress=False)
    other = Thresholds("meta-llama_Llama-3.2-3B", "mmlu", AUTHORS_FRACTIONS, {"LTHON (HN)": (0.5,) * 7})
    with pytest.raises(ValueError, match="not for .*thresholds do not carry over"):
        run_sweep(model, task, thresholds=other, fractions=(0, 0.3), progress=False)
