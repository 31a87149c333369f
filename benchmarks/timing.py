"""Shared by the benchmark scripts: threads, wall and CPU timing, alternating runs, the machine line and the
writing of one section of docs/records/benchmarks.md.

Compared runs alternate (A B A B ...) so that a neighbour's load hits both alike; each run's wall and CPU seconds
are kept, so a script reports medians (``.wall``, ``.cpu``), the least disturbed round (``.best``) or round-by-round
ratios (``.walls``). On a shared machine the CPU seconds of a one-thread run are what an idle core would take.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from lens_heads.plumbing.io import atomic_write_text
from lens_heads.plumbing.settings import from_args, option

DOCS = Path(__file__).resolve().parents[1] / "docs" / "records" / "benchmarks.md"


# ---------------------------------------------------------------- settings: the flags the scripts share


def repeats_option(default: int) -> Any:
    return option(default, "alternating repetitions per comparison")


def rounds_option(default: int) -> Any:
    return option(default, "interleaved timing rounds (median reported)")


def batch_size_option(default: int) -> Any:
    return option(default, "rows per forward")


def threads_option() -> Any:
    return option(None, "torch threads (unset: torch's choice)", parse=int)


def write_docs_option(section: str) -> Any:
    return option(False, f"replace the '{section}' section of docs/records/benchmarks.md")


@dataclass(frozen=True)
class Comparison:
    """Settings of a benchmark of compared runs on the embedded model."""

    repeats: int = repeats_option(2)
    batch_size: int = batch_size_option(8)
    write_docs: bool = option(False, "write the figures into docs/records/benchmarks.md")


def parse_settings(cls, argv, doc: str):
    """The settings dataclass ``cls`` from the command line; ``--help`` shows the script's docstring ``doc``."""
    return from_args(cls, argv, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)


# ---------------------------------------------------------------- timing


def set_threads(threads: int | None) -> None:
    """Use ``threads`` torch threads (None: leave torch's choice, e.g. from OMP_NUM_THREADS)."""
    if threads:
        torch.set_num_threads(threads)


def load_average() -> float:
    return os.getloadavg()[0]


@dataclass
class Timing:
    """Wall and CPU seconds of the runs of one function, and the output of its last run."""

    walls: list[float] = field(default_factory=list)
    cpus: list[float] = field(default_factory=list)
    out: Any = None

    @property
    def wall(self) -> float:
        return statistics.median(self.walls)

    @property
    def cpu(self) -> float:
        return statistics.median(self.cpus)

    @property
    def best(self) -> float:
        """The fastest run: on a shared machine, the least disturbed estimate of the cost."""
        return min(self.walls)

    def run(self, fn: Callable[[], Any], keep: bool = True) -> Timing:
        wall, cpu = time.perf_counter(), time.process_time()
        out = fn()
        self.walls.append(time.perf_counter() - wall)
        self.cpus.append(time.process_time() - cpu)
        self.out = out if keep else None
        return self


def timed(fn: Callable[[], Any]) -> Timing:
    """One run of ``fn``."""
    return Timing().run(fn)


def repeated(fn: Callable[[], Any], repeats: int) -> Timing:
    """``repeats`` runs of ``fn`` back to back."""
    timing = Timing()
    for _ in range(repeats):
        timing.run(fn)
    return timing


def alternate(fns: Mapping[str, Callable[[], Any]], repeats: int, *, prepared: bool = False,
              keep: Sequence[str] | None = None, show: bool = False) -> dict[str, Timing]:
    """Run the functions in turn ``repeats`` times; per name, its timings and its last output.

    ``prepared``: each function is a set-up, run untimed, that returns the function to time (a fresh model, say).
    ``keep``: the names whose output is kept (default all; a large output is dropped at once so that it does not
    weigh on the runs after it). ``show``: print each run's wall time as it ends.
    """
    timings = {name: Timing() for name in fns}
    for round_ in range(repeats):
        for name, fn in fns.items():
            timing = timings[name].run(fn() if prepared else fn, keep=keep is None or name in keep)
            if show:
                print(f"  round {round_ + 1}: {name:12s} {timing.walls[-1]:6.1f} s", flush=True)
    return timings


# ---------------------------------------------------------------- the machine and the docs


CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")  # the vector units torch's kernels pick between


def cpu_description(threads: int | None = None) -> dict[str, Any]:
    """The CPU a timing ran on: lscpu's model name, which of :data:`CPU_FLAGS` it has, the cores this process may
    use, torch's CPU capability (the kernels ATen dispatched to) and the torch threads of the timed run (``threads``
    where it set its own, else this process's)."""
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        lscpu = ""
    fields = dict(line.split(":", 1) for line in lscpu.splitlines() if ":" in line)
    flags = set(fields.get("Flags", "").split())
    return dict(model=" ".join(fields.get("Model name", platform.processor()).split()),
                flags={flag: flag in flags for flag in CPU_FLAGS}, cores=len(os.sched_getaffinity(0)),
                torch_cpu_capability=torch.backends.cpu.get_cpu_capability(), torch_threads=threads or torch.get_num_threads())


def machine_line(started_load: float | None = None) -> str:
    """Where and how loaded the numbers were made: the load average says whether absolute times can be read."""
    start = f"{started_load:.1f} at the start, " if started_load is not None else ""
    return (f"{time.strftime('%Y-%m-%d')}; {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
            f"{torch.get_num_threads()} threads; load average {start}{load_average():.1f} at the end")


def cpu_line() -> str:
    """The CPU as a record names it: its model (/proc/cpuinfo, lscpu's "Model name"), which of the flags that pick
    torch's kernels it has, and the kernels torch chose (its CPU capability)."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = re.search(r"^model name\s*:\s*(.+)$", info, re.M)
    flags = set((re.search(r"^flags\s*:\s*(.+)$", info, re.M) or re.search("(.*)", "")).group(1).split())
    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
    has = ", ".join(f for f in wanted if f in flags) or "none of avx2/avx512f/avx512_bf16/amx"
    capability = torch.backends.cpu.get_cpu_capability()
    return f"CPU {model.group(1).strip() if model else platform.processor() or 'unknown'} (flags: {has}); " \
           f"torch CPU capability {capability}"


def commit_words() -> str:
    """``commit abc1234`` (``with local changes`` where the checkout differs from it), or "" outside a git checkout."""
    from lens_heads.plumbing.provenance import code_commit

    code = code_commit()
    if not code["commit"]:
        return ""
    return f"commit {code['commit'][:7]}" + (" with local changes" if code["dirty"] else "")


def print_machine(started_load: float) -> str:
    """Print the machine line (load at the start and now, the CPU, the commit measured) and return it."""
    machine = "; ".join(x for x in (machine_line(started_load), cpu_line(), commit_words()) if x)
    print(f"machine: {machine}")
    return machine


def write_section(heading: str, body: str, path: Path = DOCS) -> None:
    """Replace (or append) the ``## heading`` section of ``path``, leaving the other sections as they are."""
    old = path.read_text() if path.exists() else "# Benchmarks\n"
    section = f"## {heading}\n\n{body.strip()}\n"
    pattern = re.compile(rf"^## {re.escape(heading)}\n.*?(?=^## |\Z)", re.S | re.M)
    new = pattern.sub(lambda _: section + "\n", old) if pattern.search(old) else old.rstrip() + "\n\n" + section
    atomic_write_text(path, new)
    print(f"wrote the '{heading}' section of {path}")


def write_printed(heading: str, command: str, machine: str, note: str, blocks: Sequence[Sequence[str]],
                  after: Sequence[str] = ()) -> None:
    """The docs section of a script that prints blocks of lines: its command and machine, ``note``, the printed
    blocks in one fenced block (a blank line between blocks), then the paragraphs ``after``."""
    printed = [line for i, block in enumerate(blocks) for line in ([""] if i else []) + list(block)]
    paragraphs = [line for paragraph in after for line in ("", paragraph)]
    write_section(heading, "\n".join([f"`{command}` ({machine}){note}", "", "```", *printed, "```", *paragraphs]))


def print_and_write(record: dict, path: Path, write: bool) -> None:
    """Print a benchmark's JSON record, and write it to ``path`` (atomically) where ``write`` asks for it."""
    text = json.dumps(record, indent=1)
    print(text)
    if write:
        atomic_write_text(path, text + "\n")
        print(f"wrote {path}")
