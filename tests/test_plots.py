"""Sweep figures tell curves apart by the table's ``curve``/``score``/``mode`` columns, never by their labels."""

import pandas as pd
import pytest

from lens_heads.heads.scores import base_score
from lens_heads.viz.palette import PALETTE
from lens_heads.viz.sweep_figures import Curve, ablation_curves, curve_style, sweep_curves


def sweep_table(curves, *, with_curve_column=True) -> pd.DataFrame:
    """Rows as SweepResult.to_dataframe writes them: a baseline point at 0 (mode "baseline") and one at 10%."""
    rows = []
    for label, score, mode in curves:
        for f, m in ((0.0, "baseline"), (0.1, mode)):
            rows.append(dict(curve=label, score=score, mode=m, realised_fraction=f, target_fraction=f,
                             accuracy=0.5 - f, ci_low=0.4 - f, ci_high=0.6 - f))
    table = pd.DataFrame(rows)
    return table if with_curve_column else table.drop(columns="curve").assign(score=[r["curve"] for r in rows])


def test_base_score_of_the_variants():
    assert [base_score(n) for n in ("AHON (LN)", "LTHON (LN)", "AWFT", "LTHON (full, LN)")] == [
        "AHON", "LTHON", "AWFT", "LTHON"]
    assert base_score("something else") == "something else"


def test_curves_are_read_from_the_columns_not_the_labels():
    # a label that looks like a static LN curve, but the columns say what it is
    table = sweep_table([("AHON (LN) (static)", "AHON (LN)", "static"), ("my label", "AHON", "threshold"),
                         ("random", "random", "random")])
    assert sweep_curves(table) == [Curve("AHON (LN) (static)", "AHON (LN)", "static"),
                                   Curve("my label", "AHON", "threshold"), Curve("random", "random", "random")]
    # before the curve column exists, the score column is the label
    legacy = sweep_table([("AWFT", "AWFT", "threshold"), ("random", "random", "random")], with_curve_column=False)
    assert [c.label for c in sweep_curves(legacy)] == ["AWFT", "random"]
    no_mode = legacy.drop(columns="mode")
    assert [c.mode for c in sweep_curves(no_mode)] == ["threshold", "random"]


def test_styles_follow_mode_and_family():
    families = ["AWFT", "AHON"]
    static_ln = curve_style(Curve("x", "AHON (LN)", "static"), families)
    ln = curve_style(Curve("y", "AHON (LN)", "threshold"), families)
    base = curve_style(Curve("z", "AHON", "threshold"), families)
    assert static_ln["color"] == ln["color"] == base["color"] == PALETTE[1]  # one colour per family
    assert (static_ln["dash"], ln["dash"], base["dash"]) == ("dot", "solid", "dashdot")
    assert curve_style(Curve("random", "random", "random"), families) == dict(color="black", width=2.5, dash="dash")
    first, second = (curve_style(Curve(f"o{i}", "oracle", "oracle"), families, i) for i in (0, 1))
    assert (first["dash"], second["dash"]) == ("solid", "dot")


def test_ablation_figure_rows_and_reference_curves():
    names = ["AWFT", "AEQD", "FTVVN", "AVVN", "AWFT (LN)", "AEQD (LN)", "FTVVN (LN)"]
    table = sweep_table([(n, n, "threshold") for n in names] + [("random", "random", "random"),
                                                                 ("held out", "oracle", "oracle")])
    fig = ablation_curves(table, baseline=50.0, chance=0.25, title="<b>t</b>")
    drawn = [t.name for t in fig.data]
    # seven scored curves: base and (LN) get a row each, random and oracle appear in both
    assert drawn.count("random") == 2 and drawn.count("held out") == 2 and drawn.count("AWFT (LN)") == 1
    assert "<b>" not in fig.layout.title.text
    awft = next(t for t in fig.data if t.name == "AWFT")
    assert list(awft.x) == pytest.approx([0.0, 10.0]) and list(awft.y) == pytest.approx([50.0, 40.0])
    random = next(t for t in fig.data if t.name == "random")
    assert list(random.error_y.array) == pytest.approx([10.0, 10.0]) and awft.error_y.array is None
    few = ablation_curves(sweep_table([("AWFT", "AWFT", "threshold"), ("random", "random", "random")]),
                          baseline=50.0, chance=0.25)
    assert [t.name for t in few.data] == ["AWFT", "random"]  # one row, accuracy panel only (no other columns)


def test_rank_profile_names_its_aggregation_and_draws_the_bands():
    from lens_heads.viz.layer_figures import rank_profile

    fig = rank_profile([3.5, 1.25], [2.0, 1.0], None, [False, True], title="ranks", aggregation="layer_rank",
                       max_rank_sd=[0.5, 0.25], mean_rank_sd=[0.1, 0.0])
    assert "aggregation: layer_rank" in fig.layout.title.text and "±1 sd" in fig.layout.title.text
    bars, means = fig.data[0], fig.data[1]
    assert list(bars.error_y.array) == [0.5, 0.25] and list(means.error_y.array) == [0.1, 0.0]
    plain = rank_profile([3, 1], [2, 1], None, [False, True], title="ranks", aggregation="matrix")
    assert "aggregation: matrix]" in plain.layout.title.text and plain.data[0].error_y.array is None
