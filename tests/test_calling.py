"""The one calling rule: the permutation test tests the quantity whose interval is reported, verdicts need the
interval and the adjusted p to agree, one rank rule for estimates and intervals, and sentences that never
contradict their own numbers."""

import re
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from lens_heads import InputError
from lens_heads.report.sweep_stages import headline_tests
from lens_heads.stats import calling
from lens_heads.stats import inference as stats
from lens_heads.sweep.result import SweepResult
from synthetic_sweeps import synthetic_sweep

LEVELS = {"A": (0.05, 0.3), "B": (0.2, 1.0), "random": (0.5, 2.0)}


def test_the_permutation_test_permutes_the_reported_difference_when_realised_shares_differ():
    """Curves that realise very different shares of heads zeroed: unpermuted, the permutation test's statistic is
    the difference of the two curves' full-sample summaries, each on its own realised x axis."""
    sweep = synthetic_sweep(np.random.default_rng(0), 30, LEVELS, share_factor={"A": 0.4, "random": 2.5})
    realised = {name: [u.realised_fraction for u in units[1:]] for name, units in sweep.curves().items()}
    assert realised["random"][0] > 2 * realised["A"][0]  # the shares do differ
    iv = sweep.intervals(n_resamples=50)
    n = 30
    for summary, direct in (("zeroable_authors", sweep.zeroable_within(rule="authors")),
                            ("kl_auc", sweep.normalised_auc(metric="kl")),
                            ("accuracy_auc", sweep.normalised_auc())):
        observed = iv.permuted_difference("A", "random", summary)(np.arange(n)[None], np.arange(n, 2 * n)[None])
        # both sides summarise the same items in the same order: only float summation order may differ
        assert observed[0] == pytest.approx(direct["A"] - direct["random"], rel=1e-12, abs=1e-12)
        assert iv.difference("A", "random", summary, n_permutations=20)["difference"] == pytest.approx(
            direct["A"] - direct["random"], rel=1e-12, abs=1e-12)


def test_a_curve_without_per_item_zeroing_counts_is_refused_a_test_but_keeps_its_intervals():
    sweep = synthetic_sweep(np.random.default_rng(1), 20, LEVELS, zeroed=False)
    iv = sweep.intervals(n_resamples=30)
    assert iv.meta["realised_share"].startswith("held")
    d = iv.difference("A", "random", "kl_auc")
    assert d["low"] <= d["difference"] <= d["high"] and np.isnan(d["p_value"])
    assert d["verdict"] == calling.NOT_TESTED and "re-record the sweep" in d["test_note"]
    assert (iv.versus("random")["verdict"] == calling.NOT_TESTED).all()
    items = iv.data[0]
    with pytest.raises(InputError, match="re-record the sweep"):  # the test itself refuses another statistic
        items[0].paired_with(items[-1])


@pytest.mark.parametrize("low, high, p, expected", [
    (0.1, 0.5, 0.01, "a better"),            # both call it, a higher and higher is better
    (-0.5, -0.1, 0.01, "b better"),
    (-0.2, 0.4, 0.002, calling.DISAGREE),    # the report's first box: interval holds 0, p small
    (0.1, 0.5, 0.3, calling.DISAGREE),       # interval excludes 0, p large
    (-0.2, 0.4, 0.3, calling.CANNOT_TELL),
    (float("nan"), float("nan"), float("nan"), calling.NOT_TESTED),
    (0.1, 0.5, float("nan"), calling.NOT_TESTED),
])
def test_the_rule_calls_a_difference_only_where_interval_and_adjusted_p_agree(low, high, p, expected):
    assert calling.verdict(low, high, p, higher_is_better=True) == expected


def test_a_table_is_one_family_its_p_values_adjusted_together():
    table = pd.DataFrame(dict(a=["x", "y", "z"], b="r", difference=[1.0, 1.0, 1.0], low=[0.5, 0.5, 0.5],
                              high=[1.5, 1.5, 1.5], p_value=[0.01, 0.04, 0.045], higher_is_better=True))
    called = calling.call_table(table)
    # Benjamini-Hochberg by hand: p_(i) * m / i, made monotone from the largest down
    assert called["p_adjusted"].tolist() == pytest.approx([0.03, 0.045, 0.045])
    assert called["verdict"].tolist() == ["x better", "y better", "z better"]
    alone = calling.call_table(table.iloc[[0]].assign(p_value=0.04))
    assert alone["p_adjusted"].tolist() == pytest.approx([0.04])
    spread = calling.call_table(table.assign(p_value=[0.04, 0.5, 0.9]))
    assert spread["verdict"].tolist() == [calling.DISAGREE] * 3  # 0.04 adjusted over three tests is 0.12


