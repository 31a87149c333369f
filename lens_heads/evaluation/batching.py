"""``batch_size="auto"``: the largest batch that fits, found by halving on out-of-memory.

The evaluator and the scoring pass run their longest inputs first, so the first batch is the largest one and an
out-of-memory error comes early: the retry loses little work. Within :func:`settled_sizes` (a sweep's units: the same
rows under other hooks) the size one evaluation settled on is where the next one starts, so the run goes on at it
instead of running out of memory again for every unit.
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar
from typing import Callable, Iterable, Iterator, TypeVar

import torch

from lens_heads.evaluation.ablation_interface import Ablation
from lens_heads.plumbing.errors import InputError

AUTO = "auto"
AUTO_START = {"cuda": 256}  # first size tried per device type; others (cpu, mps) start at DEFAULT_START
DEFAULT_START = 16
T = TypeVar("T")
_SETTLED: ContextVar[dict[str, int] | None] = ContextVar("settled_batch_sizes", default=None)


@contextlib.contextmanager
def settled_sizes() -> Iterator[None]:
    """Within this block (or a function it decorates), each kind of pass (``"evaluate"``, ``"score"``) that halved
    after an out-of-memory error starts the next ``"auto"`` run at the size it settled on."""
    token = _SETTLED.set({})
    try:
        yield
    finally:
        _SETTLED.reset(token)


def check_batch_size(batch_size) -> None:
    """A whole number >= 1, or ``"auto"``."""
    if batch_size == AUTO:
        return
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InputError(f"batch_size must be a whole number >= 1 or 'auto', got {batch_size!r}")


def parse_batch_size(text: str) -> int | str:
    """A batch size written as text (a command-line flag, lm-eval's model_args): a whole number >= 1 or ``"auto"``."""
    text = str(text).strip()
    if text == AUTO:
        return AUTO
    try:
        size = int(text)
    except ValueError:
        raise InputError(f"batch_size must be a whole number >= 1 or 'auto', got {text!r}") from None
    check_batch_size(size)
    return size


def first_size(device, n_rows: int, what: str = "evaluate") -> int:
    """Where halving starts: the device's start size, or fewer when there are fewer rows (rounded up to a power of
    two, so the sizes tried stay powers of two), or the size a ``what`` pass settled on (:func:`settled_sizes`)."""
    kind = torch.device(device).type
    start = min(AUTO_START.get(kind, DEFAULT_START), (_SETTLED.get() or {}).get(what, 1 << 62))
    return max(1, min(start, 1 << max(0, int(n_rows) - 1).bit_length()))


def is_out_of_memory(error: BaseException) -> bool:
    """CUDA's ``OutOfMemoryError``, or an allocator's RuntimeError that says it ran out of memory."""
    if isinstance(error, torch.OutOfMemoryError):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)


def halving(run: Callable[[int], T], start: int, hook_objects: Iterable = (), what: str = "evaluate") -> T:
    """``run(size)`` from ``size = start``, halved after each out-of-memory error until it fits (at 1 the error is
    raised). Hook objects that count what they see (a ``HeadAblation``) are rewound to before the failed attempt.
    A size reached by halving is remembered for the next ``what`` pass within :func:`settled_sizes`."""
    objects = [obj for obj in hook_objects if isinstance(obj, Ablation)]  # the others are pairs' hook names
    size = start
    while True:
        marks = [(obj, obj.snapshot()) for obj in objects]
        try:
            result = run(size)
            settled = _SETTLED.get()
            if settled is not None and size < start:
                settled[what] = size
            return result
        except Exception as e:
            if not is_out_of_memory(e) or size == 1:
                raise
            for obj, mark in marks:
                obj.restore(mark)
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            size //= 2
