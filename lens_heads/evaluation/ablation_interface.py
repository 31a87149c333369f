"""What an ablation is to the evaluator, the sweep and the lm-eval model: one base class, :class:`Ablation`, and
for one unit of a sweep, :class:`UnitAblation`.

The vocabulary is TransformerLens's: an ablation is a list of ``(hook_name, fn)`` pairs on hook points such as
``blocks.{l}.attn.hook_z`` (a head's output before ``W_O``, ``[batch, pos, head, d_head]``) or
``blocks.{l}.hook_attn_out`` (``[batch, pos, d_model]``), which go wherever TransformerLens takes hooks
(``model.hooks(fwd_hooks=...)``, ``run_with_hooks``). Around those pairs the evaluator asks an ablation:

- :attr:`~Ablation.hooks`: its pairs (abstract: the one member every ablation defines);
- :meth:`~Ablation.batch`: a context manager entered around each forward, told the batch's attention mask, which
  input each row is (``first=`` or ``inputs=``), each row's key within its input (``rows=``, where
  :attr:`~Ablation.reads_rows`) and whether to count what it ablates (``count=False``: a shared prefix). Only
  ablations that decide or count per input need it (:attr:`~Ablation.per_input`);
- :attr:`~Ablation.prefix_scope`: over which rows its action at a position is alike, so that a shared prefix may run
  once (``"any"``, ``"item"``; None: it reads the whole row, :mod:`lens_heads.evaluation.prefix`);
- :meth:`~Ablation.snapshot` / :meth:`~Ablation.restore` / :meth:`~Ablation.reset`: rewind what it counted (a batch
  that ran out of memory and is retried smaller, :mod:`lens_heads.evaluation.batching`);
- :attr:`~Ablation.cache_exact`: whether a key/value cache stays exact under it: what it does at a position is fixed
  once that position has run (it reads no later position and decides no differently as the sequence grows), so
  generation may run only each new token against the keys and values of the earlier ones
  (:mod:`lens_heads.evaluation.cached_generation`). False (the default, and what a threshold zeroing declares, since
  it decides from the whole sequence): generation reruns the whole sequence at every step;
- :attr:`~Ablation.units`: a stack of units run in one forward (:mod:`lens_heads.ablation.stacked`) lists them, and
  the evaluator runs one copy of each batch per unit; None for one ablation;
- :meth:`~Ablation.zeroed_by_input`: per input id, (rows counted, (layer, head) pairs ablated), where
  :attr:`~Ablation.counts_inputs`.

A unit of a sweep (:class:`UnitAblation`) also says which heads it took out (:meth:`~UnitAblation.zeroed`,
:meth:`~UnitAblation.share_zeroed`), which the sweep records. The ablations: head ablations
(:class:`lens_heads.ablation.hooks.HeadAblation`: static, per-input, threshold and random zeroing), a layer removal
(:class:`lens_heads.ablation.removed_layers.RemovedLayers`) and a stack of head ablations
(:class:`lens_heads.ablation.stacked.StackedAblation`). A new kind of ablation is one subclass: ``hooks``, and
``batch`` with ``per_input = True`` where it decides per input, and ``cache_exact = True`` where it acts on each
position alone.

Hook sets also take plain pairs, and objects of other classes with a ``.hooks`` list (and, optionally, the members
above): :func:`as_ablation` reads those once, at the door, so that nothing past it asks an object what it can do.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from typing import Any, Callable, ContextManager, Sequence

from jaxtyping import Bool, Int
from torch import Tensor

HookFn = Callable[..., Tensor | None]
HookPair = tuple[str, HookFn]


class Ablation(ABC):
    """Hooks the evaluator runs and tells about each batch (module docstring: what each member means)."""

    description: str = ""  # what the results' ``meta["hooks"]`` call it (empty: its repr)
    prefix_scope: str | None = None  # "any" | "item" | None: the rows over which its action is alike at a position
    reads_rows: bool = False  # batch() needs each row's key within its input (a per-row draw)
    per_input: bool = False  # batch() must be entered around each forward (it decides or counts per input)
    counts_inputs: bool = False  # zeroed_by_input() counts what each input lost
    cache_exact: bool = False  # a key/value cache of earlier positions stays exact under it (module docstring)
    units: Sequence[UnitAblation | None] | None = None  # a stack's units (None: the baseline's), one copy each

    @property
    @abstractmethod
    def hooks(self) -> list[HookPair]:
        """TransformerLens ``(hook_name, fn)`` pairs."""

    def batch(self, attention_mask: Bool[Tensor, "batch pos"] | None = None, *, first: int | None = None,
              inputs: Int[Tensor, "batch"] | Sequence[int] | None = None,
              rows: Int[Tensor, "batch"] | Sequence[int] | None = None,
              count: bool = True) -> ContextManager[Any]:
        """Entered around each forward where :attr:`per_input`: the batch's real positions, its rows' input ids
        (``first``: inputs ``first, first+1, ...``; or ``inputs``, one per row), their keys (``rows``) and whether
        to count. This one needs none of it."""
        return contextlib.nullcontext(self)

    def snapshot(self) -> Any:
        """What was counted so far, for :meth:`restore`."""
        return None

    def restore(self, snapshot: Any) -> None:
        """Forget what was counted after ``snapshot``."""

    def reset(self) -> None:
        """Forget everything counted."""

    def zeroed_by_input(self) -> dict[int, tuple[int, int]]:
        """Per input id: (rows counted, (layer, head) pairs ablated over them); empty unless :attr:`counts_inputs`."""
        return {}


class UnitAblation(Ablation):
    """One unit of a sweep: an :class:`Ablation` that says which heads it took out."""

    n_layers: int
    n_heads: int

    @abstractmethod
    def zeroed(self) -> Bool[Tensor, "input layer head"]:
        """Which heads were ablated for each input row counted (one row where it is the same for every input)."""

    @abstractmethod
    def share_zeroed(self) -> float:
        """The realised share of heads ablated, averaged over layers."""


def describe(obj: Ablation | str) -> str:
    """What a result's ``meta["hooks"]`` calls a hook set's member: an ablation's description, a pair's hook name."""
    return repr(obj) if isinstance(obj, str) else obj.description or repr(obj)


def as_ablation(obj: object) -> Ablation:
    """``obj`` (a member of a hook set that is not a pair, :func:`is_hook_object`) as an :class:`Ablation`: itself,
    or an object of another class with a ``.hooks`` list read through :class:`Foreign`."""
    if isinstance(obj, Ablation):
        return obj
    return Foreign(obj)


def is_hook_object(obj: object) -> bool:
    """Whether ``obj`` is one member of a hook set that is not a pair: an :class:`Ablation`, or an object with
    ``.hooks`` (the door :class:`Foreign` reads)."""
    return isinstance(obj, Ablation) or hasattr(obj, "hooks")


class Foreign(Ablation):
    """An object of another class that has a ``.hooks`` list, read as an :class:`Ablation`: each member it lacks
    takes the base class's meaning (no batch, no prefix sharing, nothing counted). The one place where an object is
    asked what it can do."""

    def __init__(self, obj: Any):
        self.obj = obj
        self.description = getattr(obj, "description", None) or repr(obj)
        self.prefix_scope = getattr(obj, "prefix_scope", None)
        self.reads_rows = bool(getattr(obj, "reads_rows", False))
        self.per_input = hasattr(obj, "batch")
        self.counts_inputs = hasattr(obj, "zeroed_by_input")
        self.cache_exact = getattr(obj, "cache_exact", False) is True
        self.units = list(obj.units) if hasattr(obj, "copies") else None

    @property
    def hooks(self) -> list[HookPair]:
        return self.obj.hooks

    def batch(self, attention_mask=None, *, first=None, inputs=None, rows=None, count=True) -> ContextManager[Any]:
        told: dict = dict(first=first) if first is not None else dict(inputs=inputs)
        if rows is not None:
            told["rows"] = rows
        if not count:
            told["count"] = False
        return self.obj.batch(attention_mask, **told) if self.per_input else contextlib.nullcontext(self)

    def snapshot(self) -> Any:
        return self.obj.snapshot() if hasattr(self.obj, "snapshot") else None

    def restore(self, snapshot: Any) -> None:
        if hasattr(self.obj, "restore"):
            self.obj.restore(snapshot)

    def reset(self) -> None:
        if hasattr(self.obj, "reset"):
            self.obj.reset()

    def zeroed_by_input(self) -> dict[int, tuple[int, int]]:
        return self.obj.zeroed_by_input() if self.counts_inputs else {}

    def __repr__(self) -> str:
        return repr(self.obj)
