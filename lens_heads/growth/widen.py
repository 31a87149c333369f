"""lens_heads' half-width warm start (``half_width_widened``): a trained GPT-2 of half the width, doubled to full width.

Sanyal et al.'s half-width baseline is not this. Their repository (sanyalsunny111/LLM-Inheritune) holds no script
for it, but its training log ``GPT2-experiments/logs/OpenWebText_logs/Baselines/medium-baselines/medium_halfwdth.txt``
starts at validation loss 10.87 at step 0 (a fresh model's: ln 50304 = 10.83; their 12-layer scratch log starts at
11.01) and falls like a run from scratch to 3.05 at 100K steps; the large and XL logs do the same. So theirs is a
model at half the width trained from a fresh initialisation: the ``half_width`` baseline of `run_inheritune`, whose
trained model is also the source this module widens. The depth of their half-width model is not in the logs;
lens_heads uses the student's.
`widen` follows Net2WiderNet (Chen, Goodfellow & Shlens 2016, "Net2Net: accelerating learning via knowledge
transfer") with bert2BERT's treatment of LayerNorm and attention heads (Chen et al. 2022, function-preserving
initialisation): every unit is duplicated and whatever reads a duplicated unit takes half of each copy, so the wider
model computes the same function as the source. Concretely, for a residual stream x of width d the wide model
carries [x, x] (width 2d):

- token and position embeddings, LayerNorm weights and biases, the attention and MLP output biases: concatenated
  with themselves ([a, a]). A LayerNorm of [x, x] is [LN(x), LN(x)]: the mean and variance of [x, x] are x's.
- maps that read the stream (W_Q, W_K, W_V, W_in; an untied W_U): their input rows stacked twice and halved.
- attention: heads doubled (the source has half the heads, of the same d_head): each source head appears twice and
  the two copies' W_O are halved, their output columns duplicated. Or, where the source has as many heads of half
  the d_head, each head's dimensions are duplicated, W_Q and W_K scaled by 2^(-1/4) each (q.k doubles and
  sqrt(d_head) grows by sqrt(2)) and W_O's rows stacked twice and halved.
- MLP: hidden units duplicated, W_out's rows stacked twice and halved, its columns duplicated.
- a tied unembedding reads the embedding [E, E], so the final LayerNorm's weight and bias are halved instead.

Exact copies would stay copies under training (their gradients are equal), so ``noise`` adds N(0, noise^2) to the
second copy of every weight matrix (Net2Net adds noise for the same reason). The training settings, depth, context
and vocabulary are the source's; biases the `GPT2Options` leave out stay zero and frozen.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import torch
from torch import Tensor

from lens_heads.growth.gpt2 import gpt2_config, gpt2_model, gpt2_options, is_tied
from lens_heads.plumbing.errors import InputError

if TYPE_CHECKING:  # TransformerLens 3.9 only
    from transformer_lens import HookedTransformer


def _twice(x: Tensor, dim: int) -> Tensor:
    return torch.cat([x, x], dim=dim)


def _check_halves(source: HookedTransformer, d_model: int, n_heads: int) -> str:
    """``"heads"`` or ``"head_dim"``: how the target's attention doubles the source's; an error where the source is
    not the target at half the width."""
    c = source.cfg
    if c.d_model * 2 != d_model:
        raise InputError(f"a half-width source must have half the target's width: the target has d_model {d_model}, "
                         f"so the source needs {d_model / 2:g}, it has {c.d_model}")
    if c.d_mlp is None or c.d_mlp * 2 != 4 * d_model:
        raise InputError(f"the source's MLP width {c.d_mlp} is not half the target's {4 * d_model} (4 x d_model)")
    if n_heads == 2 * c.n_heads and c.d_head * n_heads == d_model:
        return "heads"
    if n_heads == c.n_heads and 2 * c.d_head * n_heads == d_model:
        return "head_dim"
    raise InputError(f"the target's {n_heads} heads of {d_model // n_heads} dimensions are neither twice the "
                     f"source's {c.n_heads} heads of {c.d_head} nor its heads at twice the d_head: build the source "
                     f"with {n_heads // 2 if n_heads % 2 == 0 else n_heads} heads")


def widened_state(source: HookedTransformer, mode: str) -> dict[str, Tensor]:
    """The function-preserving doubled state dict of ``source`` (no noise), by the rules of the module docstring."""
    src = source.state_dict()
    tied = is_tied(source)
    out: dict[str, Tensor] = {}
    q_scale = 2 ** -0.25 if mode == "head_dim" else 1.0
    for name, t in src.items():
        last = name.rsplit(".", 1)[-1]
        if name in ("embed.W_E", "pos_embed.W_pos"):
            w = _twice(t, 1)
        elif name.startswith("ln_final."):
            w = _twice(t, 0) / (2 if tied else 1)
        elif last in ("w", "b", "b_O", "b_out"):  # LayerNorms and the biases written into the stream
            w = _twice(t, 0)
        elif name == "unembed.W_U":
            w = _twice(t, 0) / 2
        elif name == "unembed.b_U":
            w = t.clone()
        elif last == "W_in":
            w = _twice(_twice(t, 0) / 2, 1)
        elif last == "b_in":
            w = _twice(t, 0)
        elif last == "W_out":
            w = _twice(_twice(t, 0) / 2, 1)
        elif last in ("W_Q", "W_K", "W_V"):  # [head, d_model, d_head]
            w = _twice(t, 1) / 2 * (q_scale if last != "W_V" else 1.0)
            w = _twice(w, 0) if mode == "heads" else _twice(w, 2)
        elif last in ("b_Q", "b_K", "b_V"):  # [head, d_head]
            w = t * (q_scale if last != "b_V" else 1.0)
            w = _twice(w, 0) if mode == "heads" else _twice(w, 1)
        elif last == "W_O":  # [head, d_head, d_model]
            w = _twice(t, 2)
            w = _twice(w, 0) / 2 if mode == "heads" else _twice(w, 1) / 2
        elif last in ("IGNORE", "mask"):  # attention buffers: the target's own
            continue
        else:
            raise InputError(f"widen does not know how to double {name!r} {tuple(t.shape)}: a GPT-2 has no such "
                             "tensor")
        out[name] = w
    return out


def _second_copy(t: Tensor, name: str, mode: str) -> Tensor:
    """A mask of the entries of the widened tensor ``t`` that belong to the second copy (the one noise goes to)."""
    mask = torch.zeros_like(t, dtype=torch.bool)
    last = name.rsplit(".", 1)[-1]
    if last in ("W_Q", "W_K", "W_V", "W_O") and mode == "heads":
        mask[t.shape[0] // 2:] = True
    elif last in ("W_Q", "W_K", "W_V"):
        mask[..., t.shape[-1] // 2:] = True
    elif last == "W_O":
        mask[:, t.shape[1] // 2:] = True
    elif last == "W_U":  # [d_model, vocab]: the copies are rows
        mask[t.shape[0] // 2:] = True
    else:  # embeddings, W_in, W_out, W_U: the second half of the last dimension
        mask[..., t.shape[-1] // 2:] = True
    return mask


def widen(source: HookedTransformer, *, d_model: int, n_heads: int, seed: int = 0,
          noise: float = 1e-3) -> HookedTransformer:
    """A GPT-2 of width ``d_model`` with ``n_heads`` heads (MLP 4 x d_model) that computes what the trained
    ``source``, of half that width, computes, plus ``noise`` on the second copy of each weight matrix (seeded by
    ``seed``); see the module docstring. Built with the source's `GPT2Options`."""
    if noise < 0:
        raise InputError(f"noise is a standard deviation: give >= 0, got {noise}")
    mode = _check_halves(source, d_model, n_heads)
    c = source.cfg
    cfg = gpt2_config(c.n_layers, d_model=d_model, n_heads=n_heads, n_ctx=c.n_ctx, d_vocab=c.d_vocab)
    wide = gpt2_model(cfg, seed=seed, options=gpt2_options(source), tokenizer=source.tokenizer, device=c.device)
    state = widened_state(source, mode)
    own = wide.state_dict()
    with torch.no_grad():
        gen = torch.Generator().manual_seed(seed)
        for name, value in state.items():
            if noise and name.rsplit(".", 1)[-1].startswith("W_"):
                draw = torch.randn(value.shape, generator=gen, dtype=value.dtype) * noise
                value = value + draw.to(value.device) * _second_copy(value, name, mode)
            own[name].copy_(value)
    wide.cfg.model_name = f"widened-{c.n_layers}L-{d_model}d-of-{c.model_name}"
    cast(dict, wide.lens_heads_meta).update(name=wide.cfg.model_name, source=(
        f"half-width warm start: {c.model_name} ({c.d_model}d, {c.n_heads} heads) doubled to {d_model}d, "
        f"{n_heads} heads (function-preserving, {mode} doubled), noise {noise} seed {seed}"))
    return wide
