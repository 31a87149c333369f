"""Fast blocks (one norm per sublayer, one product for queries, keys and values, grouped-query attention without
copied K/V, a stacked gate/input product): per family of tests/families.py, the same logits, log-likelihoods and
zeroing decisions as TransformerLens's eager forward, within float32 rounding, with and without per-input head
zeroing on ``hook_z``."""

import contextlib

import numpy as np
import pytest
import torch

from conftest import LOGLIK_TOL, assert_close_to_scale, tiny_tokenizer
from families import FAMILIES, INPUTS, PAD, REFUSED, build_folder, load_hf
from lens_heads import load_model, static_zeroing, threshold_zeroing
from lens_heads.data.inputs import right_pad
from lens_heads.data.items import Item, Task
from lens_heads.evaluation.evaluate import evaluate
from lens_heads.evaluation.fast_blocks import fast_blocks, norm, slow_reason
from lens_heads.evaluation.fused_attention import fused_attention
from lens_heads.evaluation.packed_weights import packed_weights
from lens_heads.models.backends import default_backend
from test_families import _threshold

pytestmark = pytest.mark.skipif(default_backend() != "hooked", reason="fast blocks replace HookedTransformer's blocks")
HOOKED = [f for f in FAMILIES if (f, "hooked") not in REFUSED]
# The families whose blocks are plain pre-norm blocks (OLMo-2 normalises after each sublayer, Gemma before and after:
# their own forwards)
FAST = {"llama-3", "qwen2.5", "qwen3", "mistral", "gpt-2"}


@pytest.fixture(scope="module")
def family_model(tmp_path_factory):
    loaded: dict = {}

    def get(family: str, text: bool = False):
        """The family's tiny model; ``text``: speaking the tests' tiny BPE tokenizer (for tasks of text items)."""
        if (family, text) not in loaded:
            folder = build_folder(family, tmp_path_factory.mktemp(family), tokenizer=tiny_tokenizer() if text else None)
            loaded[family, text] = load_model(str(folder), device="cpu")
            loaded[family, text].lens_heads_folder = folder
        return loaded[family, text]

    return get


def fast_path(model) -> contextlib.ExitStack:
    """The evaluator's forward context: packed weights, fused attention, fast blocks."""
    stack = contextlib.ExitStack()
    for ctx in (packed_weights(model), fused_attention(model), fast_blocks(model)):
        stack.enter_context(ctx)
    return stack


def head_mask_hooks(model, seed: int):
    """Per-input head zeroing on every layer's ``hook_z``: a random 0/1 mask per (row, head)."""
    gen = torch.Generator().manual_seed(seed)
    masks = [(torch.rand(len(INPUTS), model.cfg.n_heads, generator=gen) > 0.4).float()
             for _ in range(model.cfg.n_layers)]
    return [(f"blocks.{layer}.attn.hook_z", lambda z, hook, m=m: z * m[:, None, :, None])
            for layer, m in enumerate(masks)]


@pytest.mark.floats
@pytest.mark.parametrize("zeroing", [False, True])
@pytest.mark.parametrize("family", HOOKED)
def test_fast_forward_equals_eager_per_family(family, zeroing, family_model):
    model = family_model(family)
    assert (all(slow_reason(b) is None for b in model.blocks)) == (family in FAST), \
        [slow_reason(b) for b in model.blocks]
    tokens, mask = right_pad(INPUTS, PAD)
    mask = mask.long()
    hooks = head_mask_hooks(model, seed=1) if zeroing else []
    with torch.no_grad(), model.hooks(fwd_hooks=hooks):
        eager = model(tokens, attention_mask=mask)
        with fast_path(model):
            swapped = sum("forward" in vars(b) for b in model.blocks)
            got = model(tokens, attention_mask=mask)
    assert swapped == (model.cfg.n_layers if family in FAST else 0)
    assert all("forward" not in vars(b) for b in model.blocks)  # the blocks' own forwards are back
    real = mask.bool()
    # float32: ATen's norms, one stacked product and SDPA sum in other orders than the eager steps (conftest)
    assert_close_to_scale(got[real], eager[real])


