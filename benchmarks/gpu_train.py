"""The training rate the GPU check measures: the Inheritune presets' GPT-2 shapes (the authors' GPT-2,
``lens_heads.growth.gpt2``, at random init) trained for a few optimizer steps through lens_heads' loop
(``lens_heads.training.loop.train``) on synthetic token windows, at the presets' micro-batch, accumulation and bf16
autocast, beside a plain PyTorch loop on the same model (forward, loss, backward, AdamW step), so the record says what
lens_heads' loop costs. Warm-up steps (first kernel launches, the optimiser's state) are not timed.

Per shape: tokens/s and useful training FLOP/s (``lens_heads.training.budget.training_flops``: 3 x the forward) of
each loop; the check adds their shares of the matmul rate it measures and of the vendor peak (:func:`with_shares`).
The plain loop leaves out what the loop does besides the arithmetic: drawing each step's windows on the host and
copying them over, gradient clipping, reading the loss and gradient norm back (two synchronisations a step), the
learning-rate schedule and the log.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F

from flops import peak_memory_gib, reset_peak_memory, synchronize
from lens_heads.growth.gpt2 import PADDED_VOCAB, gpt2_config, gpt2_model
from lens_heads.training.budget import GPU_PEAK_FLOPS, training_flops
from lens_heads.training.config import TrainConfig
from lens_heads.training.loop import train
from lens_heads.training.windows import batch_at


@dataclass(frozen=True)
class TrainShape:
    """A GPT-2 reference shape of an Inheritune preset and the micro-batch it trains at (``analyses/inheritune.py``'s
    PRESETS: ``batch_size`` windows of ``seq_len`` tokens, ``grad_accum`` micro-batches a step, bf16 autocast)."""

    n_layers: int
    d_model: int
    n_heads: int
    seq_len: int
    micro_batch: int
    grad_accum: int
    vocab: int = PADDED_VOCAB

    def smoke(self) -> TrainShape:
        """Toy size: a CPU trains it in a second (two micro-batches a step, so accumulation still runs)."""
        return TrainShape(2, 64, 4, 32, 2, 2, 512)


# a test holds these to analyses/inheritune.py's PRESETS (the scripts cannot import each other's heavy imports)
TRAIN_SHAPES = {
    "gpt2-medium": TrainShape(24, 1024, 16, 1024, 12, 4),
    "gpt2-xl": TrainShape(48, 1600, 25, 1024, 4, 12),
}
WARMUP_STEPS, TIMED_STEPS = 2, 3  # XL: ~5e14 FLOPs a step (12 micro-batches), ~1.5 s at 1/3 of peak
TOKENS = 1 << 22  # synthetic training tokens the windows are drawn from


@dataclass
class TrainingResult:
    """One shape trained by lens_heads' loop and by the plain loop; rates over the timed steps (input tokens)."""

    shape: str
    device_name: str
    n_params: int
    n_layers: int
    d_model: int
    seq_len: int
    micro_batch: int
    grad_accum: int
    amp: bool
    warmup_steps: int
    timed_steps: int
    tokens_per_step: int
    flops_per_step: float
    loop_tokens_per_s: float = math.nan
    loop_flops_per_s: float = math.nan
    plain_tokens_per_s: float = math.nan
    plain_flops_per_s: float = math.nan
    peak_memory_gib: float | None = None
    loop_share_of_matmul: float = math.nan  # the rest: filled by with_shares
    loop_share_of_peak: float = math.nan
    plain_share_of_matmul: float = math.nan
    plain_share_of_peak: float = math.nan
    error: str | None = None

    @property
    def loop_vs_plain(self) -> float:
        return self.loop_tokens_per_s / self.plain_tokens_per_s


def with_shares(row: TrainingResult, matmul_flops_per_s: float, peak: float = GPU_PEAK_FLOPS) -> TrainingResult:
    """``row`` with each loop's FLOP/s as a share of the matmul rate measured in the same run and of ``peak``."""
    return replace(row, loop_share_of_matmul=row.loop_flops_per_s / matmul_flops_per_s,
                   loop_share_of_peak=row.loop_flops_per_s / peak,
                   plain_share_of_matmul=row.plain_flops_per_s / matmul_flops_per_s,
                   plain_share_of_peak=row.plain_flops_per_s / peak)


@dataclass(frozen=True)
class SyntheticCorpus:
    """Uniform random token ids as a corpus (``.train``/``.val``): throughput does not depend on the text."""

    train: np.ndarray
    val: np.ndarray
    meta: dict


def synthetic_corpus(vocab: int, seed: int, tokens: int = TOKENS) -> SyntheticCorpus:
    rng = np.random.default_rng(seed)
    return SyntheticCorpus(rng.integers(0, vocab, tokens, dtype=np.int64), rng.integers(0, vocab, 4096, dtype=np.int64),
                           dict(name="synthetic", seed=seed, tokens=tokens))


