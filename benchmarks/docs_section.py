"""Shared by the benchmark scripts: the machine line and the writing of one section of docs/benchmarks.md."""

from __future__ import annotations

import os
import platform
import re
import time
from pathlib import Path

import torch

from lens_heads.io import atomic_write_text

DOCS = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"


def machine_line(started_load: float | None = None) -> str:
    """Where and how loaded the numbers were made: the load average says whether absolute times can be read."""
    load = os.getloadavg()[0]
    start = f"{started_load:.1f} at the start, " if started_load is not None else ""
    return (f"{time.strftime('%Y-%m-%d')}; {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
            f"{torch.get_num_threads()} threads; load average {start}{load:.1f} at the end")


def write_section(heading: str, body: str, path: Path = DOCS) -> None:
    """Replace (or append) the ``## heading`` section of ``path``, leaving the other sections as they are."""
    old = path.read_text() if path.exists() else "# Benchmarks\n"
    section = f"## {heading}\n\n{body.strip()}\n"
    pattern = re.compile(rf"^## {re.escape(heading)}\n.*?(?=^## |\Z)", re.S | re.M)
    new = pattern.sub(lambda _: section + "\n", old) if pattern.search(old) else old.rstrip() + "\n\n" + section
    atomic_write_text(path, new)
    print(f"wrote the '{heading}' section of {path}")
