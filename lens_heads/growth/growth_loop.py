"""The paper's growth loop from any pretrained reference (the embedded SmolLM2 included), over several seeds.

Per seed: inherit the reference's first ``start_layers`` blocks (`inherit_first_layers`), train, compare with the
reference's validation loss; while worse and shallower than ``max_layers``, grow the trained student by the
reference's next ``grow_by`` blocks (`grow_any`, lazy blocks included) and train again. Beside every student size, a
same-size random init trained the same steps and a same-size random init trained for the FLOPs the student has
consumed so far (every stage it went through; `same_flops_steps`). Every trained model's attention rank per layer
in both aggregations of `lens_heads.collapse.rank` (``averaged``: the rank of the input-averaged matrix, the
paper's; ``per_input``: the mean of each input's rank), before and after training, and its loss on each of a fixed
set of validation windows (the items the paired tests resample). Every stage trains in its own resumable folder, and
a run interrupted or repeated with the same settings reuses the measurements of the stages already recorded.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

import numpy as np
import torch

from lens_heads.collapse.rank import attention_rank
from lens_heads.growth.inherit import _copy, _meta_of, inherit_first_layers, same_size_random
from lens_heads.plumbing.errors import InputError
from lens_heads.plumbing.io import atomic_write_json
from lens_heads.plumbing.signals import stops_cleanly
from lens_heads.training.budget import training_flops
from lens_heads.training.config import TrainConfig
from lens_heads.training.loop import train
from lens_heads.training.windows import eval_windows, validation_loss, window_losses

if TYPE_CHECKING:  # TransformerLens 3.9 only
    from transformer_lens import HookedTransformer

# what a model's FLOP count reads of its config (`lens_heads.training.budget`)
SHAPE = ("n_layers", "d_model", "n_heads", "d_head", "d_mlp", "d_vocab", "n_key_value_heads", "gated_mlp")
KINDS = {"student": "Inheritune: the reference's first blocks, grown by its next ones, trained",
         "random": "same-size random init, the stage's steps",
         "same_flops": "same-size random init, the steps that spend the student's FLOPs so far (all its stages)"}


@dataclass(frozen=True)
class GrowthLoopConfig:
    """``start_layers`` (k: the paper's first lazy layer), ``grow_by`` blocks a round up to ``max_layers`` (default:
    the reference's depth); ``train_config``: every stage's schedule; ``seeds``; ``rank_inputs`` windows of ``rank_len``
    tokens for the attention rank, ``loss_windows`` validation windows of ``train_config.seq_len`` for the paired tests."""

    start_layers: int
    train_config: TrainConfig
    grow_by: int = 2
    max_layers: int | None = None
    seeds: tuple[int, ...] = (0, 1, 2)
    rank_inputs: int = 32
    rank_len: int = 64
    loss_windows: int = 64

    def check(self, ref_layers: int) -> int:
        """The deepest student; errors for sizes the reference cannot provide."""
        top = self.max_layers or ref_layers
        if not 0 < self.start_layers <= top <= ref_layers:
            raise InputError(f"need 0 < start_layers ({self.start_layers}) <= max_layers ({top}) <= the reference's "
                             f"{ref_layers} layers")
        if self.grow_by < 1:
            raise InputError(f"grow_by={self.grow_by} must be at least 1 (blocks added per round)")
        if not self.seeds:
            raise InputError("give at least one seed")
        return top


@dataclass
class LoopStage:
    """One trained model of the loop: its seed, ``kind`` (`KINDS`), size, steps, FLOPs, validation loss before and
    after training, per-window losses, and attention rank per layer in both aggregations before and after."""

    name: str
    seed: int
    kind: str
    n_layers: int
    steps: int
    tokens_seen: int
    flops: float
    val_loss_before: float
    val_loss: float
    window_losses: list[float]
    rank: dict  # {"averaged": RankProfile.to_dict(), "per_input": ...} after training
    rank_at_init: dict
    wall_time_s: float
    built_from: list[str] = field(default_factory=list)


def same_flops_steps(flops_so_far: float, model_cfg, train_cfg: TrainConfig) -> int:
    """Steps of ``train_cfg``'s batches after which a model of ``model_cfg`` has spent ``flops_so_far`` (rounded to
    the nearest step, at least 1)."""
    per_step = training_flops(model_cfg, train_cfg.tokens_per_step, train_cfg.seq_len)
    return max(1, round(flops_so_far / per_step))


def planned_loop(ref_cfg, config: GrowthLoopConfig) -> list[dict]:
    """The trainings `run_growth_loop` does for one seed when no student matches the reference (the costliest case),
    in order, each with its steps, tokens and FLOPs: the run's cost before it runs (x the number of seeds)."""
    c = config
    top, n, spent, rows = c.check(ref_cfg.n_layers), c.start_layers, 0.0, []
    while True:
        shape = SimpleNamespace(**{**{k: getattr(ref_cfg, k) for k in SHAPE}, "n_layers": n})
        per_step = training_flops(shape, c.train_config.tokens_per_step, c.train_config.seq_len)
        spent += per_step * c.train_config.steps
        for kind, steps in (("student", c.train_config.steps), ("random", c.train_config.steps),
                            ("same_flops", same_flops_steps(spent, shape, c.train_config))):
            rows.append({"stage": f"{kind}_{n}L", "kind": kind, "n_layers": n, "steps": steps,
                         "tokens": steps * c.train_config.tokens_per_step, "flops": steps * per_step})
        if n >= top:
            return rows
        n = min(n + c.grow_by, top)


