"""What every stage of the report returns (:class:`StageResult`: numbers for results.json, CSV tables, figures), its
numbers made plain JSON, and the cache a stage keeps its computed files in."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol, TypeVar

import numpy as np
import torch

from lens_heads.plumbing import distributed
from lens_heads.plumbing.cache import Cache


@dataclass(frozen=True)
class StageResult:
    """What a stage computed: its part of results.json, its CSV tables and its figures (by file stem)."""

    numbers: dict
    tables: dict = field(default_factory=dict)
    figures: dict = field(default_factory=dict)


def jsonable(obj):
    """Plain JSON types for results.json (tensors and arrays become lists, unknown objects strings)."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, (torch.Tensor, np.ndarray)):
        return jsonable(obj.tolist())
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    return str(obj)


class _Saveable(Protocol):
    def save(self, path: Path) -> object: ...


S = TypeVar("S", bound=_Saveable)


def cached_file(cache: Cache, label: str, key: dict, suffix: str, compute: Callable[[], S],
                load: Callable[[Path], S]) -> tuple[S, bool]:
    """``(value, reused)``: the value kept under ``key`` (read by ``load(path)``), or ``compute()`` saved there by
    rank 0 (the value's own ``.save(path)``)."""
    fresh: list[S] = []

    def write(path):
        fresh.append(compute())
        if distributed.is_main():
            fresh[0].save(path)

    value = cache.file(label, key, suffix, write, lambda path: fresh[0] if fresh else load(path))
    return value, not fresh
