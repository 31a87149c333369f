"""Local (sliding-window) attention runs fused, a chunk of queries against its own window of keys, and the scores
read a windowed layer's rows by the same windows: on a tiny Gemma-3-shaped model (local and global layers with
their own rotary bases, per-head q/k norms, one key/value head for four query heads, window 4 over 24 tokens),
every value equals TransformerLens's eager attention, which masks the whole [query, key] pattern."""

import numpy as np
import pytest
import torch

from conftest import LOGLIK_TOL, assert_close_to_scale, text_model
from lens_heads import tiny_model
from lens_heads.data.tasks import load_task
from lens_heads.evaluation import fused_attention as fa
from lens_heads.evaluation.eval_settings import EvalSettings
from lens_heads.evaluation.evaluate import evaluate
from lens_heads.evaluation.prefix import QKV
from lens_heads.heads.scores import scores_of_layer
from lens_heads.heads.scoring import score_heads
from lens_heads.models import tl_internals as tl
from lens_heads.models.loading import expand_kv
from test_fused_attention import padded_batch  # every row longer than the window

WINDOW = 4


def gemma3_like(seed: int = 0):
    """Four layers, local, local, global, local (Gemma 3 alternates five local with one global)."""
    return tiny_model("llama", seed=seed, n_layers=4, n_ctx=32, n_key_value_heads=1, act_fn="gelu_pytorch_tanh",
                      use_qk_norm=True, use_local_attn=True, window_size=WINDOW,
                      attn_types=["local", "local", "global", "local"], rotary_base=1_000_000,
                      rotary_base_local=10_000, use_normalization_before_and_after=True)




def explicit_windowed(q, k, v, real, scale: float, window: int):
    """The masked softmax of the whole [query, key] scores in float64, as TransformerLens's local layer masks it."""
    q, k, v = (x.double() for x in (q, k, v))
    k, v = (x.repeat_interleave(q.shape[2] // x.shape[2], dim=2) for x in (k, v))
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    pos = torch.arange(q.shape[1])
    near = (pos[None, :] <= pos[:, None]) & (pos[None, :] > pos[:, None] - window)
    allowed = near[None, None] & real.bool()[:, None, None, :]
    pattern = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1).nan_to_num(0.0)
    return torch.einsum("bhqk,bkhd->bqhd", pattern, v)


@pytest.mark.floats
@pytest.mark.parametrize("query_chunk", [3, 5, 256])  # chunks smaller than, larger than and beyond the window
def test_windowed_z_is_the_masked_softmax(query_chunk):
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(4, 24, 4, 8, generator=gen)
    k, v = torch.randn(4, 24, 1, 8, generator=gen), torch.randn(4, 24, 1, 8, generator=gen)
    _, mask = padded_batch()
    got = fa.windowed_z(QKV(q, k, v, mask), scale=0.35, window=WINDOW, query_chunk=query_chunk)
    # float32 sums of at most 4 terms against float64: a few float32 roundoffs of the values' scale
    assert_close_to_scale(got, explicit_windowed(q, k, v, mask, 0.35, WINDOW))


@pytest.mark.floats
@pytest.mark.parametrize("query_chunk", [3, 256])
def test_local_layers_run_fused_and_equal_the_eager_forward(query_chunk, monkeypatch):
    monkeypatch.setattr(fa, "WINDOW_QUERY_CHUNK", query_chunk)
    model = gemma3_like()
    assert [tl.window(b.attn) for b in model.blocks] == [WINDOW, WINDOW, None, WINDOW]
    assert all(fa.eager_reason(b.attn) is None for b in model.blocks)
    tokens, mask = padded_batch()
    names = lambda name: name.endswith("hook_z")  # noqa: E731
    with torch.no_grad():
        eager_logits, eager = model.run_with_cache(tokens, attention_mask=mask, names_filter=names)
        with fa.fused_attention(model) as calls:
            fused_logits, fused = model.run_with_cache(tokens, attention_mask=mask, names_filter=names)
    assert calls.fused == model.cfg.n_layers and calls.eager == 0
    real = mask.bool()
    # SDPA sums in another order than the eager matmuls: float32 rounding, relative to each tensor's scale
    for layer in range(model.cfg.n_layers):
        name = f"blocks.{layer}.attn.hook_z"
        assert_close_to_scale(fused[name][real], eager[name][real], msg=name)
    assert_close_to_scale(fused_logits[real], eager_logits[real])


def test_the_eager_reference_is_windowed():
    """The eager pattern the tests compare against gives no weight a window or more back (else they prove nothing)."""
    model = gemma3_like()
    tokens, _ = padded_batch()
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens[:1], names_filter=lambda n: n.endswith("hook_pattern"))
    pos = torch.arange(tokens.shape[1])
    far = pos[None, :] <= pos[:, None] - WINDOW
    assert float(cache["blocks.0.attn.hook_pattern"][..., far].abs().max()) == 0.0
    assert float(cache["blocks.2.attn.hook_pattern"][..., far].abs().min()) > 0.0  # the global layer reaches back


@pytest.mark.floats
@pytest.mark.parametrize("query_chunk", [3, 5, 256])
def test_scores_of_windowed_layers_equal_the_eager_patterns(query_chunk, attention_calls):
    model = gemma3_like()
    tokens, mask = padded_batch()
    got = score_heads(model, tokens, attention_mask=mask, batch_size=4, progress=False, query_chunk=query_chunk)
    assert attention_calls == {"fused": [0, 1, 2, 3], "eager": []}  # no layer materialised its pattern
    keep = ("hook_pattern", "hook_v", "hook_z")
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, attention_mask=mask, names_filter=lambda n: n.endswith(keep))
    H = model.cfg.n_heads
    for layer in range(model.cfg.n_layers):
        a = f"blocks.{layer}.attn."
        want = scores_of_layer(cache[a + "hook_pattern"], expand_kv(cache[a + "hook_v"], H), cache[a + "hook_z"],
                               mask.bool(), causal=True)
        # fused float32 forward against the eager float32 one (1e-6 of the activations' scale, see conftest),
        # each score a sum or ratio of such numbers: within 1e-5 relative plus 1e-6
        torch.testing.assert_close(got.values[:, layer], want, rtol=1e-5, atol=1e-6, msg=lambda m: f"layer {layer}: {m}")


@pytest.mark.floats
def test_a_windowed_model_evaluates_row_by_row_as_eagerly():
    """Shared prefixes attend to a prefix without windows: a model with a windowed layer takes the row-by-row path,
    fused, and gets the eager log-likelihoods."""
    model = text_model(n_ctx=256, use_local_attn=True, window_size=WINDOW, attn_types=["local", "global"])
    task = load_task("arc_easy", n=4, seed=2, split="validation")
    fused = evaluate(model, task, progress=False)
    eager = evaluate(model, task, settings=EvalSettings(attention="eager"), progress=False)
    assert fused.meta["shared_prefix"] is None
    for x, y in zip(fused.items, eager.items):
        np.testing.assert_allclose(x.logprobs, y.logprobs, **LOGLIK_TOL)  # other matmul shapes: float32 rounding