def grow_any(reference: HookedTransformer, n_layers: int, student: HookedTransformer, *,
             seed: int = 0) -> HookedTransformer:
    """The trained ``student`` (every tensor it has) with the reference's blocks ``student.n_layers..n_layers-1``
    appended: `inherit_first_layers` at ``n_layers``, then the student's tensors copied over it."""
    if student.cfg.n_layers >= n_layers:
        raise InputError(f"grow to {n_layers} layers needs a student with fewer layers, got {student.cfg.n_layers}")
    grown = inherit_first_layers(reference, n_layers, seed=seed)
    _copy(grown, student, list(student.state_dict()))
    _meta_of(grown)["source"] += (f"; blocks 0..{student.cfg.n_layers - 1}, embeddings and final norm from the "
                                  "trained student")
    return grown


def both_ranks(model: HookedTransformer, tokens: torch.Tensor) -> dict:
    """The attention rank profile in both aggregations, and each input's rank per layer (the max over its heads,
    ``[input][layer]``: what the paired tests of a layer's rank resample)."""
    per_input = attention_rank(model, tokens, average=False, progress=False)
    assert per_input.per_input is not None  # the per-input aggregation keeps every input's ranks
    return {"averaged": attention_rank(model, tokens, average=True, progress=False).to_dict(),
            "per_input": per_input.to_dict(), "input_layer_max": per_input.per_input.max(axis=2).tolist()}


