"""The Backend object (lens_heads.models.backends.backend): what each backend may do, and its forwards against the
model's own forward. The HookedTransformer side runs on tiny random models under TransformerLens 3.9; the bridge
side loads the embedded model under 4.x (.venv-bridge)."""

import pytest
import torch

from conftest import text_model
from lens_heads.models import backends
from lens_heads.models.backends import BRIDGE, HOOKED, backend, backend_of, tl_major

# The reassembled forward (residual stream, final norm, unembedding) is the same operations on the same values (equal
# to the bit on CPU float32); a cached step multiplies one query against cached keys, other shapes than the whole
# sequence's, so its float32 sums round differently: ~2e-6 on logits of ~4 here, covered with room for other BLAS.
ATOL, RTOL = 1e-5, 1e-5


@pytest.fixture(scope="module")
def llama():
    return text_model(n_ctx=32)  # with a tokenizer: the cached forward builds its attention mask with one


@pytest.mark.skipif(tl_major() >= 4, reason="HookedTransformer: TransformerLens 3.9 (.venv)")
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_hooked_backend_does_everything_and_its_forwards_are_the_models(arch, llama):
    from lens_heads.models.loading import tiny_model

    model = llama if arch == "llama" else tiny_model(arch, n_ctx=32, d_vocab=llama.cfg.d_vocab,
                                                     tokenizer=llama.tokenizer)
    assert backend(model) is HOOKED and backend_of(model) == "hooked"
    assert HOOKED.fuses_attention and HOOKED.packs_weights and HOOKED.starts_at_layer
    assert HOOKED.own_attention(model) is None  # the evaluator counts lens_heads's own fused and eager calls
    tokens = torch.randint(0, model.cfg.d_vocab, (2, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(tokens)
    mask[1, 5:] = 0
    with torch.no_grad():
        want = model(tokens, attention_mask=mask)
        whole = HOOKED.final_logits(model, HOOKED.run_to_resid(model, tokens, mask, stop=model.cfg.n_layers))
        middle = HOOKED.run_to_resid(model, tokens, mask, stop=1)
        resumed = HOOKED.run_to_resid(model, middle, mask, start=1, stop=model.cfg.n_layers)
        torch.testing.assert_close(whole, want, atol=ATOL, rtol=RTOL)
        torch.testing.assert_close(HOOKED.final_logits(model, resumed), want, atol=ATOL, rtol=RTOL)
        # cached generation: each step's logits after the cache equal the whole sequence's last position
        kv, seen = HOOKED.new_kv_cache(model), 0
        for end in (4, 5, 6):
            logits, kv = HOOKED.cached_logits(model, tokens[:1, seen:end], kv)
            seen = end
            torch.testing.assert_close(logits, model(tokens[:1, :end])[0, -1], atol=ATOL, rtol=RTOL)


@pytest.mark.skipif(tl_major() < 4, reason="TransformerBridge: TransformerLens 4.x (.venv-bridge)")
@pytest.mark.slow
def test_bridge_backend_runs_the_models_own_forward_and_refuses_to_start_mid_way():
    from lens_heads import load_model

    model = load_model()
    assert backend(model) is BRIDGE and backend_of(model) == "bridge"
    assert not (BRIDGE.fuses_attention or BRIDGE.packs_weights or BRIDGE.starts_at_layer)
    assert BRIDGE.own_attention(model).startswith("TransformerBridge attention: ")
    tokens = torch.tensor([[1, 504, 3458, 314, 260, 2911]])
    with torch.no_grad():
        want = model(tokens)
        got = BRIDGE.final_logits(model, BRIDGE.run_to_resid(model, tokens, None, stop=model.cfg.n_layers))
        # the Hugging Face forward against the same modules called one by one: float32 rounding of logits ~20
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)
        kv, seen = BRIDGE.new_kv_cache(model), 0
        for end in (4, 6):
            logits, kv = BRIDGE.cached_logits(model, tokens[:, seen:end], kv)
            seen = end
            torch.testing.assert_close(logits, model(tokens[:, :end])[0, -1], atol=1e-4, rtol=1e-5)
    with pytest.raises(ValueError, match="never starts a TransformerBridge at a layer"):
        backends.run_to_resid(model, tokens, None, start=1, stop=2)
