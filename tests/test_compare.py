"""Comparing sweeps across models and tasks: ranks, Spearman correlations and top-k overlaps against values worked
out by hand on small synthetic sweeps (real EvalResult / UnitResult objects with hand-chosen accuracies), reading
sweeps back from a run folder and from the analysis JSON, and the report's comparison section."""

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import lens_heads as lh
from conftest import text_model
from lens_heads.evaluation.results import EvalResult, ItemRecord
from lens_heads.stats.inference import average_ranks, spearman
from lens_heads.sweep.compare import RecordedSweep, compare_by_metric, compare_sweeps, read_sweep_record
from lens_heads.sweep.result import SweepResult, UnitResult
from lens_heads.sweep.run import run_sweep
from lens_heads.sweep.unit_store import read_sweep_folder
from synthetic_sweeps import spec_of

N = 10  # items per synthetic evaluation


def evaluation(accuracy_pct: float, task: str) -> EvalResult:
    """N two-choice items, the first round(accuracy x N) answered right (choice 0 more likely and gold)."""
    k = round(accuracy_pct / 100 * N)
    items = [ItemRecord(id=f"q{i}", gold=0 if i < k else 1, logprobs=[-1.0, -2.0], n_tokens=[1, 1], n_chars=[3, 3])
             for i in range(N)]
    return EvalResult(task=task, format="cloze", items=items, chance=0.5)


def synthetic_sweep(model: str, task: str, curves: dict[str, tuple[float, float]], baseline: float = 80.0):
    """A sweep whose curve ``name`` has accuracy ``curves[name]`` (%) at 10% and 20% of heads zeroed."""
    units = [UnitResult(spec_of("baseline", None, 0.0), 0.0, evaluation(baseline, task))]
    for i, p in enumerate((0.1, 0.2)):
        for name, accuracies in curves.items():
            mode, score = ("random", None) if name == "random" else ("threshold", name)
            units.append(UnitResult(spec_of(mode, score, p, None if mode == "random" else 0.5), p,
                                    evaluation(accuracies[i], task)))
    fingerprint = {"model": {"name": model, "weight_basis": "raw"}, "task": {"task": task, "n": N, "seed": 0}}
    return SweepResult(baseline=units[0].result, units=units,
                       meta={"fingerprint": fingerprint, "scores": [c for c in curves if c != "random"]})


# Normalised AUC over [0, 20] of (80, y10, y20) is (80 + 2 y10 + y20) / 4.
A = {"S1": (80, 70), "S2": (70, 60), "S3": (80, 80), "random": (60, 40)}  # AUC 77.5, 70, 80, 60
B = {"S1": (80, 80), "S2": (70, 60), "S3": (70, 60), "random": (60, 60)}  # AUC 80, 70, 70, 65 (S2, S3 tied)


@pytest.fixture
def two():
    return [synthetic_sweep("m1", "t1", A), synthetic_sweep("m1", "t2", B)]


def test_average_ranks_and_spearman_by_hand():
    assert average_ranks([10, 20, 20, 5]).tolist() == [2, 3.5, 3.5, 1]
    assert spearman([1, 2, 3, 4], [10, 20, 30, 45]) == pytest.approx(1.0)
    assert spearman([1, 2, 3], [9, 4, 1]) == pytest.approx(-1.0)
    # ranks [1, 2, 3] vs [1, 3, 2]: centred [-1, 0, 1] . [-1, 1, 0] = 1, norms 2 and 2
    assert spearman([1, 2, 3], [1, 3, 2]) == pytest.approx(0.5)
    assert math.isnan(spearman([1, 2, 3], [5, 5, 5]))


