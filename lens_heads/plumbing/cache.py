"""Finished work kept on disk, so a rerun (or a resumed one) computes only what is missing.

One rule everywhere: a value is stored beside the key it was computed under (a JSON dict of everything its numbers
depend on: model, data, sample, seed, settings), and is reused only when a rerun's key is equal. Every write is
atomic, so a killed run leaves either the finished value or nothing. Used by the report's stages, the sweep's units
and calibration, the analyses' caches, head effects and training runs.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Callable

from lens_heads.plumbing.errors import InputError
from lens_heads.plumbing.io import atomic_write_json


def canonical(key: Any) -> Any:
    """``key`` as it reads back from JSON (tuples become lists, paths and other objects their ``str``), so a key
    compares equal to its stored copy."""
    return json.loads(json.dumps(key, sort_keys=True, default=str))


def digest(key: Any, length: int = 12) -> str:
    """A short hash of ``key`` for file names."""
    return hashlib.sha256(json.dumps(canonical(key), sort_keys=True).encode()).hexdigest()[:length]


def read_json(path: str | Path) -> Any | None:
    """The JSON in ``path``, or None where it is missing or unreadable (a torn or foreign file is recomputed)."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def load_keyed(path: str | Path, key: Any) -> Any | None:
    """The value stored in ``path`` under ``key``, or None where there is none or it was computed under another key."""
    entry = read_json(path)
    if not isinstance(entry, dict) or entry.get("key") != canonical(key):
        return None
    return entry.get("value")


def save_keyed(path: str | Path, key: Any, value: Any) -> Path:
    """Store ``value`` with ``key`` in ``path``, atomically."""
    return atomic_write_json(path, {"key": canonical(key), "value": value})


def keyed(path: str | Path, key: Any, compute: Callable[[], Any]) -> Any:
    """The value stored in ``path`` under ``key``; computed by ``compute()`` and stored first where missing."""
    value = load_keyed(path, key)
    if value is None:
        value = compute()
        save_keyed(path, key, value)
    return value


def claim_folder(folder: str | Path, key: Any, marker: str = "key.json") -> Path:
    """Mark ``folder`` as holding the resumable units of the run ``key`` (in ``folder/marker``), or refuse a folder
    that holds another run's units, naming the settings that differ."""
    folder = Path(folder)
    stored = read_json(folder / marker)
    if isinstance(stored, dict) and "key" in stored:
        if stored["key"] != canonical(key):
            raise InputError(f"{folder} holds a run of another configuration ({_diff(stored['key'], canonical(key))}):"
                             " pass a new output folder, or delete this one to start over")
        return folder
    atomic_write_json(folder / marker, {"key": canonical(key)})
    return folder


class Cache:
    """A folder of keyed entries, each named by a label and the digest of its key (``<root>/<label>-<digest>``).
    Work that keeps its own resumable units (a sweep, head effects, a training run) claims a folder of its own
    instead (:func:`claim_folder`)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def path(self, label: str, key: Any, suffix: str = "") -> Path:
        return self.root / f"{label}-{digest(key)}{suffix}"

    def json(self, label: str, key: Any, compute: Callable[[], Any]) -> Any:
        """A JSON value, computed once per key."""
        return keyed(self.path(label, key, ".json"), key, compute)

    def file(self, label: str, key: Any, suffix: str, write: Callable[[Path], None], read: Callable[[Path], Any]):
        """A value kept in its own file (safetensors, ...): ``write(path)`` where no finished entry exists, then
        ``read(path)``. The key is stored last, and only once the file exists (a ``write`` may leave the saving to
        another process), so it marks the file as complete."""
        path, marker = self.path(label, key, suffix), self.path(label, key, ".json")
        if load_keyed(marker, key) is None or not path.exists():
            write(path)
            if path.exists():
                save_keyed(marker, key, {"file": path.name})
        return read(path)


def _diff(a: Any, b: Any) -> str:
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return "differs"
    keys = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    return "differs in " + ", ".join(keys) if keys else "same"
