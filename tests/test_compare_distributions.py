"""Score distributions across models: the distances against hand computations and scipy, seeded intervals that
reproduce, the swapped null, shape refusals, the per-head agreement, and the fine-tune's loss."""

import numpy as np
import pytest
import torch
from scipy import stats

from lens_heads.experiments.compare_distributions import compare_distributions
from lens_heads.experiments.distribution_settings import DistributionSettings
from lens_heads.heads.scores import DIRECTION, SCORE_NAMES, most_inactive
from lens_heads.heads.scoring import HeadScores
from lens_heads.plumbing.errors import InputError
from lens_heads.stats.distances import PooledValues, counts, greater_p_value, swap_draws

N_ITEMS, ROWS_PER_ITEM = 30, 3
ITEMS = np.repeat(np.arange(N_ITEMS), ROWS_PER_ITEM)


def scores(values: np.ndarray, name: str = "m", task: str = "t") -> HeadScores:
    """HeadScores of ``values`` [row, layer, head, 12], the rows of items 0..N_ITEMS-1 (three rows each)."""
    return HeadScores(values=torch.tensor(values, dtype=torch.float32), names=list(SCORE_NAMES),
                      direction=dict(DIRECTION),
                      meta=dict(model=dict(name=name), data=dict(task=task, split="validation", n=N_ITEMS, seed=0,
                                                                 row_items=ITEMS.tolist())))


def w1_by_hand(a: np.ndarray, b: np.ndarray) -> float:
    """Wasserstein-1 as the area between the two step CDFs, summed over the gaps of the merged sorted values."""
    x = np.sort(np.concatenate([a, b]))
    fa = np.searchsorted(np.sort(a), x[:-1], side="right") / a.size
    fb = np.searchsorted(np.sort(b), x[:-1], side="right") / b.size
    return float(np.sum(np.abs(fa - fb) * np.diff(x)))


def ks_by_hand(a: np.ndarray, b: np.ndarray) -> float:
    """The largest gap between the two CDFs, read at every value (the sup is reached at a jump)."""
    x = np.concatenate([a, b])
    fa = np.searchsorted(np.sort(a), x, side="right") / a.size
    fb = np.searchsorted(np.sort(b), x, side="right") / b.size
    return float(np.abs(fa - fb).max())


def test_distances_match_hand_computations_and_scipy_with_ties_and_reweighting():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(20, 7)).round(1)  # rounding makes ties within and across the samples
    b = rng.normal(0.3, 1.3, size=(20, 5)).round(1)
    ia, ib = np.repeat(np.arange(20), 7), np.repeat(np.arange(20), 5)
    pooled = PooledValues.of([(a, ia), (b, ib)], 20)
    w1, ks = pooled.distances({0: (1.0, 0.0), 1: (0.0, 1.0)})
    # float64 sums of a few hundred terms in different orders: 1e-12
    assert w1[0] == pytest.approx(w1_by_hand(a.ravel(), b.ravel()), rel=1e-12)
    assert w1[0] == pytest.approx(stats.wasserstein_distance(a.ravel(), b.ravel()), rel=1e-12)
    assert ks[0] == pytest.approx(ks_by_hand(a.ravel(), b.ravel()), rel=1e-12)
    assert ks[0] == pytest.approx(stats.ks_2samp(a.ravel(), b.ravel()).statistic, rel=1e-12)
    # a bootstrap replicate weighs each item by its count: the distance of the resampled samples, written out
    idx = rng.integers(0, 20, size=(4, 20))
    c = counts(idx, 20)
    assert (c.sum(1) == 20).all() and c[1, idx[1, 0]] == (idx[1] == idx[1, 0]).sum()
    w1, ks = pooled.distances({0: (c, 0.0), 1: (0.0, c)})
    for r in range(4):
        ra, rb = a[idx[r]].ravel(), b[idx[r]].ravel()
        assert w1[r] == pytest.approx(w1_by_hand(ra, rb), rel=1e-12)
        assert ks[r] == pytest.approx(ks_by_hand(ra, rb), rel=1e-12)
    # a permutation swaps whole items between the samples
    swap = swap_draws(20, 3, seed=1)
    f = swap.astype(float)
    w1, ks = pooled.distances({0: (1 - f, f), 1: (f, 1 - f)})
    for r in range(3):
        ra = np.concatenate([b[swap[r]].ravel(), a[~swap[r]].ravel()])
        rb = np.concatenate([a[swap[r]].ravel(), b[~swap[r]].ravel()])
        assert w1[r] == pytest.approx(w1_by_hand(ra, rb), rel=1e-12)
        assert ks[r] == pytest.approx(ks_by_hand(ra, rb), rel=1e-12)
    assert greater_p_value(1.0, np.array([0.5, 1.0, 2.0, 0.1])) == pytest.approx(3 / 5)
    with pytest.raises(InputError, match="non-finite"):
        PooledValues.of([(np.array([1.0, np.nan]), np.array([0, 1])), (b, ib)], 20)


