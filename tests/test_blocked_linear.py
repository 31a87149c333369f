"""Products by weights packed into oneDNN's blocked layout: the float64 product up to float32 rounding, whatever the
rows, and the plain product wherever the blocked one does not apply (gradients, other dtypes, oneDNN turned off)."""

import pytest
import torch

from lens_heads.evaluation.blocked_linear import available, linear

# float32 sums of 64 products of unit-scale terms, in any order: a few units of 2^-24 of the sum of |terms|
ROUNDING = 64 * 2.0 ** -24


def reference(x, w, b):
    out = x.double() @ w.double().T
    return out if b is None else out + b.double()


@pytest.mark.floats
@pytest.mark.parametrize("rows", [1, 7, 600])  # fewer and more rows than the blocking is chosen for
@pytest.mark.parametrize("with_bias", [False, True])
def test_blocked_product_equals_the_float64_product(rows, with_bias):
    gen = torch.Generator().manual_seed(rows)
    w, b = torch.randn(48, 64, generator=gen), torch.randn(48, generator=gen)
    x = torch.randn(2, rows, 64, generator=gen)
    with torch.no_grad():
        product = linear(w, b if with_bias else None)
        out = product(x)
    assert product.blocked is not None  # torch's CPU wheels carry oneDNN: the blocked path is what ran
    bound = ROUNDING * (x.abs().double() @ w.abs().double().T + (b.abs().double() if with_bias else 0))
    assert out.shape == (2, rows, 48)
    assert bool(((out.double() - reference(x, w, b if with_bias else None)).abs() <= bound).all())


def test_the_plain_product_runs_where_the_blocked_one_does_not_apply():
    gen = torch.Generator().manual_seed(0)
    w, x = torch.randn(8, 16, generator=gen), torch.randn(3, 16, generator=gen)
    with torch.no_grad():
        product = linear(w)
    with torch.enable_grad():  # a gradient must reach x: the plain product, differentiable
        xg = x.clone().requires_grad_()
        out = product(xg)
        out.sum().backward()
    assert torch.equal(out.detach(), torch.nn.functional.linear(x, w))
    assert torch.allclose(xg.grad, w.sum(0).expand(3, -1))
    with torch.no_grad(), torch.backends.mkldnn.flags(enabled=False):
        assert torch.equal(product(x), torch.nn.functional.linear(x, w))
    with torch.no_grad():
        assert not available(w.double())
    with torch.enable_grad():
        assert linear(w).blocked is None and not available(w)  # packed under grad: nothing to pack for


@pytest.mark.floats
def test_a_transposed_weight_is_packed_without_a_copy_beside_the_blocked_one():
    """TransformerLens keeps its MLP and unembedding weights [in, out]: packed from their transposed view, the product
    keeps that view for the plain path (the memory of one copy, not two) and both paths give the product."""
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(64, 48, generator=gen).T  # [out, in] as a view of an [in, out] tensor
    x = torch.randn(5, 64, generator=gen)
    with torch.no_grad():
        product = linear(w)
        bound = ROUNDING * (x.abs().double() @ w.abs().double().T)
        assert product.blocked is not None and product.weight.data_ptr() == w.data_ptr()
        for out in (product(x), _plain(product, x)):
            assert bool(((out.double() - reference(x, w, None)).abs() <= bound).all())


def _plain(product, x):
    with torch.backends.mkldnn.flags(enabled=False):
        return product(x)
