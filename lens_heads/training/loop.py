"""A plain language-model training loop for a HookedTransformer (nanoGPT's loop, hooked model).

AdamW with linear warmup and cosine decay, gradient clipping, periodic validation loss, tokens seen, progress bar
with loss and tokens/s. Checkpoints are safetensors (weights and optimizer state) plus a JSON state; an
interrupted run resumes from its last checkpoint and ends at exactly the weights an uninterrupted run reaches,
because the batch of step s is a pure function of (seed, s) and nothing else carries hidden state. The run folder
is claimed for the run's settings and the model's shape (:func:`lens_heads.plumbing.cache.claim_folder`), so a changed setting
is refused rather than resumed from another run's checkpoints.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from jaxtyping import Int
from torch import Tensor
from tqdm.auto import tqdm

from lens_heads.plumbing.cache import claim_folder
from lens_heads.plumbing.errors import InputError
from lens_heads.plumbing.io import atomic_write_bytes, atomic_write_json
from lens_heads.training.checkpoints import (
    latest_checkpoint,
    load_model_state,
    load_optimizer_state,
    model_state_bytes,
    save_checkpoint,
)
from lens_heads.training.config import TrainConfig, lr_at, make_optimizer
from lens_heads.training.windows import batch_at, eval_windows

if TYPE_CHECKING:  # HookedTransformer is TransformerLens 3.9 only
    from transformer_lens import HookedTransformer

Callback = Callable[["HookedTransformer", int], "dict | None"]


class Objective(Protocol):
    """A training loss other than the language-model loss (e.g. `lens_heads.training.distill.Distillation`)."""

    def __call__(self, model: HookedTransformer, windows: Tensor) -> Tensor: ...

    def describe(self) -> dict: ...


def lm_loss(model: HookedTransformer, windows: Int[Tensor, "batch seq_plus_1"]) -> Tensor:
    """Mean next-token cross-entropy of ``windows[:, 1:]`` given ``windows[:, :-1]``."""
    logits = model(windows[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1).float(), windows[:, 1:].flatten())


@torch.no_grad()
def validation_loss(model: HookedTransformer, val: np.ndarray, cfg: TrainConfig) -> float:
    """Mean loss over ``eval_batches`` fixed batches of validation windows."""
    windows = eval_windows(val, cfg.eval_batches * cfg.batch_size, cfg.seq_len).to(model.cfg.device)
    losses = []
    for chunk in windows.split(cfg.batch_size):
        with _autocast(model, cfg):
            losses.append(lm_loss(model, chunk).item())
    return float(np.mean(losses))


def _autocast(model: HookedTransformer, cfg: TrainConfig):
    assert model.cfg.device is not None  # HookedTransformerConfig sets it when built
    device_type = torch.device(model.cfg.device).type
    return torch.autocast(device_type, dtype=torch.bfloat16, enabled=cfg.amp and device_type == "cuda")


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
    model: HookedTransformer,
    corpus,
    config: TrainConfig,
    *,
    out_dir: str | Path | None = None,
    callbacks: Sequence[Callback] = (),
    objective: Objective | None = None,
    progress: bool = True,
    desc: str = "train",
) -> TrainResult:
    """Train ``model`` in place on ``corpus`` (`lens_heads.training.corpus.TokenCorpus`: ``.train``/``.val`` token arrays).

    With ``out_dir``: checkpoints every ``checkpoint_every`` steps, resumes from the last one, and a finished run
    (``out_dir/final``) only reloads its weights. ``callbacks(model, step)`` run after every step; a returned
    dict is logged at that step (e.g. `RankTracker`). ``objective(model, windows)``: the training loss (default: the
    next-token cross-entropy, `lm_loss`); the validation loss is always `lm_loss`, so runs compare.
    """
    cfg = config
    _check_fits(model, corpus, cfg)
    out = Path(out_dir) if out_dir is not None else None
    if out is not None:  # the folder holds this run only: another configuration is refused before anything is read
        claim_folder(out, run_key(model, cfg, objective))
        if (out / "final" / "result.json").exists():
            load_model_state(model, out / "final" / "model.safetensors")
            return TrainResult(**json.loads((out / "final" / "result.json").read_text()))

    optimizer = make_optimizer(model, cfg)
    ckpt = latest_checkpoint(out) if out is not None else None
    run = _resume(model, optimizer, ckpt) if ckpt is not None else _first_record(model, corpus, cfg, callbacks)
    model.train()
    log = _Log(cfg, run, tqdm(total=cfg.steps, initial=run.step, desc=desc, disable=not progress, unit="step"))
    for step in range(run.step, cfg.steps):
        t0 = time.perf_counter()
        lr, loss, grad_norm = _train_step(model, optimizer, corpus, cfg, step, objective or lm_loss)
        run.step, run.tokens_seen = step + 1, run.tokens_seen + cfg.tokens_per_step
        run.wall_time_s += time.perf_counter() - t0
        log(loss, lr, grad_norm, _measurements(model, corpus, cfg, callbacks, run.step))
        if out is not None and (run.step % cfg.checkpoint_every == 0 or run.step == cfg.steps):
            state = {**asdict(run), "config": asdict(cfg)}
            save_checkpoint(out / "checkpoints" / f"step_{run.step:07d}", model, optimizer, state)
            _prune_checkpoints(out, cfg.keep_checkpoints)
    log.bar.close()
    model.eval()
    return _finish(model, corpus, cfg, run, out, objective)


def _check_fits(model: HookedTransformer, corpus, cfg: TrainConfig) -> None:
    if cfg.seq_len > model.cfg.n_ctx:
        raise InputError(f"seq_len {cfg.seq_len} exceeds the model's context n_ctx={model.cfg.n_ctx}")
    if int(np.max(corpus.train[: 1 << 20])) >= model.cfg.d_vocab:
        raise InputError(f"the corpus has token ids >= the model's d_vocab={model.cfg.d_vocab}")


def _resume(model: HookedTransformer, optimizer, ckpt: Path) -> _Run:
    """Weights, optimizer state and the run's position from the checkpoint folder ``ckpt``."""
    state = json.loads((ckpt / "state.json").read_text())
    load_model_state(model, ckpt / "model.safetensors")
    load_optimizer_state(optimizer, (ckpt / "optimizer.safetensors").read_bytes(),
                         json.loads((ckpt / "optimizer.json").read_text()))
    return _Run(state["step"], state["tokens_seen"], state["history"], state["wall_time_s"])