def test_ranks_spearman_and_overlap_by_hand(two):
    c = compare_sweeps(two, top_k=1)
    assert c.labels == ("m1 / t1", "m1 / t2") and c.curves == ("S1", "S2", "S3", "random")
    assert c.auc[0] == pytest.approx((77.5, 70, 80, 60)) and c.auc[1] == pytest.approx((80, 70, 70, 65))
    assert c.rank == ((2, 3, 1, 4), (1, 2.5, 2.5, 4))
    # centred ranks [-.5, .5, -1.5, 1.5] and [-1.5, 0, 0, 1.5]: covariance 3, squared norms 5 and 4.5
    expected = 3 / math.sqrt(5 * 4.5)
    pairs = c.pairs()
    assert pairs["spearman"].item() == pytest.approx(expected)
    assert c.spearman_table().loc["m1 / t1", "m1 / t2"] == pytest.approx(expected)
    assert np.allclose(np.diag(c.spearman_table()), 1.0)
    assert pairs["top_k_overlap"].item() == 0  # best: S3 vs S1
    assert compare_sweeps(two, top_k=3).pairs()["top_k_overlap"].item() == 3
    # ties in B broken by curve order: top 2 of B are S1, S2; of A S3, S1
    two_best = compare_sweeps(two, top_k=2).pairs().iloc[0]
    assert (two_best["top_k_overlap"], two_best["shared_top_k"]) == (1, "S1")
    # intersection over union: {S3, S1} and {S1, S2} share 1 of 3; the top 3 share all; the top 1 (S3, S1) none
    assert two_best["top_k_iou"] == pytest.approx(1 / 3)
    assert compare_sweeps(two, top_k=3).pairs()["top_k_iou"].item() == 1.0
    assert pairs["top_k_iou"].item() == 0.0
    long = c.to_dataframe()
    assert len(long) == 8 and long.set_index(["task", "curve"]).loc[("t2", "random"), "rank"] == 4
    assert list(c.rank_table().index) == ["S1", "S3", "S2", "random"]  # mean ranks 1.5, 1.75, 2.75, 4



def test_compare_by_metric_ranks_by_accuracy_and_by_kl(two):
    """The comparison the report and analyses/compare_sweeps.py share: one per ranking metric."""
    by = compare_by_metric(two, top_k=2, n_resamples=50)  # the ranks do not depend on the intervals
    assert list(by) == ["accuracy", "kl"] and [c.metric for c in by.values()] == ["accuracy", "kl"]
    assert by["accuracy"].rank == ((2, 3, 1, 4), (1, 2.5, 2.5, 4)) and by["accuracy"].top_k == 2  # as worked above
    # every synthetic item gives its choices the same log-likelihoods under every curve: no KL, all four tied
    assert by["kl"].auc == ((0, 0, 0, 0), (0, 0, 0, 0)) and by["kl"].rank == ((2.5,) * 4, (2.5,) * 4)

def test_kl_ranking_puts_the_smallest_first():
    # a recorded table: KL AUC over [0, 20] of (0, k10, k20) is (2 k10 + k20) / 4
    def recorded(model, task, kls):
        rows = [dict(score=s, mode="baseline", target_fraction=0.0, realised_fraction=0.0, accuracy=0.8, kl=0.0)
                for s in kls]
        rows += [dict(score=s, mode="threshold", target_fraction=p, realised_fraction=p, accuracy=0.8, kl=k[i])
                 for s, k in kls.items() for i, p in enumerate((0.1, 0.2))]
        return RecordedSweep(table=pd.DataFrame(rows), baseline_accuracy=0.8, chance=0.5,
                             meta={"fingerprint": {"model": {"name": model}, "task": {"task": task}}})

    a = recorded("m1", "t1", {"S1": (0.1, 0.2), "S2": (0.4, 0.4), "S3": (0.0, 0.1)})  # 0.1, 0.3, 0.025
    b = recorded("m2", "t1", {"S1": (0.0, 0.0), "S2": (0.4, 0.8), "S3": (0.1, 0.1)})  # 0, 0.4, 0.075
    c = compare_sweeps([a, b], metric="kl")
    assert c.auc[0] == pytest.approx((0.1, 0.3, 0.025)) and c.rank == ((2, 3, 1), (1, 3, 2))
    assert c.pairs()["spearman"].item() == pytest.approx(0.5)