@pytest.fixture(scope="module")
def three_models():
    rng = np.random.default_rng(1)
    base = rng.normal(1.0, 0.3, size=(N_ITEMS * ROWS_PER_ITEM, 4, 3, 12)) + rng.normal(0, 0.3, (1, 4, 3, 12))
    tuned = base + rng.normal(0, 0.01, size=base.shape)  # barely moved: a null the tests should not call
    other = rng.normal(1.6, 0.4, size=(N_ITEMS * ROWS_PER_ITEM, 2, 5, 12))  # another shape, shifted
    return {"base": scores(base, "base"), "tuned": scores(tuned, "tuned"), "other": scores(other, "other")}


def test_point_estimates_are_the_distances_of_the_selected_values(three_models):
    result = compare_distributions(three_models, names=["AHON (LN)", "AWFT"], n_resamples=50, seed=0)
    table = result.distances
    base, tuned, other = (three_models[m].score("AHON (LN)").double().numpy() for m in ("base", "tuned", "other"))

    def row(b, view, level, statistic):
        r = table[(table.score == "AHON (LN)") & (table.b == b) & (table.view == view) & (table.level == level)
                  & (table.statistic == statistic)]
        assert len(r) == 1
        return r.iloc[0]

    assert row("other", "pooled", 0, "wasserstein").distance == pytest.approx(w1_by_hand(base.ravel(), other.ravel()),
                                                                              rel=1e-9)
    assert row("other", "pooled", 0, "ks").distance == pytest.approx(ks_by_hand(base.ravel(), other.ravel()), rel=1e-9)
    # relative depth in thirds: base's 4 layers fall in bins 0, 1, 1, 2 and other's 2 layers in 0 and 2
    assert row("other", "depth", 2, "wasserstein").distance == pytest.approx(
        w1_by_hand(base[:, 3].ravel(), other[:, 1].ravel()), rel=1e-9)
    assert row("tuned", "depth", 1, "ks").distance == pytest.approx(
        ks_by_hand(base[:, 1:3].ravel(), tuned[:, 1:3].ravel()), rel=1e-9)
    assert row("tuned", "layer", 2, "wasserstein").distance == pytest.approx(
        w1_by_hand(base[:, 2].ravel(), tuned[:, 2].ravel()), rel=1e-9)
    assert not ((table.b == "other") & (table.view == "layer")).any()  # other depths: no layer by layer view
    assert not ((table.b == "other") & (table.view == "depth") & (table.level == 1)).any()  # no middle layer
    assert result.meta["views_by_pair"] == {"base vs tuned": ["pooled", "depth", "layer", "head"],
                                            "base vs other": ["pooled", "depth"]}


