"""Where a sweep's units live: a resumable run folder keyed by the run's fingerprint (one file per unit), and the
single gzipped file of every unit a recorded sweep ships with; both read back without a model.

A unit file is named by the hash of its spec's JSON (``spec.to_dict()``). Runs of earlier versions filed units under
an older JSON of the spec (the ablation under ``"mode"``, the word for a curve's kind; a per-item random draw left
out): the first :class:`UnitStore` to open such a folder re-files them once (:func:`refile_units`) and marks the
folder, so every read is one lookup and an old folder resumes as a new one does. A unit stores its resolved spec
whole; one stored before it did (``mode``, ``score``, ... instead) is read with the spec its key files it under
(:mod:`lens_heads.sweep.old_units`, the one reader of old formats), so such a folder also resumes as it is."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

from lens_heads.ablation.specs import UNIT_MODES, AblationSpec
from lens_heads.ablation.specs import from_dict as spec_from_dict
from lens_heads.heads.scores import SCORE_NAMES
from lens_heads.models.loading import model_meta
from lens_heads.plumbing.cache import Cache, canonical, claim_folder, load_keyed, read_json, save_keyed
from lens_heads.plumbing.errors import InputError
from lens_heads.plumbing.io import atomic_write_bytes, atomic_write_json
from lens_heads.sweep.result import SweepResult, UnitResult, unit_key

FORMAT_VERSION = 4  # of a units file (save_units): 4, each unit stores its spec whole (3: mode, score, ... instead)
RUN_VERSION = 3  # of a run's fingerprint: what its stored units' numbers depend on (old folders keep resuming)
MARKER = "sweep.json"
REFILED = "units_refiled.json"  # marks a folder whose every unit is filed under its spec's current JSON


class UnitStore:
    """The finished units of one run in ``out_dir`` (or nowhere: ``out_dir=None``), each stored under the run's
    ``fingerprint`` and its ablation spec (:mod:`lens_heads.plumbing.cache`); the folder is claimed for the run in
    ``out_dir/<marker>``, so another configuration's run can't mix in."""

    def __init__(self, out_dir, fingerprint: dict, marker: str = MARKER):
        self.out = Path(out_dir) if out_dir is not None else None
        self.fingerprint = fingerprint
        if self.out is not None:
            claim_folder(self.out, fingerprint, marker=marker)
            refile_units(self.out)

    def path(self, spec: AblationSpec) -> Path:
        """Where ``spec``'s unit is filed."""
        assert self.out is not None  # load and save read it only with an out_dir
        return unit_path(self.out, spec)

    def key(self, spec: AblationSpec) -> dict:
        return dict(run=self.fingerprint, ablation=spec.to_dict())

    def load(self, spec: AblationSpec) -> UnitResult | None:
        """The finished unit of ``spec``, or None."""
        if self.out is None:
            return None
        stored = load_keyed(self.path(spec), self.key(spec))
        return UnitResult.from_dict(stored, filed=spec.to_dict()) if stored is not None else None

    def save(self, spec: AblationSpec, unit: UnitResult) -> None:
        if self.out is not None:
            save_keyed(self.path(spec), self.key(spec), unit.to_dict())

    def describe(self) -> str | None:
        return str(self.out) if self.out is not None else None


def unit_path(out: Path, spec: AblationSpec) -> Path:
    """The file of ``spec``'s unit in run folder ``out``: its readable name and the hash of ``spec.to_dict()``."""
    return Cache(out).path(unit_key(spec.kind, spec.ranked_by, spec.target_fraction), spec.to_dict(), ".json")


def refile_units(out: Path) -> int:
    """Re-file, once, the units that runs of earlier versions filed in ``out`` under an older JSON of their spec
    (each is moved to :func:`unit_path` with its key's spec rewritten, its value unchanged), then mark the folder
    (``REFILED``) so that it is never scanned again. Returns how many were moved. Workers of a job array may run it
    at once: each move writes the same file atomically, and a unit another worker moved first is skipped."""
    if (out / REFILED).exists():
        return 0
    moved = 0
    for path in sorted(out.glob("*__*__*.json")):
        entry = read_json(path)
        if not isinstance(entry, dict):
            continue
        key = entry.get("key")
        if not isinstance(key, dict) or not isinstance(key.get("ablation"), dict) or "value" not in entry:
            continue  # torn, another worker's move in flight, or not a unit: read_sweep_folder names the unreadable
        try:
            spec = spec_from_dict(key["ablation"])
        except (InputError, TypeError):
            continue
        if canonical(spec.to_dict()) == key["ablation"]:
            continue
        target = save_keyed(unit_path(out, spec), dict(key, ablation=spec.to_dict()), entry["value"])
        if target != path:
            path.unlink(missing_ok=True)
        moved += 1
    atomic_write_json(out / REFILED, {"refiled": moved})
    return moved


def run_fingerprint(model, task, **settings) -> dict:
    """What must match for a stored unit of a resumable run to be reused: model, data (item ids) and ``settings``
    (plain JSON values: seed, scoring, calibration, rows, ...)."""
    m = model_meta(model)
    ids = hashlib.sha256("\n".join(item.id for item in task).encode()).hexdigest()[:16]
    meta = task.meta() if hasattr(task, "meta") else {}
    model = {k: m.get(k) for k in ("name", "source", "weight_basis", "dtype", "n_layers", "n_heads", "n_kv_heads",
                                   "d_model", "d_head")}
    if m.get("backend", "hooked") != "hooked":  # HookedTransformer runs stored before backends existed stay valid
        model["backend"] = m["backend"]
    return dict(version=RUN_VERSION, model=model,
                task={k: meta.get(k) for k in ("task", "split", "shots", "format", "n", "seed")}, item_ids=ids,
                **settings)


