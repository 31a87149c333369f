"""The random baseline: each (input, layer, head) ablated with probability ``p``, drawn from a generator seeded per
input (or per forward row), so a draw depends on neither batch size nor order and the zeroed sets are nested as
``p`` grows."""

from __future__ import annotations

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from lens_heads.ablation.hooks import DRAWS, HeadAblation
from lens_heads.heads.scores import what_still_works
from lens_heads.models.backends import check_attention_hooks
from lens_heads.plumbing.errors import InputError


def random_zeroing(model, p: float, seed: int = 0, *, draw: str = "per_item", ablation: str = "zero",
                   means: Tensor | None = None) -> HeadAblation:
    """The random baseline: ablate each (input, layer, head) independently with probability ``p``.

    ``draw="per_item"``: input ``i`` draws ``u ~ U[0, 1)`` of shape [layer, head] from a ``torch.Generator`` seeded
    with :func:`input_seed` ``(seed, i)`` and ablates where ``u < p``: the draw doesn't depend on batch size or
    order, the same input gets the same heads in every run, and the zeroed sets are nested as ``p`` grows. Input ids
    come from :meth:`HeadAblation.batch` (the evaluator passes item indices, so all choices of a question share one
    draw, and their shared prefix is computed once).

    ``draw="per_row"`` (the authors' baseline: each forward row its own draw, so each choice of a cloze item loses
    other heads): row ``k`` of input ``i`` (the evaluator's key: the row's first choice) draws from
    ``input_seed(seed, i, k)``, as reproducible and nested as the per-item draw. Rows of one item differ, so no
    prefix is shared (``prefix_scope`` None: the evaluator runs the rows whole)."""
    if not 0.0 <= p <= 1.0:
        raise InputError(f"p must be a probability in [0, 1], got {p}")
    if draw not in DRAWS:
        raise InputError(f"draw must be one of {DRAWS}, got {draw!r}")
    check_attention_hooks(model, ["hook_z"], uses="zeroing heads", advice=what_still_works)
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    per_row = draw == "per_row"
    batch: dict = {}  # the current batch's (input, row) keys and their [row, layer, head] uniforms

    def rule(layer: int, z: Tensor, acts: dict) -> Tensor:
        if acts["inputs"] is None:
            raise InputError("random ablation draws per input: run the forward inside "
                             "`with ablation.batch(attention_mask, first=...)` (or inputs=...), or use evaluate()")
        ids = acts["inputs"].tolist()
        rows = [None] * len(ids) if not per_row else _row_keys(ids, acts["rows"])
        keys = tuple(zip(ids, rows))
        if batch.get("keys") != keys:
            batch.update(keys=keys, uniforms=torch.stack([_uniforms(seed, i, n_layers, n_heads, k) for i, k in keys]))
        return batch["uniforms"][:, layer].to(z.device) < p

    return HeadAblation(n_layers, n_heads, rule, description=f"random: p={p:g}, seed={seed}" + (
        ", drawn per row" if per_row else ""), ablation=ablation, means=means,
        prefix_scope=None if per_row else "item", reads_rows=per_row,
        cache_exact=True)  # a row's draw is fixed by its input (and row key), whatever its length


def _row_keys(ids: list[int], rows: Tensor | None) -> list[int]:
    """Each row's key within its input; without keys, only rows of distinct inputs can be told apart."""
    if rows is not None:
        return rows.tolist()
    if len(set(ids)) < len(ids):
        raise InputError("a per-row random draw must tell the rows of one input apart: give "
                         "`ablation.batch(mask, inputs=..., rows=...)` (one key per row), or use evaluate()")
    return [0] * len(ids)


def _uniforms(seed: int, i: int, n_layers: int, n_heads: int, row: int | None = None) -> Float[Tensor, "layer head"]:
    return torch.rand(n_layers, n_heads, generator=torch.Generator().manual_seed(input_seed(seed, i, row)))


def input_seed(seed: int, i: int, row: int | None = None) -> int:
    """The generator seed of input ``i`` (and of its row ``row``, for a per-row draw) under ``seed``: mixed by
    numpy's SeedSequence into 32 bits (torch's CPU generator keeps only 32 bits of a seed, so ``seed * 2**32 + i``
    would ignore ``seed``). SeedSequence pads its entropy with zeros, so a row is mixed in as ``row + 1``: row 0's
    draw differs from its input's per-item draw."""
    entropy = [int(seed), int(i)] + ([] if row is None else [int(row) + 1])
    return int(np.random.SeedSequence(entropy).generate_state(1)[0])
