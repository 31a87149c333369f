"""Packed weights: the unembedding and gated MLPs give TransformerLens's own outputs and hook values, follow weights
changed in place (also across the blocks of a shared_layouts scope), and leave gradients to the weights intact."""

import pytest
import torch

from conftest import assert_close_to_scale
from lens_heads import tiny_model
from lens_heads.evaluation.fused_attention import fused_attention
from lens_heads.evaluation.packed_weights import packed_weights, shared_layouts


def model_with_bias(seed=0):
    """A tiny llama (gated MLP) whose unembedding has a non-zero bias, and one whose bias stays zero."""
    plain = tiny_model("llama", seed=seed, d_vocab=97)
    biased = tiny_model("llama", seed=seed, d_vocab=97)
    with torch.no_grad():
        biased.unembed.b_U.copy_(torch.randn(97, generator=torch.Generator().manual_seed(1)))
    return plain, biased


def run(model, tokens):
    seen = {}
    names = ("blocks.0.mlp.hook_pre", "blocks.0.mlp.hook_pre_linear", "blocks.1.mlp.hook_post", "unembed.hook_in",
             "unembed.hook_out")
    hooks = [(name, lambda x, hook: seen.__setitem__(hook.name, x.clone())) for name in names]
    return model.run_with_hooks(tokens, fwd_hooks=hooks), seen


@pytest.mark.floats
def test_outputs_and_hooks_equal_the_plain_modules():
    tokens = torch.randint(0, 97, (3, 11), generator=torch.Generator().manual_seed(2))
    for model in model_with_bias():
        with torch.no_grad():
            plain, plain_seen = run(model, tokens)
            with packed_weights(model):
                packed, packed_seen = run(model, tokens)
                assert "forward" in vars(model.unembed) and "forward" in vars(model.blocks[0].mlp)
        # one matmul over the packed weights where the plain modules run two: equal here, float32 rounding of
        # each tensor's scale where a BLAS blocks the wider matmul otherwise
        assert_close_to_scale(packed, plain)
        assert packed_seen.keys() == plain_seen.keys() and len(plain_seen) == 5
        for name in plain_seen:
            assert_close_to_scale(packed_seen[name], plain_seen[name], msg=name)
        assert "forward" not in vars(model.unembed)  # restored


@pytest.mark.floats
def test_a_weight_changed_in_place_is_laid_out_again():
    model, _ = model_with_bias()
    tokens = torch.randint(0, 97, (2, 7))
    with torch.no_grad(), packed_weights(model):
        before = model(tokens)
        model.blocks[0].mlp.W_in.mul_(2.0)
        model.unembed.b_U.add_(1.0)  # a bias that was zero is no longer left out
        after = model(tokens)
    with torch.no_grad():
        expected = model(tokens)
    assert not torch.allclose(before, after)
    assert_close_to_scale(after, expected)


@pytest.mark.floats
def test_shared_layouts_follow_weights_changed_or_replaced_between_blocks():
    """Blocks of forwards inside one shared_layouts scope reuse the layouts, yet each block multiplies by the weights
    as they are when it runs: changed in place (W_in, W_Q) or replaced by another tensor (W_O)."""
    model, _ = model_with_bias()
    tokens = torch.randint(0, 97, (2, 7), generator=torch.Generator().manual_seed(3))

    def laid_out():
        with packed_weights(model), fused_attention(model):
            return model(tokens)

    with torch.no_grad(), shared_layouts():
        laid_out()
        model.blocks[0].mlp.W_in.mul_(2.0)
        model.blocks[1].attn.W_Q.mul_(-1.0)
        model.blocks[0].attn.W_O = torch.nn.Parameter(model.blocks[0].attn.W_O.detach() * 3.0)
        after = laid_out()
        expected = model(tokens)  # the eager modules on the changed weights
    assert_close_to_scale(after, expected)


@pytest.mark.floats
def test_gradients_reach_the_weights_as_without_packing():
    model, _ = model_with_bias()
    tokens = torch.randint(0, 97, (2, 7))
    grads = []
    for packed in (False, True):
        model.zero_grad()
        with packed_weights(model) if packed else torch.enable_grad():
            model(tokens).logsumexp(-1).sum().backward()
        grads.append([p.grad.clone() for p in (model.unembed.W_U, model.blocks[1].mlp.W_gate)])
    for a, b in zip(*grads):
        assert a.abs().sum() > 0
        assert_close_to_scale(b, a)  # the backward of the packed matmul sums in its own order