def train_config(shape: TrainShape, steps: int, amp: bool) -> TrainConfig:
    """The preset's optimiser and micro-batches for ``steps`` steps; no validation, checkpoint or log between."""
    return TrainConfig(steps=steps, batch_size=shape.micro_batch, seq_len=shape.seq_len, grad_accum=shape.grad_accum,
                       lr=2e-4, min_lr=1e-5, warmup_steps=1, eval_every=0, log_every=steps, checkpoint_every=steps,
                       amp=amp)


def measure_training(name: str, shape: TrainShape, device: str, seed: int, steps: tuple[int, int]) -> TrainingResult:
    """Train a random-init GPT-2 of ``shape`` for ``steps`` = (warm-up, timed) steps through lens_heads' loop, then
    as many through the plain loop; out of memory is recorded as the row's error, not raised."""
    warmup, timed_steps = steps
    amp = device.startswith("cuda")  # the loop's bf16 autocast is CUDA-only; on the CPU both loops run float32
    cfg = train_config(shape, warmup + timed_steps, amp)
    tokens_per_step = cfg.tokens_per_step
    gpu = torch.cuda.get_device_name(device) if amp else "cpu"
    reset_peak_memory(device)
    model = gpt2_model(gpt2_config(shape.n_layers, d_model=shape.d_model, n_heads=shape.n_heads, n_ctx=shape.seq_len,
                                   d_vocab=shape.vocab), seed=seed, device=device)
    row = TrainingResult(shape=name, device_name=gpu, n_params=sum(p.numel() for p in model.parameters()),
                         n_layers=shape.n_layers, d_model=shape.d_model, seq_len=shape.seq_len,
                         micro_batch=shape.micro_batch, grad_accum=shape.grad_accum, amp=amp, warmup_steps=warmup,
                         timed_steps=timed_steps, tokens_per_step=tokens_per_step,
                         flops_per_step=training_flops(model.cfg, tokens_per_step, shape.seq_len))
    corpus = synthetic_corpus(shape.vocab, seed)
    try:
        loop_s = loop_seconds(model, corpus, cfg, warmup)
        plain_s = plain_seconds(model, corpus, cfg, warmup)
    except torch.cuda.OutOfMemoryError as e:
        row.error = f"out of GPU memory: {str(e).splitlines()[0]}"
    else:
        row.loop_tokens_per_s, row.loop_flops_per_s = (timed_steps * x / loop_s for x in
                                                       (tokens_per_step, row.flops_per_step))
        row.plain_tokens_per_s, row.plain_flops_per_s = (timed_steps * x / plain_s for x in
                                                         (tokens_per_step, row.flops_per_step))
    row.peak_memory_gib = peak_memory_gib(device)
    model = None  # freed before the next shape
    reset_peak_memory(device)
    return row


def loop_seconds(model, corpus: SyntheticCorpus, cfg: TrainConfig, warmup: int) -> float:
    """Wall seconds of ``lens_heads.training.loop.train``'s steps after the first ``warmup``: a callback stamps the
    time after each step, the device's queue drained."""
    stamps: dict[int, float] = {}
    device = next(model.parameters()).device

    def stamp(_model, step: int) -> None:
        synchronize(device)
        stamps[step] = time.perf_counter()

    train(model, corpus, cfg, callbacks=[stamp], progress=False, desc="gpu check")
    return stamps[cfg.steps] - stamps[warmup]


def plain_seconds(model, corpus: SyntheticCorpus, cfg: TrainConfig, warmup: int) -> float:
    """Wall seconds of the plain loop's steps after the first ``warmup``: the same windows (drawn beforehand, on
    the device), forward under the same autocast, cross-entropy, backward per micro-batch, then one AdamW step."""
    device = next(model.parameters()).device
    windows = [[batch_at(corpus.train, step, micro, cfg).to(device) for micro in range(cfg.grad_accum)]
               for step in range(cfg.steps)]
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), weight_decay=cfg.weight_decay)
    model.train()
    for step, micro_batches in enumerate(windows):
        if step == warmup:
            synchronize(device)
            start = time.perf_counter()
        for w in micro_batches:
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.amp and device.type == "cuda"):
                logits = model(w[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1).float(), w[:, 1:].flatten()) / cfg.grad_accum
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    synchronize(device)
    model.eval()
    return time.perf_counter() - start


def parse_train_shapes(text: str) -> tuple[str, ...]:
    """Comma-separated names of :data:`TRAIN_SHAPES` ('' for none: the check then trains nothing)."""
    names = tuple(t.strip() for t in text.split(",") if t.strip())
    unknown = [n for n in names if n not in TRAIN_SHAPES]
    if unknown:
        raise ValueError(f"unknown training shape {', '.join(unknown)}: choose from {', '.join(TRAIN_SHAPES)} "
                         "(or '' for none)")
    return names
