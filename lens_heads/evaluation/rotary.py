"""Rotary embedding for the fused attention: the tables read once per forward, the rotation in three passes.

TransformerLens's ``apply_rotary`` clones the rotated part, writes its two halves back (one negated), multiplies
twice, adds and concatenates: about eight passes over the queries or keys, and for every layer, for queries and keys
alike, it counts the positions from the attention mask again and gathers the tables at them. Here the tables at a
forward's positions are gathered once and shared by every layer reading the same tables, the sign of rotate-half is
folded into the sine table, and the rotation is ``x * cos + swap_halves(x) * signed_sin``: a product, a
concatenation and a multiply-add. ``-x2 * sin`` and ``x2 * -sin`` are the same float, so the values are eager's up
to the rounding of the multiply-add (one float32 rounding per element where the kernel fuses it).

GPT-J-style rotary (adjacent pairs) and dynamic NTK scaling keep TransformerLens's own ``apply_rotary``.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from lens_heads.models import tl_internals as tl

Heads = Float[Tensor, "batch pos head d_head"]


def lean(attn) -> bool:
    """Whether the layer's rotary is the half-split kind :func:`rotate` computes (not adjacent pairs, no dynamic
    NTK scaling)."""
    return not attn.cfg.rotary_adjacent_pairs and not attn.cfg.use_dynamic_ntk_rope


def rotate(x: Heads, cos: Float[Tensor, "batch pos 1 rot"], signed_sin: Float[Tensor, "batch pos 1 rot"]) -> Heads:
    """``x``'s first ``rot`` features rotated (``x * cos + rotate_half(x) * sin``, with rotate-half's sign in
    ``signed_sin``), the rest passed through."""
    rot = cos.shape[-1]
    part = x[..., :rot]
    half = rot // 2
    out = (part * cos).addcmul_(torch.cat((part[..., half:], part[..., :half]), dim=-1), signed_sin)
    return out if rot == x.shape[-1] else torch.cat((out, x[..., rot:]), dim=-1)


@dataclass
class _Entry:
    table: weakref.ref
    version: int
    source: weakref.ref | None
    source_version: int
    n_pos: int
    value: tuple[Tensor, Tensor]


def _same(entry: _Entry, source: Tensor | None) -> bool:
    """Whether ``source`` is the entry's positions source, unchanged in place since."""
    if source is not None and entry.source is not None:
        return entry.source() is source and entry.source_version == _version(source)
    return source is None and entry.source is None


def _version(t: Any) -> int:
    """The tensor's in-place version counter (it moves at every in-place write)."""
    return int(getattr(t, "_version"))


@dataclass
class RotaryTables:
    """The layers' cos and signed-sin tables at one forward's positions, gathered once per forward and table pair
    (one per :func:`lens_heads.evaluation.fused_attention.fused_attention` block; nothing outlives it). An entry is
    reused only while the tables and the tensor the positions come from (the attention mask, or the prefixes'
    lengths) are the same objects, unchanged in place, and the forward has as many positions."""

    _entries: dict[int, _Entry] = field(default_factory=dict)

    def at_mask(self, attn, n_pos: int, attention_mask: Int[Tensor, "batch pos"] | None) -> tuple[Tensor, Tensor]:
        """The tables at positions ``0 .. n_pos - 1`` of each row, counted from its first real token as
        TransformerLens counts them under left padding."""
        def positions() -> Tensor | None:
            if attention_mask is None:
                return None
            return (attention_mask.cumsum(dim=1) - 1).clamp(min=0)[:, :n_pos]
        return self._get(attn, n_pos, attention_mask, positions)

    def at_positions(self, attn, n_pos: int, source: Tensor, positions) -> tuple[Tensor, Tensor]:
        """The tables at ``positions()`` (``[batch, n_pos]``), which depend on ``source`` alone."""
        return self._get(attn, n_pos, source, positions)

    def _get(self, attn, n_pos: int, source: Tensor | None, positions) -> tuple[Tensor, Tensor]:
        cos_table: Tensor = attn.rotary_cos
        sin_table: Tensor = attn.rotary_sin
        entry = self._entries.get(id(cos_table))
        if entry is not None and entry.table() is cos_table and entry.version == _version(cos_table) \
                and entry.n_pos == n_pos and _same(entry, source):
            return entry.value
        at = positions()
        needed = n_pos if at is None else (int(at.max()) + 1 if at.numel() else 0)
        if needed > cos_table.shape[0]:  # the tables grow with the longest forward so far, as apply_rotary grows them
            tl.extend_rotary(attn, min(attn.cfg.n_ctx, max(needed, 2 * cos_table.shape[0])))
            return self._get(attn, n_pos, source, positions)
        if at is None:
            cos, sin = cos_table[None, :n_pos, None], sin_table[None, :n_pos, None]
        else:
            at = at.clamp(max=cos_table.shape[0] - 1).to(cos_table.device)
            cos, sin = cos_table[at, None], sin_table[at, None]
        half = sin.shape[-1] // 2
        value = (cos, torch.cat((-sin[..., :half], sin[..., half:]), dim=-1))
        self._entries[id(cos_table)] = _Entry(weakref.ref(cos_table), _version(cos_table),
                                              None if source is None else weakref.ref(source),
                                              0 if source is None else _version(source), n_pos, value)
        return value
