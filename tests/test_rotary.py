"""The fused attention's rotary embedding: equal to an explicit rotation of each feature pair by its angle, computed
here in float64 from the rotary base, and to TransformerLens's ``apply_rotary``; its tables gathered once per forward
and gathered again whenever the positions' source changes."""

import pytest
import torch

from lens_heads import tiny_model
from lens_heads.evaluation.rotary import RotaryTables, lean, rotate

# float32: the rotated values are sums of two products of magnitude |x|; eager rounds each product and the sum, the
# multiply-add may round once (one float32 rounding, 2^-24 relative, per term)
ROUNDING = 4 * 2.0 ** -24


def explicit_rotation(x: torch.Tensor, positions: torch.Tensor, rotary_dim: int, base: float) -> torch.Tensor:
    """Feature pairs (i, i + rotary_dim / 2) rotated by ``position * base^(-2i / rotary_dim)``, in float64."""
    half = rotary_dim // 2
    x = x.double()
    angle = positions.double()[..., None] * base ** (-torch.arange(half, dtype=torch.float64) * 2 / rotary_dim)
    cos, sin = angle.cos()[:, :, None], angle.sin()[:, :, None]  # [batch, pos, 1, half]
    a, b = x[..., :half], x[..., half:rotary_dim]
    return torch.cat([a * cos - b * sin, b * cos + a * sin, x[..., rotary_dim:]], dim=-1)


def left_padded_mask() -> torch.Tensor:
    mask = torch.ones(3, 10, dtype=torch.long)
    mask[1, :4] = 0  # left padding: the row's positions count from its first real token
    mask[2, :9] = 0
    return mask


@pytest.mark.floats
@pytest.mark.parametrize("rotary_dim", [16, 8])  # the whole head and a partial rotary (the rest passed through)
def test_rotate_equals_explicit_rotation_and_transformer_lens(rotary_dim):
    model = tiny_model("llama", seed=0, rotary_dim=rotary_dim)
    attn = model.blocks[0].attn
    assert lean(attn) and attn.cfg.d_head == 16
    mask = left_padded_mask()
    x = torch.randn(3, 10, 4, 16, generator=torch.Generator().manual_seed(0))
    cos, sin = RotaryTables().at_mask(attn, 10, mask)
    ours = rotate(x, cos, sin)
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    reference = explicit_rotation(x, positions, rotary_dim, model.cfg.rotary_base)
    scale = x.abs().max()
    real = mask.bool()
    assert torch.allclose(ours[real].double(), reference[real], atol=float(scale) * 1e-6, rtol=0)
    with torch.no_grad():
        eager = attn.apply_rotary(x, 0, mask)
    assert torch.allclose(ours, eager, atol=float(scale) * ROUNDING, rtol=0)
    assert torch.equal(ours[..., rotary_dim:], x[..., rotary_dim:])


def test_tables_are_gathered_once_per_forward_and_again_when_the_positions_change():
    model = tiny_model("llama", seed=0)
    first, second = model.blocks[0].attn, model.blocks[1].attn
    tables = RotaryTables()
    mask = left_padded_mask()
    cos, sin = tables.at_mask(first, 10, mask)
    if second.rotary_cos is first.rotary_cos:  # layers sharing one pair share the gathered tables
        assert tables.at_mask(second, 10, mask)[0] is cos
    assert tables.at_mask(first, 10, mask)[0] is cos
    mask[0, :2] = 0  # changed in place: the positions are counted again
    changed = tables.at_mask(first, 10, mask)[0]
    assert changed is not cos and not torch.equal(changed[0], cos[0]) and torch.equal(changed[1:], cos[1:])
    other = left_padded_mask()  # another forward's mask, equal values: gathered afresh, the same tables
    assert torch.equal(tables.at_mask(first, 10, other)[0], cos)
    unmasked, _ = tables.at_mask(first, 7, None)
    assert torch.equal(unmasked[0, :, 0], first.rotary_cos[:7])
    signed = tables.at_mask(first, 7, None)[1][0, :, 0]
    half = signed.shape[-1] // 2
    assert torch.equal(signed[:, :half], -first.rotary_sin[:7, :half])
    assert torch.equal(signed[:, half:], first.rotary_sin[:7, half:])


def test_tables_grow_past_their_length_as_transformer_lens_grows_them():
    model = tiny_model("llama", seed=0)
    attn = model.blocks[0].attn
    attn.rotary_cos, attn.rotary_sin = attn.rotary_cos[:4].clone(), attn.rotary_sin[:4].clone()  # tables cut short
    n = 9
    positions = torch.arange(n)[None].expand(2, -1)
    cos, sin = RotaryTables().at_positions(attn, n, positions, lambda: positions)
    assert attn.rotary_cos.shape[0] >= n
    x = torch.randn(2, n, 4, attn.cfg.d_head, generator=torch.Generator().manual_seed(1))
    reference = explicit_rotation(x, positions, attn.cfg.rotary_dim, model.cfg.rotary_base)
    assert torch.allclose(rotate(x, cos, sin).double(), reference, atol=float(x.abs().max()) * 1e-6, rtol=0)
