"""Linear products by weights packed once into oneDNN's blocked layout, for forwards that record no gradient.

A plain ``F.linear`` on the CPU multiplies by the ``[out, in]`` matrix as it lies, and the matrix library re-packs
panels of it into its own tiles at every call. oneDNN can take the weight already in its blocked layout (the
packing torch's own compiler does when it freezes a model: ``torch.ops.mkldnn._reorder_linear_weight`` and
``_linear_pointwise``), so the packing is paid once per block of forwards. Whole evaluations against plain
products: ``benchmarks/bench_blocked.py`` (its record, ``docs/records/blocked_linear.json``, names the CPU).
The sums run in another order, so the values are the plain product's up to float32 rounding.

Used only where it applies: float32 weights and inputs on the CPU, no gradient recorded, and torch built with
oneDNN and not told to leave it out (``torch.backends.mkldnn.flags(enabled=False)`` turns it off, as for torch's
own oneDNN paths). Elsewhere the plain product runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor


def _op(name: str):
    try:
        return getattr(torch.ops.mkldnn, name)
    except (AttributeError, RuntimeError):  # a torch built without oneDNN, or one whose ops moved
        return None


_REORDER = _op("_reorder_linear_weight")
_LINEAR = _op("_linear_pointwise")
ROWS_HINT = 512  # the rows oneDNN picks its blocking for; any number of rows multiplies correctly


def available(weight: Tensor) -> bool:
    """Whether a product by ``weight`` can run blocked now."""
    return bool(_REORDER is not None and _LINEAR is not None and torch.backends.mkldnn.is_available()
                and torch.backends.mkldnn.enabled and weight.device.type == "cpu" and weight.dtype == torch.float32
                and not torch.is_grad_enabled())


@dataclass(frozen=True, eq=False)  # identity, as a module's: fields that are tensors have no useful equality
class Linear:
    """``x @ weight.T + bias``; by ``blocked`` (the weight in oneDNN's layout) where it applies at the call."""

    weight: Float[Tensor, "out d_in"]
    bias: Float[Tensor, " out"] | None
    blocked: Tensor | None

    def __call__(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... out"]:
        if (self.blocked is not None and x.device.type == "cpu" and x.dtype == torch.float32
                and not torch.is_grad_enabled() and torch.backends.mkldnn.enabled):
            return _LINEAR(x, self.blocked, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)


def linear(weight: Float[Tensor, "out d_in"], bias: Float[Tensor, " out"] | None = None) -> Linear:
    """A product by ``weight`` (``[out, in]``, laid out as ``F.linear`` takes it), packed into oneDNN's blocked layout
    where that applies now (see the module docstring). Packed, the weight is kept as given for the plain product, a
    transposed view without a copy of its own; otherwise it is laid out contiguously once."""
    if available(weight):
        return Linear(weight, bias, _REORDER(weight, ROWS_HINT))
    return Linear(weight.contiguous(), bias, None)
