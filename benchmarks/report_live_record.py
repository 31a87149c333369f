"""Write docs/records/report_live.json from the logs of timed report runs (docs/report.md renders it).

Each run was made under ``/usr/bin/time -v`` (its wall time, user CPU time and peak resident memory are read from the
log), beside a loop that copied report.html each time it changed, named ``page_<seconds since the start>.html``, which
gives when the first page and the page with the ablation running appeared:

    python benchmarks/report_live_record.py --run 'CMD|LOG|SNAPSHOTS|LOAD|OUTCOME' ... --warning LOG --warning-note TEXT

A run of the embedded model goes under "embedded", one of ``gpt2-medium`` under "gpt2_medium".
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import torch

from lens_heads.plumbing.io import atomic_write_json
from lens_heads.plumbing.provenance import provenance

FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")


def timed(log: str) -> dict:
    """Wall seconds, user CPU seconds and peak RSS (kB) from ``/usr/bin/time -v``'s lines at the end of ``log``
    (None each where the run was stopped before ``time`` could write them)."""
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", log)
    if wall is None:
        return {"wall_s": None, "user_cpu_s": None, "peak_rss_kb": None, "exit_status": None}
    parts = [float(p) for p in wall.group(1).split(":")]
    seconds = sum(p * 60 ** i for i, p in enumerate(reversed(parts)))
    return {"wall_s": round(seconds, 1),
            "user_cpu_s": float(re.search(r"User time \(seconds\): ([\d.]+)", log).group(1)),
            "peak_rss_kb": int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", log).group(1)),
            "exit_status": int(re.search(r"Exit status: (\d+)", log).group(1))}


def snapshot_times(folder: Path) -> dict:
    """Seconds to the first page, and to the first page showing the ablation running."""
    pages = sorted(folder.glob("page_*.html"), key=lambda p: float(p.stem.removeprefix("page_")))
    at = lambda p: float(p.stem.removeprefix("page_"))  # noqa: E731
    running = [p for p in pages if "Ablation sweep on arc_easy (running)" in p.read_text()]
    scores = re.search(r"<td>scores:arc_easy</td><td>done</td><td>([\d.]+)</td><td>([\d.]+)</td>",
                       pages[0].read_text())
    return {"first_page_s": round(at(pages[0]), 1), "ablation_running_s": round(at(running[0]), 1) if running else None,
            "pages_seen": len(pages), "scores_stage_s": float(scores.group(1)) if scores else None,
            "scores_stage_cpu_s": float(scores.group(2)) if scores else None}


def machine() -> dict:
    cpu = Path("/proc/cpuinfo").read_text()
    model = re.search(r"model name\s*:\s*(.+)", cpu)
    flags = set(re.search(r"flags\s*:\s*(.+)", cpu).group(1).split())
    return {"cpu": model.group(1).strip() if model else "unknown", "cores": cpu.count("processor\t:"),
            "flags": [f for f in FLAGS if f in flags], "torch_capability": torch.backends.cpu.get_cpu_capability(),
            "threads": torch.get_num_threads()}


def estimated(log: str) -> dict:
    """What the run said it would take and the work it measured for that (results.json's "estimate", beside the
    report.html the log's last line names), and its own seconds from loading to the end (the estimate's span: the
    interpreter's start-up before it is not in it); None each where the run did not finish or made no estimate."""
    done = re.search(r"\[report\] done in \d+ s: (.+)/report\.html", log)
    if done is None:
        return {"estimate": None, "run_s": None}
    results = json.loads((Path(done.group(1)) / "results.json").read_text())
    return {"estimate": results.get("estimate"), "run_s": results["stages"]["total"]["seconds"]}


def run_record(spec: str) -> tuple[str, dict]:
    """One run's entry from ``CMD|LOG|SNAPSHOTS|LOAD|OUTCOME``, and the section it belongs to."""
    command, log, snapshots, load, outcome = spec.split("|")
    text = Path(log).read_text()
    entry = {"command": command, **timed(text), **snapshot_times(Path(snapshots)), **estimated(text),
             "load_average": load, "outcome": outcome}
    return ("gpt2_medium" if "gpt2-medium" in command else "embedded"), entry


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", action="append", required=True, metavar="CMD|LOG|SNAPSHOTS|LOAD|OUTCOME")
    p.add_argument("--warning", type=Path, required=True, help="a file holding the long-run warning a run printed")
    p.add_argument("--warning-note", required=True)
    p.add_argument("--out", type=Path, default=Path("docs/records/report_live.json"))
    a = p.parse_args()
    runs: dict[str, list] = {"embedded": [], "gpt2_medium": []}
    for spec in a.run:
        section, entry = run_record(spec)
        runs[section].append(entry)
    warning = next((line for line in a.warning.read_text().splitlines() if "[report] warning:" in line), None)
    if warning is None:
        raise SystemExit(f"{a.warning} holds no long-run warning")
    atomic_write_json(a.out, {"provenance": provenance(), "machine": machine(), **runs,
                              "warning_example": {"text": warning, "note": a.warning_note}})
    print(a.out)


if __name__ == "__main__":
    main()
