"""A sweep's plan as one value: checked when made, built from keywords, its units in the documented order, and
recorded whole in the sweep's meta."""

import pytest

import lens_heads as lh
from conftest import text_model
from lens_heads.ablation.specs import LayerRemoval, RandomAblation, StaticAblation, ThresholdAblation, Unablated
from lens_heads.data.tasks import load_task
from lens_heads.plumbing.errors import InputError
from lens_heads.sweep.plan import FIELDS, SweepPlan, sweep_plan


def test_the_plan_lists_its_units_in_order_and_round_trips():
    plan = SweepPlan(scores=["AWFT", "AHON (LN)"], fractions=[0.2, 0.1], seed=3, static_scores=["AWFT"],
                     specs=[LayerRemoval([1]), LayerRemoval([1])], random="per_row")
    assert lh.SweepPlan is SweepPlan and plan.fractions == (0.0, 0.1, 0.2) and hash(plan) == hash(SweepPlan(**{
        f: getattr(plan, f) for f in FIELDS}))
    assert plan.units() == [
        Unablated(),
        RandomAblation(0.1, 3, draw="per_row"), ThresholdAblation("AWFT", 0.1), ThresholdAblation("AHON (LN)", 0.1),
        StaticAblation(score="AWFT", fraction=0.1),
        RandomAblation(0.2, 3, draw="per_row"), ThresholdAblation("AWFT", 0.2), ThresholdAblation("AHON (LN)", 0.2),
        StaticAblation(score="AWFT", fraction=0.2),
        LayerRemoval([1])]
    assert SweepPlan.from_dict(plan.to_dict()) == plan
    assert SweepPlan(random_baseline=False, scores=[], fractions=[0.1]).units() == [Unablated()]


@pytest.mark.parametrize("fields, message", [
    (dict(scores="AWFT"), "scores takes a list"), (dict(fractions=0.1), "fractions takes a list"),
    (dict(scores=["nope"]), "unknown scores"), (dict(fractions=[1.0]), r"\[0, 1\)"),
    (dict(random="per_choice"), "random must be one of"), (dict(specs=LayerRemoval([1])), "specs takes a list"),
    (dict(specs=["layers"]), "must be ablation specs")])
def test_a_bad_plan_is_refused_when_made(fields, message):
    with pytest.raises(InputError, match=message):
        SweepPlan(**fields)


def test_keywords_build_the_plan_override_its_fields_and_leave_the_other_options():
    options = dict(seed=5, batch_size=4)
    plan = sweep_plan(SweepPlan(scores=["AWFT"], seed=1), options)
    assert plan == SweepPlan(scores=["AWFT"], seed=5) and options == dict(batch_size=4)
    assert sweep_plan(None, {}) == SweepPlan()
    with pytest.raises(InputError, match="plan takes a SweepPlan"):
        sweep_plan({"scores": ["AWFT"]}, {})


def test_run_sweep_takes_the_plan_or_its_keywords_alike_and_records_it(tmp_path):
    model, task = text_model(n_layers=2), load_task("arc_easy", split="validation", n=2, seed=3)
    plan = SweepPlan(scores=["AHON (LN)"], fractions=[0.5], seed=1, static_scores=["AWFT"])
    by_value = lh.run_sweep(model, task, plan=plan, batch_size=4, progress=False, out_dir=tmp_path)
    by_keywords = lh.run_sweep(model, task, scores=["AHON (LN)"], fractions=[0.5], seed=1, static_scores=["AWFT"],
                               batch_size=4, progress=False, out_dir=tmp_path)
    assert by_value.meta["plan"] == by_keywords.meta["plan"] == plan.to_dict()
    assert by_keywords.meta["units_run"] == 0  # the same units: found in the folder the first run filled
    assert [u.spec["kind"] for u in by_value.units] == ["baseline", "random", "threshold", "static"]
    assert by_value.to_dataframe().equals(by_keywords.to_dataframe())
    with pytest.raises(InputError, match="unknown setting"):
        lh.run_sweep(model, task, plan=plan, sede=1, progress=False)
