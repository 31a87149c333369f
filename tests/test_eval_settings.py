"""The evaluation settings as one value: checked when made, built from keywords, threaded to every evaluation of the
experiments that take it (each compared with a plain forward under the same setting), and recorded whole."""

import dataclasses

import numpy as np
import pytest

import lens_heads as lh
from conftest import LOGLIK_TOL, text_model
from lens_heads.data.tasks import load_task
from lens_heads.evaluation.eval_settings import FIELDS, EvalSettings, eval_settings
from lens_heads.plumbing.errors import InputError
from test_evaluate import loop_logprobs


@pytest.fixture(scope="module")
def model():
    return text_model(n_layers=2)


@pytest.fixture(scope="module")
def task():
    return load_task("arc_easy", split="validation", n=3, seed=3)


def test_the_value_is_frozen_hashable_and_round_trips():
    s = EvalSettings(batch_size="auto", primary="per_char", protocol="tl", apply_chat_template="auto",
                     attention="eager")
    assert lh.EvalSettings is EvalSettings and FIELDS == tuple(s.to_dict())
    assert EvalSettings.from_dict(s.to_dict()) == s and hash(EvalSettings.from_dict(s.to_dict())) == hash(s)
    assert EvalSettings.from_dict({"primary": "per_token"}) == EvalSettings(primary="per_token")
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.batch_size = 2  # type: ignore[misc]
    assert s.replace(batch_size=2).batch_size == 2 and s.batch_size == "auto"
    assert s.rows() == {"protocol": "tl", "apply_chat_template": "auto"}


@pytest.mark.parametrize("field,value,message", [
    ("batch_size", 0, "batch_size must be a whole number >= 1 or 'auto'"),
    ("batch_size", 2.0, "batch_size must be a whole number"),
    ("primary", "acc", "primary must be one of"),
    ("protocol", "hf", "unknown protocol 'hf'"),
    ("apply_chat_template", "yes", "apply_chat_template"),
    ("attention", "flash", "attention must be one of"),
])
def test_a_bad_setting_is_refused_when_the_value_is_made(field, value, message):
    with pytest.raises(InputError, match=message):
        EvalSettings(**{field: value})
    with pytest.raises(InputError, match=message):  # and through a keyword laid over a value
        eval_settings(EvalSettings(), {field: value})


def test_keywords_build_the_value_and_override_its_fields():
    base = EvalSettings(batch_size=3, primary="per_token")
    assert eval_settings(None, {}) == EvalSettings()
    assert eval_settings(base, {}) is base
    assert eval_settings(base, {"protocol": "tl"}) == EvalSettings(batch_size=3, primary="per_token", protocol="tl")
    with pytest.raises(InputError, match="unknown setting batch: the evaluation settings are batch_size, primary"):
        eval_settings(None, {"batch": 4})
    with pytest.raises(InputError, match="settings takes an EvalSettings"):
        eval_settings({"batch_size": 4}, {})  # type: ignore[arg-type]


@pytest.mark.floats
def test_evaluate_runs_under_the_value_and_records_it_whole(model, task):
    s = EvalSettings(batch_size=2, primary="per_token", protocol="tl")
    by_value = lh.evaluate(model, task, settings=s, progress=False)
    by_keywords = lh.evaluate(model, task, batch_size=2, primary="per_token", protocol="tl", progress=False)
    overridden = lh.evaluate(model, task, settings=EvalSettings(protocol="lm-eval"), protocol="tl", batch_size=2,
                             primary="per_token", progress=False)
    assert by_value.meta["settings"] == s.to_dict() == by_keywords.meta["settings"] == overridden.meta["settings"]
    assert by_value.primary == "per_token" and by_value.meta["protocol"] == "tl"
    for record, item in zip(by_value.items, task):  # the "tl" rows, against one plain forward per choice
        np.testing.assert_allclose(record.logprobs, loop_logprobs(model, item, protocol="tl"), **LOGLIK_TOL)
    for a, b, c in zip(by_value.items, by_keywords.items, overridden.items):  # the same operations: equal
        assert a.logprobs == b.logprobs == c.logprobs
    with pytest.raises(InputError, match="unknown setting batchsize"):
        lh.evaluate(model, task, batchsize=2)


@pytest.mark.floats
def test_the_experiments_thread_the_value_to_their_evaluations(model, task, tmp_path):
    s = EvalSettings(batch_size=2, protocol="tl")
    expected = [loop_logprobs(model, item, protocol="tl") for item in task]  # the "tl" rows, one forward a choice

    def same_rows(result):
        for record, reference in zip(result.items, expected):
            np.testing.assert_allclose(record.logprobs, reference, **LOGLIK_TOL)

    sweep = lh.run_sweep(model, task, scores=["AHON (LN)"], fractions=[0.2], settings=s, progress=False,
                         out_dir=tmp_path / "sweep")
    assert sweep.meta["settings"] == s.to_dict()
    same_rows(sweep.baseline)
    assert all(u.result.meta["settings"]["protocol"] == "tl" for u in sweep.units)
    assert lh.read_sweep_folder(tmp_path / "sweep").baseline.meta["settings"] == s.to_dict()  # kept with each unit
    scores = lh.score_heads(model, task, settings=s, progress=False)
    assert scores.meta["settings"] == s.to_dict() and scores.meta["data"]["protocol"] == "tl"
    assert len(scores) == sum(len(item.continuations) for item in task)  # cloze under "tl": a row per choice
    effects = lh.head_effects(model, task, settings=s, progress=False)
    assert effects.meta["settings"] == s.to_dict() and effects.meta["protocol"] == "tl"
    assert effects.meta["baseline"]["accuracy"] == pytest.approx(np.mean([np.argmax(e) == it.gold
                                                                          for e, it in zip(expected, task)]))
    ranked = lh.ranking_sweep(model, task, [], fractions=[0.0], settings=s, progress=False)
    assert ranked.meta["settings"] == s.to_dict()
    same_rows(ranked.baseline)
