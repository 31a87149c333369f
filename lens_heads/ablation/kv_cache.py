"""The KV cache removed heads hold, counted per key/value group.

Under grouped-query attention, query head ``h`` of a layer reads key/value head ``h // (n_heads // n_kv_heads)``
(:func:`lens_heads.models.loading.expand_kv`). A KV head's cache is freed only when every query head it serves is
removed: removing one head of a group frees nothing. Every KV head of a model holds the same cache (two vectors of
``d_head`` per token), so the share of the cache a set of removed heads could free is the share of KV groups whose
heads are all removed. Removed layers (attention or block) free every group of theirs.

This is accounting: what a runtime that drops those groups could save. What :func:`lens_heads.ablation.prune.prune`
frees physically is only the dropped blocks' cache: a zeroed head, and a zeroed attention layer, still compute and
cache their keys and values, since a Hugging Face config gives every layer the same KV heads.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from lens_heads.plumbing.errors import InputError


def freed_groups(removed: Bool[Tensor, "*batch layer head"], n_kv_heads: int) -> Bool[Tensor, "*batch layer kv"]:
    """Which KV groups have every query head they serve in ``removed`` (per input where ``removed`` has leading
    dimensions, e.g. a per-input zeroing's ``zeroed()``)."""
    n_heads = removed.shape[-1]
    if n_kv_heads < 1 or n_heads % n_kv_heads:
        raise InputError(f"{n_heads} query heads can't be split into {n_kv_heads} key/value groups: give the model's "
                         "n_key_value_heads (n_heads when it has no grouped-query attention)")
    # query head h is served by group h // (n_heads // n_kv_heads): groups are runs of adjacent heads
    return removed.bool().unflatten(-1, (n_kv_heads, n_heads // n_kv_heads)).all(-1)


def kv_share(removed: Bool[Tensor, "*batch layer head"], n_kv_heads: int) -> Float[Tensor, "*batch"]:
    """Share of the KV cache held by the groups ``removed`` frees whole (:func:`freed_groups`)."""
    return freed_groups(removed, n_kv_heads).flatten(-2).float().mean(-1)


@dataclass(frozen=True)
class KVAccount:
    """The KV cache a static removal frees: by the groups it removes whole (``accounted``) and by the export
    (``physical``: the dropped blocks only), as shares of the whole cache and in bytes per token."""

    freed: Bool[Tensor, "layer kv"]
    accounted: float
    physical: float
    bytes_per_token: int  # of the whole cache

    def freed_bytes_per_token(self, *, physical: bool = False) -> float:
        return (self.physical if physical else self.accounted) * self.bytes_per_token


def kv_account(cfg, heads=(), layers=(), *, part: str = "attention", bytes_per_value: int = 4) -> KVAccount:
    """What removing ``heads`` and ``layers`` (their ``part``) of a model with config ``cfg`` (``n_layers``,
    ``n_heads``, ``n_key_value_heads``, ``d_head``: a TransformerLens config) frees of its KV cache."""
    number = isinstance(bytes_per_value, (int, float)) and not isinstance(bytes_per_value, bool)
    if not number or not 0 < bytes_per_value < float("inf"):  # NaN fails the comparison too
        raise InputError(f"bytes_per_value={bytes_per_value!r}: give the size of one cached value in bytes, a positive "
                         "number (4 for float32, 2 for bfloat16/float16, 1 for 8-bit)")
    n_kv = getattr(cfg, "n_key_value_heads", None) or cfg.n_heads
    removed = torch.zeros(cfg.n_layers, cfg.n_heads, dtype=torch.bool)
    for layer, head in heads:
        if not (0 <= layer < cfg.n_layers and 0 <= head < cfg.n_heads):
            raise InputError(f"head ({layer}, {head}) is outside the model's {cfg.n_layers} layers x {cfg.n_heads} "
                             "heads")
        removed[layer, head] = True
    for layer in layers:
        if not 0 <= layer < cfg.n_layers:
            raise InputError(f"layer {layer} is outside the model's layers 0..{cfg.n_layers - 1}")
        removed[layer] = True
    freed = freed_groups(removed, n_kv)
    dropped = len(set(layers)) if part == "block" else 0
    return KVAccount(freed=freed, accounted=float(freed.float().mean()), physical=dropped / cfg.n_layers,
                     bytes_per_token=2 * cfg.n_layers * n_kv * cfg.d_head * bytes_per_value)
