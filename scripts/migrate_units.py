"""Migrate recorded units files to the format in which each unit stores its ablation spec whole.

    python scripts/migrate_units.py                 # every figures/*_units.json.gz
    python scripts/migrate_units.py PATH [PATH...]  # the units files, or run_sweep output folders, given

A unit of an earlier format kept ``mode``, ``score``, ``target_fraction`` and ``threshold``; it becomes ``spec``,
built by :func:`lens_heads.experiments.unit_migration.legacy_spec` from what the unit holds and what its file's meta
records (a random unit's ``seed`` and ``random_draw``; a ranking's ablation, ``rankings``; an extra spec of
``specs``), or in a run folder from the spec its key files it under (such a folder also resumes unmigrated: this only
rewrites it). A field neither records is named in the spec's ``"unrecorded"``, never guessed. Every other field of
the unit is kept as it is, and each migrated unit must read back the mode, score, target fraction, threshold and key
it had, or the file is left alone. A file already in the current format is left alone, so a second run changes
nothing. Each file is rewritten atomically; the script prints what it changed.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import zlib
from pathlib import Path

from lens_heads.ablation.specs import ranked_by, target_fraction
from lens_heads.experiments.sweep_result import UnitResult
from lens_heads.experiments.unit_migration import is_legacy, legacy_spec
from lens_heads.experiments.unit_store import FORMAT_VERSION, write_units_file
from lens_heads.plumbing.cache import read_json, save_keyed
from lens_heads.plumbing.errors import InputError

ROOT = Path(__file__).resolve().parents[1]
VIEWS = ("mode", "score", "target_fraction", "threshold", "key")  # what a migrated unit must read back unchanged


def known_fields(unit: dict, meta: dict) -> tuple[dict | None, dict]:
    """What the file's ``meta`` records of ``unit``'s spec: the extra spec it is (``meta["specs"]``), else the
    fields the meta holds for its kind."""
    for spec in meta.get("specs") or []:
        if (spec["kind"], ranked_by(spec), target_fraction(spec)) == (unit["mode"], unit["score"],
                                                                      unit["target_fraction"]):
            return spec, {}
    if unit["mode"] == "random":
        return None, {k: meta[m] for k, m in (("seed", "seed"), ("draw", "random_draw")) if meta.get(m) is not None}
    if unit["mode"] in ("static", "per_input") and unit["score"] in (meta.get("rankings") or {}):
        return None, {"ablation": meta["rankings"][unit["score"]]}
    return None, {}


def migrated(unit: dict, filed: dict | None, known: dict) -> dict:
    """``unit`` (an old-format unit's JSON) with its spec in place of its separate fields, checked to read back
    the same."""
    spec = legacy_spec(unit, filed, known)
    new = {"key": unit["key"], "spec": spec,
           **{k: v for k, v in unit.items() if k not in ("key", "mode", "score", "target_fraction", "threshold")}}
    read = UnitResult.from_dict(new)
    changed = [v for v in VIEWS if getattr(read, v) != unit[v]]
    if changed:
        raise InputError(f"unit {unit['key']}: the migrated spec {spec} reads back other {changed}")
    return new


def migrate(path: Path) -> str:
    """Migrate the units file ``path`` in place; returns what it did."""
    data = read_units_file(path)
    legacy = [u for u in data["units"] if is_legacy(u)]
    if data.get("format") == FORMAT_VERSION and not legacy:
        return f"{path.name}: already format {FORMAT_VERSION}, unchanged"
    units = [migrated(u, *known_fields(u, data["meta"])) if is_legacy(u) else u for u in data["units"]]
    unrecorded = sorted({f for u in units for f in u["spec"].get("unrecorded", [])})
    write_units_file(path, data["meta"], units)
    return (f"{path.name}: format {data.get('format')} -> {FORMAT_VERSION}, {len(legacy)} of {len(units)} units given "
            f"their spec" + (f" (fields no record held: {', '.join(unrecorded)})" if unrecorded else ""))


def read_units_file(path: Path) -> dict:
    """The units file at ``path``, or an InputError naming it where it is torn (a gzip stream or JSON cut short) or
    not a units file: nothing is written then, so the file stays as it is."""
    try:
        data = json.loads(gzip.decompress(path.read_bytes()))
    except (OSError, EOFError, zlib.error, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"{path}: torn or not a gzipped units file ({type(e).__name__}: {e}); left untouched: restore "
                         "it (e.g. git checkout) or rerun the sweep that wrote it, then migrate again") from None
    if not isinstance(data, dict) or not isinstance(data.get("units"), list) or not isinstance(data.get("meta"), dict):
        raise InputError(f"{path}: not a units file (no units and meta); left untouched")
    return data


def migrate_folder(out: Path) -> str:
    """Migrate the unit files of the run folder ``out`` in place, each from the spec its key files it under."""
    changed, torn = 0, []
    for path in sorted(out.glob("*__*__*.json")):
        entry = read_json(path)
        if not isinstance(entry, dict) or not isinstance(entry.get("key"), dict) or "value" not in entry:
            torn.append(path.name)  # left as it is: the sweep recomputes a unit it cannot read
            continue
        if is_legacy(entry["value"]):
            save_keyed(path, entry["key"], migrated(entry["value"], entry["key"].get("ablation"), {}))
            changed += 1
    done = f"{out.name}/: {changed} unit file(s) given their spec" if changed else f"{out.name}/: unchanged"
    if torn:
        raise InputError(f"{done}; {len(torn)} file(s) torn or not units, left untouched: {', '.join(torn)} (rerun the "
                         "sweep into this folder: it recomputes them)")
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="*", type=Path, help="units files (default: every figures/*_units.json.gz)")
    args = parser.parse_args(argv)
    failed = 0
    for path in args.paths or sorted((ROOT / "figures").glob("*_units.json.gz")):
        try:
            print(migrate_folder(path) if path.is_dir() else migrate(path))
        except InputError as e:  # one bad file stops neither the others nor leaves it half written
            print(f"migrate_units: {e}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