def sentence_numbers(text: str) -> tuple[float, float, list[float]]:
    low, high = map(float, re.search(r"\[(-?[\d.]+), (-?[\d.]+)\]", text).groups())
    return low, high, [float(p) for p in re.findall(r"(?:p = |, )(\d[\d.e-]*)(?: adjusted)?", text.split("]")[-1])]


@pytest.mark.parametrize("seed", range(6))
def test_no_findings_line_contradicts_its_own_interval_or_p_value(seed):
    """Headline tests of synthetic sweeps, some with real differences, some without, curves at different realised
    shares: a line that claims a difference shows an interval excluding 0 and an adjusted p below 0.05; a line
    that says the data cannot tell them apart shows neither; a line that says the tests disagree shows one."""
    rng = np.random.default_rng(seed)
    levels = {"A": (0.05, 0.3), "B": tuple(rng.uniform(0.05, 1.0, 2)), "random": tuple(rng.uniform(0.05, 2, 2))}
    sweep = synthetic_sweep(rng, 25, levels, share_factor={"random": rng.uniform(0.5, 2)})
    tests = headline_tests(sweep.intervals(n_resamples=200, seed=seed))
    assert tests
    for key, test in tests.items():
        line = calling.sentence(test, "KL AUC" if "kl" in key else "% zeroable", ".3f",
                                lower_is_better="kl" in key)
        low, high, p = sentence_numbers(line)
        p_used = p[-1]  # the adjusted p where it differs from the raw one
        excludes = low > 0 or high < 0
        if " beats " in line or " costs less than " in line:
            assert excludes and p_used < 0.05, line
        elif line.startswith("the data cannot tell"):
            assert not excludes and p_used >= 0.05 - 1e-12, line
        elif line.startswith("the two tests disagree"):
            assert excludes != (p_used < 0.05), line
        else:
            pytest.fail(line)


def test_the_report_box_example_reads_as_a_disagreement_not_as_cannot_tell_apart():
    test = dict(a="FTVVN (LN)", b="random", difference=30.4, low=-26.5, high=30.4, p_value=0.002,
                higher_is_better=True)
    row = calling.call_table(pd.DataFrame([test])).iloc[0].to_dict()
    line = calling.sentence(row, "% zeroable within 1 point", ".1f")
    assert row["verdict"] == calling.DISAGREE
    assert line.startswith("the two tests disagree on FTVVN (LN) against random") and "holds 0" in line


def test_summary_ranks_by_the_rule_its_intervals_use_so_a_tied_rank_lies_inside_its_interval():
    sweep = synthetic_sweep(np.random.default_rng(4), 30, {"A": (0.2, 1.0), "random": (0.5, 2.0)})
    twin = [replace(u, spec={**u.spec, "score": "A2"}) for u in sweep.units if u.score == "A"]
    sweep = SweepResult(sweep.baseline, sweep.units + twin, dict(sweep.meta, scores=["A", "A2"]))
    iv = sweep.intervals(n_resamples=100)
    summary = sweep.summary(intervals=iv).set_index("score")
    for column in ("auc_rank", "kl_rank"):
        assert summary.loc["A", column] == summary.loc["A2", column]  # tied: they share the mean of ranks 1 and 2
        for curve in summary.index:
            assert summary.loc[curve, f"{column}_low"] <= summary.loc[curve, column] <= summary.loc[curve,
                                                                                                    f"{column}_high"]
    assert summary.loc["A", "kl_rank"] == 1.5 and summary.loc["random", "kl_rank"] == 3.0
    # the rule by hand: higher is better for accuracy, NaN last, ties averaged
    assert stats.ranks([2.0, float("nan"), 2.0, 5.0], higher_is_better=True).tolist() == [2.5, 4.0, 2.5, 1.0]


