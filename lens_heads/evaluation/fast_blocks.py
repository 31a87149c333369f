"""Transformer blocks without the copies the maths does not need, for forwards whose hooks leave the norms alone.

TransformerLens's pre-norm block normalises its input three times (once each for the query, key and value inputs,
the same tensor), and its norms are five elementwise passes each (``x.pow(2).mean``, ``+ eps``, ``sqrt``, ``x /
scale``, ``* w``), every one a full read and write of the residual stream. Inside ``with fast_blocks(model):`` each
plain pre-norm block (see :func:`slow_reason`) normalises once, with ATen's ``rms_norm`` / ``layer_norm`` (on CPU
``rms_norm`` is itself a composite of elementwise passes, as the profile shows), and hands the attention the one normalised tensor as its query, key and value input, which lets the fused attention
compute queries, keys and values in one product (:mod:`lens_heads.evaluation.fused_attention`). Every hook point of
the block outside the norms fires as before, with the values it has eagerly (up to float32 rounding: ATen's norm multiplies
by ``rsqrt`` where the eager norm divides by ``sqrt``).

A block runs its own forward, per forward, whenever a hook is attached to a hook point of its norms (``ln1`` and
``ln2``'s ``hook_scale`` and ``hook_normalized``, which the eager block fires three times and this one would fire
once), when given a key/value cache or shortformer positions, and always where the block is not a plain pre-norm
block.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Iterator

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from lens_heads.models import tl_internals as tl
from lens_heads.models.backends import backend
from lens_heads.models.capture import any_hooked

FLOAT_DTYPES = (torch.float32, torch.float64)  # TransformerLens's norms compute in float32 below these


def slow_reason(block) -> str | None:
    """Why this block always runs its own forward inside :func:`fast_blocks` (None: it runs fast while no hook
    reads its norms)."""
    cfg = block.cfg
    norms = tl.NORMS
    checks = [
        (tl.TRANSFORMER_BLOCK is None or type(block) is not tl.TRANSFORMER_BLOCK,
         f"{type(block).__name__} is not TransformerLens's TransformerBlock"),
        (cfg.dtype not in FLOAT_DTYPES, f"{cfg.dtype} weights (the eager norms compute in float32)"),
        (cfg.use_attn_in or cfg.use_split_qkv_input, "per-head attention inputs"),
        (cfg.use_hook_mlp_in, "hook_mlp_in"),
        (cfg.parallel_attn_mlp, "parallel attention and MLP"),
        (cfg.original_architecture in tl.post_norm_architectures(), "norms after the sublayers"),
        (cfg.use_normalization_before_and_after, "norms before and after the sublayers"),
        (cfg.positional_embedding_type == "shortformer", "shortformer positions"),
        (type(getattr(block, "ln1", None)) not in norms, "a norm other than RMSNorm or LayerNorm before attention"),
        (not cfg.attn_only and type(getattr(block, "ln2", None)) not in norms,
         "a norm other than RMSNorm or LayerNorm before the MLP"),
    ]
    return next((why for failed, why in checks if failed), None)


@contextlib.contextmanager
def fast_blocks(model) -> Iterator[None]:
    """Run every plain pre-norm block of ``model`` without the eager block's repeated norms for the duration of the
    block (see the module docstring); the blocks' own forwards are restored on exit. Nothing is swapped on a backend
    whose blocks lens_heads doesn't replace (a TransformerBridge runs the Hugging Face modules)."""
    if not backend(model).fuses_attention:
        yield
        return
    tl.require(tl.FAST_BLOCKS)
    swapped = []
    for block in model.blocks:
        if slow_reason(block) is None and "forward" not in vars(block):
            block.forward = functools.partial(_forward, block)
            swapped.append(block)
    try:
        yield
    finally:
        for block in swapped:
            del block.forward


def _norm_hook_points(block) -> list:
    return [hp for ln in (getattr(block, "ln1", None), getattr(block, "ln2", None)) if ln is not None
            for hp in (ln.hook_scale, ln.hook_normalized)]


def _forward(block, resid_pre: Float[Tensor, "batch pos d_model"], shortformer_pos_embed=None,
             past_kv_cache_entry=None, attention_mask: Int[Tensor, "batch pos"] | None = None
             ) -> Float[Tensor, "batch pos d_model"]:
    if (shortformer_pos_embed is not None or past_kv_cache_entry is not None or any_hooked(_norm_hook_points(block))
            or not _on_device(block, resid_pre)):
        return tl.eager_forward(block, resid_pre, shortformer_pos_embed, past_kv_cache_entry, attention_mask)
    resid_pre = block.hook_resid_pre(resid_pre)
    normed = norm(block.ln1, resid_pre)
    attn_out = block.hook_attn_out(block.attn(query_input=normed, key_input=normed, value_input=normed,
                                              past_kv_cache_entry=None, attention_mask=attention_mask))
    if block.cfg.attn_only:
        return block.hook_resid_post(resid_pre + attn_out)
    resid_mid = block.hook_resid_mid(resid_pre + attn_out)
    mlp_out = block.hook_mlp_out(block.mlp(norm(block.ln2, resid_mid)))
    return block.hook_resid_post(resid_mid + mlp_out)


def _on_device(block, x: Tensor) -> bool:
    """Whether the block's norm weights sit on ``x``'s device (TransformerLens's norms move themselves otherwise)."""
    return all(p.device == x.device for ln in (block.ln1, getattr(block, "ln2", None)) if ln is not None
               for p in ln.parameters())


def norm(ln, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
    """TransformerLens's RMSNorm / RMSNormPre / LayerNorm / LayerNormPre of ``x`` by ATen's norm: ``x /
    sqrt(mean(x^2) + eps)`` (centred first for LayerNorm), times the weight and plus the bias where the norm has
    them."""
    shape = (x.shape[-1],)
    w, b = getattr(ln, "w", None), getattr(ln, "b", None)
    if type(ln) in tl.RMS_NORMS:
        return F.rms_norm(x, shape, w, ln.eps)
    return F.layer_norm(x, shape, w, b, ln.eps)
