"""Agreement of scores with head effects: the rank statistics against their textbook definitions written as loops,
and the orientation of '<' and '>' scores on constructed effects."""

import itertools

import numpy as np
import pytest
import torch

from conftest import assert_close_to_scale
from lens_heads.experiments.agreement import precision_at_k, score_agreement
from lens_heads.experiments.effects import EFFECT_METRICS, HeadEffects
from lens_heads.heads.scoring import HeadScores
from lens_heads.stats.inference import kendall, spearman


def kendall_by_pairs(x, y):
    concordant = discordant = ties_x = ties_y = 0
    for i, j in itertools.combinations(range(len(x)), 2):
        dx, dy = np.sign(x[i] - x[j]), np.sign(y[i] - y[j])
        if dx == 0 and dy == 0:
            continue
        if dx == 0:
            ties_x += 1
        elif dy == 0:
            ties_y += 1
        elif dx == dy:
            concordant += 1
        else:
            discordant += 1
    return (concordant - discordant) / np.sqrt((concordant + discordant + ties_x) * (concordant + discordant + ties_y))


def test_rank_statistics_match_their_definitions():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=30), rng.normal(size=30)
    d = np.argsort(np.argsort(x)) - np.argsort(np.argsort(y))
    assert spearman(x, y) == pytest.approx(1 - 6 * np.sum(d ** 2) / (30 * (30 ** 2 - 1)))
    assert kendall(x, y) == pytest.approx(kendall_by_pairs(x, y))
    tied_x, tied_y = np.round(x), np.round(y * 2)  # many ties on both sides
    assert kendall(tied_x, tied_y) == pytest.approx(kendall_by_pairs(tied_x, tied_y))
    # Spearman with ties = Pearson of average ranks: [1, 1, 2] ranks as [0.5, 0.5, 2]
    a, b = np.array([1.0, 1.0, 2.0]), np.array([3.0, 1.0, 2.0])
    ra, rb = np.array([0.5, 0.5, 2.0]), np.array([2.0, 0.0, 1.0])
    assert spearman(a, b) == pytest.approx(np.corrcoef(ra, rb)[0, 1])
    assert np.isnan(spearman(np.ones(4), np.arange(4.0)))
    # the 2 lowest activities are heads 0 and 3; the 2 smallest effects heads 3 and 1: one of two found
    assert precision_at_k(np.array([0.1, 0.9, 0.5, 0.2]), np.array([0.5, 0.1, 0.7, 0.0]), 2) == 0.5


def constructed(n=12, L=4, H=5, seed=0):
    """Effects with known sizes; scores: one equal to the per-item absolute effect ('<'), one its negation ('>'),
    one unrelated noise ('<')."""
    rng = np.random.default_rng(seed)
    effect = rng.normal(size=(n, L, H)) * rng.uniform(0.01, 3, size=(1, L, H))
    values = torch.zeros(n, L, H, len(EFFECT_METRICS), dtype=torch.float64)
    values[..., EFFECT_METRICS.index("kl")] = torch.tensor(np.abs(effect))
    values[..., EFFECT_METRICS.index("gold_logprob")] = torch.tensor(effect)
    effects = HeadEffects(values=values, metrics=list(EFFECT_METRICS), metric="gold_logprob", method="ablation",
                          item_ids=[str(i) for i in range(n)], meta={})
    score = torch.tensor(np.stack([np.abs(effect), -np.abs(effect), rng.normal(size=(n, L, H))], -1)).float()
    scores = HeadScores(values=score, names=["same", "negated", "noise"],
                        direction={"same": "<", "negated": ">", "noise": "<"}, meta={})
    return scores, effects, effect


def test_a_score_equal_to_the_effect_agrees_perfectly_in_either_direction():
    scores, effects, effect = constructed()
    table = score_agreement(scores, effects, n_boot=50).to_dataframe().set_index("score")
    for name in ("same", "negated"):
        for column in ("spearman", "kendall", "spearman_per_input", "kendall_per_input", "precision_at_5pct",
                       "precision_at_30pct"):
            assert table.loc[name, column] == pytest.approx(1.0), (name, column)
        assert table.loc[name, "spearman_low"] == pytest.approx(1.0)
    noise = table.loc["noise"]
    mean_noise = scores.score("noise").double().numpy().mean(0).reshape(-1)
    size = np.abs(effect).mean(0).reshape(-1)
    assert noise["spearman"] == pytest.approx(np.corrcoef(np.argsort(np.argsort(mean_noise)),
                                                          np.argsort(np.argsort(size)))[0, 1])
    assert noise["spearman_low"] <= noise["spearman"] <= noise["spearman_high"]
    assert abs(noise["spearman"]) < 0.6


def test_mismatched_items_are_refused():
    scores, effects, _ = constructed()
    fewer = HeadScores(values=scores.values[:5], names=scores.names, direction=scores.direction, meta={})
    with pytest.raises(ValueError, match="score the same task"):
        score_agreement(fewer, effects)


def test_figures_carry_the_numbers_and_escape_the_names():
    from lens_heads.viz.score_figures import agreement_bars, score_vs_effect

    scores, effects, effect = constructed()
    table = score_agreement(scores, effects, n_boot=20).to_dataframe()
    table.loc[2, "score"] = "<b>noise</b>"
    bars = agreement_bars(table)
    assert list(bars.data[0].y) == pytest.approx(list(table["spearman"]))
    assert list(bars.data[0].error_y.array) == pytest.approx(list(table["spearman_high"] - table["spearman"]))
    assert "<b>" not in "".join(bars.data[0].x)
    size = np.abs(effect).mean(0)
    mean = {name: scores.mean(name).numpy() for name in scores.names}
    scatter = score_vs_effect(mean, size, scores.direction, effect_label="KL")
    for trace, name in zip(scatter.data, scores.names):
        assert list(trace.x) == pytest.approx(mean[name].reshape(-1).tolist())
        assert list(trace.y) == pytest.approx(size.reshape(-1).tolist())


@pytest.mark.floats
def test_row_scores_are_averaged_per_item():
    """score_heads on a Task scores each forward row (one per choice for cloze): an item's score is its rows' mean."""
    scores, effects, effect = constructed(n=4)
    rows = torch.cat([scores.values, scores.values + 1.0, scores.values[:2] - 3.0])  # items 0-3, 0-3, 0-1
    row_items = list(range(4)) * 2 + [0, 1]
    by_rows = HeadScores(values=rows, names=scores.names, direction=scores.direction,
                         meta={"data": {"row_items": row_items}})
    from lens_heads.experiments.agreement import item_scores

    expected = np.empty(tuple(scores.values.shape))
    expected[:2] = (scores.values[:2].double().numpy() * 3 + 1.0 - 3.0) / 3
    expected[2:] = scores.values[2:].double().numpy() + 0.5
    assert_close_to_scale(item_scores(by_rows), expected, scale=rows)  # a float32 mean of 2 or 3 rows
    assert score_agreement(by_rows, effects, n_boot=5).meta["item_scores"] == "mean over each item's forward rows"
