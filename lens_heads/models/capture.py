"""One layer at a time: keep a layer's captured activations until its ``hook_z``, where one function sees them all.

The scoring pass and the per-input zeroing both decide at ``blocks.{l}.attn.hook_z`` from the same layer's
``hook_pattern`` and ``hook_v``, which fire earlier in the same attention forward. Holding only the current layer
is what keeps both from needing a full activation cache.
"""

from __future__ import annotations

import difflib
from typing import Callable, Iterable, Sequence

from torch import Tensor

from lens_heads.models.backends import get_act_name
from lens_heads.plumbing.errors import InputError

HookPair = tuple[str, Callable]
AtZ = Callable[[int, Tensor, dict[str, Tensor]], "Tensor | None"]


class LayerCapture:
    """``at_z(layer, z, acts)`` runs at every layer's ``hook_z`` with ``acts`` = that layer's captured activations
    (``capture`` names such as ``"v"``, ``"pattern"``, the same for every layer, or a function of the layer giving
    them); what it returns replaces ``z`` (None leaves it)."""

    def __init__(self, n_layers: int, at_z: AtZ,
                 capture: Sequence[str] | Callable[[int], Sequence[str]] = ("v", "pattern")):
        self.n_layers = n_layers
        self.capture = capture if callable(capture) else (lambda layer, names=tuple(capture): names)
        self._at_z = at_z
        self._held: dict[int, dict[str, Tensor]] = {}

    @property
    def hooks(self) -> list[HookPair]:
        """TransformerLens ``(hook_name, fn)`` pairs: each layer's captures, then its ``hook_z``."""
        pairs: list[HookPair] = []
        for layer in range(self.n_layers):
            pairs += [(get_act_name(name, layer), self._keeper(layer, name)) for name in self.capture(layer)]
            pairs.append((get_act_name("z", layer), self._caller(layer)))
        return pairs

    def leftover(self) -> list[str]:
        """Captures that no ``hook_z`` consumed (an attention layer that doesn't follow the standard hooks)."""
        return [f"blocks.{layer}.{name}" for layer, acts in sorted(self._held.items()) for name in acts]

    def _keeper(self, layer: int, name: str):
        def hook(x: Tensor, hook=None) -> None:
            self._held.setdefault(layer, {})[name] = x

        return hook

    def _caller(self, layer: int):
        def hook(z: Tensor, hook=None):
            return self._at_z(layer, z, self._held.pop(layer, {}))

        return hook


def check_hook_names(model, names: Sequence) -> None:
    """Refuse hook names the model doesn't have, naming them and the closest it does have (TransformerLens would
    fail with a KeyError from deep inside). Callables (TransformerLens name filters) pass as they are."""
    unknown = [name for name in names if isinstance(name, str) and name not in model.hook_dict]
    if unknown:
        hints = [f"{name!r}" + (f" (did you mean {close[0]!r}?)" if (close := difflib.get_close_matches(
            name, list(model.hook_dict), n=1)) else "") for name in dict.fromkeys(unknown)]
        raise InputError(f"this model has no hook {', '.join(hints)}: its {model.cfg.n_layers} layers have hooks "
                         "such as 'blocks.0.attn.hook_z' (see model.hook_dict)")


def any_hooked(points: Iterable) -> bool:
    """Whether any of the hook points ``points`` holds a hook, forward or backward, as TransformerLens lists them
    (``HookPoint.has_hooks``: every hook added through ``add_hook``, ``model.hooks()`` or ``run_with_hooks``). A hook
    registered on a point with torch's own ``register_forward_hook`` bypasses TransformerLens and isn't listed."""
    return any(p.has_hooks("both") for p in points)
