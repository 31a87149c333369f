"""SIGTERM and SIGINT end a long run cleanly: what is finished stays, the run says how to resume, and the process
exits 143 (SIGTERM, a scheduler's preemption) or 130 (SIGINT, Ctrl-C).

Inside :func:`stoppable` both signals raise :class:`Stopped` at the next Python instruction of the main thread. That is
a safe point everywhere in lens_heads: every result is written whole or not at all (:mod:`lens_heads.plumbing.io`
writes through a temporary file and a rename, and removes the temporary file when interrupted), so the unit in
progress is dropped and every finished one (sweep units, head effects, cached report stages) is kept; the same call
run again finds them and resumes. ``Stopped`` is a ``SystemExit``: a script ends with the exit code without a
traceback, and ``except Exception`` (a report stage recording a failure) does not swallow it. The outermost
``stoppable`` block prints one line to stderr naming what stopped, where its finished work is and how to resume.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import signal
import sys
import threading
from typing import Callable, Iterator, TypeVar

F = TypeVar("F", bound=Callable)

EXIT_CODES = {signal.SIGTERM: 143, signal.SIGINT: 130}  # 128 + the signal's number, as a shell reports it
_depth = 0  # how many stoppable blocks are open: the outermost one speaks
_pending: list[int] = []  # a signal a deferring block received, raised at the next safe_point()


class Stopped(SystemExit):
    """A run stopped by SIGTERM or SIGINT; its ``code`` is the exit status (143 or 130)."""

    def __init__(self, signum: int):
        super().__init__(EXIT_CODES.get(signal.Signals(signum), 128 + signum))
        self.signal = signal.Signals(signum).name


def _raise(signum, frame) -> None:
    raise Stopped(signum)


def _defer(signum, frame) -> None:
    if _pending:  # a second signal: the caller insists, stop now
        raise Stopped(signum)
    _pending.append(signum)


def stop_requested() -> bool:
    """Whether a deferring block holds a signal: a loop writes what it must keep before its :func:`safe_point`."""
    return bool(_pending)


def safe_point() -> None:
    """Inside ``stoppable(..., defer=True)``: raise :class:`Stopped` here if a signal arrived since the block began
    (a training loop calls it between steps, after a checkpoint is written); elsewhere nothing happens."""
    if _pending:
        raise Stopped(_pending.pop())


@contextlib.contextmanager
def stoppable(what: str, kept: str | None, *, defer: bool = False) -> Iterator[None]:
    """Within this block SIGTERM and SIGINT raise :class:`Stopped` (module docstring). ``what`` names the run
    (``"sweep"``); ``kept`` says where its finished work is (``"in runs/sweep"``), None where nothing is kept (no
    output folder given). ``defer=True``: for loops whose state is only whole between steps (a model and its
    optimiser mid-update), a signal is held until the loop's next :func:`safe_point` (a second signal stops at
    once). Outside the main thread signals can't be caught, and the block changes nothing."""
    global _depth
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, _defer if defer else _raise) for s in EXIT_CODES}
    _depth += 1
    try:
        yield
    except Stopped as e:
        if _depth == 1:
            where = (f"every finished unit is kept {kept}; run the same command (or call) again to resume" if kept
                     else "nothing was kept (no output folder was given): give one to make the run resumable")
            print(f"lens_heads: {what} stopped by {e.signal} (exit {e.code}): {where}", file=sys.stderr, flush=True)
        raise
    finally:
        _depth -= 1
        if defer:
            _pending.clear()
        for s, handler in previous.items():  # None: a handler set outside Python, which can't be put back
            signal.signal(s, signal.SIG_DFL if handler is None else handler)


def stops_cleanly(what: str, folder: str = "out_dir") -> Callable[[F], F]:
    """Decorate a long run: it runs inside :func:`stoppable`, its finished work kept in its ``folder`` argument."""
    def decorate(fn: F) -> F:
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def run(*args, **kwargs):
            out = signature.bind_partial(*args, **kwargs).arguments.get(folder)
            with stoppable(what, None if out is None else f"in {out}"):
                return fn(*args, **kwargs)

        return run  # type: ignore[return-value]

    return decorate