@pytest.mark.floats
@pytest.mark.parametrize("family", HOOKED)
def test_threshold_zeroing_decides_as_plain_hugging_face_in_fast_blocks(family, family_model):
    """The per-input threshold zeroing of test_families (AWFT reads the pattern by query rows, AVVN the values,
    AHON (LN) the head outputs; each layer decided on the stream zeroed before it) in the evaluator's forward: the
    same (input, layer, head) zeroed as in plain Hugging Face at a threshold no score comes within 1e-4 of, and the
    same logits as the eager forward."""
    model = family_model(family)
    hf = load_hf(model.lens_heads_folder)
    tokens, mask = right_pad(INPUTS, PAD)
    for name in ("AWFT", "AVVN", "AHON (LN)"):
        threshold, want, _ = _threshold(hf, name)
        (eager, eager_logits), (got, logits) = (_zeroing(model, name, threshold, tokens, mask, fast=f)
                                                for f in (False, True))
        assert torch.equal(got, want), (name, got, want)
        assert torch.equal(eager, want), name
        real = mask.bool()
        assert_close_to_scale(logits[real], eager_logits[real])


def _zeroing(model, name: str, threshold: float, tokens, mask, *, fast: bool):
    ablation = threshold_zeroing(model, name, float(threshold), query_chunk=3)
    with torch.no_grad(), fast_path(model) if fast else contextlib.nullcontext(), \
            model.hooks(fwd_hooks=ablation.hooks), ablation.batch(mask, first=0):
        logits = model(tokens, attention_mask=mask.long())
    return ablation.zeroed(), logits


def text_task() -> Task:
    """Cloze items in the tiny tokenizer's text (one row per choice, answers of one to three words)."""
    items = [Item("sky", ("The sky is",) * 3, (" blue", " green", " very loud today"), 0),
             Item("water", ("Water is",) * 2, (" wet", " dry and hot"), 1),
             Item("cat", ("A cat likes to",) * 2, (" sleep", " fly"), 0)]
    return Task(name="toy", split="test", shots=0, format="cloze", items=items, n_total=len(items), seed=0)


@pytest.mark.floats
@pytest.mark.parametrize("family", HOOKED)
def test_evaluate_log_likelihoods_equal_the_eager_path(family, family_model):
    """The evaluator's fast path (shared prefixes, fused attention, fast blocks, packed weights) against its eager
    path (row by row in TransformerLens's blocks and attention), unablated and under a static zeroing on hook_z."""
    model = family_model(family, text=True)
    task = text_task()
    for hooks in (lambda: [], lambda: [static_zeroing(model, [(0, 1), (1, 2)])]):
        eager = evaluate(model, task, hooks=hooks(), batch_size=4, progress=False, attention="eager")
        got = evaluate(model, task, hooks=hooks(), batch_size=4, progress=False)
        for a, b in zip(eager.items, got.items):
            np.testing.assert_allclose(b.logprobs, a.logprobs, **LOGLIK_TOL)


def test_a_hook_on_a_norm_runs_the_block_as_eagerly(family_model):
    """ln1's hook_normalized fires three times per eager block (query, key and value inputs): a fast block with a
    hook there runs its own forward, so the hook sees what it sees eagerly."""
    model = family_model("llama-3")
    tokens, mask = right_pad(INPUTS, PAD)
    seen: dict[str, list] = {"eager": [], "fast": []}
    for where in seen:
        hook = ("blocks.1.ln1.hook_normalized", lambda x, hook, where=where: seen[where].append(x.clone()))
        with torch.no_grad(), model.hooks(fwd_hooks=[hook]):
            if where == "fast":
                with fast_path(model):
                    model(tokens, attention_mask=mask.long())
            else:
                model(tokens, attention_mask=mask.long())
    assert len(seen["fast"]) == len(seen["eager"]) == 3
    for a, b in zip(seen["fast"], seen["eager"]):
        assert_close_to_scale(a, b)


@pytest.mark.floats
@pytest.mark.parametrize("family", ["llama-3", "gpt-2"])
def test_one_pass_norm_equals_the_formula_in_float64(family, family_model):
    """The norms against their formula in float64: RMSNorm x / sqrt(mean x^2 + eps) * w, LayerNorm centred first
    and plus b."""
    model = family_model(family)
    ln = model.blocks[0].ln1
    x = torch.randn(3, 5, model.cfg.d_model, generator=torch.Generator().manual_seed(0))
    xd = x.double()
    if family == "gpt-2":
        xd = xd - xd.mean(-1, keepdim=True)
    want = xd / (xd.pow(2).mean(-1, keepdim=True) + ln.eps).sqrt() * ln.w.double()
    if family == "gpt-2":
        want = want + ln.b.double()
    with torch.no_grad():
        assert_close_to_scale(norm(ln, x), want, rel=1e-6)
