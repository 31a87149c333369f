"""Weights laid out once for a block of forwards, where TransformerLens lays them out again at every call.

TransformerLens multiplies by ``W.T.contiguous()`` in the unembedding and in gated MLPs, so every forward copies
those matrices (the unembedding's is vocabulary x d_model: 113 MB for SmolLM2), and it adds the unembedding bias,
zeros for models that have none, into every logit (an ``addmm`` that first writes the broadcast bias over the whole
``[pos, vocab]`` output). On the embedded model these copies are about a seventh of a plain forward's CPU time.

Inside ``with packed_weights(model):`` the unembedding and the gated MLPs multiply by copies laid out once per block
(made again whenever a weight is changed in place; on the CPU in oneDNN's blocked layout,
:mod:`lens_heads.evaluation.blocked_linear`), all-zero unembedding and MLP input biases are left out, and every hook
point fires as before. The outputs equal the eager ones up to float32 rounding (the blocked products sum in another
order; adding a zero bias is exact). Where gradients must reach the weights (grad enabled and the weight requires
it, as in training) a module computes its layout afresh at each call, as TransformerLens does.

A block of forwards lays its weights out when it begins. Inside ``with shared_layouts():`` the blocks that follow one
another (a sweep's units, each an evaluation of its own) reuse the layouts the first one made, for the attention's
weights (:mod:`lens_heads.evaluation.fused_attention`) as for these; a layout is made again when its weights change.
"""

from __future__ import annotations

import contextlib
import functools
from contextvars import ContextVar
from typing import Callable, Iterator

import torch
from jaxtyping import Float
from torch import Tensor

from lens_heads.evaluation.blocked_linear import linear
from lens_heads.models import tl_internals as tl
from lens_heads.models.backends import backend


class Packed:
    """``make(*weights)`` kept until one of ``weights`` changes (its in-place version counter or its storage)."""

    def __init__(self, make: Callable, *weights: Tensor):
        self.make, self.weights, self.key, self.value = make, weights, None, None

    def get(self):
        if torch.is_grad_enabled() and any(w.requires_grad for w in self.weights):
            return self.make(*self.weights)  # a cached copy would cut the gradient to the weights
        key = tuple((w._version, w.data_ptr()) for w in self.weights)
        if key != self.key:
            with torch.no_grad():
                self.value = self.make(*self.weights)
            self.key = key
        return self.value


_SHARED: ContextVar[dict | None] = ContextVar("shared_layouts", default=None)


@contextlib.contextmanager
def shared_layouts(store: dict | None = None) -> Iterator[None]:
    """Within this block, every block of forwards that lays weights out (:func:`packed_weights`, fused attention)
    reuses the layout an earlier one made of the same weights instead of making it again. The layouts are held
    until the block ends: as much memory again as the weights laid out, which each block of forwards holds anyway
    while it runs. ``store``: a dict to keep them in past the block (an owner's, passed to each of its blocks, so
    its later calls find them; its holder keeps that memory while it keeps the dict)."""
    token = _SHARED.set({} if store is None else store)
    try:
        yield
    finally:
        _SHARED.reset(token)


def layout(owner, role: str, make: Callable, *weights: Tensor) -> Packed:
    """``make(*weights)`` laid out for ``owner``'s ``role`` (e.g. a layer's ``"qkv"``): within
    :func:`shared_layouts`, the one an earlier block made of these same weight tensors; otherwise a new one."""
    store = _SHARED.get()
    if store is None:
        return Packed(make, *weights)
    held = store.get((id(owner), role))
    if held is None or len(held.weights) != len(weights) or any(a is not b for a, b in zip(held.weights, weights)):
        held = store[(id(owner), role)] = Packed(make, *weights)
    return held


@contextlib.contextmanager
def packed_weights(model) -> Iterator[None]:
    """Run the unembedding and the gated MLPs of ``model`` on weights laid out once, for the duration of the block
    (see the module docstring); the modules' own forwards are restored on exit. Nothing changes on a backend whose
    weights lens_heads doesn't pack (a TransformerBridge runs the Hugging Face modules)."""
    if not backend(model).packs_weights:
        yield
        return
    tl.require(tl.PACKED_WEIGHTS)
    swapped: list[torch.nn.Module] = []
    if tl.is_plain_unembed(model.unembed) and "forward" not in vars(model.unembed):
        packed = layout(model.unembed, "unembed", _unembed_layout, model.unembed.W_U, model.unembed.b_U)
        # an instance attribute shadows the method for the block (deleted on exit): mypy reads a method assigned
        model.unembed.forward = functools.partial(_unembed, model.unembed, packed)  # type: ignore[method-assign]
        swapped.append(model.unembed)
    for block in model.blocks:
        mlp = getattr(block, "mlp", None)  # attention-only models have none
        if mlp is not None and tl.is_plain_gated_mlp(mlp) and "forward" not in vars(mlp):
            packed = layout(mlp, "gated", _gated_layout, mlp.W_gate, mlp.W_in, mlp.W_out, mlp.b_in, mlp.b_out)
            mlp.forward = functools.partial(_gated_mlp, mlp, packed)  # type: ignore[method-assign]  # as above
            swapped.append(mlp)
    try:
        yield
    finally:
        for module in swapped:
            del module.forward


def _unembed(unembed, packed: Packed, residual: Float[Tensor, "batch pos d_model"]
             ) -> Float[Tensor, "batch pos d_vocab"]:
    if residual.device != unembed.W_U.device:
        return tl.eager_forward(unembed, residual)
    return unembed.hook_out(packed.get()(unembed.hook_in(residual)))


def _unembed_layout(w_u: Tensor, b_u: Tensor):
    return linear(w_u.T, nonzero_bias(b_u))


def _gated_layout(w_gate: Tensor, w_in: Tensor, w_out: Tensor, b_in: Tensor, b_out: Tensor) -> tuple:
    """The gate, input and output products by weights laid out once (:func:`lens_heads.evaluation.blocked_linear.linear`;
    the output's bias with it), and the input bias (None where all zero: adding zero is exact). The gate and input products stay two: one stacked
    ``[2 d_mlp, d_model]`` product measured slower on our CPUs, and its halves reach the activation strided."""
    return linear(w_gate.T), linear(w_in.T), linear(w_out.T, nonzero_bias(b_out)), nonzero_bias(b_in)


def nonzero_bias(b: Tensor) -> Tensor | None:
    """``b``, or None where it is all zero (a product left without it is exact)."""
    return b if bool(b.any()) else None


def _gated_mlp(mlp, packed: Packed, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
    if x.device != mlp.W_gate.device:
        return tl.eager_forward(mlp, x)
    gate, linear_in, out, b_in = packed.get()
    pre_act = mlp.hook_pre(gate(x))
    pre_linear = mlp.hook_pre_linear(linear_in(x))
    post = tl.activation(mlp)(pre_act) * pre_linear
    post_act = mlp.hook_post(post if b_in is None else post + b_in)
    return out(post_act)