def test_curves_not_in_every_sweep_are_left_out(two):
    c = compare_sweeps(two + [synthetic_sweep("m2", "t1", {"S1": (80, 80), "S3": (70, 70), "S9": (80, 80)})])
    assert c.curves == ("S1", "S3") and c.dropped == {"m1 / t1": ["S2", "random"], "m1 / t2": ["S2", "random"],
                                                      "m2 / t1": ["S9"]}
    assert c.rank[0] == (2, 1) and c.rank[2] == (1, 2) and len(c.pairs()) == 3
    assert c.top_k == 2  # five asked, two curves in common


def test_bad_input_is_explained(two):
    with pytest.raises(ValueError, match="at least two sweeps"):
        compare_sweeps(two[:1])
    with pytest.raises(ValueError, match="at least two sweeps"):
        compare_sweeps(two[0])
    with pytest.raises(ValueError, match=r"same \(model, task, setting\): m1 / t1"):
        compare_sweeps([two[0], synthetic_sweep("m1", "t1", B)])
    with pytest.raises(ValueError, match="0 curve.*in common.*m2 / t9: X1, X2"):
        compare_sweeps([two[0], synthetic_sweep("m2", "t9", {"X1": (80, 80), "X2": (80, 70)})])
    with pytest.raises(ValueError, match="unknown metric 'auc'"):
        compare_sweeps(two, metric="auc")
    with pytest.raises(ValueError, match="top_k"):
        compare_sweeps(two, top_k=0)
    bare = SweepResult(baseline=two[0].baseline, units=two[0].units, meta={})
    with pytest.raises(ValueError, match="without a fingerprint"):
        compare_sweeps([bare, two[1]])


# ---------------------------------------------------------------- reading sweeps back


@pytest.fixture(scope="module")
def tiny_sweep(tmp_path_factory):
    from lens_heads.data.tasks import load_task

    model = text_model(n_layers=2)
    task = load_task("arc_easy", split="validation", n=4, seed=1)
    out = tmp_path_factory.mktemp("sweep") / "arc_easy"
    result = run_sweep(model, task, scores=["AHON (LN)", "AWFT"], fractions=(0, 0.2, 0.4), out_dir=out,
                       static_scores=["AHON (LN)"], seed=1, batch_size=4, progress=False)
    return model, task, result, out


def test_a_run_folder_reads_back_as_the_sweep_that_wrote_it(tiny_sweep, tmp_path):
    _, _, result, out = tiny_sweep
    loaded = read_sweep_record(out)
    assert isinstance(loaded, SweepResult) and loaded.meta["fingerprint"] == result.meta["fingerprint"]
    # the folder does not keep the order the scores were asked in: compare the rows in one order
    def rows(df):
        return df.sort_values(["score", "target_fraction"], kind="stable").reset_index(drop=True)

    pd.testing.assert_frame_equal(rows(loaded.to_dataframe()), rows(result.to_dataframe()))
    assert loaded.normalised_auc(metric="kl") == result.normalised_auc(metric="kl")
    assert loaded.zeroable_within(mode="static") == result.zeroable_within(mode="static")
    with pytest.raises(FileNotFoundError, match="no readable sweep.json"):
        read_sweep_folder(tmp_path)
    # the names before read_sweep_folder and read_sweep_record still read the same things
    assert lh.load_sweep is read_sweep_folder and lh.read_sweep is read_sweep_record
    pd.testing.assert_frame_equal(rows(lh.load_sweep(out).to_dataframe()), rows(result.to_dataframe()))


def test_a_run_folder_with_per_input_units_reads_back(tiny_sweep, tmp_path):
    """Each input its own heads (InputAblation, curve mode per_input) reads back beside the threshold curves; its
    realised share is worked out by hand: every input zeroes 2 of the 2 x 4 heads."""
    from lens_heads.ablation.specs import InputAblation

    model, task, _, _ = tiny_sweep
    heads = [((0, i % 4), (1, (i + 1) % 4)) for i in range(len(task))]
    spec = InputAblation(heads=heads, score="hand", fraction=0.25)
    out = tmp_path / "per_input"
    result = run_sweep(model, task, scores=["AWFT"], fractions=(0, 0.25), out_dir=out, specs=[spec], seed=1,
                       batch_size=4, progress=False)
    loaded = read_sweep_folder(out)
    assert sorted(u.mode for u in loaded.units) == ["baseline", "per_input", "random", "threshold"]
    (unit,) = loaded.curves("per_input")["hand"][1:]
    assert unit.realised_fraction == pytest.approx(2 / 8, abs=1e-12)  # the shares are ratios of small counts
    assert unit.result.to_dict() == next(u for u in result.units if u.mode == "per_input").result.to_dict()

    def rows(df):
        return df.sort_values(["mode", "score", "target_fraction"], kind="stable").reset_index(drop=True)

    pd.testing.assert_frame_equal(rows(loaded.to_dataframe()), rows(result.to_dataframe()))


