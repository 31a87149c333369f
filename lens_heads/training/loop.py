"""The one training loop (nanoGPT's loop): a model, its data, a config and an objective.

AdamW with linear warmup and a cosine or linear decay, gradient clipping, periodic validation loss, tokens seen,
progress bar with loss and tokens/s. What the loop reads is data (`TrainData`): token windows of a corpus
(`lens_heads.training.windows.CorpusWindows`, what a corpus passed as such becomes) or solved items
(`lens_heads.training.example_data.ExampleData`, the fine-tune's); what it minimises is an objective
(`lens_heads.training.objectives`: next-token loss, answer loss, distillation), by default the data's own.
Checkpoints are safetensors (weights and optimizer state) plus a JSON state; an interrupted run resumes from its last
checkpoint and ends at exactly the weights an uninterrupted run reaches, because the batch of step s is a pure
function of (seed, s) and nothing else carries hidden state. The run folder is claimed for the run's settings and
the model's shape (:func:`lens_heads.plumbing.cache.claim_folder`), so a changed setting is refused rather than
resumed from another run's checkpoints.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from lens_heads.plumbing import signals
from lens_heads.plumbing.cache import claim_folder
from lens_heads.plumbing.errors import NonFiniteError
from lens_heads.plumbing.io import atomic_write_bytes, atomic_write_json
from lens_heads.training.checkpoints import (
    latest_checkpoint,
    load_model_state,
    load_optimizer_state,
    model_state_bytes,
    save_checkpoint,
)
from lens_heads.training.config import TrainConfig, config_key, make_optimizer
from lens_heads.training.objectives import Objective, autocast, device_of
from lens_heads.training.schedules import lr_at
from lens_heads.training.windows import CorpusWindows

if TYPE_CHECKING:  # HookedTransformer is TransformerLens 3.9 only
    from transformer_lens import HookedTransformer

Callback = Callable[["HookedTransformer", int], "dict | None"]


class TrainData(Protocol):
    """What the loop reads: each step's batches, their size in tokens, the validation loss, the default objective."""

    @property
    def objective(self) -> Objective: ...

    @property
    def meta(self) -> dict: ...

    def check(self, model: Any, cfg: TrainConfig) -> None: ...

    def batch(self, step: int, micro: int, cfg: TrainConfig, device) -> Any: ...

    def tokens(self, batch: Any) -> int: ...

    def validation_loss(self, model: Any, cfg: TrainConfig) -> float: ...


def training_data(data) -> TrainData:
    """``data`` as the loop reads it: a corpus (``.train``/``.val`` token arrays) becomes its windows."""
    return data if hasattr(data, "validation_loss") else CorpusWindows(data)


def model_shape(model) -> dict:
    """The shape of a HookedTransformer (its config's sizes) or of a Hugging Face model (its config's)."""
    if hasattr(model, "cfg"):
        return {k: getattr(model.cfg, k) for k in ("n_layers", "d_model", "n_heads", "d_head", "d_mlp", "d_vocab",
                                                   "n_ctx")}
    c = model.config
    return {"model_type": c.model_type, "n_layers": c.num_hidden_layers, "d_model": c.hidden_size,
            "n_heads": c.num_attention_heads, "d_vocab": c.vocab_size}


# ---------------------------------------------------------------- the loop


@dataclass
class TrainResult:
    """What a training run did: its log (``history``), final validation loss and tokens seen."""

    history: list[dict]
    val_loss: float
    steps: int
    tokens_seen: int
    wall_time_s: float
    meta: dict = field(default_factory=dict)

    def to_dataframe(self) -> pd.DataFrame:
        return pd.DataFrame(self.history)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class _Run:
    """Where a run stands: what a checkpoint's ``state.json`` holds besides the settings."""

    step: int = 0
    tokens_seen: int = 0
    history: list[dict] = field(default_factory=list)
    wall_time_s: float = 0.0


