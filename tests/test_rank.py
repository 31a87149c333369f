"""Attention rank: checked against an explicit numpy SVD and matrices whose rank is known by construction."""

import math

import numpy as np
import pytest
import torch

from lens_heads import tiny_model
from lens_heads.collapse.rank import approx_rank, attention_rank, mass_columns
from lens_heads.collapse.rank_settings import RankSettings
from lens_heads.plumbing.errors import InputError


def numpy_rank(A: np.ndarray, energy: float = 0.9) -> int:
    """The definition, spelled out: smallest k with sum_{i<=k} s_i^2 / sum s_i^2 >= energy."""
    s = np.linalg.svd(A.astype(np.float64), compute_uv=False)
    e = s**2 / np.sum(s**2)
    total = 0.0
    for k, value in enumerate(e, start=1):
        total += value
        if total >= energy - 1e-9:
            return k
    return len(e)


def numpy_mass_columns(A: np.ndarray, mass: float = 0.9) -> int:
    col = np.sort(A.sum(0))[::-1]
    running = 0.0
    for m, value in enumerate(col, start=1):
        running += value
        if running >= mass * col.sum() - 1e-9:
            return m
    return len(col)


def random_causal_attention(*shape, T, seed=0, temperature=3.0):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(*shape, T, T, generator=g) * temperature
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return scores.softmax(-1)


@pytest.mark.parametrize("energy", [0.5, 0.9, 0.99])
def test_approx_rank_matches_numpy_svd(energy):
    A = random_causal_attention(3, 4, T=24, seed=1)
    got = approx_rank(A, energy)
    assert got.shape == (3, 4)
    expected = np.array([[numpy_rank(A[i, j].numpy(), energy) for j in range(4)] for i in range(3)])
    np.testing.assert_array_equal(got.numpy(), expected)
    assert len(set(expected.ravel())) > 1  # the test sees matrices of different ranks


def test_rank_one_when_all_queries_attend_the_same_way():
    T = 16
    row = torch.softmax(torch.randn(T), 0)
    same_rows = row.expand(T, T).clone()  # every query: the same distribution over keys
    sink = torch.zeros(T, T)
    sink[:, 0] = 1.0  # every query attends to the first token only (a causal attention sink)
    assert approx_rank(same_rows).item() == 1
    assert approx_rank(sink).item() == 1
    assert approx_rank(sink, energy=0.999).item() == 1
    assert mass_columns(sink).item() == 1


@pytest.mark.parametrize("T", [7, 10, 32, 100])
def test_identity_attention_rank(T):
    # all singular values of the identity are 1, so k of them carry k/T of the energy: k* = ceil(0.9 T)
    assert approx_rank(torch.eye(T)).item() == math.ceil(0.9 * T - 1e-9)
    # a permutation (each query attends to one distinct key) has the same spectrum
    perm = torch.eye(T)[torch.randperm(T, generator=torch.Generator().manual_seed(0))]
    assert approx_rank(perm).item() == math.ceil(0.9 * T - 1e-9)
    assert mass_columns(torch.eye(T)).item() == math.ceil(0.9 * T - 1e-9)


def test_mass_columns_matches_explicit_count():
    A = random_causal_attention(5, T=20, seed=3)
    np.testing.assert_array_equal(mass_columns(A).numpy(), [numpy_mass_columns(a.numpy()) for a in A])


def test_approx_rank_rejects_bad_energy():
    with pytest.raises(ValueError, match="energy"):
        approx_rank(torch.eye(3), energy=1.5)


def _explicit_patterns(model, tokens):
    """Attention patterns through a full activation cache: an independent route to the same matrices."""
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_pattern"))
    return np.stack([cache[f"blocks.{l}.attn.hook_pattern"].numpy() for l in range(model.cfg.n_layers)], 1)


