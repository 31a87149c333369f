"""The fast tier's wall time and test count, written to docs/records/fast_tier.json (git keeps the earlier ones).

    python benchmarks/time_fast_tier.py [--workers 2] [--threads 1] [--pytest-args "tests/test_rows.py"] [--out PATH]

Runs ``python -m pytest -m "not slow" -q -n 2`` (this interpreter, from the repository root; ``--workers``
pytest-xdist processes, each computing on its share of the cores, ``tests/conftest.py``) in a child process and
records the date, the load average before and after, the CPU (model, vector flags, torch's CPU capability), the wall
seconds (interpreter start and collection included: what the tier costs), the CPU seconds of the run (user +
system: on one thread, what an idle core would take, whatever the neighbours' load) and the counts pytest reports, with the record's provenance (the commit
and whether the tree had changes, package versions, machine).
Run it on an idle machine: the load average beside the figure says whether it can be read. A run with failures
is printed, not recorded; ``--pytest-args`` (extra arguments, e.g. a subset of files) are recorded with the run.
"""

from __future__ import annotations

import os
import re
import resource
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from lens_heads.plumbing.provenance import write_record
from lens_heads.plumbing.settings import option
from timing import cpu_description, parse_settings

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "docs" / "records" / "fast_tier.json"
TIER = ["-m", "not slow", "-q", "-p", "no:cacheprovider"]


@dataclass(frozen=True)
class FastTier:
    """What to run and where to record it."""

    workers: int = option(2, "pytest-xdist worker processes (0: one pytest process)")
    threads: int | None = option(None, "OMP_NUM_THREADS for the run (unset: inherited; under xdist each worker "
                                       "takes its share of the cores)", parse=int)
    pytest_args: str = option("", "extra pytest arguments, e.g. a subset of test files (recorded with the run)")
    out: Path = option(RECORD, "the JSON record to write (replaced)", parse=Path)


def counts(summary: str) -> dict[str, int]:
    """``{"passed": 502, "deselected": 81, ...}`` from pytest's last line ("502 passed, 81 deselected in 99.1s")."""
    found = re.findall(r"(\d+) (passed|failed|skipped|deselected|xfailed|xpassed|errors?|warnings?)\b", summary)
    return {{"error": "errors", "warning": "warnings"}.get(word, word): int(n) for n, word in found}


def run(settings: FastTier) -> dict:
    env = dict(os.environ)
    if settings.threads:
        env["OMP_NUM_THREADS"] = str(settings.threads)
    command = [sys.executable, "-m", "pytest", *TIER, "-n", str(settings.workers), *shlex.split(settings.pytest_args)]
    load_before = os.getloadavg()
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    load_after = os.getloadavg()
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    summary = lines[-1] if lines else ""
    # "date" beside the provenance block: the README reads it from the committed record
    return dict(date=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                command=shlex.join(["python", *command[1:]]), workers=settings.workers,
                omp_num_threads=env.get("OMP_NUM_THREADS"),
                cpu_count=os.cpu_count(), load_average_before=[round(x, 2) for x in load_before],
                load_average_after=[round(x, 2) for x in load_after], wall_s=round(wall, 1), cpu_s=round(cpu, 1),
                returncode=done.returncode, summary=summary, **counts(summary), cpu=cpu_description(settings.threads))


def main(argv: list[str] | None = None) -> None:
    settings = parse_settings(FastTier, argv, __doc__)
    record = run(settings)
    print("\n".join(f"{k}: {v}" for k, v in record.items()))
    if record["returncode"] != 0:
        raise SystemExit(f"pytest exited with {record['returncode']}: not recorded")
    write_record(settings.out, record)
    print(f"wrote {settings.out}")


if __name__ == "__main__":
    main()