def test_the_null_the_verdicts_and_seeded_intervals(three_models):
    names = ["AHON (LN)", "AEQD"]
    result = compare_distributions(three_models, names=names, views=["pooled"], n_resamples=200, seed=3)
    again = compare_distributions(three_models, names=names, views=["pooled"], n_resamples=200, seed=3)
    other_seed = compare_distributions(three_models, names=names, views=["pooled"], n_resamples=200, seed=4)
    assert result.distances.equals(again.distances) and result.versus.equals(again.versus)
    assert not np.allclose(result.distances["low"], other_seed.distances["low"])
    as_value = compare_distributions(three_models, names=names, settings=DistributionSettings(
        views="pooled", n_resamples=200, seed=4), seed=3)  # a keyword overrides the value's field
    assert as_value.distances.equals(result.distances) and as_value.versus.equals(result.versus)
    assert result.meta["settings"] == {"views": ["pooled"], "depth_bins": 3, "shares": [0.1, 0.3],
                                       "n_resamples": 200, "seed": 3, "confidence": 0.95, "cdf_points": 200}
    with pytest.raises(InputError, match="unknown setting n_resample"):
        compare_distributions(three_models, n_resample=10)
    d = result.distances
    tuned, other = d[d.b == "tuned"], d[d.b == "other"]
    assert (tuned.verdict == "cannot tell apart").all()  # a copy with 1% noise: its excess interval holds 0
    assert ((tuned.low <= 0) & (tuned.high >= 0)).all()
    assert (other.verdict == "higher").all() and (other.p_value == 1 / 201).all()  # no permutation reaches it
    # the excess is the distance less the mean distance under swapping (recomputed here from the same swaps)
    data = PooledValues.of([(three_models[m].score("AEQD").double().numpy(), np.broadcast_to(
        ITEMS[:, None, None], (N_ITEMS * ROWS_PER_ITEM, *three_models[m].values.shape[1:3]))) for m in
        ("base", "other")], N_ITEMS)
    f = swap_draws(N_ITEMS, 200, 3).astype(float)
    null_w1, _ = data.distances({0: (1 - f, f), 1: (f, 1 - f)})
    r = other[(other.score == "AEQD") & (other.statistic == "wasserstein")].iloc[0]
    assert r.null_level == pytest.approx(null_w1.mean(), rel=1e-12)
    assert r.difference == pytest.approx(r.distance - null_w1.mean(), rel=1e-12)
    v = result.versus
    assert (v.verdict == "higher").all() and (v.a == "tuned").all() and (v.b == "other").all()


def test_shape_and_item_mismatches_are_refused(three_models):
    with pytest.raises(InputError, match="view 'layer' compares models of one number of layers"):
        compare_distributions(three_models, views=["pooled", "layer"], n_resamples=10)
    same_layers = np.random.default_rng(2).normal(size=(N_ITEMS * ROWS_PER_ITEM, 4, 2, 12))
    pair = {"base": three_models["base"], "narrow": scores(same_layers, "narrow")}
    with pytest.raises(InputError, match="view 'head' compares models of one layer x head shape"):
        compare_distributions(pair, views=["head"], n_resamples=10)
    layer_only = compare_distributions(pair, names=["AWFT"], views=["layer"], n_resamples=10)  # 4 layers each
    assert set(layer_only.distances.view) == {"layer"} and layer_only.heads.empty
    elsewhere = {"base": three_models["base"], "tuned": scores(three_models["tuned"].values.numpy(), task="other")}
    with pytest.raises(InputError, match="not scored on the same items"):
        compare_distributions(elsewhere, n_resamples=10)
    with pytest.raises(InputError, match="at least two models"):
        compare_distributions({"base": three_models["base"]})


def test_per_head_ranks_and_zeroing_overlap(three_models):
    pair = {m: three_models[m] for m in ("base", "tuned")}
    result = compare_distributions(pair, names=["AHON (LN)", "AWFT"], views=["head"], shares=[0.25],
                                   n_resamples=100, seed=0)
    h = result.heads
    for name in ("AHON (LN)", "AWFT"):
        a, b = (pair[m].score(name).double().numpy() for m in ("base", "tuned"))
        r = {q: h[(h.score == name) & (h.quantity == q)].iloc[0] for q in h.quantity.unique()}
        assert r["spearman_heads"].estimate == pytest.approx(
            stats.spearmanr(a.mean(0).ravel(), b.mean(0).ravel()).statistic, rel=1e-9)
        # each model's own threshold on its pooled values: the 25% quantile ('<' scores) or the 75% ('>', AWFT)
        q = 0.25 if DIRECTION[name] == "<" else 0.75
        za, zb = ((v < np.quantile(v, q)) if DIRECTION[name] == "<" else (v > np.quantile(v, q)) for v in (a, b))
        assert r["jaccard_rows"].estimate == pytest.approx((za & zb).sum() / (za | zb).sum(), rel=1e-9)
        k = round(0.25 * 12)
        top = [set(most_inactive(torch.from_numpy(v.mean(0)), DIRECTION[name], k)) for v in (a, b)]
        assert r["jaccard_static"].estimate == pytest.approx(len(top[0] & top[1]) / len(top[0] | top[1]))
        assert r["jaccard_rows"].chance == pytest.approx(0.25 / 1.75)
        assert all(r[x].low <= r[x].estimate + 1e-12 and r[x].estimate <= r[x].high + 1e-12 for x in r)


