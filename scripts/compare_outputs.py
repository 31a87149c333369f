"""Run the same sweep and report from two checkouts and compare what they write, file by file.

    OMP_NUM_THREADS=1 nice -n 19 .venv/bin/python scripts/compare_outputs.py BEFORE_TREE AFTER_TREE \
        --work /tmp/compare --record docs/records/contracts_outputs.json

Each tree runs under this interpreter with the tree first on ``PYTHONPATH`` (its own ``lens_heads``, checked before
the runs), in its own folder under ``--work``: ``analyses/sweep.py`` on the embedded model (``SWEEP``) and
``python -m lens_heads.report`` (``REPORT``), the same settings for both. Then every file either wrote is compared:
a CSV byte for byte; a JSON (also gzipped) value by value, listing the fields that differ (provenance and wall
times are expected to); anything else (HTML, PNG) by its bytes. ``--compare-only`` compares two folders already
written. The record names the commands, the settings, each tree's commit and every file's outcome; the exit status
is 1 where a CSV differs or is missing on one side.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

from lens_heads.plumbing.io import atomic_write_text

SWEEP = ["analyses/sweep.py", "--tasks", "arc_easy", "--n", "16", "--scores", "AHON (LN),AWFT",
         "--fractions", "0,0.15,0.3", "--check-tasks", "arc_easy", "--check-n", "16", "--force",
         "--n-resamples", "200", "--threads", "1", "--no-png"]
REPORT = ["-m", "lens_heads.report", "--quick", "--no-png", "--no-progress"]
MAX_FIELDS = 40  # differing JSON fields listed per file


def commit(tree: Path) -> dict:
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True).stdout.strip()
    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def run(tree: Path, out: Path) -> list[list[str]]:
    """Run the sweep and the report of ``tree`` into ``out``; the command lines run (``out`` written OUT)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    where = subprocess.run([sys.executable, "-c", "import lens_heads; print(lens_heads.__file__)"], cwd=tree,
                           env=env, capture_output=True, text=True, check=True).stdout.strip()
    if not Path(where).resolve().is_relative_to(tree.resolve()):
        raise SystemExit(f"{tree}: lens_heads imports from {where}, not from the tree")
    commands = [SWEEP + ["--out", str(out / "sweep_units"), "--figures", str(out / "sweep")],
                REPORT + ["--out", str(out / "report")]]
    for command in commands:
        subprocess.run([sys.executable, *command], cwd=tree, env=env, check=True)
    return [[arg.replace(str(out), "OUT") for arg in command] for command in commands]


def _flat(value, path: str = "") -> dict[str, object]:
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in _flat(item, f"{path}.{key}" if path else key).items()}
    if isinstance(value, list):
        return {k: v for i, item in enumerate(value) for k, v in _flat(item, f"{path}[{i}]").items()}
    return {path: value}


def json_fields(a: bytes, b: bytes) -> list[str]:
    """The fields (list indices as ``[]``) whose values differ between two JSON documents, or exist in one only."""
    x, y = _flat(json.loads(a)), _flat(json.loads(b))
    differing = {k for k in x.keys() | y.keys() if k not in x or k not in y or x[k] != y[k]}
    return sorted({_indexless(k) for k in differing})


def _indexless(field: str) -> str:
    out, depth = [], 0
    for ch in field:
        depth += ch == "["
        if not depth:
            out.append(ch)
        depth -= ch == "]"
        if ch == "]" and not depth:
            out.append("[]")
    return "".join(out)


def compare(before: Path, after: Path) -> dict[str, dict]:
    """Every file under either folder (cached intermediate files left out): its kind and whether it is identical."""
    names = sorted({str(p.relative_to(root)) for root in (before, after) for p in root.rglob("*")
                    if p.is_file() and "cache" not in p.relative_to(root).parts
                    and "sweep_units" not in p.relative_to(root).parts})
    files = {}
    for name in names:
        a, b = before / name, after / name
        kind = "csv" if name.endswith(".csv") else "json" if name.endswith((".json", ".json.gz")) else "other"
        if not (a.exists() and b.exists()):
            files[name] = {"kind": kind, "identical": False, "only_in": "before" if a.exists() else "after"}
            continue
        x, y = a.read_bytes(), b.read_bytes()
        entry: dict = {"kind": kind, "identical": x == y}
        if kind == "json" and x != y:
            unzip = gzip.decompress if name.endswith(".gz") else bytes
            fields = json_fields(unzip(x), unzip(y))
            entry["differing_fields"] = fields[:MAX_FIELDS] + ([f"... {len(fields) - MAX_FIELDS} more"]
                                                               if len(fields) > MAX_FIELDS else [])
        files[name] = entry
    return files


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("before", type=Path, help="a checkout (or, with --compare-only, an output folder)")
    p.add_argument("after", type=Path)
    p.add_argument("--work", type=Path, default=Path("/tmp/compare_outputs"), help="where each tree writes")
    p.add_argument("--record", type=Path, help="write the record (JSON) here")
    p.add_argument("--compare-only", action="store_true", help="compare two folders already written")
    a = p.parse_args(argv)
    record: dict = {"what": "the same sweep and report from two checkouts, every file they write compared"}
    if a.compare_only:
        folders = a.before, a.after
    else:
        folders = a.work / "before", a.work / "after"
        for tree, out in zip((a.before, a.after), folders):
            if out.exists() and any(out.iterdir()):
                raise SystemExit(f"{out} is not empty: every run starts from nothing (no cached stage is reused)")
            record.setdefault("commands", run(tree, out))
        record |= {"before": commit(a.before), "after": commit(a.after),
                   "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    files = compare(*folders)
    csvs = {k: v for k, v in files.items() if v["kind"] == "csv"}
    record |= {"csv_files": len(csvs), "csv_identical": sum(v["identical"] for v in csvs.values()), "files": files}
    text = json.dumps(record, indent=1)
    if a.record:
        atomic_write_text(a.record, text + "\n")
    for name, v in files.items():
        print(f"{'identical' if v['identical'] else 'DIFFERENT':9}  {name}  {', '.join(v.get('differing_fields', []))}")
    print(f"{record['csv_identical']} of {record['csv_files']} CSVs identical")
    return 0 if record["csv_identical"] == record["csv_files"] else 1


if __name__ == "__main__":
    sys.exit(main())
