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
import math
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
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from torch import Tensor
from tqdm.auto import tqdm

from lens_heads.collapse.rank import attention_rank
from lens_heads.plumbing.cache import claim_folder
from lens_heads.plumbing.errors import InputError
from lens_heads.plumbing.io import atomic_write_bytes, atomic_write_json

if TYPE_CHECKING:  # HookedTransformer is TransformerLens 3.9 only
    from transformer_lens import HookedTransformer

Callback = Callable[["HookedTransformer", int], "dict | None"]


class Objective(Protocol):
    """A training loss other than the language-model loss (e.g. `lens_heads.collapse.distill.Distillation`)."""

    def __call__(self, model: HookedTransformer, windows: Tensor) -> Tensor: ...

    def describe(self) -> dict: ...


@dataclass
class TrainConfig:
    """Training hyper-parameters.

    The optimiser is the Inheritune authors' (AdamW, betas (0.9, 0.95), weight decay 0.1 on weight matrices only,
    gradient clip 1.0, linear warm-up then cosine decay to ``min_lr`` at the last step). The step counts and rates
    here are toy-scale defaults; the authors train 100K steps at lr 2e-4 (cosine to 1e-5, 2000 warm-up steps).
    ``decay_embeddings=True`` also decays the embeddings (TransformerLens ``W_E``, ``W_pos``), the rule before the
    authors' was adopted.
    """

    steps: int = 1000
    batch_size: int = 16
    seq_len: int = 128
    grad_accum: int = 1
    lr: float = 6e-4
    min_lr: float = 6e-5
    warmup_steps: int = 100
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    eval_every: int = 100
    eval_batches: int = 8
    log_every: int = 10
    checkpoint_every: int = 100
    keep_checkpoints: int = 2
    seed: int = 0
    amp: bool = False  # bfloat16 autocast (CUDA only)
    decay_embeddings: bool = False

    def __post_init__(self):
        for name in ("log_every", "checkpoint_every"):  # eval_every=0 means never, these have no such meaning
            if getattr(self, name) < 1:
                raise InputError(f"TrainConfig({name}={getattr(self, name)}): give a number of steps >= 1")
        if self.eval_every < 0:
            raise InputError(f"TrainConfig(eval_every={self.eval_every}): give steps >= 1, or 0 for never")

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len * self.grad_accum


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate of (0-based) step ``step``: linear warmup to ``lr``, cosine decay to ``min_lr`` at the end.

    (The authors' nanoGPT loop warms up as ``lr * step / warmup``, so its step 0 does not move the weights; here
    step 0 already takes ``lr / warmup``. Otherwise the same schedule.)"""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.min_lr + 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))) * (cfg.lr - cfg.min_lr)


def batch_at(data: np.ndarray, step: int, micro: int, cfg: TrainConfig) -> Int[Tensor, "batch seq_plus_1"]:
    """The training windows of (step, micro-batch): random offsets drawn from a generator seeded by
    (seed, step, micro), so the data order is the same in a resumed run."""
    if len(data) <= cfg.seq_len + 1:
        raise InputError(f"the training split has {len(data)} tokens, fewer than seq_len + 1 = {cfg.seq_len + 1}")
    rng = np.random.default_rng([cfg.seed, step, micro])
    offsets = rng.integers(0, len(data) - cfg.seq_len - 1, size=cfg.batch_size)
    return torch.from_numpy(np.stack([np.asarray(data[o: o + cfg.seq_len + 1], dtype=np.int64) for o in offsets]))


def eval_windows(data: np.ndarray, n: int, seq_len: int) -> Int[Tensor, "n seq_plus_1"]:
    """``n`` fixed validation windows of ``seq_len + 1`` tokens, evenly spaced over the split."""
    if len(data) <= seq_len + 1:
        raise InputError(f"the validation split has {len(data)} tokens, fewer than seq_len + 1 = {seq_len + 1}")
    offsets = np.linspace(0, len(data) - seq_len - 1, num=n).astype(np.int64)
    return torch.from_numpy(np.stack([np.asarray(data[o: o + seq_len + 1], dtype=np.int64) for o in offsets]))


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


EMBEDDINGS = ("W_E", "W_pos")


def decays(name: str, cfg: TrainConfig) -> bool:
    """Whether parameter ``name`` gets weight decay: the weight matrices of linear maps (TransformerLens ``W_*``:
    attention, MLP and an untied unembedding), not embeddings, LayerNorm weights or biases, as the authors'
    nanoGPT ``configure_optimizers`` (Linear weights decay; Embedding, LayerNorm and biases do not)."""
    last = name.rsplit(".", 1)[-1]
    return last.startswith("W_") and (cfg.decay_embeddings or last not in EMBEDDINGS)


def make_optimizer(model: HookedTransformer, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW over the trainable parameters, weight decay on `decays` ones only (frozen biases are left out)."""
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    decay = [p for n, p in trainable if decays(n, cfg)]
    no_decay = [p for n, p in trainable if not decays(n, cfg)]
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))


