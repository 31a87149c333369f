"""What a set of hooks touches: its (name, fn) pairs, the objects told about each batch, the first block it reads
or writes (the forward below it can be shared among sets), and the prefix sharing it allows.

A hook set is what ``evaluate_each`` and ``generate`` take per ablation: a list of ``(hook_name, fn)`` pairs and
objects with ``.hooks`` (a :class:`lens_heads.ablation.hooks.HeadAblation`), or one such object; ``None`` is no
hooks. A stacked set (an object with ``copies``, :class:`lens_heads.ablation.stacked.StackedAblation`) runs ``copies``
copies of each batch in one forward, one per unit it stacks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from lens_heads.evaluation.prefix import hook_scope
from lens_heads.models import backends
from lens_heads.models.capture import check_hook_names
from lens_heads.plumbing.errors import InputError


@dataclass
class HookSet:
    """One set of hooks as the forward loop uses it: the (name, fn) pairs, the objects told about each batch, the
    first block they touch (None: something before the blocks, so the forward starts from the tokens) and the
    prefix sharing they allow (:func:`lens_heads.evaluation.prefix.hook_scope`); ``copies``: how many copies of each
    batch one forward stacks (1 unless the set stacks units)."""

    pairs: list
    batch_aware: list
    first_layer: int | None
    prefix_scope: str | None = None
    copies: int = 1


def hook_set(model, hooks) -> HookSet:
    """``hooks`` (pairs and hook objects, or one object) checked against ``model``'s hook points."""
    pairs, batch_aware = collect_hooks(hooks, model)
    layers = [layer_of(name, model.cfg.n_layers) for name, _ in pairs]
    known = [layer for layer in layers if layer is not None]
    first = None if len(known) < len(layers) or model.cfg.positional_embedding_type == "shortformer" \
        or not backends.backend(model).starts_at_layer else min(known, default=model.cfg.n_layers)
    return HookSet(pairs, batch_aware, first, hook_scope(listed(hooks)), stacked_copies(hooks))


def stacked_copies(hooks) -> int:
    """How many copies of each batch the set stacks: its stacked object's ``copies`` (at most one per set), else 1."""
    stacked = [obj for obj in listed(hooks) if not isinstance(obj, tuple) and hasattr(obj, "copies")]
    if len(stacked) > 1:
        raise InputError(f"a hook set holds {len(stacked)} stacked ablations: stack every unit into one "
                         "(stack_ablations([...]))")
    return int(stacked[0].copies) if stacked else 1


def unit_objects(hooks) -> list[list]:
    """The objects of each result a set gives: one list (:func:`hook_objects`) per stacked unit, or the set's own."""
    stacked = [obj for obj in listed(hooks) if not isinstance(obj, tuple) and hasattr(obj, "copies")]
    if not stacked:
        return [hook_objects(hooks)]
    others = [obj for obj in hook_objects(hooks) if obj is not stacked[0]]
    return [others + ([] if unit is None else [unit]) for unit in stacked[0].units]


def listed(hooks) -> list:
    """A hook set as a list of its members: one hook object becomes a list of it, ``None`` an empty list."""
    if hooks is None:
        return []
    if hasattr(hooks, "hooks"):
        return [hooks]
    if isinstance(hooks, (str, bytes)) or not hasattr(hooks, "__iter__"):
        raise InputError(f"hooks must be a list of (hook_name, fn) pairs and objects with .hooks (e.g. a "
                         f"HeadAblation), one such object, or None, got {hooks!r}")
    return list(hooks)


def layer_of(name: str, n_layers: int) -> int | None:
    """The block a hook point belongs to (``n_layers`` after the last block), None before the first."""
    if name.startswith("blocks."):
        return int(name.split(".")[1])
    return n_layers if name.startswith(("ln_final.", "unembed.")) else None


def collect_hooks(hooks: Iterable | None, model) -> tuple[list, list]:
    """The (name, fn) pairs of ``hooks`` and the objects among them that want each batch (``.batch``)."""
    pairs, batch_aware = [], []
    for obj in listed(hooks):
        if hasattr(obj, "hooks"):
            pairs.extend(obj.hooks)
            if hasattr(obj, "batch"):
                batch_aware.append(obj)
        elif isinstance(obj, tuple) and len(obj) == 2 and isinstance(obj[0], str) and callable(obj[1]):
            pairs.append(obj)
        else:
            raise InputError(f"hooks must be (hook_name, fn) pairs or objects with .hooks (e.g. a HeadAblation), "
                            f"got {obj!r}")
    check_hook_names(model, [name for name, _ in pairs])
    return pairs, batch_aware


def hook_objects(hooks: Iterable | None) -> list:
    """The objects of a hook set as results describe them: each hook object, or each pair's hook name."""
    return [h[0] if isinstance(h, tuple) else h for h in listed(hooks)]
