"""Per query row statistics (first-token weight, entropy) from one fused attention's log-sum-exp and by chunks of
rows, against the softmax written out in float64."""

import pytest
import torch

from lens_heads.heads.attention_rows import QueryKeys, fused_row_statistics, fused_statistics_apply, row_statistics


def reference(q, k, real, attn_scale: float, causal: bool):
    """[batch, head, q] first-token weights and entropies of the float64 softmax over the allowed keys."""
    s = torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double()) / attn_scale
    keep = real[:, None, None, :].expand_as(s).clone()
    if causal:
        keep &= torch.ones(s.shape[-2:], dtype=torch.bool).tril()
    A = torch.softmax(s.masked_fill(~keep, float("-inf")), -1).nan_to_num(0.0)  # a row with no allowed key: 0
    entropy = -torch.where(A > 0, A * A.log(), torch.zeros_like(A)).sum(-1)
    first = real.int().argmax(1)
    return A[torch.arange(A.shape[0]), :, :, first], entropy


def source(seed: int = 0):
    """Two inputs of 12 positions, 3 heads: one whole, one left-padded by 4; keys sharing a large component and
    sharp rows, as trained models' do."""
    g = torch.Generator().manual_seed(seed)
    q = 3 * torch.randn(2, 12, 3, 8, generator=g)
    k = torch.randn(2, 12, 3, 8, generator=g) + 4 * torch.randn(8, generator=g)
    real = torch.ones(2, 12, dtype=torch.bool)
    real[1, :4] = False
    return q, k, real


@pytest.mark.floats
@pytest.mark.parametrize("padding", ["left", "right"])
@pytest.mark.parametrize("causal", [True, False])
def test_fused_and_chunked_rows_match_the_float64_softmax(causal, padding):
    q, k, real = source()
    if padding == "right":
        real = real.flip(1)
    rows = QueryKeys(q, k, real, attn_scale=2.0, causal=causal)
    assert fused_statistics_apply(rows)  # this CPU's flash attention returns the log-sum-exp
    first = real.int().argmax(1)
    want_first, want_entropy = reference(q, k, real, 2.0, causal)
    read = real[:, None, :].expand_as(want_entropy)  # the rows a score reads: real queries
    for got in (fused_row_statistics(rows, first), row_statistics(rows, first, causal=causal, query_chunk=5)):
        # float32 scores of size ~50: their rounding (~1e-5) moves a log-probability by as much, and the
        # entropy, a difference of such numbers, by a few times that
        torch.testing.assert_close(got.first_weight[read].double(), want_first[read], rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(got.entropy[read].double(), want_entropy[read], rtol=1e-4, atol=5e-5)
    fused = fused_row_statistics(rows, first)
    if causal:  # a row with one allowed key: all its weight on it and entropy 0, exactly as the softmax gives
        ones = [(0, 0), (1, 4)] if padding == "left" else [(0, 0), (1, 0)]
        for b, i in ones:
            assert bool((fused.first_weight[b, :, i] == 1).all()) and bool((fused.entropy[b, :, i] == 0).all())
    assert bool((fused.entropy[read] >= 0).all())
    if causal and padding == "left":  # the padding queries before the first token: no allowed key, all zero
        assert bool((fused.first_weight[1, :, :4] == 0).all()) and bool((fused.entropy[1, :, :4] == 0).all())


def test_rows_with_a_prefix_of_keys_take_the_chunks():
    """More keys than queries (a shared prefix's): the fused attention's causal mask would align them wrongly."""
    q, k, real = source()
    assert not fused_statistics_apply(QueryKeys(q[:, 4:], k, real, attn_scale=2.0, causal=True))
