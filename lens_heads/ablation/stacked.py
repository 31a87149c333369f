"""Several ablations in one forward: the rows of ``k`` units stacked in one batch, each unit's rows ablated by its own
rule.

A :class:`StackedAblation` holds ``k`` units (each a :class:`lens_heads.ablation.hooks.HeadAblation`, or None for the
unablated baseline). The evaluator runs every batch of rows ``k`` times over in one forward, unit-major (rows
``[u * b, (u + 1) * b)`` are unit ``u``'s copy of the batch's ``b`` rows), and reads each copy into its unit's result
(:func:`lens_heads.evaluation.evaluate.evaluate_each`). At each layer's ``hook_z`` the batch is cut into the units'
slices, and each unit decides on its own slice alone: its captured activations, its mask, its input ids and row
keys, its counters. Rows never see each other (a forward is row-independent), so a threshold unit scores its own
ablated stream (the cascade) and a random unit draws what it draws alone: every unit counts and ablates exactly
what it would alone, and its log-likelihoods differ from its own run only by the float rounding of the larger
matmuls.

What cannot stack: an ablation that is not a ``HeadAblation`` (a layer removal skips whole blocks for every row of
the forward, :mod:`lens_heads.ablation.removed_layers`). The stacked forward runs row by row (no shared prefixes:
the units that share one alone, random drawn per item and static sets, lose it).
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from lens_heads.ablation.hooks import HeadAblation
from lens_heads.evaluation.ablation_interface import Ablation, HookPair
from lens_heads.models.capture import LayerCapture
from lens_heads.plumbing.errors import InputError


class StackedAblation(Ablation):
    """``units`` (HeadAblations, None for none) applied to consecutive equal slices of each forward's rows.

    ``hooks`` go to the model as any hook object's; :meth:`batch` is told the whole stacked batch (its mask, one input
    id and row key per stacked row) and tells each unit its slice. ``copies``: the number of units, which the evaluator
    reads to stack that many copies of each batch.
    """

    prefix_scope = None  # the evaluator runs stacked rows row by row
    per_input = True

    def __init__(self, units: Sequence[HeadAblation | None]):
        units = list(units)
        if not units:
            raise InputError("stack_ablations: give at least one unit (a HeadAblation, or None for the baseline)")
        bad = [u for u in units if u is not None and not isinstance(u, HeadAblation)]
        if bad:
            raise InputError(f"only head ablations (HeadAblation) stack, got {bad[0]!r}: run it alone "
                             "(a layer removal skips whole blocks for every row of a forward)")
        shapes = {(u.n_layers, u.n_heads) for u in units if u is not None}
        if len(shapes) > 1:
            raise InputError(f"stacked units are built for different models (layers, heads) {sorted(shapes)}: "
                             "build every unit for the model being run")
        self.units: list[HeadAblation | None] = units
        self.copies = len(units)
        self.reads_rows = any(u is not None and u.reads_rows for u in units)
        self.cache_exact = all(u is None or u.cache_exact for u in units)  # each slice acts as its unit alone
        self.description = f"stacked: {self.copies} units"
        self._ablating = [u for u in units if u is not None]
        n_layers = shapes.pop()[0] if shapes else 0
        self._capture = LayerCapture(n_layers, self._ablate, self._captures)
        self._slice = 0

    @property
    def hooks(self) -> list[HookPair]:
        """Each layer's captures (what any unit's rule reads), then its ``hook_z``."""
        return self._capture.hooks

    @contextlib.contextmanager
    def batch(self, attention_mask: Bool[Tensor, "batch pos"] | None = None, *, first: int | None = None,
              inputs: Int[Tensor, "batch"] | Sequence[int] | None = None,
              rows: Int[Tensor, "batch"] | Sequence[int] | None = None,
              count: bool = True) -> Iterator["StackedAblation"]:
        """:meth:`HeadAblation.batch` for the stacked batch: its rows are ``copies`` equal slices, one per unit,
        and each unit is told its slice's mask, input ids (``inputs``; ``first``: the slices are all inputs
        ``first, first+1, ...``) and row keys."""
        if (first is None) == (inputs is None):
            raise InputError("StackedAblation.batch() needs the batch's first input index (first=) or one input id "
                             "per stacked row (inputs=), not both")
        n = None if attention_mask is None else attention_mask.shape[0]
        n = len(inputs) if n is None and inputs is not None else n
        if n is not None and n % self.copies:
            raise InputError(f"a stacked batch of {n} rows does not split into {self.copies} equal unit slices: "
                             f"give {self.copies} copies of the batch, unit after unit")
        with contextlib.ExitStack() as stack:
            for u, unit in enumerate(self.units):
                if unit is None:
                    continue
                told: dict = dict(count=count)
                if first is not None:
                    told["first"] = first
                else:
                    told["inputs"] = _part(inputs, u, self.copies)
                if rows is not None and unit.reads_rows:
                    told["rows"] = _part(rows, u, self.copies)
                stack.enter_context(unit.batch(_part(attention_mask, u, self.copies), **told))
            yield self

    # the evaluator's out-of-memory halving rewinds what a failed attempt counted
    def snapshot(self) -> list[list[int]]:
        return [u.snapshot() for u in self._ablating]

    def restore(self, snapshot: list[list[int]]) -> None:
        for unit, mark in zip(self._ablating, snapshot):
            unit.restore(mark)

    def reset(self) -> None:
        for unit in self._ablating:
            unit.reset()

    def __repr__(self) -> str:
        return f"StackedAblation({[None if u is None else u.description for u in self.units]})"

    def _captures(self, layer: int) -> tuple[str, ...]:
        return tuple(dict.fromkeys(name for u in self._ablating for name in u.captures(layer)))

    def _ablate(self, layer: int, z: Float[Tensor, "batch pos head d_head"], acts: dict) -> Tensor:
        if z.shape[0] % self.copies:
            raise InputError(f"a stacked forward of {z.shape[0]} rows does not split into {self.copies} unit slices")
        b = z.shape[0] // self.copies
        out = []
        for u, unit in enumerate(self.units):
            part = z[u * b:(u + 1) * b]
            if unit is None:
                out.append(part)
                continue
            own = {name: acts[name][u * b:(u + 1) * b] for name in unit.captures(layer) if name in acts}
            out.append(unit.ablate(layer, part, own))
        return torch.cat(out)


def stack_ablations(units: Sequence[HeadAblation | None]) -> StackedAblation:
    """``units`` (HeadAblations, None for the baseline) in one forward: evaluate the result with
    :func:`lens_heads.evaluation.evaluate.evaluate_each` (``[stacked]``) for one result per unit, each what the unit
    alone gives."""
    return StackedAblation(units)


def _part(x, u: int, k: int):
    """Slice ``u`` of ``k`` equal consecutive slices of ``x`` (a tensor or a sequence; None stays None)."""
    if x is None:
        return None
    b = len(x) // k
    return x[u * b:(u + 1) * b]