# ---------------------------------------------------------------- checkpoints


def model_state_bytes(model: HookedTransformer) -> bytes:
    return st_save({k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()})


def load_model_state(model: HookedTransformer, path: Path) -> None:
    model.load_state_dict(st_load(Path(path).read_bytes()))


def optimizer_state(optimizer: torch.optim.Optimizer) -> tuple[bytes, dict]:
    """Optimizer state as safetensors bytes (the tensors) and a JSON-able dict (everything else); no pickle."""
    sd = optimizer.state_dict()
    tensors = {f"{i}.{k}": v.detach().contiguous().cpu() for i, s in sd["state"].items() for k, v in s.items()
               if isinstance(v, Tensor)}
    scalars = {f"{i}.{k}": v for i, s in sd["state"].items() for k, v in s.items() if not isinstance(v, Tensor)}
    return st_save(tensors), {"param_groups": sd["param_groups"], "scalars": scalars}


def load_optimizer_state(optimizer: torch.optim.Optimizer, tensors: bytes, info: dict) -> None:
    state: dict[int, dict] = {}
    for key, value in [*st_load(tensors).items(), *info["scalars"].items()]:
        i, name = key.split(".", 1)
        state.setdefault(int(i), {})[name] = value
    groups = [{**g, "betas": tuple(g["betas"])} for g in info["param_groups"]]
    optimizer.load_state_dict({"state": state, "param_groups": groups})


def save_checkpoint(folder: Path, model, optimizer, state: dict) -> Path:
    """Write a complete checkpoint folder atomically (built beside it, then renamed)."""
    folder = Path(folder)
    staging = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    opt_tensors, opt_info = optimizer_state(optimizer)
    atomic_write_bytes(staging / "model.safetensors", model_state_bytes(model))
    atomic_write_bytes(staging / "optimizer.safetensors", opt_tensors)
    atomic_write_json(staging / "optimizer.json", opt_info)
    atomic_write_json(staging / "state.json", state)
    shutil.rmtree(folder, ignore_errors=True)
    staging.rename(folder)
    return folder


def latest_checkpoint(out_dir: Path) -> Path | None:
    folders = sorted(p for p in (Path(out_dir) / "checkpoints").glob("step_*") if not p.name.endswith(".tmp"))
    return folders[-1] if folders else None


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
    """Train ``model`` in place on ``corpus`` (`lens_heads.collapse.corpus.TokenCorpus`: ``.train``/``.val`` token arrays).

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


@dataclass
class RankTracker:
    """Callback: the attention rank of every layer on fixed ``tokens`` every ``every`` steps (and at step 0)."""

    tokens: Int[Tensor, "n pos"]
    every: int = 100
    average: bool = True  # the paper's: rank of the input-averaged matrix

    def __post_init__(self):
        if self.every < 1:
            raise InputError(f"RankTracker(every={self.every}): track every 1 or more steps")

    def __call__(self, model: HookedTransformer, step: int) -> dict | None:
        if step % self.every:
            return None

        was_training = model.training
        profile = attention_rank(model, self.tokens, average=self.average, progress=False)
        model.train(was_training)
        return {"max_rank": profile.max_rank.tolist(), "mean_rank": profile.mean_rank.tolist(),
                "mass_columns": profile.mass_columns.tolist()}
