"""What a set of hooks touches: its (name, fn) pairs, the objects told about each batch, the first block it reads
or writes (the forward below it can be shared among sets), and the prefix sharing it allows.

A hook set is what ``evaluate_each`` and ``generate`` take per ablation: a list of ``(hook_name, fn)`` pairs and
ablations (:class:`lens_heads.evaluation.ablation_interface.Ablation`, e.g. a
:class:`lens_heads.ablation.hooks.HeadAblation`, or any object with ``.hooks``), or one ablation; ``None`` is no
hooks. A stacked set (an ablation with ``units``, :class:`lens_heads.ablation.stacked.StackedAblation`) runs one copy
of each batch per unit in one forward.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from lens_heads.evaluation.ablation_interface import Ablation, HookPair, as_ablation, describe, is_hook_object
from lens_heads.evaluation.prefix import hook_scope
from lens_heads.models import backends
from lens_heads.models.capture import check_hook_names
from lens_heads.plumbing.errors import InputError

Member = HookPair | Ablation  # one member of a hook set


@dataclass
class HookSet:
    """One set of hooks as the forward loop uses it: the (name, fn) pairs, the ablations told about each batch, the
    first block they touch (None: something before the blocks, so the forward starts from the tokens) and the
    prefix sharing they allow (:func:`lens_heads.evaluation.prefix.hook_scope`); ``copies``: how many copies of each
    batch one forward stacks (1 unless the set stacks units); ``unit_objects``: what each of its results is made
    of (:func:`unit_objects`)."""

    pairs: list[HookPair]
    batch_aware: list[Ablation]
    first_layer: int | None
    prefix_scope: str | None = None
    copies: int = 1
    unit_objects: list[list[Ablation | str]] = field(default_factory=list)


def hook_set(model, hooks) -> HookSet:
    """``hooks`` (pairs and hook objects, or one object) checked against ``model``'s hook points."""
    members = listed(hooks)
    pairs, batch_aware = collect_hooks(members, model)
    layers = [layer_of(name, model.cfg.n_layers) for name, _ in pairs]
    known = [layer for layer in layers if layer is not None]
    first = None if len(known) < len(layers) or model.cfg.positional_embedding_type == "shortformer" \
        or not backends.backend(model).starts_at_layer else min(known, default=model.cfg.n_layers)
    return HookSet(pairs, batch_aware, first, hook_scope(members), stacked_copies(members), unit_objects(members))


def _stack(members: list[Member]) -> Ablation | None:
    """The set's stacked ablation (at most one per set), or None."""
    stacked = [obj for obj in members if isinstance(obj, Ablation) and obj.units is not None]
    if len(stacked) > 1:
        raise InputError(f"a hook set holds {len(stacked)} stacked ablations: stack every unit into one "
                         "(stack_ablations([...]))")
    return stacked[0] if stacked else None


def stacked_copies(hooks) -> int:
    """How many copies of each batch the set stacks: one per unit of its stacked ablation, else 1."""
    stack = _stack(listed(hooks))
    return 1 if stack is None or stack.units is None else len(stack.units)


def unit_objects(hooks) -> list[list[Ablation | str]]:
    """The objects of each result a set gives: one list (:func:`hook_objects`) per stacked unit, or the set's own."""
    members = listed(hooks)
    stack = _stack(members)
    if stack is None or stack.units is None:
        return [hook_objects(members)]
    others = [obj for obj in hook_objects(members) if obj is not stack]
    return [others + ([] if unit is None else [unit]) for unit in stack.units]


def listed(hooks) -> list[Member]:
    """A hook set as a list of its members, each a pair or an :class:`Ablation` (other objects with ``.hooks`` read
    through :func:`lens_heads.evaluation.ablation_interface.as_ablation`): one hook object becomes a list of it,
    ``None`` an empty list."""
    if hooks is None:
        return []
    if is_hook_object(hooks):
        return [as_ablation(hooks)]
    if isinstance(hooks, (str, bytes)) or not isinstance(hooks, Iterable):
        raise InputError(f"hooks must be a list of (hook_name, fn) pairs and objects with .hooks (e.g. a "
                         f"HeadAblation), one such object, or None, got {hooks!r}")
    return [obj if isinstance(obj, tuple) or not is_hook_object(obj) else as_ablation(obj) for obj in hooks]


def layer_of(name: str, n_layers: int) -> int | None:
    """The block a hook point belongs to (``n_layers`` after the last block), None before the first."""
    if name.startswith("blocks."):
        return int(name.split(".")[1])
    return n_layers if name.startswith(("ln_final.", "unembed.")) else None


def collect_hooks(hooks: Iterable | None, model) -> tuple[list[HookPair], list[Ablation]]:
    """The (name, fn) pairs of ``hooks`` and the ablations among them that are told each batch (``per_input``)."""
    pairs: list[HookPair] = []
    batch_aware: list[Ablation] = []
    for obj in listed(hooks):
        if isinstance(obj, Ablation):
            pairs.extend(obj.hooks)
            if obj.per_input:
                batch_aware.append(obj)
        elif isinstance(obj, tuple) and len(obj) == 2 and isinstance(obj[0], str) and callable(obj[1]):
            pairs.append(obj)
        else:
            raise InputError(f"hooks must be (hook_name, fn) pairs or objects with .hooks (e.g. a HeadAblation), "
                            f"got {obj!r}")
    check_hook_names(model, [name for name, _ in pairs])
    return pairs, batch_aware


def hook_objects(hooks: Iterable | None) -> list[Ablation | str]:
    """The members of a hook set as results describe them: each ablation, or each pair's hook name."""
    return [h[0] if isinstance(h, tuple) else h for h in listed(hooks)]


def not_cache_exact(hooks: Iterable | None, *, pairs: bool = True) -> list[str]:
    """The members of a hook set under which a key/value cache of earlier positions would not be exact, described
    (empty: it is exact under all of them): each ablation that does not declare
    :attr:`~lens_heads.evaluation.ablation_interface.Ablation.cache_exact`, and, where ``pairs``, each pair whose
    function is not marked for shared prefixes (:func:`lens_heads.evaluation.prefix.mark`: a pair so marked acts at
    a position on what the forward holds there, so a forward of only the new positions acts on them as the whole
    row's; an unmarked pair may read the whole row)."""
    out = []
    for obj in listed(hooks):
        if isinstance(obj, Ablation):
            if not obj.cache_exact:
                out.append(describe(obj))
        elif pairs and (not isinstance(obj, tuple) or hook_scope([obj]) is None):
            out.append(f"a hook on {obj[0]}" if isinstance(obj, tuple) and obj else repr(obj))
    return out
