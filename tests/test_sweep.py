"""The sweep: curve summaries on hand-made curves, thresholds from the unablated CDF, static pruning, resuming."""

import json

import numpy as np
import pandas as pd
import pytest

import lens_heads.sweep.run as sweep_module
from conftest import count_layouts, text_model
from lens_heads.data.tasks import load_task
from lens_heads.evaluation.evaluate import evaluate
from lens_heads.evaluation.results import paired_difference
from lens_heads.stats.curves import ends_above, normalised_auc, zeroable_within
from lens_heads.sweep.run import run_sweep
from lens_heads.sweep.table2 import table2


def test_zeroable_within_censored_rule_interpolates_the_last_downward_crossing():
    x, base = [0, 10, 20, 30], 50.0

    def censored(*args, **kwargs):
        return zeroable_within(*args, **kwargs, rule="censored")

    # one clean drop: crosses 49 between x=10 (49.5) and x=20 (48)
    assert censored(x, [50, 49.5, 48, 47], base) == pytest.approx(10 + 0.5 / 1.5 * 10)
    # dips, recovers, drops again: the last crossing counts (between 20 (49.6) and 30 (47))
    assert censored(x, [50, 48.5, 49.6, 47], base) == pytest.approx(20 + 0.6 / 2.6 * 10)
    # never drops a point: the whole measured range (a lower bound, flagged by ends_above)
    assert censored(x, [50, 49.9, 49.2, 49.0], base) == 30 and ends_above(x, [50, 49.9, 49.2, 49.0], base)
    # ends above the line after a dip: the whole range too
    assert censored(x, [50, 48, 49.5, 49.5], base) == 30
    assert not ends_above(x, [50, 49.5, 48, 47], base)
    # a wider tolerance and unsorted input
    assert censored([20, 0, 10, 30], [45, 50, 47, 40], base, points=4) == pytest.approx(10 + 1 / 2 * 10)
    # realised x need not be evenly spaced
    assert censored([0, 4, 13], [60, 60, 58], 60.0) == pytest.approx(4 + 1 / 2 * 9)


def test_zeroable_within_authors_rule_takes_the_last_crossing_in_either_direction_or_zero():
    x, base = [0, 10, 20, 30], 50.0
    assert zeroable_within(x, [50, 49.5, 48, 47], base) == pytest.approx(10 + 0.5 / 1.5 * 10)
    assert zeroable_within(x, [50, 48.5, 49.6, 47], base) == pytest.approx(20 + 0.6 / 2.6 * 10)
    # never meets the line: 0, not the end of the range
    assert zeroable_within(x, [50, 49.9, 49.5, 49.2], base) == 0.0
    # dips and comes back: the upward crossing is the last one (10 + 1 / 1.5 * 10)
    assert zeroable_within(x, [50, 48, 49.5, 49.5], base) == pytest.approx(10 + 1 / 1.5 * 10)
    # a point exactly on the line counts as a crossing
    assert zeroable_within([0, 10, 20], [50, 49, 48], base) == 10
    # the points are walked in order of realised share, as the authors' notebook sorts them, whatever order they
    # come in: (0, 50), (9, 48), (12, 49.5) cross at 4.5 going down and at 9 + 1 / 1.5 * 3 going up
    assert zeroable_within([0, 12, 9], [50, 49.5, 48], base) == pytest.approx(9 + 1 / 1.5 * 3)
    with pytest.raises(ValueError, match="unknown rule"):
        zeroable_within(x, [50, 49, 48, 47], base, rule="last")


def test_normalised_auc_is_the_trapezoid_mean():
    assert normalised_auc([0, 10, 30], [50, 40, 40]) == pytest.approx((10 * 45 + 20 * 40) / 30)
    assert normalised_auc([0, 5], [30, 30]) == pytest.approx(30)
    assert np.isnan(normalised_auc([0], [50]))


@pytest.fixture(scope="module")
def tiny_text_model():
    return text_model(n_layers=3)


SETTINGS = dict(scores=["AHON (LN)", "AWFT"], fractions=(0, 0.25, 0.5), static_scores=["AHON (LN)"], seed=3,
                batch_size=4, progress=False, stack=1)  # one unit at a time: tests/test_stacked.py stacks them