def train(
    model: HookedTransformer | torch.nn.Module,
    corpus,
    config: TrainConfig,
    *,
    out_dir: str | Path | None = None,
    callbacks: Sequence[Callback] = (),
    objective: Objective | None = None,
    progress: bool = True,
    desc: str = "train",
) -> TrainResult:
    """Train ``model`` in place on ``corpus``: a corpus (`lens_heads.training.corpus.TokenCorpus`: ``.train``/``.val``
    token arrays) or other `TrainData` (`lens_heads.training.example_data.ExampleData`).

    With ``out_dir``: checkpoints every ``checkpoint_every`` steps, resumes from the last one, and a finished run
    (``out_dir/final``, which replaces the checkpoints) only reloads its weights. ``callbacks(model, step)`` run
    after every step; a returned dict is logged at that step (e.g. `RankTracker`). ``objective(model, batch)``: the
    training loss (default: the data's, the next-token cross-entropy `lm_loss` on a corpus); the validation loss is
    the data's (on a corpus always `lm_loss`, so runs compare).
    """
    cfg, data = config, training_data(corpus)
    data.check(model, cfg)
    out = Path(out_dir) if out_dir is not None else None
    if out is not None:  # the folder holds this run only: another configuration is refused before anything is read
        claim_folder(out, run_key(model, cfg, objective))
        if (out / "final" / "result.json").exists():
            load_model_state(model, out / "final" / "model.safetensors")
            return TrainResult(**json.loads((out / "final" / "result.json").read_text()))

    optimizer = make_optimizer(model, cfg)
    ckpt = latest_checkpoint(out) if out is not None else None
    run = _resume(model, optimizer, ckpt) if ckpt is not None else _first_record(model, data, cfg, callbacks)
    model.train()
    log = _Log(cfg, run, tqdm(total=cfg.steps, initial=run.step, desc=desc, disable=not progress, unit="step"))
    # SIGTERM/SIGINT wait for the step in progress (the model and optimiser are whole only between steps), which
    # is then checkpointed, so a preempted run loses no step
    with signals.stoppable(desc, None if out is None else f"in {out}", defer=True):
        for step in range(run.step, cfg.steps):
            t0 = time.perf_counter()
            lr, loss, grad_norm, tokens = _train_step(model, optimizer, data, cfg, step, objective or data.objective)
            run.step, run.tokens_seen = step + 1, run.tokens_seen + tokens
            run.wall_time_s += time.perf_counter() - t0
            log(loss, lr, grad_norm, _measurements(model, data, cfg, callbacks, run.step))
            # the last step's weights go to final, written next, instead
            due = run.step % cfg.checkpoint_every == 0 and run.step < cfg.steps
            if out is not None and (due or signals.stop_requested()):
                state = {**asdict(run), "config": asdict(cfg)}
                save_checkpoint(out / "checkpoints" / f"step_{run.step:07d}", model, optimizer, state)
                _prune_checkpoints(out, cfg.keep_checkpoints)
            signals.safe_point()
    log.bar.close()
    model.eval()
    return _finish(model, data, cfg, run, out, objective or data.objective)


def _resume(model, optimizer, ckpt: Path) -> _Run:
    """Weights, optimizer state and the run's position from the checkpoint folder ``ckpt``."""
    state = json.loads((ckpt / "state.json").read_text())
    load_model_state(model, ckpt / "model.safetensors")
    load_optimizer_state(optimizer, (ckpt / "optimizer.safetensors").read_bytes(),
                         json.loads((ckpt / "optimizer.json").read_text()))
    return _Run(state["step"], state["tokens_seen"], state["history"], state["wall_time_s"])


def _first_record(model, data: TrainData, cfg: TrainConfig, callbacks: Sequence[Callback]) -> _Run:
    """A fresh run, its history starting with the measurements at step 0 (the starting point of the curves)."""
    run = _Run()
    first = {"val_loss": _finite(data.validation_loss(model, cfg), 0, model)} if cfg.eval_every else {}
    first.update(_run_callbacks(callbacks, model, 0))
    if first:
        run.history.append({"step": 0, "tokens_seen": 0, **first})
    return run


def _train_step(model, optimizer, data: TrainData, cfg: TrainConfig, step: int,
                objective: Objective) -> tuple[float, float, float, int]:
    """One optimizer step (``grad_accum`` micro-batches); its learning rate, training loss, gradient norm and the
    tokens it read."""
    lr = lr_at(step, cfg)
    for group in optimizer.param_groups:
        group["lr"] = lr
    loss_sum, tokens = 0.0, 0
    for micro in range(cfg.grad_accum):
        batch = data.batch(step, micro, cfg, device_of(model))
        with autocast(model, cfg):
            loss = objective(model, batch) / cfg.grad_accum
        if not bool(torch.isfinite(loss.detach()).all()):  # before backward: the weights stay as they were
            raise NonFiniteError(f"training step {step} (micro-batch {micro}): the loss is NaN or infinite, so the run "
                                 f"stops with the weights of step {step}; {nonfinite_advice(model)}")
        loss.backward()
        loss_sum += loss.item()
        tokens += data.tokens(batch)
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip).item()
    if not math.isfinite(grad_norm):  # a finite loss with NaN gradients: one step would make every weight NaN
        optimizer.zero_grad(set_to_none=True)
        raise NonFiniteError(f"training step {step}: the gradients are NaN or infinite (the loss is {loss_sum:.4g}), "
                             f"so the run stops with the weights of step {step}; {nonfinite_advice(model)}")
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return lr, loss_sum, grad_norm, tokens