def test_unreadable_unit_files_are_refused_by_name_and_recomputed_once_deleted(tiny_sweep, tmp_path):
    import shutil

    model, task, result, out = tiny_sweep
    folder = tmp_path / "copy"
    shutil.copytree(out, folder)
    units = sorted(folder.glob("*__*__*.json"))
    torn, foreign = units[1], units[2]
    torn.write_text(torn.read_text()[:100])  # a write cut short
    foreign.write_text("[1, 2]")  # JSON, but no unit
    with pytest.raises(ValueError) as e:
        read_sweep_folder(folder)
    message = str(e.value)
    assert "2 unit file(s) can't be read" in message and torn.name in message and foreign.name in message
    assert "Delete them and rerun run_sweep" in message and str(folder) in message
    torn.unlink()
    foreign.unlink()
    again = run_sweep(model, task, scores=["AHON (LN)", "AWFT"], fractions=(0, 0.2, 0.4), out_dir=folder,
                      static_scores=["AHON (LN)"], seed=1, batch_size=4, progress=False)
    assert again.meta["units_run"] == 2  # only the two deleted units were evaluated again
    assert len(read_sweep_folder(folder).units) == len(result.units)


def test_the_analysis_json_reads_back_with_the_same_aucs(tiny_sweep, tmp_path):
    from conftest import load_script
    from lens_heads.evaluation.evaluate import evaluate

    model, task, result, _ = tiny_sweep
    analysis = load_script("sweep")
    args = analysis.parse_args(["--model", "tiny/llama", "--figures", str(tmp_path), "--seed", "1", "--fractions",
                                "0,.2,.4", "--scores", "AHON (LN),AWFT", "--static-scores", "AHON (LN)", "--no-png",
                                "--n-resamples", "50"])
    analysis.write_outputs(result, task, args, pd.DataFrame(), model)
    stem = tmp_path / "sweep_llama_arc_easy"  # another model than the default: named by it
    with_units = read_sweep_record(f"{stem}.json")  # the units file beside it: every unit with its items
    assert isinstance(with_units, SweepResult) and len(with_units.units) == len(result.units)
    summary = pd.read_csv(f"{stem}_summary.csv").set_index("score")
    for score, value in result.normalised_auc(metric="kl").items():
        assert summary.loc[score, "normalised_auc_kl"] == pytest.approx(value, rel=1e-5)  # the CSV's 6 digits
        low, high = summary.loc[score, ["normalised_auc_kl_low", "normalised_auc_kl_high"]]
        assert low <= value <= high or np.isnan(low)  # 4 items: some replicates zero nothing (no AUC there)
    tests = pd.read_csv(f"{stem}_tests.csv")
    assert set(tests["reference"]) == {"random", "best"} and tests["p_value"].between(0, 1).all()
    record = json.loads(Path(f"{stem}.json").read_text())  # the headline numbers, under the report's keys
    assert record["baseline"]["n"] == len(task) and record["baseline"]["accuracy"] == result.baseline.accuracy
    for key, rule in (("zeroable_within_1_point_pct", "authors"), ("zeroable_within_1_point_censored_pct", "censored")):
        assert record[key] == pytest.approx(result.zeroable_within(1.0, rule=rule), nan_ok=True)
    Path(f"{stem}_units.json.gz").unlink()
    recorded = read_sweep_record(f"{stem}.json")
    assert isinstance(recorded, RecordedSweep)
    for metric in ("accuracy", "kl"):
        for sweep in (recorded, with_units):
            got, want = sweep.normalised_auc(metric=metric), result.normalised_auc(metric=metric)
            assert list(got) == list(want) and np.allclose(list(got.values()), list(want.values()), equal_nan=True)
    assert recorded.baseline_accuracy == evaluate(model, task, progress=False).accuracy

    (tmp_path / "other.json").write_text(json.dumps({"table": []}))
    with pytest.raises(ValueError, match="not a sweep record"):
        read_sweep_record(tmp_path / "other.json")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_sweep_record(tmp_path / "missing.json")