def test_answer_loss_is_the_answer_tokens_mean_negative_log_likelihood(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    from lens_heads.training.config import TrainConfig
    from lens_heads.training.example_data import Example
    from lens_heads.training.finetune import finetune
    from lens_heads.training.objectives import answer_loss
    from lens_heads.training.schedules import lr_at

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(config).eval()
    batch = [Example((3, 4, 5, 6, 7), 3, (7, 8)), Example((9, 10, 11), 1, (11, 12))]
    with torch.no_grad():
        loss = float(answer_loss(model, batch, pad_id=0))
        # plain full forward of each example alone, log-softmax over the vocabulary, the answer positions read
        logprobs = [torch.log_softmax(model(torch.tensor([e.tokens])).logits[0].double(), -1) for e in batch]
    nll = [-logprobs[b][e.first + k, t] for b, e in enumerate(batch) for k, t in enumerate(e.answer)]
    assert loss == pytest.approx(float(torch.stack(nll).mean()), rel=1e-5)  # float32 forward against float64 sums
    cfg = TrainConfig.finetune(steps=4, batch_size=2, lr=1e-2, warmup_steps=1, eval_every=2)
    assert [lr_at(s, cfg) for s in range(4)] == pytest.approx([1e-2, 1e-2, 1e-2 * 2 / 3, 1e-2 / 3])
    folder = tmp_path / "base"
    model.save_pretrained(folder)
    _tokenizer_files(folder)
    train = [Example((1, 2, 3, 4), 2, (4, 5)), Example((6, 7, 8), 1, (8, 9)), Example((1, 5, 9), 1, (9, 2))]
    result = finetune(folder, train, train[:2], tmp_path / "tuned", cfg, progress=False)
    assert len(result.train_loss) == 4 and result.eval_steps == [0, 2, 4]
    assert result.eval_loss[-1] < result.eval_loss[0]  # four steps at 1e-2 on three examples: it learns them
    tuned = LlamaForCausalLM.from_pretrained(tmp_path / "tuned")
    with torch.no_grad():
        assert float(answer_loss(tuned, train[:2], 0)) == pytest.approx(result.eval_loss[-1], rel=1e-5)
    again = finetune(folder, train, train[:2], tmp_path / "tuned", cfg, progress=False)  # reused, not retrained
    assert again.train_loss == result.train_loss
    with pytest.raises(InputError, match="answer"):
        Example((1, 5, 9), 2, (9, 2))  # position 3 would predict the second answer token: the row is one short
    with pytest.raises(InputError, match="another fine-tune"):
        finetune(folder, train, train[:1], tmp_path / "tuned", cfg, progress=False)


def _tokenizer_files(folder):
    """A minimal word-level tokenizer beside a tiny model, so the fine-tune can save one with the weights."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(50)}
    fast = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="w0")),
                                   pad_token="w0", eos_token="w1")
    fast.save_pretrained(folder)


def test_the_cdf_figure_draws_each_view_and_switches_between_them(three_models):
    from lens_heads.viz.score_figures import score_cdfs

    result = compare_distributions(three_models, names=["AHON", "AWFT"], n_resamples=10)
    fig = score_cdfs(result.cdfs, list(three_models), title="t")
    # pooled: 2 scores x 3 models; depth bins 0 and 2: 3 models, bin 1: base and tuned; 4 layers: base and tuned
    assert len(fig.data) == 2 * (3 + 3 + 2 + 3 + 4 * 2)
    buttons = fig.layout.updatemenus[0].buttons
    assert [b.label for b in buttons] == ["pooled over every layer", "relative depth 1/3", "relative depth 2/3",
                                          "relative depth 3/3", "layer 0", "layer 1", "layer 2", "layer 3"]
    assert sum(buttons[2].args[0]["visible"]) == 2 * 2 and sum(t.visible for t in fig.data) == 2 * 3
    x, q = result.cdfs["pooled"][0]["AWFT"]["other"]
    assert x[0] == pytest.approx(float(three_models["other"].score("AWFT").min()), rel=1e-6)
    assert q[0] == 0 and q[-1] == 1
    assert fig.layout.xaxis.type == "log" and fig.layout.xaxis2.type != "log"  # AHON is a raw norm, AWFT is not
