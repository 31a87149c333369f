"""``batch_size="auto"``: the largest batch that fits, found by halving on out-of-memory.

The evaluator and the scoring pass run their longest inputs first, so the first batch is the largest one and an
out-of-memory error comes early: the retry loses little work.
"""

from __future__ import annotations

from typing import Callable, Iterable, TypeVar

import torch

from lens_heads.plumbing.errors import InputError

AUTO = "auto"
AUTO_START = {"cuda": 256}  # first size tried per device type; others (cpu, mps) start at DEFAULT_START
DEFAULT_START = 16
T = TypeVar("T")


def check_batch_size(batch_size) -> None:
    """A whole number >= 1, or ``"auto"``."""
    if batch_size == AUTO:
        return
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InputError(f"batch_size must be a whole number >= 1 or 'auto', got {batch_size!r}")


def first_size(device, n_rows: int) -> int:
    """Where halving starts: the device's start size, or fewer when there are fewer rows (rounded up to a power of
    two, so the sizes tried stay powers of two)."""
    kind = torch.device(device).type
    start = AUTO_START.get(kind, DEFAULT_START)
    return max(1, min(start, 1 << max(0, int(n_rows) - 1).bit_length()))


def is_out_of_memory(error: BaseException) -> bool:
    """CUDA's ``OutOfMemoryError``, or an allocator's RuntimeError that says it ran out of memory."""
    if isinstance(error, torch.OutOfMemoryError):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)


def halving(run: Callable[[int], T], start: int, hook_objects: Iterable = ()) -> T:
    """``run(size)`` from ``size = start``, halved after each out-of-memory error until it fits (at 1 the error is
    raised). Hook objects that count what they see (a ``HeadAblation``) are rewound to before the failed attempt."""
    objects = [obj for obj in hook_objects if hasattr(obj, "snapshot")]
    size = start
    while True:
        marks = [(obj, obj.snapshot()) for obj in objects]
        try:
            return run(size)
        except Exception as e:
            if not is_out_of_memory(e) or size == 1:
                raise
            for obj, mark in marks:
                obj.restore(mark)
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            size //= 2