# ---------------------------------------------------------------- the report section


def test_report_section_from_two_sweeps_escapes_names(tmp_path):
    from lens_heads.report import sections
    from lens_heads.report.render import render_page
    from lens_heads.report.sweep_stages import compare_stage

    evil = "<script>alert(1)</script>"
    sweeps = [synthetic_sweep(evil, "t1", A), synthetic_sweep("m1", "t&2", B)]
    out = compare_stage(sweeps)
    section = sections.compare(out)
    page = render_page("report", "", [section])
    assert evil not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "t&amp;2" in page
    assert section.anchor == "compare" and {"compare_ranks", "compare_spearman"} <= set(out.figures)
    heat = out.figures["compare_ranks"].data[0]
    assert list(heat.y) == ["S1", "S3", "S2", "random"] and "&lt;script&gt;" in heat.x[0]
    assert np.array(heat.z).tolist() == [[2, 1], [1, 2.5], [3, 2.5], [4, 4]]
    pairs = out.tables["compare_pairs"]
    assert pairs.loc[pairs["ranking"] == "accuracy", "spearman"].item() == pytest.approx(3 / math.sqrt(22.5))
    assert out.numbers["curves"] == ["S1", "S2", "S3", "random"]
    t2 = out.tables["compare_table2"].set_index("task")  # no AWFT curve here: NaN beside the best other
    assert math.isnan(t2.loc["t1", "awft_pct"]) and t2.loc["t1", "best_score"] == "S1"
    assert t2.loc["t1", "best_pct"] == pytest.approx(11)  # 80 -> 80 -> 70 crosses 79 at 10 + 1/10 * 10
    assert "Table 2" in page


def test_report_cli_checks_compare_paths(tmp_path):
    from lens_heads.report.__main__ import config_from_args

    with pytest.raises(SystemExit) as e:
        config_from_args(["--compare", str(tmp_path / "nope.json")])
    assert e.value.code == 2
    (tmp_path / "s.json").write_text("{}")
    assert config_from_args(["--compare", str(tmp_path / "s.json")]).compare == (str(tmp_path / "s.json"),)


def test_table2_of_sweeps_and_of_their_records_by_hand():
    from lens_heads.sweep.table2 import table2

    # line = 80 - 1 = 79; authors' rule: last crossing in order of target fraction, 0 if none
    curves = {"AWFT": (80, 70), "S2": (70, 60), "S3": (80, 80), "random": (60, 40)}
    # AWFT: 80 at 10% then 70: crosses at 10 + 1/10 * 10 = 11; S2: 80 -> 70 between 0 and 10: 1; S3 never: 0;
    # random: 80 -> 60: 1/20 * 10 = 0.5
    full = [synthetic_sweep("m1", "t1", curves), synthetic_sweep("m2", "t1", {**curves, "S3": (80, 60)})]
    recorded = [RecordedSweep(table=s.to_dataframe(), meta=s.meta, baseline_accuracy=s.baseline.accuracy,
                              chance=0.5) for s in full]
    assert recorded[0].zeroable_within() == pytest.approx({"AWFT": 11, "S2": 1, "S3": 0, "random": 0.5})
    # S3 of m2: 80, 80, 60: crosses at 10 + 1/20 * 10 = 10.5
    for sweeps in (full, recorded):
        t = table2(sweeps).set_index("model")
        assert t.loc["m1", "awft_pct"] == pytest.approx(11) and t.loc["m1", "best_score"] == "S2"
        assert t.loc["m1", "best_pct"] == pytest.approx(1)
        assert t.loc["m2", "best_score"] == "S3" and t.loc["m2", "best_pct"] == pytest.approx(10.5)