def test_the_grouped_permutation_p_value_is_the_exact_sign_flip_p_value():
    """Two groups of 3 and 4 paired items, every one of the 2^7 swaps enumerated here: the share whose mean over
    groups of mean differences is at least as far from 0 as the observed one (the null is symmetric, so this is
    scipy's two-sided p; 10,000 resamples > 2^7 makes scipy enumerate too)."""
    import itertools

    d = [np.array([1.0, 2.0, -0.5]), np.array([0.5, 1.5, 3.0, -1.0])]
    x = [np.array([3.0, 4.0, 1.0]), np.array([2.0, 2.5, 5.0, 0.0])]
    pairs = [(xi, xi - di) for xi, di in zip(x, d)]

    def group(xi, yi):
        both = np.concatenate([xi, yi])
        return lambda sa, sb: both[sa].mean(-1) - both[sb].mean(-1)

    observed = np.mean([di.mean() for di in d])
    flips = [np.mean([np.dot(s[:3], d[0]) / 3, np.dot(s[3:], d[1]) / 4])
             for s in itertools.product([1, -1], repeat=7)]
    exact = np.mean(np.abs(flips) >= abs(observed) - 1e-12)
    got = stats.grouped_permutation_p_value([group(*p) for p in pairs], [3, 4], n_resamples=10_000)
    assert got == pytest.approx(exact, abs=1e-12)  # counts of the same 128 sums: no rounding between them
    one = stats.permutation_p_value(group(*pairs[1]), 4, n_resamples=10_000)
    assert stats.grouped_permutation_p_value([group(*pairs[1])], [4], n_resamples=10_000) == one
    with pytest.raises(InputError, match="one statistic per group"):
        stats.grouped_permutation_p_value([group(*pairs[0])], [3, 4])


def test_table2_average_row_carries_the_rules_verdict_on_its_own_interval_and_p_value():
    from lens_heads.sweep.table2 import table2

    levels = {"AWFT": (0.3, 0.6), "AHON": (0.2, 0.4), "random": (0.5, 2.0)}
    sweeps = [synthetic_sweep(np.random.default_rng(s), 40, levels, task=t) for s, t in ((0, "t1"), (1, "t2"))]
    table = table2(sweeps, n_resamples=200, seed=3)
    average = table.iloc[-1]
    assert average["model"] == "Average" and 0 < average["p_value"] <= 1
    # the table is one family (the rule: "adjusted within its table"): Benjamini-Hochberg by hand over its rows
    p = table["p_value"].to_numpy()
    order = np.argsort(p)
    by_hand = np.empty_like(p)
    by_hand[order] = np.minimum.accumulate((p[order] * len(p) / np.arange(1, len(p) + 1))[::-1])[::-1].clip(max=1)
    assert table["p_adjusted"].to_numpy() == pytest.approx(by_hand)
    for _, r in table.iterrows():
        assert r["verdict"] == calling.verdict(r["difference_low"], r["difference_high"], r["p_adjusted"],
                                               higher_is_better=True, a="AWFT", b=r["best_score"] or "best")
    assert average["verdict"].endswith(("AWFT better", "best better")) or average["verdict"] in calling.UNCALLED
    # a group of one: the Average of a single sweep is tested exactly as that sweep's own row
    single = table2(sweeps[:1], n_resamples=200, seed=3)
    assert single.iloc[-1]["p_value"] == single.iloc[0]["p_value"]
    assert single.iloc[-1]["verdict"] == single.iloc[0]["verdict"].replace(single.iloc[0]["best_score"], "best")
    untested = table2([synthetic_sweep(np.random.default_rng(0), 40, levels, zeroed=False, task=t)
                       for t in ("t1", "t2")], n_resamples=50).iloc[-1]
    assert untested["verdict"] == calling.NOT_TESTED and "per-item zeroing" in untested["test_note"]


def test_a_change_with_no_better_direction_is_said_as_higher_or_lower_never_as_better():
    row = dict(a="chat", b="plain", difference=0.3, low=0.1, high=0.5, p_value=0.001, higher_is_better=None)
    table = calling.call_table(pd.DataFrame([row]))
    assert table["verdict"].item() == calling.HIGHER
    line = calling.sentence(table.iloc[0].to_dict(), "KL AUC")
    assert line.startswith("chat is higher than plain by KL AUC") and "better" not in line and "beats" not in line


def test_an_untested_comparison_says_which_test_it_lacks():
    nan = float("nan")
    base = dict(a="x", b="y", difference=1.0, higher_is_better=False)
    no_interval = calling.call_table(pd.DataFrame([dict(base, low=nan, high=nan, p_value=0.001, test_note=nan)]))
    no_p = calling.call_table(pd.DataFrame([dict(base, low=0.5, high=1.5, p_value=nan, test_note=nan)]))
    for table, why in ((no_interval, "no bootstrap interval"), (no_p, "no permutation p-value")):
        row = table.iloc[0].to_dict()
        assert row["verdict"] == calling.NOT_TESTED
        assert calling.sentence(row, "KL").endswith(f"; {why}.")
    noted = dict(no_p.iloc[0].to_dict(), test_note="units lack per-item counts")
    assert calling.sentence(noted, "KL").endswith("; units lack per-item counts.")
