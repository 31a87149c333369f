"""Several processes share one evaluation, scoring pass or sweep: torchrun ranks (torch.distributed) or the tasks
of a scheduler's job array.

- **torchrun** (``torchrun --nproc_per_node=N script.py``; multi-node with its rendezvous): the environment holds
  ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK``. The first collective call joins the process group (NCCL on CUDA,
  gloo on the CPU); each rank holds its own model on ``cuda:LOCAL_RANK`` (or the CPU). ``evaluate`` and
  ``score_heads`` split their items into contiguous blocks, one per rank, and gather the per-item records, so every
  rank returns the whole result in the single-process order. ``run_sweep`` splits its units instead, each unit
  evaluated whole by one rank (so its numbers are exactly those of a single process).
- **a job array** (SLURM: ``SLURM_ARRAY_TASK_ID`` / ``SLURM_ARRAY_TASK_COUNT``): no process group; each task runs
  its share of a sweep's units into the shared ``out_dir``, and a final plain run reuses them all.

Without either, the world is one process and nothing changes. Only the main process (:func:`is_main`) writes
results, figures and reports. Hooks passed to a split ``evaluate`` see only their rank's items (a ``HeadAblation``'s
counts included); a sweep's units are whole, so theirs are complete.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from lens_heads.plumbing.errors import InputError

_LOCAL = contextvars.ContextVar("lens_heads_local", default=False)


@dataclass(frozen=True)
class Workers:
    """Who shares the work: ``count`` workers, this one is ``index``; ``kind`` is "single", "torchrun" or
    "array" (a scheduler's job array, each task possibly a torchrun group of its own)."""

    index: int
    count: int
    kind: str

    def share(self, n: int) -> range:
        """This worker's contiguous block of ``range(n)`` (blocks differ in size by at most one; may be empty)."""
        return block(n, self.index, self.count)

    def to_dict(self) -> dict:
        return dict(index=self.index, count=self.count, kind=self.kind)


def block(n: int, index: int, count: int) -> range:
    """Block ``index`` of ``count`` contiguous, nearly equal blocks of ``range(n)``."""
    return range(index * n // count, (index + 1) * n // count)


# ---------------------------------------------------------------- the torchrun world


def launched() -> bool:
    """True when this process is one of several torchrun ranks (``WORLD_SIZE`` > 1 in the environment)."""
    return _env_int("WORLD_SIZE", 1) > 1


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else _env_int("RANK", 0)


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else _env_int("WORLD_SIZE", 1)


def local_rank() -> int:
    return _env_int("LOCAL_RANK", 0)


def is_main() -> bool:
    """Whether this process writes results: rank 0 of a torchrun group, or the only process."""
    return rank() == 0


def device() -> str:
    """The device this process's model belongs on: ``cuda:LOCAL_RANK`` under torchrun, ``cuda`` alone, else cpu."""
    if not torch.cuda.is_available():
        return "cpu"
    return f"cuda:{local_rank()}" if launched() else "cuda"


def init() -> bool:
    """Join the torchrun process group if launched by torchrun and not joined yet (NCCL when CUDA is available,
    else gloo). Returns whether a process group is active. Called by every collective function here."""
    if not launched():
        return False
    if not dist.is_available():
        raise RuntimeError("launched by torchrun (WORLD_SIZE > 1) but this torch has no torch.distributed")
    if not dist.is_initialized():
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(local_rank())  # NCCL's object collectives use the current device
        dist.init_process_group(backend="nccl" if cuda else "gloo")
    return True


def sharding() -> bool:
    """Whether ``evaluate``/``score_heads`` split their items here: a torchrun group, outside :func:`local`."""
    return launched() and not _LOCAL.get()


@contextlib.contextmanager
def local():
    """Inside this block (or a function decorated with ``@local()``), ``evaluate`` and ``score_heads`` run whole on
    this process, not split across ranks: for work that is already divided (a sweep's units) or rank-specific."""
    token = _LOCAL.set(True)
    try:
        yield
    finally:
        _LOCAL.reset(token)


def all_gather(obj: Any) -> list:
    """``obj`` of every rank, in rank order (``[obj]`` without a process group)."""
    if not init():
        return [obj]
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    if init():
        dist.barrier()


def check_agree(value: Any, what: str) -> None:
    """Raise on every rank (before anything is written) unless all ranks hold the same ``value``."""
    values = all_gather(value)
    differ = [r for r, v in enumerate(values) if v != values[0]]
    if differ:
        detail = ""
        if isinstance(values[0], dict) and isinstance(values[differ[0]], dict):
            keys = sorted(k for k in set(values[0]) | set(values[differ[0]])
                          if values[0].get(k) != values[differ[0]].get(k))
            detail = f" (they differ in {', '.join(map(str, keys))})"
        raise InputError(f"the ranks disagree on the {what}: rank(s) {differ} differ from rank 0{detail}. Every "
                         "rank must load the same model and data with the same settings; nothing was written")


# ---------------------------------------------------------------- who runs which sweep unit


def unit_workers() -> Workers:
    """How a sweep's units are divided: by job array task (``SLURM_ARRAY_TASK_ID``/``SLURM_ARRAY_TASK_COUNT``;
    ``SLURM_ARRAY_TASK_MIN`` is subtracted from the id) and, within a task, by torchrun rank."""
    group_index, group_count = rank(), world_size()
    if "SLURM_ARRAY_TASK_ID" not in os.environ:
        return Workers(group_index, group_count, "torchrun" if group_count > 1 else "single")
    if "SLURM_ARRAY_TASK_COUNT" not in os.environ:
        raise InputError("SLURM_ARRAY_TASK_ID is set but SLURM_ARRAY_TASK_COUNT is not: a job array shards the "
                         "sweep only when it knows how many tasks share it")
    task = _env_int("SLURM_ARRAY_TASK_ID", 0) - _env_int("SLURM_ARRAY_TASK_MIN", 0)
    count = _env_int("SLURM_ARRAY_TASK_COUNT", 1)
    if not 0 <= task < count:
        raise InputError(f"SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN = {task} is outside the {count} array tasks: "
                         "use a contiguous array such as --array=0-3")
    return Workers(task * group_count + group_index, count * group_count, "array")


def _env_int(name: str, default: int) -> int:
    text = os.environ.get(name)
    if text is None or text == "":
        return default
    try:
        return int(text)
    except ValueError:
        raise InputError(f"environment variable {name}={text!r} is not a whole number") from None
