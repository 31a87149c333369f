"""The one error type for bad input to lens_heads: raised at the public functions, naming the argument and what to
do. A ``ValueError`` subclass, so ``except ValueError`` keeps working."""

from __future__ import annotations


class InputError(ValueError):
    """Bad input to a lens_heads function; the message names the argument and what to give instead."""


class NonFiniteError(InputError):
    """A model's numbers went NaN or infinite (a diverged fine-tune, a NaN weight, a float16/bfloat16 overflow): the
    message names the inputs and, where it could be found, the first hook point whose output was non-finite."""
