"""Remove whole layers through hooks: a layer's attention, or its whole block, so the residual stream passes it
unchanged.

A layer is removed by zeroing what it writes into the residual stream, at every position of every row:

- ``part="attention"``: ``blocks.{l}.hook_attn_out`` := 0. That is the attention's whole output, every head's
  ``z_h @ W_O[h]`` plus ``b_O`` (after the post-attention norm, on models that have one), so ``resid_mid =
  resid_pre``. It equals zeroing all of the layer's heads on ``hook_z`` (:func:`lens_heads.ablation.hooks.zero_heads`)
  *and* ``b_O``: zeroing the heads alone leaves ``b_O`` in the stream (zero on Llama-style models such as SmolLM2,
  which have no attention bias).
- ``part="block"``: ``hook_attn_out`` and ``hook_mlp_out`` := 0, so ``resid_post = resid_pre`` exactly (x + 0 is x
  in floating point): the block is skipped, as ShortGPT (Men et al., 2024) deletes it.

The removed layers still run (their output is discarded): this measures what a layer contributes, not the time its
removal saves. The action at a position does not depend on the rest of the row, so the evaluator's shared prefixes
stay exact (``prefix_scope = "any"``, :mod:`lens_heads.evaluation.prefix`), and so does generation's key/value cache
(``cache_exact``, :mod:`lens_heads.evaluation.cached_generation`).
"""

from __future__ import annotations

import operator
from typing import Sequence

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from lens_heads.evaluation.ablation_interface import HookPair, UnitAblation
from lens_heads.evaluation.prefix import mark
from lens_heads.models.capture import check_hook_names
from lens_heads.plumbing.errors import InputError

PARTS = ("attention", "block")


def check_layers(layers: Sequence[int], n_layers: int, *, what: str = "layers") -> tuple[int, ...]:
    """``layers`` as a tuple of distinct indices of a model with ``n_layers`` layers, or a ValueError saying what to
    give. Removing every layer is refused: nothing of the model would be left to measure."""
    if isinstance(layers, (str, bytes)) or not hasattr(layers, "__iter__"):
        raise InputError(f"{what} takes a list of layer indices, got {layers!r}: write {what}=[{layers!r}]")
    out = [_index(layer, what, n_layers) for layer in layers]
    bad = [layer for layer in out if not 0 <= layer < n_layers]
    if bad:
        raise InputError(f"{what}: layer(s) {bad} out of range: this model has layers 0..{n_layers - 1}")
    repeated = sorted({layer for layer in out if out.count(layer) > 1})
    if repeated:
        raise InputError(f"{what}: layer(s) {repeated} given more than once: name each layer once")
    if not out:
        raise InputError(f"{what} is empty: name at least one layer to remove (the unablated model is the baseline)")
    if len(out) == n_layers:
        raise InputError(f"{what}: removing all {n_layers} layers leaves only the embedding and unembedding: "
                         "remove fewer layers")
    return tuple(out)


class RemovedLayers(UnitAblation):
    """Hooks that remove ``layers`` (their ``part``: ``"attention"`` or ``"block"``) for every input; built by
    :func:`remove_layers`. ``.hooks`` go wherever hooks go; :meth:`share_zeroed` and :meth:`zeroed` say which heads
    the removal takes out, as :class:`lens_heads.ablation.hooks.HeadAblation` does, so a sweep records it alike. It
    acts alike on every input, so it is told no batches and counts nothing per input (``per_input`` False)."""

    prefix_scope = "any"
    cache_exact = True  # the same layers removed at every position, whatever the sequence's length

    def __init__(self, n_layers: int, n_heads: int, layers: tuple[int, ...], part: str, hook_names: list[str]):
        self.n_layers, self.n_heads, self.layers, self.part = n_layers, n_heads, layers, part
        self.description = f"remove {part} of layer(s) {', '.join(map(str, layers))}"
        self._hooks: list[HookPair] = [(name, mark(_zero_output, "any")) for name in hook_names]

    @property
    def hooks(self) -> list[HookPair]:
        """Each removed output's hook point (``hook_attn_out``, and ``hook_mlp_out`` for a block), zeroed."""
        return self._hooks

    def heads_removed(self) -> Bool[Tensor, "layer head"]:
        """Every head of a removed layer (its attention is gone in both parts)."""
        removed = torch.zeros(self.n_layers, self.n_heads, dtype=torch.bool)
        removed[list(self.layers)] = True
        return removed

    def zeroed(self) -> Bool[Tensor, "one layer head"]:
        """The heads removed, as one row: the same for every input."""
        return self.heads_removed()[None]

    def share_zeroed(self) -> float:
        """Share of the model's heads removed: layers removed / layers."""
        return len(self.layers) / self.n_layers

    def __repr__(self) -> str:
        return f"RemovedLayers({self.description})"


def remove_layers(model, layers: Sequence[int], *, part: str = "attention") -> RemovedLayers:
    """Hooks that remove ``layers`` of ``model``: their attention output (``part="attention"``) or their whole
    block (``"block"``), so that the residual stream passes them unchanged (module docstring)."""
    if part not in PARTS:
        raise InputError(f"part must be one of {PARTS}, got {part!r}")
    cfg = model.cfg
    layers = check_layers(layers, cfg.n_layers)
    names = [f"blocks.{layer}.hook_attn_out" for layer in layers]
    if part == "block" and not cfg.attn_only:
        names += [f"blocks.{layer}.hook_mlp_out" for layer in layers]
    check_hook_names(model, names)
    return RemovedLayers(cfg.n_layers, cfg.n_heads, layers, part, names)


def _zero_output(out: Float[Tensor, "batch pos d_model"], hook=None) -> Tensor:
    return torch.zeros_like(out)


def check_layer_order(order, n_layers: int, *, what: str = "order") -> tuple[int, ...]:
    """A ranking of layers (the first is removed first): a flat sequence naming each of the model's ``n_layers``
    layers once, or a ValueError saying what is wrong with it."""
    shape = getattr(order, "shape", None)
    if shape is not None and len(shape) != 1:
        raise InputError(f"{what} has shape {tuple(shape)}: give a flat ranking of the {n_layers} layers, one index "
                         "each")
    if isinstance(order, (str, bytes)) or not hasattr(order, "__iter__"):
        raise InputError(f"{what} takes a ranking of the {n_layers} layers, got {order!r}")
    order = [_index(layer, what, n_layers) for layer in order]
    repeated = sorted({layer for layer in order if order.count(layer) > 1})
    if repeated:
        raise InputError(f"{what} names layer(s) {repeated} more than once: a ranking names each layer once")
    if sorted(order) != list(range(n_layers)):
        raise InputError(f"{what} ranks {len(order)} layers {sorted(order)[:8]}...: give each of the model's layers "
                         f"0..{n_layers - 1} once")
    return tuple(order)


def _index(layer, what: str, n_layers: int) -> int:
    try:
        if isinstance(layer, bool):
            raise TypeError
        return operator.index(layer)
    except TypeError:
        raise InputError(f"{what}: {layer!r} is not a layer index: give whole numbers 0..{n_layers - 1}") from None