@stops_cleanly("growth loop")
def run_growth_loop(reference: HookedTransformer, corpus, config: GrowthLoopConfig, *, out_dir: str | Path,
                    progress: bool = True) -> dict:
    """The loop for every seed (module docstring). Returns the reference's losses and ranks, every `LoopStage` (as
    dicts) and per seed the stages the growth went through and why it stopped; ``out_dir/growth_loop.json`` is
    rewritten as each stage finishes. SIGTERM/SIGINT stop it with exit 143/130: between stages at once, inside a
    stage after its training step in progress is checkpointed; the same call resumes (recorded stages reloaded, the
    interrupted one from its checkpoint)."""
    c, out = config, Path(out_dir)
    top = c.check(reference.cfg.n_layers)
    rank_tokens = eval_windows(corpus.val, c.rank_inputs, c.rank_len - 1)
    windows = eval_windows(corpus.val, c.loss_windows, c.train_config.seq_len)
    ref_loss = validation_loss(reference, corpus.val, c.train_config)
    previous = _earlier_record(out / "growth_loop.json", c, ref_loss)
    measured = {(s["seed"], s["name"]): s for s in previous["stages"]} if previous else {}
    reference_measures = previous["reference"] if previous else {
        "n_layers": reference.cfg.n_layers, "val_loss": ref_loss, "window_losses": window_losses(reference, windows),
        "rank": both_ranks(reference, rank_tokens)}
    record: dict = {"reference": reference_measures, "config": asdict(c), "kinds": KINDS, "stages": [], "growth": {}}

    def trained(name: str, seed: int, kind: str, model, cfg: TrainConfig, built_from: list[str]) -> LoopStage:
        earlier = measured.get((seed, name))
        if earlier is not None:  # measured by an earlier run of this loop: the training folder reloads its weights
            res = train(model, corpus, cfg, out_dir=out / f"seed_{seed}" / name, progress=False, desc=name)
            if res.val_loss == earlier["val_loss"]:
                stage = LoopStage(**earlier)
                record["stages"].append(asdict(stage))
                return stage
        at_init, before = both_ranks(model, rank_tokens), validation_loss(model, corpus.val, cfg)
        res = train(model, corpus, cfg, out_dir=out / f"seed_{seed}" / name, progress=progress, desc=name)
        if not math.isfinite(res.val_loss):
            raise InputError(f"{name} (seed {seed}) ended with validation loss {res.val_loss}: lower the learning "
                             f"rate ({cfg.lr})")
        stage = LoopStage(name=name, seed=seed, kind=kind, n_layers=model.cfg.n_layers, steps=res.steps,
                          tokens_seen=res.tokens_seen, flops=training_flops(model.cfg, res.tokens_seen, cfg.seq_len),
                          val_loss_before=before, val_loss=res.val_loss, window_losses=window_losses(model, windows),
                          rank=both_ranks(model, rank_tokens), rank_at_init=at_init, wall_time_s=res.wall_time_s,
                          built_from=built_from)
        record["stages"].append(asdict(stage))
        atomic_write_json(out / "growth_loop.json", record)
        return stage

    for seed in c.seeds:
        cfg = replace(c.train_config, seed=seed)
        n, student, spent, prev, path = c.start_layers, None, 0.0, None, []
        while True:
            if student is None:
                student, built = inherit_first_layers(reference, n, seed=seed), ["reference"]
            else:
                assert prev is not None  # the stage that trained this student
                student, built = grow_any(reference, n, student, seed=seed), [prev.name, "reference"]
            prev = trained(f"student_{n}L", seed, "student", student, cfg, built)
            spent += prev.flops
            trained(f"random_{n}L", seed, "random", same_size_random(reference, n, seed=seed + 1000), cfg, [])
            flops_cfg = replace(cfg, steps=same_flops_steps(spent, student.cfg, cfg))
            trained(f"same_flops_{n}L", seed, "same_flops", same_size_random(reference, n, seed=seed + 2000),
                    flops_cfg, [])
            matched = prev.val_loss <= ref_loss
            path.append({"stage": prev.name, "n_layers": n, "val_loss": prev.val_loss,
                         "minus_reference": prev.val_loss - ref_loss, "matched": matched, "flops_so_far": spent})
            if matched or n >= top:
                why = "matched the reference" if matched else f"reached max_layers ({top})"
                record["growth"][str(seed)] = {"stages": path, "stopped": why, "final_layers": n}
                break
            path[-1]["then"] = "grew"
            n = min(n + c.grow_by, top)
    atomic_write_json(out / "growth_loop.json", record)
    return record


def _earlier_record(path: Path, config: GrowthLoopConfig, ref_loss: float) -> dict | None:
    """The record an earlier run of the same loop (same settings, a reference with the same validation loss) left
    in ``path``, so that an interrupted or repeated run measures only the stages it has not measured."""
    if not path.exists():
        return None
    earlier = json.loads(path.read_text())
    stored = earlier.get("config") or {}
    if "train" in stored and "train_config" not in stored:  # a record from before the field said what it holds
        stored = {("train_config" if k == "train" else k): v for k, v in stored.items()}
    same = (stored == json.loads(json.dumps(asdict(config)))
            and earlier.get("reference", {}).get("val_loss") == ref_loss)
    return earlier if same else None


def lazy_layers(rank: dict) -> list[int]:
    """The layers a rank profile (``RankProfile.to_dict()``) marks lazy."""
    return [i for i, flag in enumerate(rank["lazy"]) if flag]


def stage_table(record: dict) -> list[dict]:
    """One row per trained model: seed, kind, size, steps, FLOPs, losses and the lazy layers in both aggregations."""
    return [{k: s[k] for k in ("seed", "kind", "name", "n_layers", "steps", "tokens_seen", "flops",
                                "val_loss_before", "val_loss", "wall_time_s")}
            | {"minus_reference": s["val_loss"] - record["reference"]["val_loss"],
               "lazy_averaged": lazy_layers(s["rank"]["averaged"]), "lazy_per_input": lazy_layers(s["rank"]["per_input"]),
               "mean_window_loss": float(np.mean(s["window_losses"]))} for s in record["stages"]]