def test_interrupted_sweep_resumes_to_the_same_table(tiny_text_model, tmp_path, monkeypatch):
    model, task = tiny_text_model, load_task("arc_easy", split="validation", n=5, seed=1)
    full = run_sweep(model, task, out_dir=tmp_path / "full", **SETTINGS)
    n_units = 1 + 2 * (1 + 2 + 1)  # baseline + per fraction: random, two scores, one static
    assert len(full.units) == n_units and full.meta["units_run"] == n_units

    calls = []

    def interrupt_after_four(*args, **kwargs):
        if len(calls) == 4:
            raise KeyboardInterrupt
        calls.append(1)
        return evaluate(*args, **kwargs)

    monkeypatch.setattr(sweep_module, "evaluate", interrupt_after_four)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(model, task, out_dir=tmp_path / "resumed", **SETTINGS)
    assert len(list((tmp_path / "resumed").glob("*__*.json"))) == 4

    calls.clear()
    monkeypatch.setattr(sweep_module, "evaluate", lambda *a, **k: (calls.append(1), evaluate(*a, **k))[1])
    resumed = run_sweep(model, task, out_dir=tmp_path / "resumed", **SETTINGS)
    assert len(calls) == n_units - 4 and resumed.meta["units_reused"] == 4
    pd.testing.assert_frame_equal(resumed.to_dataframe(), full.to_dataframe())
    assert resumed.zeroable_within() == full.zeroable_within()

    calls.clear()
    again = run_sweep(model, task, out_dir=tmp_path / "resumed", **SETTINGS)  # all done: nothing runs
    assert not calls and again.meta["units_run"] == 0
    pd.testing.assert_frame_equal(again.to_dataframe(), full.to_dataframe())

    with pytest.raises(ValueError, match="another configuration"):
        run_sweep(model, task, out_dir=tmp_path / "full", **{**SETTINGS, "seed": 4})


def test_sweep_units_mean_what_they_say(tiny_text_model, tmp_path):
    from lens_heads.heads.scoring import score_heads

    model, task = tiny_text_model, load_task("piqa", n=4, seed=2)
    calibration = score_heads(model, task, progress=False)
    result = run_sweep(model, task, out_dir=tmp_path, calibration=calibration, **SETTINGS)
    plain = evaluate(model, task, progress=False)
    assert result.baseline.accuracy == plain.accuracy
    assert [it.logprobs for it in result.baseline.items] == [it.logprobs for it in plain.items]

    L, H = model.cfg.n_layers, model.cfg.n_heads
    ahon_ln = calibration.score("AHON (LN)").double().numpy()  # [input, layer, head]
    for unit in result.units:
        if unit.mode == "threshold" and unit.score == "AHON (LN)":  # '<' score: the p quantile of pooled values
            assert unit.threshold == pytest.approx(np.quantile(ahon_ln.reshape(-1), unit.target_fraction))
        if unit.mode == "threshold" and unit.score == "AWFT":  # '>' score: the (1 - p) quantile
            awft = calibration.score("AWFT").double().numpy().reshape(-1)
            assert unit.threshold == pytest.approx(np.quantile(awft, 1 - unit.target_fraction))
        if unit.mode == "static":  # the k lowest mean scores, zeroed for every input
            k = round(unit.target_fraction * L * H)
            assert unit.realised_fraction == pytest.approx(k / (L * H))
            lowest = set(np.argsort(ahon_ln.mean(0).reshape(-1))[:k].tolist())
            share = np.array(unit.head_share).reshape(-1)
            assert set(np.nonzero(share == 1.0)[0].tolist()) == lowest and set(np.unique(share)) <= {0.0, 1.0}
        if unit.mode in ("threshold", "random"):
            assert 0.0 <= unit.realised_fraction <= 1.0
            assert unit.realised_fraction == pytest.approx(np.mean(unit.head_share))
        if unit.mode != "baseline":  # per item: its rows (one per choice) and triples zeroed, summing to the share
            rows, zeroed = np.array(unit.item_zeroed).T
            assert rows.tolist() == [len(it.logprobs) for it in unit.result.items]
            assert zeroed.sum() / (rows.sum() * L * H) == pytest.approx(unit.realised_fraction)
    table = result.to_dataframe()
    assert set(table["curve"]) == {"AHON (LN)", "AWFT", "random", "AHON (LN) (static)"}
    assert set(zip(table["mode"], table["score"])) == {("threshold", "AHON (LN)"), ("threshold", "AWFT"),
                                                       ("random", "random"), ("static", "AHON (LN)")}
    assert (table[table["target_fraction"] == 0]["paired_diff"] == 0).all()
    assert (table[table["target_fraction"] == 0]["kl"].abs() < 1e-12).all()
    stored = json.loads((tmp_path / "calibration.json").read_text())["value"]
    assert len(stored["thresholds"]) == 4 and len(stored["static_heads"]) == 2
    # before the cascade: the share of unablated values strictly on the inactive side, counted here; layer 0 is
    # scored on the unablated stream, so its realised share is that count over layer 0's values exactly
    check = result.target_check()
    for unit in result.units:
        if unit.mode != "threshold":
            continue
        values = calibration.score(unit.score).double().numpy()
        side = values < unit.threshold if unit.score == "AHON (LN)" else values > unit.threshold
        row = check[(check["score"] == unit.score) & (check["target_pct"] == 100 * unit.target_fraction)].iloc[0]
        assert row["unablated_pct"] == pytest.approx(100 * side.mean())
        assert np.mean(unit.head_share[0]) == pytest.approx(side[:, 0].mean())
        assert row["miss_points"] == pytest.approx(100 * (unit.realised_fraction - unit.target_fraction))
    assert len(check) == 4
    assert set(result.zeroable_within()) == {"AHON (LN)", "AWFT", "random"}
    # the KL ranking integrates the KL of each curve's units, recomputed here from the per-item answer scores
    for score, units in result.curves().items():
        kls = []
        for u in units:
            per_item = []
            for a, b in zip(u.result.items, result.baseline.items):
                p, q = (np.exp(x - np.max(x)) / np.exp(x - np.max(x)).sum() for x in (np.array(b.logprobs),
                                                                                      np.array(a.logprobs)))
                per_item.append(float(np.sum(p * np.log(p / q))))
            kls.append(np.mean(per_item))
        assert result.normalised_auc(metric="kl")[score] == pytest.approx(
            normalised_auc([100 * u.realised_fraction for u in units], kls), abs=1e-9, nan_ok=True)
    assert not np.isnan(result.normalised_auc(metric="kl")["random"])  # a curve with width: a real check
    random_units = result.curves()["random"]
    x = [100 * u.realised_fraction for u in random_units]
    mid = (x[0] + x[1]) / 2  # halfway between the first two points: the mean of their KLs
    first_kls = [paired_difference(u.result, result.baseline).kl.mean for u in random_units[:2]]
    assert result.at_share(mid / 100)["random"] == pytest.approx(np.mean(first_kls))
    assert np.isnan(result.at_share(min(1.0, (max(x) + 1) / 100))["random"])  # beyond the curve: not extrapolated
    summary = result.summary()
    assert sorted(summary["kl_rank"]) == list(range(1, len(summary) + 1))
    assert summary.sort_values("kl_rank")["normalised_auc_kl"].dropna().is_monotonic_increasing  # NaN ranks last