def save_units(result: SweepResult, path) -> Path:
    """Every unit of ``result`` with its per-item records, gzipped JSON written atomically: what
    :func:`read_units` (and :func:`lens_heads.sweep.compare.read_sweep_record` beside a recorded ``sweep_<task>.json``) needs to
    recompute every summary and its interval without the run folder."""
    return write_units_file(path, result.meta, [u.to_dict() for u in result.units])


def write_units_file(path, meta: dict, units: list[dict]) -> Path:
    """A units file of the current format from its ``meta`` and units' JSON (:func:`save_units`, and the script that
    migrates recorded files), gzipped without a timestamp so the same units give the same bytes."""
    data = dict(format=FORMAT_VERSION, meta=meta, units=units)
    return atomic_write_bytes(path, gzip.compress(json.dumps(data).encode("utf-8"), mtime=0))


def read_units(path) -> SweepResult:
    """The sweep :func:`save_units` wrote."""
    try:
        data = json.loads(gzip.decompress(Path(path).read_bytes()))
    except (OSError, ValueError) as e:
        raise InputError(f"{path} is not a units file written by save_units ({e})") from None
    units = [UnitResult.from_dict(u) for u in data["units"]]
    base = next((u for u in units if u.mode == "baseline"), None)
    if base is None:
        raise InputError(f"{path} has no baseline unit")
    return SweepResult(baseline=base.result, units=units, meta=dict(data["meta"], source=str(path)))


def read_sweep_folder(out_dir) -> SweepResult:
    """The sweep kept in a ``run_sweep`` output folder (its ``out_dir``), read back without a model: every unit stored under the
    folder's fingerprint (``sweep.json``); a sweep interrupted midway gives the units it finished. A unit file that
    can't be read is refused, naming it: the folder keeps no plan, so a unit left out would be a point silently
    missing from its curve. ``lens_heads.load_sweep`` is this function under its earlier name."""
    out = Path(out_dir)
    stored = read_json(out / MARKER)
    if not isinstance(stored, dict) or "key" not in stored:
        raise FileNotFoundError(f"{out} holds no sweep (no readable {MARKER}): give the out_dir of run_sweep")
    fingerprint = stored["key"]
    units, unreadable = [], []
    for path in sorted(out.glob("*__*__*.json")):
        unit, why = _read_unit(path, fingerprint)
        if why:
            unreadable.append(f"{path.name} ({why})")
        elif unit is not None:  # None: another run's unit (a folder may hold runs under other markers)
            units.append(unit)
    if unreadable:
        raise InputError(f"{out}: {len(unreadable)} unit file(s) can't be read: {'; '.join(unreadable)}. Delete "
                         f"them and rerun run_sweep with out_dir={str(out)!r} and the same settings to recompute "
                         "those units (the others are reused)")
    base = [u for u in units if u.mode == "baseline"]
    if not base:
        raise InputError(f"{out} has no finished baseline unit yet: rerun run_sweep with out_dir={str(out)!r}")
    rank: dict[str | None, int] = {s: i for i, s in enumerate(SCORE_NAMES)}
    units.sort(key=lambda u: (u.target_fraction, UNIT_MODES.index(u.mode), rank.get(u.score, -1)))
    scores = sorted({u.score for u in units if u.mode == "threshold"}, key=lambda s: rank.get(s, len(rank)))
    static = sorted({u.score for u in units if u.mode == "static"}, key=lambda s: rank.get(s, len(rank)))
    calibration = load_keyed(out / "calibration.json", fingerprint)
    meta = dict(fingerprint=fingerprint, fractions=sorted({u.target_fraction for u in units}), scores=scores,
                static_scores=static, random_baseline=any(u.mode == "random" for u in units),
                random_draw=fingerprint.get("random_draw", "per_item"), seed=fingerprint.get("seed"), out_dir=str(out),
                calibration=calibration.get("inputs") if calibration else None,
                unablated_shares=calibration.get("unablated_shares", {}) if calibration else {},
                units_reused=len(units), units_run=0)
    return SweepResult(baseline=base[0].result, units=units, meta=meta)


load_sweep = read_sweep_folder  # the alias scripts written for earlier releases call


def _read_unit(path: Path, fingerprint: dict) -> tuple[UnitResult | None, str]:
    """``(unit, "")`` for the unit stored in ``path`` under the run ``fingerprint``, ``(None, "")`` for another
    run's, ``(None, why)`` where it can't be read."""
    entry = read_json(path)
    if not isinstance(entry, dict) or not isinstance(entry.get("key"), dict) or "value" not in entry:
        return None, "not JSON, or torn" if entry is None else "not a stored unit"
    if entry["key"].get("run") != fingerprint:
        return None, ""
    try:
        unit = UnitResult.from_dict(entry["value"], filed=entry["key"].get("ablation"))
    except (KeyError, TypeError, ValueError) as e:
        return None, f"not a unit: {type(e).__name__}: {e}"
    if unit.mode not in UNIT_MODES:
        return None, f"unknown mode {unit.mode!r}, not one of {UNIT_MODES}"
    return unit, ""