def test_ranks_and_spearman_carry_bootstrap_intervals_and_records_without_items_say_so(two):
    from synthetic_sweeps import synthetic_sweep as noisy_sweep

    levels = {"A": (0.01, 0.02), "B": (0.5, 0.6), "C": (0.52, 0.6), "random": (2, 3)}
    sweeps = [noisy_sweep(np.random.default_rng(i), 50, levels, model="m", task=t) for i, t in enumerate("xy")]
    c = compare_sweeps(sweeps, metric="kl", n_resamples=200)
    ranks = c.to_dataframe().set_index(["task", "curve"])
    # A and random are far apart from the rest: their ranks never move; B and C are within noise of each other
    for task in "xy":
        assert (ranks.loc[(task, "A"), "rank_low"], ranks.loc[(task, "A"), "rank_high"]) == (1, 1)
        assert (ranks.loc[(task, "random"), "rank_low"], ranks.loc[(task, "random"), "rank_high"]) == (4, 4)
        assert ranks.loc[(task, "B"), "rank_low"] == 2 and ranks.loc[(task, "B"), "rank_high"] == 3
    pair = c.pairs().iloc[0]
    assert pair["spearman_low"] <= pair["spearman"] <= pair["spearman_high"] and pair["spearman_low"] >= 0.5
    assert c.intervals["no_intervals"] == [] and c.intervals["n_resamples"] == 200
    recorded = compare_sweeps([RecordedSweep(s.to_dataframe(), s.meta, s.baseline.accuracy, 0.5) for s in two])
    # tables without per-item records: estimates only
    assert recorded.intervals["no_intervals"] == list(recorded.labels)
    assert recorded.to_dataframe()["rank_low"].isna().all() and recorded.pairs()["spearman_low"].isna().all()


def test_sweeps_on_different_grids_are_compared_on_the_shares_they_share():
    from synthetic_sweeps import synthetic_sweep as noisy_sweep

    levels = {"A": (0.1, 0.3), "B": (0.5, 0.9), "random": (2, 3)}
    full = noisy_sweep(np.random.default_rng(0), 30, levels, task="x")
    other = noisy_sweep(np.random.default_rng(1), 30, levels, task="y")
    coarse = SweepResult(other.baseline, [u for u in other.units if u.target_fraction != 0.3], other.meta)
    c = compare_sweeps([full, coarse], metric="kl", n_resamples=50)
    assert c.intervals["grid"] == [0.0, 10.0, 20.0]
    cut = SweepResult(full.baseline, [u for u in full.units if u.target_fraction <= 0.2], full.meta)
    assert list(c.auc[0]) == pytest.approx([cut.normalised_auc(metric="kl")[k] for k in c.curves])
    with pytest.raises(ValueError, match="share no target share"):
        compare_sweeps([SweepResult(full.baseline, [u for u in full.units if u.target_fraction in (0, 0.3)],
                                    full.meta), coarse])


# ---------------------------------------------------------------- one model and task under two settings


def _with_setting(sweep, chat):
    fp = dict(sweep.meta["fingerprint"], apply_chat_template=chat, task=dict(sweep.meta["fingerprint"]["task"],
                                                                              split="validation"))
    return SweepResult(baseline=sweep.baseline, units=sweep.units, meta=dict(sweep.meta, fingerprint=fp))