def _first_record(model: HookedTransformer, corpus, cfg: TrainConfig, callbacks: Sequence[Callback]) -> _Run:
    """A fresh run, its history starting with the measurements at step 0 (the starting point of the curves)."""
    run = _Run()
    first = {"val_loss": validation_loss(model, corpus.val, cfg)} if cfg.eval_every else {}
    first.update(_run_callbacks(callbacks, model, 0))
    if first:
        run.history.append({"step": 0, "tokens_seen": 0, **first})
    return run


def _train_step(model: HookedTransformer, optimizer, corpus, cfg: TrainConfig, step: int,
                objective: Callable[[HookedTransformer, Tensor], Tensor]) -> tuple[float, float, float]:
    """One optimizer step (``grad_accum`` micro-batches); its learning rate, training loss and gradient norm."""
    lr = lr_at(step, cfg)
    for group in optimizer.param_groups:
        group["lr"] = lr
    loss_sum = 0.0
    for micro in range(cfg.grad_accum):
        windows = batch_at(corpus.train, step, micro, cfg).to(model.cfg.device)
        with _autocast(model, cfg):
            loss = objective(model, windows) / cfg.grad_accum
        loss.backward()
        loss_sum += loss.item()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip).item()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return lr, loss_sum, grad_norm


def _measurements(model: HookedTransformer, corpus, cfg: TrainConfig, callbacks: Sequence[Callback],
                  done: int) -> dict:
    """The validation loss when one is due after ``done`` steps, and what the callbacks return."""
    record: dict = {}
    if cfg.eval_every and (done % cfg.eval_every == 0 or done == cfg.steps):
        record["val_loss"] = validation_loss(model, corpus.val, cfg)
        model.train()
    record.update(_run_callbacks(callbacks, model, done))
    return record


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


def _finish(model: HookedTransformer, corpus, cfg: TrainConfig, run: _Run, out: Path | None,
            objective: Objective | None = None) -> TrainResult:
    """The run's result; with ``out``, the final weights and then the result, which marks the run finished."""
    val_losses = [h["val_loss"] for h in run.history if "val_loss" in h]
    result = TrainResult(
        history=run.history, val_loss=val_losses[-1] if val_losses else float("nan"), steps=cfg.steps,
        tokens_seen=run.tokens_seen, wall_time_s=run.wall_time_s,
        meta={"config": asdict(cfg), "corpus": dict(getattr(corpus, "meta", {})),
              "n_params": sum(p.numel() for p in model.parameters()),
              "n_layers": model.cfg.n_layers, "d_model": model.cfg.d_model,
              "objective": objective.describe() if objective is not None else "language-model loss"},
    )
    if out is not None:
        atomic_write_bytes(out / "final" / "model.safetensors", model_state_bytes(model))
        atomic_write_json(out / "final" / "result.json", result.to_dict())
    return result


def _run_callbacks(callbacks: Sequence[Callback], model, step: int) -> dict:
    merged: dict = {}
    for callback in callbacks:
        merged.update(callback(model, step) or {})
    return merged


def run_key(model: HookedTransformer, cfg: TrainConfig, objective: Objective | None = None) -> dict:
    """What a training run's checkpoints depend on besides the data: its settings, the model's shape and (where it
    is not the language-model loss) the objective."""
    shape = {k: getattr(model.cfg, k) for k in ("n_layers", "d_model", "n_heads", "d_head", "d_mlp", "d_vocab", "n_ctx")}
    key = {"train": asdict(cfg), "model": shape}
    return key if objective is None else {**key, "objective": objective.describe()}


def _prune_checkpoints(out: Path, keep: int) -> None:
    folders = sorted(p for p in (out / "checkpoints").glob("step_*") if not p.name.endswith(".tmp"))
    for old in folders[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