def _measurements(model, data: TrainData, cfg: TrainConfig, callbacks: Sequence[Callback], done: int) -> dict:
    """The validation loss when one is due after ``done`` steps, and what the callbacks return."""
    record: dict = {}
    if cfg.eval_every and (done % cfg.eval_every == 0 or done == cfg.steps):
        record["val_loss"] = _finite(data.validation_loss(model, cfg), done, model)
        model.train()
    record.update(_run_callbacks(callbacks, model, done))
    return record


def _finite(val_loss: float, step: int, model) -> float:
    """``val_loss``, refused where it is NaN or infinite (it would be a point of the curve and the run's result)."""
    if not math.isfinite(val_loss):
        raise NonFiniteError(f"the validation loss after {step} steps is NaN or infinite; {nonfinite_advice(model)}")
    return val_loss


def nonfinite_advice(model) -> str:
    """What a NaN loss points to: the weights (a NaN given in, or a step that diverged), or the learning rate."""
    broken = [name for name, p in model.named_parameters() if not bool(torch.isfinite(p.detach()).all())]
    if broken:
        return f"the weights hold NaN or infinity ({', '.join(broken[:3])}{' ...' if len(broken) > 3 else ''})"
    return ("the weights are finite, so the data or the step diverged: lower lr, keep grad_clip, or train in "
            "float32; resume from the last checkpoint")


@dataclass
class _Log:
    """Appends a record to the run's history when there are measurements or a log is due; drives the bar."""

    cfg: TrainConfig
    run: _Run
    bar: tqdm
    losses: list[float] = field(default_factory=list)
    t_last: float = field(default_factory=time.perf_counter)
    tokens_last: int = field(init=False)

    def __post_init__(self):
        self.tokens_last = self.run.tokens_seen

    def __call__(self, loss: float, lr: float, grad_norm: float, measured: dict) -> None:
        run, done = self.run, self.run.step
        self.losses.append(loss)
        if measured or done % self.cfg.log_every == 0 or done == self.cfg.steps:
            record = {"step": done, "tokens_seen": run.tokens_seen, "train_loss": float(np.mean(self.losses)),
                      "lr": lr, "grad_norm": grad_norm, "wall_time_s": run.wall_time_s, **measured}
            run.history.append(record)
            now = time.perf_counter()
            self.bar.set_postfix(loss=f"{np.mean(self.losses):.3f}",
                                 tok_s=f"{(run.tokens_seen - self.tokens_last) / (now - self.t_last):,.0f}",
                                 **({"val": f"{record['val_loss']:.3f}"} if "val_loss" in record else {}))
            self.t_last, self.tokens_last, self.losses = now, run.tokens_seen, []
        self.bar.update(1)


def _finish(model, data: TrainData, cfg: TrainConfig, run: _Run, out: Path | None,
            objective: Objective) -> TrainResult:
    """The run's result; with ``out``, the final weights and then the result, which marks the run finished."""
    val_losses = [h["val_loss"] for h in run.history if "val_loss" in h]
    shape = model_shape(model)
    result = TrainResult(
        history=run.history, val_loss=val_losses[-1] if val_losses else float("nan"), steps=cfg.steps,
        tokens_seen=run.tokens_seen, wall_time_s=run.wall_time_s,
        meta={"config": asdict(cfg), "corpus": data.meta,
              "n_params": sum(p.numel() for p in model.parameters()),
              "n_layers": shape["n_layers"], "d_model": shape["d_model"], "objective": objective.describe()},
    )
    if out is not None:
        atomic_write_bytes(out / "final" / "model.safetensors", model_state_bytes(model))
        atomic_write_json(out / "final" / "result.json", result.to_dict())
        # a finished run resumes from final alone; its checkpoints (weights and twice their size in Adam's moments)
        # would only fill the disk
        shutil.rmtree(out / "checkpoints", ignore_errors=True)
    return result


def _run_callbacks(callbacks: Sequence[Callback], model, step: int) -> dict:
    merged: dict = {}
    for callback in callbacks:
        merged.update(callback(model, step) or {})
    return merged


def run_key(model, cfg: TrainConfig, objective: Objective | None = None) -> dict:
    """What a training run's checkpoints depend on besides the data: its settings, the model's shape and (where one
    is given) the objective."""
    key = {"train": config_key(cfg), "model": model_shape(model)}
    return key if objective is None else {**key, "objective": objective.describe()}


def _prune_checkpoints(out: Path, keep: int) -> None:
    folders = sorted(p for p in (out / "checkpoints").glob("step_*") if not p.name.endswith(".tmp"))
    for old in folders[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