def test_bad_sweep_arguments_are_explained(tiny_text_model):
    task = load_task("arc_easy", split="validation", n=2)
    with pytest.raises(ValueError, match="unknown scores"):
        run_sweep(tiny_text_model, task, scores=["AHONN"], progress=False)
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        run_sweep(tiny_text_model, task, scores=["AHON"], fractions=(0, 1.0), progress=False)
    with pytest.raises(ValueError, match=r"scores takes a list, got 'AHON \(LN\)'"):
        run_sweep(tiny_text_model, task, scores="AHON (LN)", progress=False)
    with pytest.raises(ValueError, match=r"fractions takes a list, got 0.1: write fractions=\[0.1\]"):
        run_sweep(tiny_text_model, task, fractions=0.1, progress=False)


@pytest.mark.floats
def test_thresholds_come_from_the_evaluated_rows(tiny_text_model, tmp_path):
    """The default calibration scores exactly the rows the evaluation runs (one per choice here), written out with
    the tokenizer as lm-eval encodes them; 'prompts' scores each item's context alone."""
    model, task = tiny_text_model, load_task("piqa", n=4, seed=6)
    tok = model.tokenizer
    rows, prompts = [], []
    for item in task:
        for context, continuation in zip(item.contexts, item.continuations):
            stripped = context.rstrip()
            whole = tok.encode(stripped + context[len(stripped):] + continuation, add_special_tokens=False)
            rows.append(whole[:-1])
        prompts.append(tok.encode(item.contexts[0].rstrip(), add_special_tokens=False))
    settings = dict(scores=["AHON (LN)", "AWFT"], fractions=(0, 0.2), random_baseline=False, progress=False)
    for calibration, inputs in (("rows", rows), ("prompts", prompts)):
        from lens_heads.heads.scoring import score_heads

        expected = score_heads(model, inputs, progress=False)
        result = run_sweep(model, task, calibration=calibration, out_dir=tmp_path / calibration, **settings)
        for unit in result.units[1:]:
            values = expected.score(unit.score).double().numpy().reshape(-1)
            q = unit.target_fraction if unit.score == "AHON (LN)" else 1 - unit.target_fraction
            # the sweep's own scoring pass batches the rows otherwise: scores rounded by ~1e-6 of their size
            assert unit.threshold == pytest.approx(np.quantile(values, q), rel=1e-5)
        assert result.meta["fingerprint"]["protocol"] == "lm-eval"
    with pytest.raises(ValueError, match="unknown calibration"):
        run_sweep(model, task, calibration="questions", **settings)


