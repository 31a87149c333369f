"""What an Inheritune run leaves: one `Stage` per trained model, with its losses, attention ranks and FLOPs, and the
`InherituneResult` that holds them all and adds up each stage's budget; `load_result` reads a finished run back."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from lens_heads.plumbing.errors import InputError


@dataclass
class Stage:
    """One model an Inheritune run trained (a row of its table): what it is (``kind``: the reference, a student, a
    same-size scratch baseline, one of the paper's baselines or ablations, or the source of a warm start), its size,
    its training (steps, tokens, final validation loss, ``history`` as the training loop logged it, FLOPs), its
    attention rank before and after training, and the stages it was built from."""

    name: str
    kind: str  # "reference" | "student" | "scratch" | "ablation" (baselines too) | "stack_source" | "width_source"
    n_layers: int
    steps: int
    tokens_seen: int
    val_loss: float
    rank: dict  # RankProfile.to_dict() after training
    rank_at_init: dict  # before training (fresh init; for students: right after inheritance)
    history: list[dict]
    wall_time_s: float
    # budget: FLOPs of this stage's own training (`lens_heads.training.budget`), of a teacher's forwards
    # (distillation), and the stages whose trained weights it starts from (their budgets are not in these)
    flops: float = float("nan")
    teacher_flops: float = 0.0
    built_from: list[str] = field(default_factory=list)
    d_model: int | None = None
    method: str = ""
    n_heads: int | None = None


@dataclass
class InherituneResult:
    """All stages of an Inheritune run: reference, each student growth stage, same-size scratch baselines, the
    paper's baselines and ablations."""

    stages: list[Stage]
    reference_val_loss: float
    final_layers: int
    meta: dict

    def stage(self, name: str) -> Stage:
        found = [s for s in self.stages if s.name == name]
        if not found:
            raise InputError(f"no stage {name!r}: the run has {[s.name for s in self.stages]}")
        return found[0]

    def budget(self, stage: Stage) -> dict:
        """A stage's FLOPs: its own training (with a teacher's forwards), that of the stages it was built from
        (recursively, all but the reference, which every reference-based method shares), and their sum."""
        own = stage.flops + stage.teacher_flops
        sources, seen = 0.0, set()
        todo = list(stage.built_from)
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            src = self.stage(name)
            if src.kind != "reference":
                sources += src.flops + src.teacher_flops
                todo += src.built_from
        uses_reference = any(self.stage(n).kind == "reference" for n in seen)
        return {"train_flops": own, "source_flops": sources, "total_flops": own + sources,
                "uses_reference": uses_reference}

    def to_dataframe(self) -> pd.DataFrame:
        rows = []
        for s in self.stages:
            rows.append({"stage": s.name, "kind": s.kind, "n_layers": s.n_layers, "steps": s.steps,
                         "tokens_seen": s.tokens_seen, "val_loss": s.val_loss,
                         "val_loss_minus_reference": s.val_loss - self.reference_val_loss,
                         "mean_max_rank": float(np.mean(s.rank["max_rank"])),
                         "min_max_rank": float(np.min(s.rank["max_rank"])),
                         "n_lazy_layers": int(np.sum(s.rank["lazy"])), "wall_time_s": s.wall_time_s,
                         **self.budget(s), "built_from": ",".join(s.built_from)})
        return pd.DataFrame(rows)

    def to_dict(self) -> dict:
        return asdict(self)


def load_result(out_dir: str | Path) -> InherituneResult:
    """Read a finished run's ``result.json``."""
    data = json.loads((Path(out_dir) / "result.json").read_text())
    return InherituneResult(stages=[Stage(**s) for s in data["stages"]], reference_val_loss=data["reference_val_loss"],
                            final_layers=data["final_layers"], meta=data["meta"])
