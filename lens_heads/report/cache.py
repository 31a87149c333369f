"""Stage outputs kept in the report folder, so a rerun reuses finished work.

Each cached entry is named by its stage and a hash of everything its numbers depend on (model, dtype, data, sample,
seed, ...); the key itself is stored beside it, so a changed setting never silently reuses a stale result.
Tensors are saved by the library's own safetensors writers (no pickle), the rest as JSON; all writes are atomic.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from lens_heads.io import atomic_write_json


class StageCache:
    """``cache/`` inside a report folder."""

    def __init__(self, out_dir: str | Path):
        self.root = Path(out_dir) / "cache"

    def path(self, stage: str, key: dict, suffix: str = "") -> Path:
        digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:12]
        return self.root / f"{stage}-{digest}{suffix}"

    def load_json(self, stage: str, key: dict) -> dict | None:
        path = self.path(stage, key, ".json")
        if not path.exists():
            return None
        entry = json.loads(path.read_text())
        return entry["value"] if entry.get("key") == json.loads(json.dumps(key, default=str)) else None

    def save_json(self, stage: str, key: dict, value) -> None:
        atomic_write_json(self.path(stage, key, ".json"), {"key": json.loads(json.dumps(key, default=str)),
                                                            "value": value})

    def folder(self, stage: str, key: dict) -> Path:
        """A folder for a stage that keeps its own resumable units (the ablation sweep)."""
        path = self.path(stage, key)
        path.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path / "key.json", json.loads(json.dumps(key, default=str)))
        return path
