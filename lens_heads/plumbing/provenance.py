"""Where a recorded result came from: when, from which commit of lens_heads, with which packages, on what machine.

Every record an analysis or a report writes carries this block (:func:`write_record`), so a number in the docs can
say when and from which code it was made without anyone typing a date.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from lens_heads.plumbing.io import atomic_write_json

PACKAGES = ("lens_heads", "torch", "transformer_lens", "transformers", "numpy", "pandas", "scipy", "plotly",
            "kaleido", "circuitsvis")
SOURCE = Path(__file__).resolve().parents[2]  # the checkout (or site-packages) lens_heads is imported from


def versions(packages: tuple[str, ...] = PACKAGES) -> dict[str, str]:
    """The installed version of each of ``packages`` (``"not installed"`` where absent) and Python's."""
    out = {"python": platform.python_version()}
    for package in packages:
        for name in (package.replace("_", "-"), package):
            try:
                out[package] = importlib.metadata.version(name)
                break
            except importlib.metadata.PackageNotFoundError:
                out[package] = "not installed"
    return out


def cpus() -> int:
    """The CPUs this process may run on (its affinity where the OS tells it, else the machine's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def code_commit(source: Path = SOURCE) -> dict[str, Any]:
    """The git commit of the checkout lens_heads runs from and whether its tracked files outside ``figures/`` and
    ``docs/`` (the code) differ from it; both None where lens_heads is not run from a git checkout (an installed
    wheel) or git is missing."""
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(source), *args], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return dict(commit=None, dirty=None)
    # outputs (figures/, docs/) a run writes before its record would mark every recording dirty: code only
    status = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)figures", ":(exclude)docs")
    return dict(commit=commit, dirty=None if status is None else bool(status))


def provenance() -> dict[str, Any]:
    """When (UTC), from which code and on what machine: the block :func:`write_record` adds to a record."""
    import torch  # imported here: reading a record's provenance needs no torch

    return dict(recorded_at=datetime.now(timezone.utc).isoformat(timespec="seconds"), **code_commit(),
                versions=versions(), machine=dict(platform=platform.platform(), cpus=cpus(),
                                                  torch_threads=torch.get_num_threads()))


def write_record(path: str | os.PathLike, record: dict[str, Any]) -> Path:
    """Atomically write ``record`` as JSON with its :func:`provenance` under ``"provenance"``."""
    if "provenance" in record:
        raise ValueError("the record already has a 'provenance' key: write_record adds it")
    return atomic_write_json(path, {**record, "provenance": provenance()})