def test_two_settings_of_one_model_and_task_compare_item_by_item():
    """The same items under two settings: a curve with the same outcomes under both differs by exactly 0 in every
    paired replicate; a curve whose gold answer drops further under b has a lower accuracy AUC, by the difference
    of the two sweeps' own AUCs, with an interval below 0."""

    from lens_heads.sweep.compare import compare_settings, setting_of
    from synthetic_sweeps import synthetic_sweep as item_sweep

    plain = _with_setting(item_sweep(np.random.default_rng(0), 60, {"S1": (0.5, 3.0), "random": (0.2, 2.0)},
                                     zeroed=True), False)
    harder = [replace(u, result=EvalResult(task="synthetic", format="cloze", chance=0.5, items=[
        ItemRecord(id=r.id, gold=0, logprobs=[r.logprobs[0] - 3.0, r.logprobs[1]], n_tokens=[1, 1], n_chars=[1, 1],
                   greedy=[True, False], n_bytes=[1, 1]) for r in u.result.items])) if u.score == "S1" else u
              for u in plain.units]
    chat = _with_setting(SweepResult(baseline=plain.baseline, units=harder, meta=plain.meta), True)
    assert setting_of(chat) == "validation, chat template" and setting_of(plain) == "validation, no chat template"
    per_row = SweepResult(baseline=plain.baseline, units=plain.units,
                          meta=dict(plain.meta, fingerprint=dict(plain.meta["fingerprint"], random_draw="per_row")))
    assert setting_of(per_row) == "validation, no chat template, random drawn per row"
    table = compare_settings(plain, chat, n_resamples=300).set_index(["quantity", "curve"])
    same = table.loc[("accuracy_auc", "random")]
    assert same["difference"] == 0 and same["low"] == 0 and same["high"] == 0 and same["verdict"] == "cannot tell apart"
    s1 = table.loc[("accuracy_auc", "S1")]
    expected = chat.normalised_auc()["S1"] - plain.normalised_auc()["S1"]
    assert expected < 0 and s1["difference"] == pytest.approx(expected) and s1["high"] < 0
    assert s1["verdict"] == "lower under b"
    assert set(table.index.get_level_values("quantity")) == {"accuracy_auc", "kl_auc", "rank_accuracy_auc",
                                                              "rank_kl_auc"}
    both = compare_sweeps([plain, chat], n_resamples=100)  # two settings of one (model, task) are two sweeps
    assert both.labels == ("m / t (validation, no chat template)", "m / t (validation, chat template)")
    other = _with_setting(item_sweep(np.random.default_rng(1), 50, {"S1": (0.5, 3.0)}), True)
    with pytest.raises(ValueError, match="same items"):
        compare_settings(plain, other)


def test_zeroed_head_overlap_by_hand():
    from scipy.stats import spearmanr

    from lens_heads.sweep.compare import zeroed_head_overlap
    from synthetic_sweeps import unit

    def sweep(shares):
        units = [unit("baseline", None, 0.0, np.zeros(4))]
        for score, share in shares.items():
            u = unit("threshold", score, 0.1, np.zeros(4))
            units.append(replace(u, head_share=share))
        return SweepResult(baseline=units[0].result, units=units, meta={})

    a = sweep({"S1": [[1.0, 0.6], [0.2, 0.0]], "S2": [[0.1, 0.0], [0.0, 0.0]]})
    b = sweep({"S1": [[1.0, 0.1], [0.7, 0.0]], "S2": [[0.0, 0.2], [0.0, 0.0]]})
    table = zeroed_head_overlap(a, b).set_index("score")
    assert table.loc["S1", ["heads_a", "heads_b", "shared"]].tolist() == [2, 2, 1]
    assert table.loc["S1", "jaccard"] == pytest.approx(1 / 3)
    assert table.loc["S1", "spearman_head_share"] == pytest.approx(spearmanr([1, .6, .2, 0], [1, .1, .7, 0])[0])
    assert table.loc["S2", "heads_a"] == 0 and math.isnan(table.loc["S2", "jaccard"])


