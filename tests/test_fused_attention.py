"""Fused attention: same logits and hook values as TransformerLens's eager attention, eager wherever the pattern is
read, and a hand-written masked softmax as the reference for the SDPA call itself."""

import math

import numpy as np
import pytest
import torch

from conftest import LOGLIK_TOL, assert_close_to_scale, text_model
from lens_heads import tiny_model
from lens_heads.ablation.hooks import static_zeroing, threshold_zeroing
from lens_heads.ablation.random_draws import random_zeroing
from lens_heads.data.tasks import load_task
from lens_heads.evaluation.evaluate import evaluate
from lens_heads.evaluation.fused_attention import eager_reason, fused_attention, sdpa_z
from lens_heads.evaluation.prefix import QKV

ARCHS = {
    "gpt2": dict(scale_attn_by_inverse_layer_idx=True),  # GPT-2's per-layer score scaling folds into attn_scale
    "llama": {},  # RMSNorm, rotary, grouped-query attention (2 KV heads for 4 query heads)
}


def padded_batch(seed=0):
    """Four rows: no padding, right padding, left padding, and a single real token."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 97, (4, 24), generator=gen)
    mask = torch.ones(4, 24, dtype=torch.long)
    mask[1, 17:] = 0
    mask[2, :6] = 0
    mask[3, 1:] = 0
    return tokens, mask


@pytest.mark.floats
@pytest.mark.parametrize("arch", ARCHS)
def test_fused_logits_equal_eager_with_padding(arch):
    model = tiny_model(arch, seed=1, **ARCHS[arch])
    assert all(eager_reason(block.attn) is None for block in model.blocks)
    tokens, mask = padded_batch()
    with torch.no_grad():
        eager = model(tokens, attention_mask=mask)
        with fused_attention(model) as calls:
            fused = model(tokens, attention_mask=mask)
        plain_eager = model(tokens)
        with fused_attention(model):
            plain_fused = model(tokens)  # no mask: SDPA's own causal path
    assert calls.fused == model.cfg.n_layers and calls.eager == 0
    real = mask.bool()  # SDPA's kernel sums in another order than the eager matmuls: float32 rounding
    assert_close_to_scale(fused[real], eager[real])
    assert_close_to_scale(plain_fused, plain_eager)
    assert all("forward" not in vars(block.attn) for block in model.blocks)  # the eager forward is back


@pytest.mark.floats
@pytest.mark.parametrize("arch", ARCHS)
def test_hooks_inside_attention_fire_with_the_eager_values(arch):
    model = tiny_model(arch, seed=2, **ARCHS[arch])
    tokens, mask = padded_batch(seed=3)
    names = ["hook_q", "hook_k", "hook_v", "hook_z"] + (["hook_rot_q", "hook_rot_k"] if arch == "llama" else [])
    names = [f"blocks.{layer}.attn.{name}" for layer in range(model.cfg.n_layers) for name in names]
    names.append("blocks.1.hook_attn_out")

    def record(store):
        return [(name, lambda x, hook, name=name: store.__setitem__(name, x.clone())) for name in names]

    def zero_head_1(z, hook):  # a hook that replaces z must change the output exactly as eagerly
        z = z.clone()
        z[:, :, 1] = 0
        return z

    seen_eager, seen_fused = {}, {}
    with torch.no_grad():
        eager = model.run_with_hooks(tokens, attention_mask=mask, fwd_hooks=[("blocks.0.attn.hook_z", zero_head_1)]
                                     + record(seen_eager))
        with fused_attention(model) as calls:
            fused = model.run_with_hooks(tokens, attention_mask=mask,
                                         fwd_hooks=[("blocks.0.attn.hook_z", zero_head_1)] + record(seen_fused))
    assert calls.fused == model.cfg.n_layers
    assert set(seen_fused) == set(seen_eager) == set(names)
    real = mask.bool()
    for name in names:
        assert seen_fused[name].shape == seen_eager[name].shape, name
        assert_close_to_scale(seen_fused[name][real], seen_eager[name][real], msg=name)  # each to its own scale
    assert_close_to_scale(fused[real], eager[real])


@pytest.mark.floats
def test_a_hook_on_the_pattern_or_scores_makes_that_layer_eager():
    model = tiny_model("llama", seed=4)
    tokens, mask = padded_batch(seed=5)
    patterns = []
    with torch.no_grad(), fused_attention(model) as calls:
        model.run_with_hooks(tokens, attention_mask=mask,
                             fwd_hooks=[("blocks.1.attn.hook_pattern", lambda p, hook: patterns.append(p))])
    assert (calls.fused, calls.eager) == (1, 1)  # layer 0 fused, layer 1 eager
    assert len(patterns) == 1 and patterns[0].shape == (4, 4, 24, 24)
    torch.testing.assert_close(patterns[0].sum(-1)[mask.bool()[:, None].expand(-1, 4, -1)],  # 24 terms of <= 1
                               torch.ones(4 * int(mask.sum())), atol=1e-5, rtol=0)
    with torch.no_grad(), fused_attention(model) as calls:
        _, cache = model.run_with_cache(tokens, attention_mask=mask)  # run_with_cache hooks every pattern
    assert (calls.fused, calls.eager) == (0, model.cfg.n_layers)
    assert "blocks.0.attn.hook_attn_scores" in cache


def test_features_sdpa_does_not_express_stay_eager():
    model = tiny_model("gpt2", seed=0, attn_scores_soft_cap=30.0)
    assert "soft-capped" in eager_reason(model.blocks[0].attn)
    tokens, mask = padded_batch()
    with torch.no_grad(), fused_attention(model) as calls:
        model(tokens, attention_mask=mask)
    assert calls.fused == 0  # not swapped at all: the layer's own forward ran


@pytest.mark.floats
def test_sdpa_z_against_a_hand_written_masked_softmax():
    gen = torch.Generator().manual_seed(0)
    b, p, h, kv, d = 3, 7, 4, 2, 5
    q, k, v = (torch.randn(b, p, n, d, generator=gen, dtype=torch.float64) for n in (h, kv, kv))
    mask = torch.ones(b, p, dtype=torch.long)
    mask[1, 5:] = 0
    mask[2, :3] = 0
    scale = 0.37
    z = sdpa_z(QKV(q, k, v, mask), scale=scale)
    for i in range(b):
        for head in range(h):
            g = head // (h // kv)  # consecutive query heads share a KV head
            for t in range(p):
                keys = [j for j in range(t + 1) if mask[i, j]]
                if not keys:  # left padding before the first real token: nothing to attend to
                    assert torch.all(z[i, t, head] == 0)
                    continue
                logits = torch.stack([q[i, t, head] @ k[i, j, g] * scale for j in keys])
                weights = torch.softmax(logits, 0)
                expected = sum(w * v[i, j, g] for w, j in zip(weights, keys))
                torch.testing.assert_close(z[i, t, head], expected)
    assert not math.isnan(float(z.sum()))


@pytest.fixture(scope="module")
def tiny_text_model():
    return text_model(n_layers=3)


@pytest.mark.slow
def test_evaluate_fuses_unless_a_hook_reads_the_pattern(tiny_text_model):
    model = tiny_text_model
    task = load_task("arc_easy", split="validation", n=3, seed=1)
    cases = {
        "baseline": lambda: [],
        "static": lambda: [static_zeroing(model, [(0, 1), (2, 3)])],
        "random": lambda: [random_zeroing(model, 0.3, seed=1)],
        "threshold AHON (LN)": lambda: [threshold_zeroing(model, "AHON (LN)", 1.0)],  # reads z only
        "threshold AVVN": lambda: [threshold_zeroing(model, "AVVN", 1e9)],  # reads v only
        # reads the pattern by query rows from the queries and keys (lens_heads.heads.attention_rows): still fused
        "threshold AWFT": lambda: [threshold_zeroing(model, "AWFT", 0.5)],
        "a hook on layer 0's pattern": lambda: [("blocks.0.attn.hook_pattern", lambda pattern, hook=None: None)],
    }
    for name, hooks in cases.items():
        eager = evaluate(model, task, hooks=hooks(), batch_size=4, progress=False, attention="eager")
        fused = evaluate(model, task, hooks=hooks(), batch_size=4, progress=False)
        n_calls = model.cfg.n_layers * fused.meta["forward_passes"]  # shared prefixes: more, smaller forwards
        for a, b in zip(eager.items, fused.items):
            np.testing.assert_allclose(a.logprobs, b.logprobs, **LOGLIK_TOL, err_msg=name)
        # the hooked layer runs eagerly in every forward, the others fused
        fused_calls = n_calls - fused.meta["forward_passes"] if name == "a hook on layer 0's pattern" else n_calls
        assert fused.meta["attention"].startswith(f"fused SDPA in {fused_calls} of {n_calls} "), name
        assert eager.meta["attention"] == "eager"
    with pytest.raises(ValueError, match="attention must be one of"):
        evaluate(model, task, attention="flash", progress=False)