@pytest.mark.floats
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_attention_rank_per_input_matches_explicit_svd(arch, monkeypatch):
    model = tiny_model(arch, seed=1)
    tokens = torch.randint(0, model.cfg.d_vocab, (5, 18), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        patterns = _explicit_patterns(model, tokens)  # [n, L, H, T, T]
    # the analysis must stream through hooks, never through a full cache
    monkeypatch.setattr(model, "run_with_cache", lambda *a, **k: pytest.fail("attention_rank used run_with_cache"))
    profile = attention_rank(model, tokens, average=False, batch_size=2, progress=False)
    n, L, H = patterns.shape[:3]
    ranks = np.array([[[numpy_rank(patterns[i, l, h]) for h in range(H)] for l in range(L)] for i in range(n)])
    masses = np.array([[[numpy_mass_columns(patterns[i, l, h]) for h in range(H)] for l in range(L)] for i in range(n)])
    np.testing.assert_array_equal(profile.per_input, ranks)  # integers: the SVDs agree on every rank
    # float32 means of a few integers against numpy's float64 ones: a few u
    np.testing.assert_allclose(profile.per_head, ranks.mean(0), rtol=1e-6)
    np.testing.assert_allclose(profile.max_rank, ranks.mean(0).max(1), rtol=1e-6)
    np.testing.assert_allclose(profile.mean_rank, ranks.mean(0).mean(1), rtol=1e-6)
    np.testing.assert_allclose(profile.mass_columns, masses.mean(0).mean(1), rtol=1e-6)
    np.testing.assert_array_equal(profile.lazy, ranks.mean(0).max(1) <= 2)
    assert "<= 2" in profile.lazy_rule and profile.meta["average"] is False
    df = profile.to_dataframe()
    assert len(df) == L * H and set(df.columns) >= {"layer", "head", "rank", "lazy"}


@pytest.mark.floats
def test_layer_rank_takes_each_inputs_svd_then_the_layer_max_then_the_mean_with_its_band():
    """The paper's figures: per-input SVD ranks (hand-computed here with numpy), the max/mean over the layer's heads
    per input, then averaged over inputs (fractional) with one standard deviation over inputs as the band."""
    model = tiny_model("llama", seed=3)
    tokens = torch.randint(0, model.cfg.d_vocab, (7, 16), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        patterns = _explicit_patterns(model, tokens)
    n, L, H = patterns.shape[:3]
    ranks = np.array([[[numpy_rank(patterns[i, l, h]) for h in range(H)] for l in range(L)] for i in range(n)])
    profile = attention_rank(model, tokens, aggregation="layer_rank", batch_size=3, progress=False)
    np.testing.assert_allclose(profile.max_rank, ranks.max(2).mean(0))
    np.testing.assert_allclose(profile.max_rank_sd, ranks.max(2).std(0, ddof=1))
    np.testing.assert_allclose(profile.mean_rank, ranks.mean(2).mean(0))
    np.testing.assert_allclose(profile.mean_rank_sd, ranks.mean(2).std(0, ddof=1))
    np.testing.assert_allclose(profile.per_head, ranks.mean(0), rtol=1e-6)
    assert not np.allclose(profile.max_rank, ranks.mean(0).max(1))  # not the max of the per-head means ("rank")
    assert not np.allclose(profile.max_rank, np.round(profile.max_rank))  # fractional, as in the paper's figures
    assert profile.aggregation == "layer_rank" and profile.definition.startswith("aggregation 'layer_rank'")
    table = profile.layer_dataframe()
    assert set(table["aggregation"]) == {"layer_rank"} and {"max_rank_sd", "mean_rank_sd"} <= set(table.columns)
    assert profile.to_dict()["max_rank_sd"] == pytest.approx(ranks.max(2).std(0, ddof=1).tolist())
    assert attention_rank(model, tokens, progress=False).aggregation == "matrix"
    assert attention_rank(model, tokens, average=False, progress=False).aggregation == "rank"
    with pytest.raises(ValueError, match="unknown aggregation 'mean'"):
        attention_rank(model, tokens, aggregation="mean", progress=False)
    with pytest.raises(ValueError, match="average=False contradicts aggregation='matrix'"):
        attention_rank(model, tokens, average=False, aggregation="matrix", progress=False)


@pytest.mark.floats
def test_attention_rank_of_batch_average_matches_explicit_svd():
    model = tiny_model("gpt2", seed=2)
    tokens = torch.randint(0, model.cfg.d_vocab, (6, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        mean_patterns = _explicit_patterns(model, tokens).astype(np.float64).mean(0)  # [L, H, T, T]
    profile = attention_rank(model, tokens, batch_size=4, progress=False)  # the default: the paper's aggregation
    L, H = mean_patterns.shape[:2]
    expected = np.array([[numpy_rank(mean_patterns[l, h]) for h in range(H)] for l in range(L)])
    np.testing.assert_array_equal(profile.per_head, expected)
    np.testing.assert_array_equal(profile.max_rank, expected.max(1))  # "max rank": max over the layer's heads
    masses = np.array([[numpy_mass_columns(mean_patterns[l, h]) for h in range(H)] for l in range(L)])
    np.testing.assert_allclose(profile.mass_columns, masses.mean(1))
    assert profile.per_input is None and profile.meta["average"] is True
    assert "averaged over N=6 inputs" in profile.definition and "max over the heads" in profile.definition
    assert profile.to_dict()["definition"] == profile.definition


def test_uniform_attention_is_not_lazy_by_default():
    """Queries and keys at zero: every head averages its prefix uniformly, a matrix built here by hand."""
    model = tiny_model("gpt2", seed=4)
    with torch.no_grad():
        for block in model.blocks:
            block.attn.W_Q.zero_()
            block.attn.b_Q.zero_()
    T = 64
    uniform = np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]
    tokens = torch.randint(0, model.cfg.d_vocab, (3, T), generator=torch.Generator().manual_seed(0))
    profile = attention_rank(model, tokens, progress=False)
    assert numpy_rank(uniform) == 5
    np.testing.assert_array_equal(profile.max_rank, [numpy_rank(uniform)] * model.cfg.n_layers)
    assert not profile.lazy.any()
    assert attention_rank(model, tokens, lazy_rank=5, progress=False).lazy.all()
    by_value = attention_rank(model, tokens, settings=RankSettings(lazy_rank=5, energy=0.5), energy=0.9, progress=False)
    assert by_value.lazy.all() and by_value.meta["settings"] == {"aggregation": "matrix", "energy": 0.9, "mass": 0.9,
                                                                 "lazy_rank": 5}
    np.testing.assert_array_equal(by_value.per_head, profile.per_head)  # the keyword's energy, not the value's
    for bad, message in ((dict(energy=0.0), "energy must lie"), (dict(aggregation="mean"), "unknown aggregation"),
                         (dict(lazy=2), "unknown setting lazy")):
        with pytest.raises(InputError, match=message):
            attention_rank(model, tokens, progress=False, **bad)


@pytest.mark.parametrize("batch_size", [1, 8])  # each input in a batch of its own, or short padded to 15 tokens
def test_padding_does_not_change_the_rank(batch_size):
    model = tiny_model("gpt2", seed=3)
    g = torch.Generator().manual_seed(2)
    short, long = torch.randint(0, model.cfg.d_vocab, (9,), generator=g), torch.randint(0, model.cfg.d_vocab, (15,), generator=g)
    together = attention_rank(model, [short, long], average=False, batch_size=batch_size, progress=False)
    with torch.no_grad():
        alone = _explicit_patterns(model, short[None])[0]  # [L, H, 9, 9]
    L, H = alone.shape[:2]
    expected = np.array([[numpy_rank(alone[l, h]) for h in range(H)] for l in range(L)])
    np.testing.assert_array_equal(together.per_input[0], expected)
    assert together.meta["min_length"] == 9 and together.meta["max_length"] == 15


def test_embedded_model_profile(smollm):
    tokens = torch.randint(100, 40000, (2, 12), generator=torch.Generator().manual_seed(0))
    profile = attention_rank(smollm, tokens, average=False, progress=False)
    assert profile.per_head.shape == (smollm.cfg.n_layers, smollm.cfg.n_heads)
    with torch.no_grad():
        _, cache = smollm.run_with_cache(tokens, names_filter="blocks.5.attn.hook_pattern", stop_at_layer=6)
    layer5 = cache["blocks.5.attn.hook_pattern"].numpy()
    expected = np.array([[numpy_rank(layer5[i, h]) for h in range(smollm.cfg.n_heads)] for i in range(2)])
    np.testing.assert_array_equal(profile.per_input[:, 5], expected)