def test_compare_settings_analysis_writes_what_the_library_computes(tmp_path):
    from conftest import load_script
    from lens_heads.sweep.compare import compare_settings
    from lens_heads.sweep.unit_store import save_units
    from synthetic_sweeps import synthetic_sweep as item_sweep

    plain = _with_setting(item_sweep(np.random.default_rng(0), 30, {"S1": (0.5, 3.0), "random": (0.2, 2.0)},
                                     zeroed=True), False)
    chat = _with_setting(item_sweep(np.random.default_rng(0), 30, {"S1": (1.5, 3.0), "random": (0.2, 2.0)},
                                    zeroed=True), True)
    paths = [save_units(s, tmp_path / f"{name}_units.json.gz") for name, s in (("a", plain), ("b", chat))]
    load_script("compare_settings").main([str(p) for p in paths] + ["--name", "cmp", "--figures", str(tmp_path),
                                                                    "--n-resamples", "200"])
    written = pd.read_csv(tmp_path / "cmp.csv")
    expected = compare_settings(plain, chat, n_resamples=200)  # the CSV keeps 6 significant digits
    assert np.allclose(written["difference"], expected["difference"], rtol=1e-5) and list(written["verdict"]) == list(
        expected["verdict"])
    report = json.loads((tmp_path / "cmp.json").read_text())
    assert report["a"]["setting"] == "validation, no chat template" and report["b"]["setting"].endswith("chat template")
    assert -1 <= report["spearman"]["accuracy"]["estimate"] <= 1 and (tmp_path / "cmp_heads.csv").exists()
    right = [[int(np.argmax(it.logprobs)) == it.gold for it in s.baseline.items] for s in (plain, chat)]
    change = report["baseline_change"]  # the unablated model under b against a, item by item
    assert change["n"] == 30 and change["right_only_a"] == sum(x and not y for x, y in zip(*right))
    assert change["right_only_b"] == sum(y and not x for x, y in zip(*right))
    assert change["paired_diff"] == pytest.approx(np.mean(right[1]) - np.mean(right[0]))
    versus = pd.read_csv(tmp_path / "cmp_versus_random.csv")  # each setting's curves against its own random curve
    for setting, sweep in (("a", plain), ("b", chat)):
        auc = sweep.normalised_auc(metric="kl")  # the AUCs read straight off the curves, not through the bootstrap
        got = versus[(versus["setting"] == setting) & (versus["summary"] == "kl_auc") & (versus["a"] == "S1")]
        assert got["difference"].item() == pytest.approx(auc["S1"] - auc["random"], rel=1e-5)
    verdicts = versus.set_index(["setting", "a", "summary"])["verdict"]
    changed = {(c["curve"], c["summary"]) for c in report["claims_change"]}
    assert changed == {(a, summary) for _, a, summary in verdicts.index
                       if ("b", a, summary) in verdicts.index and ("a", a, summary) in verdicts.index
                       and verdicts["a", a, summary] != verdicts["b", a, summary]}


def test_compare_sweeps_script_names_its_outputs_by_prefix(tmp_path):
    """``--name`` keeps a second comparison beside the first: every output carries the prefix, and the Table 2 it
    writes is the by-hand one (AWFT crosses baseline - 1 at 11% on both sweeps, so their Average is 11 too)."""
    from conftest import load_script
    from lens_heads.sweep.unit_store import save_units

    curves = {"AWFT": (80, 70), "S2": (70, 60), "random": (60, 40)}
    paths = [save_units(synthetic_sweep("m1", t, curves), tmp_path / f"{t}_units.json.gz") for t in ("t1", "t2")]
    script = load_script("compare_sweeps")
    script.main([*map(str, paths), "--figures", str(tmp_path / "out"), "--name", "mine", "--no-png",
                 "--n-resamples", "20"])
    written = {p.name for p in (tmp_path / "out").iterdir()}
    assert written == {f"mine_{s}" for s in ("ranks.csv", "pairs.csv", "table2.csv", "sweeps.json",
                                              *(f"{k}_{m}.{e}" for k in ("spearman", "ranks")
                                                for m in ("accuracy", "kl") for e in ("csv", "html")))} - {
        "mine_ranks_accuracy.csv", "mine_ranks_kl.csv"}
    t2 = pd.read_csv(tmp_path / "out" / "mine_table2.csv").set_index("model")
    assert t2.loc["m1", "awft_pct"].tolist() == pytest.approx([11, 11]) and t2.loc["Average", "awft_pct"] == 11
    for bad in ("a/b", ""):
        with pytest.raises(SystemExit):
            script.parse_args([*map(str, paths), "--name", bad])
