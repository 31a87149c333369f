"""Every TransformerLens hook point a plain forward fires also fires under lens_heads' fast paths (fused attention,
packed weights, logits unembedded only where read), with its normal shape: a user's hook never silently misses."""

from __future__ import annotations

import pytest
import torch

from conftest import assert_close_to_scale, text_model
from lens_heads import evaluate
from lens_heads.data.items import Item, Task
from lens_heads.evaluation.fused_attention import fused_attention
from lens_heads.evaluation.packed_weights import packed_weights

PROMPT = "Question: which colour is the sky on a clear summer day? Answer: it is blue"


@pytest.fixture(scope="module")
def model():
    return text_model(n_layers=2)


def _plain_shapes(model) -> tuple[dict[str, tuple], int]:
    """Every hook point's shape in a plain forward of the prompt, and the prompt's length: a dimension equal to it
    is read as a position dimension, so the length must differ from every model dimension (else a wrong shape in
    a model dimension would pass for a position)."""
    tokens = model.to_tokens([PROMPT])
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    n_pos, cfg = tokens.shape[1], model.cfg
    dims = {cfg.d_model, cfg.d_head, cfg.n_heads, cfg.d_mlp, cfg.d_vocab, cfg.n_key_value_heads or 0}
    assert n_pos not in dims, f"PROMPT has {n_pos} tokens, a dimension of the model: change its length"
    return {name: tuple(x.shape) for name, x in cache.items()}, n_pos


def _same_but_batch_and_positions(seen: tuple, plain: tuple, n_pos: int) -> bool:
    """Equal rank, and equal in every dimension that is neither the batch nor a position dimension."""
    return len(seen) == len(plain) and all(p == n_pos or s == p for s, p in zip(seen[1:], plain[1:]))


def test_every_hook_point_fires_with_its_shape_in_evaluate(model):
    plain, n_pos = _plain_shapes(model)
    items = [Item(id=f"q{i}", contexts=(f"Question {i}: the sky is",) * 2, continuations=(" blue", " green and wide"),
                  gold=0) for i in range(3)]
    task = Task(name="toy", split="test", shots=0, format="cloze", items=items, n_total=3, seed=0)
    fired = {}
    for name in model.hook_dict:
        seen = []
        evaluate(model, task, hooks=[(name, lambda x, hook: seen.append(tuple(x.shape)))], progress=False)
        if seen:
            fired[name] = seen
    assert set(fired) == set(plain), (set(plain) ^ set(fired))
    for name, shapes in fired.items():
        assert all(_same_but_batch_and_positions(s, plain[name], n_pos) for s in shapes), (name, shapes[0], plain[name])


@pytest.mark.floats
def test_under_fused_attention_and_packed_weights_each_hook_sees_the_plain_values(model):
    tokens = model.to_tokens([PROMPT, PROMPT[:-10]], padding_side="right")
    mask = (tokens != model.tokenizer.pad_token_id).long()
    mask[0] = 1
    with torch.no_grad():
        _, plain = model.run_with_cache(tokens, attention_mask=mask)
        for name in plain:
            if "hook_pattern" in name or "hook_attn_scores" in name:
                continue  # a hook on them makes that layer eager (tests/test_fused_attention.py)
            seen = {}
            with fused_attention(model), packed_weights(model):
                model.run_with_hooks(tokens, attention_mask=mask,
                                     fwd_hooks=[(name, lambda x, hook: seen.__setitem__(hook.name, x.clone()))])
            assert name in seen, name
            assert seen[name].shape == plain[name].shape, name
            real = mask.bool()  # other kernels (SDPA, one packed matmul): float32 rounding, to each hook's scale
            assert_close_to_scale(seen[name][real] if seen[name].dim() > 2 else seen[name],
                                  plain[name][real] if plain[name].dim() > 2 else plain[name], msg=name)
