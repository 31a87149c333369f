"""Atomic file output: a reader never sees a half-written result, even after Ctrl-C."""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same folder and an atomic rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; results are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Atomically write UTF-8 text."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    """Atomically write ``obj`` as indented JSON (NaN is written as null so browsers can read it)."""
    return atomic_write_text(path, json.dumps(_nan_to_none(obj), indent=2, sort_keys=False) + "\n")


def _nan_to_none(obj: Any) -> Any:
    if isinstance(obj, float) and obj != obj:
        return None
    if isinstance(obj, dict):
        return {k: _nan_to_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_nan_to_none(v) for v in obj]
    return obj


def slug(text: str, keep: str = "") -> str:
    """``text`` as a file-name fragment: each run of characters other than ASCII letters, digits and ``keep``
    becomes one ``_`` (``"AHON (LN)"`` -> ``"AHON_LN"``)."""
    allowed = re.escape(keep)
    return re.sub(rf"[^A-Za-z0-9{allowed}]+", "_", text).strip("_") or "_"


def safe_name(model: str) -> str:
    """A folder name for a model name or path (``gpt2-medium``, ``/path/to/folder`` -> ``folder``)."""
    return slug(model.rstrip("/").split("/")[-1] or "model", keep="-_.")