def _sweep(model_name, task_name, curves):
    """A SweepResult from hand-chosen accuracies: ``curves[score] = [(target, realised, accuracy %), ...]``,
    baseline 50% on 1,000 items."""
    from lens_heads.evaluation.results import EvalResult, ItemRecord
    from lens_heads.sweep.result import SweepResult, UnitResult
    from synthetic_sweeps import spec_of

    def result(accuracy):
        k = round(10 * accuracy)
        items = [ItemRecord(id=str(i), gold=0, logprobs=[0.0, -1.0] if i < k else [-1.0, 0.0], n_tokens=[1, 1],
                            n_chars=[1, 1]) for i in range(1000)]
        return EvalResult(task=task_name, format="cloze", items=items, chance=0.5)

    units = [UnitResult(spec_of("baseline", None, 0.0), 0.0, result(50))]
    for score, points in curves.items():
        for target, realised, acc in points:
            units.append(UnitResult(spec_of("random" if score == "random" else "threshold", score, target, 0.0),
                                    realised / 100, result(acc)))
    meta = dict(scores=[s for s in curves if s != "random"],
                fingerprint=dict(model=dict(name=model_name), task=dict(task=task_name)))
    return SweepResult(baseline=units[0].result, units=units, meta=meta)


def test_target_check_names_ties_or_the_cascade_by_the_larger_gap():
    sweep = _sweep("m", "t", {"A": [(0.1, 10.5, 50), (0.3, 37.0, 40)], "B": [(0.3, 24.0, 50)]})
    sweep.meta["unablated_shares"] = {"A|0.100000": 0.1, "A|0.300000": 0.301, "B|0.300000": 0.25}
    check = sweep.target_check(tolerance=2.0).set_index(["score", "target_pct"])
    assert check.loc[("A", 10.0), "within"] and check.loc[("A", 10.0), "cause"] == ""
    assert check.loc[("A", 30.0), "cause"] == "cascade"  # 30.1% before the ablation, 37% with it
    assert check.loc[("A", 30.0), "cascade_points"] == pytest.approx(6.9)
    assert check.loc[("B", 30.0), "cause"] == "ties"  # 25% already before: -5 from ties, -1 from the cascade
    del sweep.meta["unablated_shares"]
    assert sweep.target_check().set_index(["score", "target_pct"]).loc[("B", 30.0), "cause"] == "unknown"


def test_table2_puts_awft_beside_the_best_other_curve_random_included():
    a = _sweep("m1", "piqa", {"AWFT": [(0.1, 10, 49), (0.2, 20, 45)],              # crosses 49 at 10
                              "AHON (LN)": [(0.1, 10, 50), (0.2, 20, 48)],         # crosses at 15
                              "random": [(0.1, 10, 46), (0.2, 20, 40)]})           # crosses at 1/4 * 10
    b = _sweep("m1", "arc_easy", {"AWFT": [(0.1, 10, 50), (0.2, 20, 49.5)],        # never meets the line: 0
                                  "AEQD": [(0.1, 10, 48), (0.2, 20, 49.5)],        # dips, comes back: 10 + 1/1.5*10
                                  "random": [(0.1, 10, 45), (0.2, 20, 40)]})
    table = table2([a, b], average=False)
    assert list(table["task"]) == ["piqa", "arc_easy"]
    assert table["awft_pct"].tolist() == pytest.approx([10, 0])
    assert table["best_score"].tolist() == ["AHON (LN)", "AEQD"]
    assert table["best_pct"].tolist() == pytest.approx([15, 10 + 1 / 1.5 * 10])
    assert b.zeroable_within(rule="censored")["AWFT"] == 20 and b.ends_above()["AWFT"]
    with pytest.raises(ValueError, match="same model and task"):
        table2([a, a])
    # the paper's Average row: each column's mean over the sweeps, the best curve differing from row to row
    average = table2([a, b]).iloc[-1]
    assert average["model"] == "Average" and average["best_score"] == ""
    assert average["awft_pct"] == pytest.approx((10 + 0) / 2)
    assert average["best_pct"] == pytest.approx((15 + 10 + 1 / 1.5 * 10) / 2)
    assert average["difference"] == pytest.approx((10 - 15 + 0 - (10 + 1 / 1.5 * 10)) / 2)
    # its interval: the percentile interval of the mean of the two sweeps' bootstrap replicates, replicate by replicate
    with_iv = table2([a, b], n_resamples=200, seed=1).iloc[-1]
    reps = [s.intervals(n_resamples=200, seed=1) for s in (a, b)]
    awft = np.mean([iv.replicates[iv.quantities.index("zeroable_authors"), iv.curves.index("AWFT")] for iv in reps], 0)
    assert (with_iv["awft_low"], with_iv["awft_high"]) == pytest.approx(tuple(np.percentile(awft, [2.5, 97.5])))
    assert with_iv["awft_low"] < with_iv["awft_high"]


