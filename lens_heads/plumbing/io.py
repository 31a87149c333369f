"""Atomic file output: a reader never sees a half-written result, even after Ctrl-C, and a full or read-only output
folder is a clear :class:`OutputFolderError` (the folder, the bytes it needed) that leaves no partial file behind."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

FOLDER_FAULTS = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "the disk quota is exceeded",
                 errno.EROFS: "the file system is read-only", errno.EACCES: "permission denied",
                 errno.EPERM: "permission denied"}


class OutputFolderError(OSError):
    """An output folder that can't take a result (full, over quota, read-only): what a run's folder needs to go on."""


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same folder and an atomic rename."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise _folder_error(e, path, len(data)) from e
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; results are meant to be shared
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise _folder_error(e, path, len(data)) from e
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _folder_error(error: OSError, path: Path, size: int) -> OSError:
    """``error`` said plainly where it is the folder's fault (full, read-only); other errors as they are."""
    if error.errno not in FOLDER_FAULTS:
        return error
    folder = next((p for p in [path.parent, *path.parent.parents] if p.exists()), path.parent)
    free = shutil.disk_usage(folder).free if folder.exists() else 0
    return OutputFolderError(error.errno, f"can't write {path.name} ({size:,} bytes) in {path.parent}: "
                             f"{FOLDER_FAULTS[error.errno]} ({free:,} bytes free there). Nothing partial was left; "
                             "free space (or give a writable output folder) and run the same command again: "
                             "finished results are kept and reused")


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
