"""A task run of the analyses: the options every per-task analysis script shares (which model and tasks, where the
outputs go, how many threads), how its recorded files are named, and the split of the recorded sweep it measures
beside.

The scripts' settings dataclasses extend :class:`TaskRunSettings`, so these flags read the same in each of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lens_heads.models.embedded import DEFAULT_MODEL
from lens_heads.plumbing.io import safe_name
from lens_heads.plumbing.provenance import SOURCE
from lens_heads.plumbing.settings import option
from lens_heads.sweep.result import SweepResult
from lens_heads.sweep.unit_store import read_units

FIGURES = SOURCE / "figures"  # the checkout's recorded inputs and outputs (the scripts run from a checkout)


@dataclass(frozen=True)
class TaskRunSettings:
    """Model, tasks and outputs of one run (each field is a ``--flag``)."""

    model: str = option(DEFAULT_MODEL, "model name (the embedded SmolLM2-135M by default)")
    tasks: tuple[str, ...] = option(("arc_easy", "piqa"), "comma-separated tasks")
    figures: str = option(str(FIGURES), "where recorded inputs are read, and tables and figures go")
    threads: int | None = option(None, "torch CPU threads (default: torch's choice)", parse=int)
    no_png: bool = option(False, "write HTML figures only (PNG needs Chromium)")


def recorded_name(model: str, task: str) -> str:
    """How recorded files and resumable folders name a task run on ``model``: ``<task>`` for the embedded default
    model, ``<model>_<task>`` for any other (``sweep_gemma-3-270m_arc_easy.json``), so no model's recordings are read
    or overwritten as another's."""
    return task if model == DEFAULT_MODEL else f"{safe_name(model)}_{task}"


def split_of(sweep: SweepResult) -> str:
    """The split a recorded sweep evaluated: the analyses that measure beside it read the same items, whatever the
    task's default split is now."""
    return sweep.baseline.meta["task"]["split"]


def sweep_split(figures: str | Path, name: str) -> str | None:
    """:func:`split_of` the sweep recorded in ``figures`` under ``name`` (a :func:`recorded_name`; None where none
    is recorded)."""
    path = Path(figures) / f"sweep_{name}_units.json.gz"
    return split_of(read_units(path)) if path.exists() else None