@pytest.mark.parametrize("share", [10, 20.0, -0.1, True])
def test_a_share_given_in_percent_is_refused(share):
    """Every share lens_heads takes is a fraction in [0, 1]; at_share read percent once, so 10 must not pass."""
    from lens_heads.stats.curves import check_share

    with pytest.raises(ValueError, match=r"a share of heads is a fraction in \[0, 1\] \(0.1 for 10%\)"):
        check_share(share, "at_share(share=...)")


def test_a_sweep_records_its_chat_template_and_split(tmp_path):
    """"auto" resolves by the model's name before the run is fingerprinted: the stored units are those of the
    rendering that ran (an instruct name: the chat template; another: plain text, the same units as False)."""
    model = text_model(n_layers=1, n_ctx=256)
    task = load_task("arc_easy", split="validation", n=2, seed=0)
    settings = dict(scores=["AHON (LN)"], fractions=(0, 0.2), random_baseline=False, batch_size=4, progress=False)
    model.lens_heads_meta["hf_name"] = "acme/base-1B"
    plain = run_sweep(model, task, out_dir=tmp_path / "plain", apply_chat_template="auto", **settings)
    assert (plain.meta["apply_chat_template"], plain.meta["chat_template"]) == ("auto", False)
    assert plain.meta["fingerprint"]["apply_chat_template"] is False and plain.meta["split"] == "validation"
    again = run_sweep(model, task, out_dir=tmp_path / "plain", apply_chat_template=False, **settings)
    assert again.meta["units_reused"] == len(again.units)  # the same run: "auto" was plain text here
    model.lens_heads_meta["hf_name"] = "acme/chat-1B-Instruct"
    chat = run_sweep(model, task, out_dir=tmp_path / "chat", apply_chat_template="auto", **settings)
    assert chat.meta["chat_template"] is True and chat.meta["fingerprint"]["apply_chat_template"] is True
    assert chat.baseline.meta["chat_template"] is True and chat.baseline.meta["task"]["split"] == "validation"
    assert [u.result.items[0].logprobs for u in chat.units] != [u.result.items[0].logprobs for u in plain.units]


def test_the_extras_sweep_with_thresholds_from_their_own_pooled_values(tiny_text_model):
    from lens_heads.heads.scoring import score_heads

    model, task = tiny_text_model, load_task("piqa", n=3, seed=4)
    result = run_sweep(model, task, scores=["LTHON (HN)", "AHON (full)"], fractions=(0, 0.3), random_baseline=False,
                       batch_size=4, progress=False)
    scored = score_heads(model, task, extras=["LTHON (HN)", "AHON (full)"], progress=False)
    for unit in result.units[1:]:
        pooled = scored.score(unit.score).double().numpy().reshape(-1)
        assert unit.threshold == pytest.approx(np.quantile(pooled, 0.3))
        assert 0 < unit.realised_fraction < 1


def test_a_sweep_lays_the_weights_out_once_for_all_its_units(tiny_text_model, tmp_path, monkeypatch):
    """The gated MLPs' and the attention's packed layouts are made once per sweep (each unit's evaluation reuses
    them), not once per unit; the resume test above compares units whose layout another unit made with a clean
    run's."""
    from lens_heads.heads.scoring import score_heads

    model, task = tiny_text_model, load_task("arc_easy", split="validation", n=3, seed=1)
    calibration = score_heads(model, task, progress=False)  # scoring lays them out in a pass of its own
    made = count_layouts(monkeypatch)
    result = run_sweep(model, task, out_dir=tmp_path, calibration=calibration, **SETTINGS)
    assert len(result.units) == 9
    assert made == {"gated": model.cfg.n_layers, "qkv": model.cfg.n_layers, "output": model.cfg.n_layers}

