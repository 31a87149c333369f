"""How long each step of ``.ci/run`` takes on a fresh clone, written to docs/records/ci_durations.json.

    python benchmarks/time_ci.py [--steps "setup ruff"] [--out PATH] [--keep]

Clones the repository's HEAD into a temporary folder (what CI sees: no ``.venv``, no ``.venv-bridge``), runs its
``.ci/run`` with ``LENS_HEADS_CI_TIMES`` set (each step appends its wall, user and system seconds and the load
average as it starts and ends) and records every step, the whole run's wall time, the load average sampled during
it and the machine (CPU model and flags, torch's CPU capability), with the record's provenance. A run with a failing
step is printed, not recorded. ``--steps``: those steps of ``.ci/run`` alone (``LENS_HEADS_CI_STEPS``); the record
names the steps it holds and those it left out.

What a fresh clone still shares with the machine, said in the record: pip's wheel cache and configuration (the
set-up installs from them) and the embedded model's cache (``LENS_HEADS_CACHE``, default ``~/.cache/lens_heads``).
On a shared machine the wall seconds carry the neighbours' load; the CPU seconds (user + system of the step's
processes) do not, and a one-thread step's CPU seconds are what an idle core would take.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from lens_heads.plumbing.provenance import write_record
from lens_heads.plumbing.settings import option
from timing import cpu_description, parse_settings

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "docs" / "records" / "ci_durations.json"
LOAD_EVERY_S = 10.0


@dataclass(frozen=True)
class TimeCI:
    """Where to record the run."""

    steps: str = option("", "the .ci/run steps to run, space-separated (empty: all)")
    out: Path = option(RECORD, "the JSON record to write (replaced)", parse=Path)
    keep: bool = option(False, "keep the clone (its .venv and .venv-bridge) and print where it is")


def steps(lines: str) -> list[dict]:
    """The steps ``.ci/run`` appended (tab-separated: name, wall, user, system seconds, load average at its start
    and end), in order."""
    out = []
    for line in lines.splitlines():
        if not line.strip():
            continue
        name, wall, user, system, load_start, load_end = line.split("\t")
        out.append(dict(name=name, wall_s=round(float(wall), 1), cpu_s=round(float(user) + float(system), 1),
                        load_average_start=float(load_start), load_average_end=float(load_end)))
    return out


def ci_steps(script: Path) -> list[str]:
    """The names of the steps ``.ci/run`` runs, in the order written (its lines ``step NAME ...``, in functions
    too)."""
    return [line.split()[1] for line in script.read_text().splitlines() if line.lstrip().startswith("step ")]


class LoadSampler:
    """The 1-minute load average every ``every`` seconds while a run lasts (its mean and maximum go in the
    record: one reading at each end of a step says little about a 10-minute step)."""

    def __init__(self, every: float = LOAD_EVERY_S):
        self.every, self.readings, self._stop = every, [], threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.readings.append(os.getloadavg()[0])
            self._stop.wait(self.every)

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def model_cached() -> bool:
    """Whether the embedded model's dequantised folder is already in the cache (the run then loads it in
    seconds instead of dequantising it)."""
    from lens_heads.models import embedded

    return any(embedded.cache_dir().glob("**/config.json"))


def run(settings: TimeCI, clone: Path) -> dict:
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(clone)], check=True)
    times = clone.parent / "ci_times.tsv"
    env = {**os.environ, "LENS_HEADS_CI_TIMES": str(times), "LENS_HEADS_CI_STEPS": settings.steps}
    env.pop("PYTHONPATH", None)  # the clone's own lens_heads, installed by its set-up
    cached = model_cached()
    start = time.perf_counter()
    with LoadSampler() as load:
        done = subprocess.run(["bash", ".ci/run"], cwd=clone, env=env)
    wall = time.perf_counter() - start
    ran = steps(times.read_text() if times.exists() else "")
    every = ci_steps(clone / ".ci" / "run")
    return dict(date=time.strftime("%Y-%m-%dT%H:%M:%S%z"), commit=head, command="bash .ci/run (a fresh clone)",
                returncode=done.returncode, wall_s=round(wall, 1), cpu_s=round(sum(s["cpu_s"] for s in ran), 1),
                steps=ran, steps_left_out=[name for name in every if name not in {s["name"] for s in ran}],
                load_average_mean=round(sum(load.readings) / max(len(load.readings), 1), 2),
                load_average_max=round(max(load.readings, default=float("nan")), 2),
                shared_with_the_machine=dict(embedded_model_cached=cached,
                                             pip_cache=(Path.home() / ".cache" / "pip").is_dir()),
                cpu=cpu_description())


def main(argv: list[str] | None = None) -> None:
    settings = parse_settings(TimeCI, argv, __doc__)
    folder = Path(tempfile.mkdtemp(prefix="lens_heads_ci_"))
    record = run(settings, folder / "clone")
    for s in record["steps"]:
        print(f"{s['name']:14s} {s['wall_s']:7.1f} s wall {s['cpu_s']:7.1f} s CPU  load "
              f"{s['load_average_start']:.1f} -> {s['load_average_end']:.1f}")
    print({k: v for k, v in record.items() if k != "steps"})
    if settings.keep:
        print(f"the clone: {folder / 'clone'}")
    else:
        subprocess.run(["rm", "-rf", str(folder)], check=False)
    if record["returncode"] != 0:
        raise SystemExit(f".ci/run exited with {record['returncode']}: not recorded")
    write_record(settings.out, record)
    print(f"wrote {settings.out}")


if __name__ == "__main__":
    sys.exit(main())
