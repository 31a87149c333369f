"""Inheritune (Sanyal et al., arXiv 2404.08634): a smaller GPT-2 that inherits the potent early layers of a
larger one, is trained, and grows while it is worse than its reference.

The student copies the reference's token embedding ``embed.W_E``, blocks ``0..n-1`` (attention, MLP, both
LayerNorms) and unembedding ``unembed.W_U``/``unembed.b_U``; the position embedding and the final LayerNorm stay
at fresh initialisation, as in the authors' code. (TransformerLens GPT-2 keeps W_E and W_U as separate tensors;
GPT-2 ties them. Both are copied, so a student starts with the reference's tie or lack of it.)
"""

from __future__ import annotations

import contextlib
import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

from lens_heads.io import atomic_write_json
from lens_heads.rank import RankProfile, attention_rank
from lens_heads.train import RankTracker, TrainConfig, TrainResult, eval_windows, train

BLOCK_PARTS = ("ln1", "ln2", "attn", "mlp")


@contextlib.contextmanager
def _own_rng():
    """TransformerLens seeds torch, numpy and random globally when a config has a seed: restore them after."""
    py, npy = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        yield
    random.setstate(py)
    np.random.set_state(npy)


def gpt2_config(n_layers: int, *, d_model: int = 768, n_heads: int = 12, n_ctx: int = 1024,
                d_vocab: int = 50257, d_mlp: int | None = None, seed: int = 0) -> HookedTransformerConfig:
    """A GPT-2 architecture (pre-LayerNorm, learned positions, GELU MLP of width 4 d_model, GPT-2 init 0.02)."""
    if d_model % n_heads:
        raise ValueError(f"d_model={d_model} is not a multiple of n_heads={n_heads}")
    with _own_rng():
        return HookedTransformerConfig(
            n_layers=n_layers, d_model=d_model, n_heads=n_heads, d_head=d_model // n_heads, n_ctx=n_ctx,
            d_mlp=d_mlp or 4 * d_model, d_vocab=d_vocab, act_fn="gelu_new", normalization_type="LN",
            positional_embedding_type="standard", init_mode="gpt2", initializer_range=0.02, seed=seed,
            default_prepend_bos=True, model_name=f"gpt2-{n_layers}L-{d_model}d",
        )


# GPT-2 sizes of the paper (the reference models it trains from scratch)
GPT2_SIZES = {"gpt2": dict(d_model=768, n_heads=12, n_layers=12), "gpt2-medium": dict(d_model=1024, n_heads=16, n_layers=24),
              "gpt2-large": dict(d_model=1280, n_heads=20, n_layers=36), "gpt2-xl": dict(d_model=1600, n_heads=25, n_layers=48)}


def gpt2_model(cfg: HookedTransformerConfig, *, seed: int, tokenizer=None, device=None) -> HookedTransformer:
    """A freshly initialised GPT-2 HookedTransformer; the init depends on ``seed`` only (global RNG untouched)."""
    with _own_rng():  # the init depends on cfg.seed, set here; the caller's generators are left as they were
        cfg = HookedTransformerConfig(**{**cfg.to_dict(), "seed": seed, "device": device or cfg.device})
        model = HookedTransformer(cfg, tokenizer=tokenizer)
    model.eval()
    model.lens_heads_meta = {"name": cfg.model_name, "source": f"GPT-2 architecture, fresh init seed {seed}",
                             "weight_basis": "raw (no weight processing)", "dtype": str(cfg.dtype).replace("torch.", "")}
    return model


def inherited_names(model: HookedTransformer, n_layers: int) -> list[str]:
    """State-dict names a student of ``n_layers`` layers takes from its reference."""
    names = ["embed.W_E", "unembed.W_U", "unembed.b_U"]
    names += [k for k, _ in model.named_parameters() for layer in range(n_layers)
              if any(k.startswith(f"blocks.{layer}.{part}.") for part in BLOCK_PARTS)]
    return names


def _copy_blocks(target: HookedTransformer, source: HookedTransformer, names: list[str]) -> None:
    src, dst = source.state_dict(), target.state_dict()
    with torch.no_grad():
        for name in names:
            dst[name].copy_(src[name])


def inherit(reference: HookedTransformer, n_layers: int, *, seed: int = 0) -> HookedTransformer:
    """A GPT-2 student of ``n_layers`` layers: the reference's token embedding, first ``n_layers`` blocks and
    unembedding, with position embedding and final LayerNorm at fresh init (seed ``seed``)."""
    if not 0 < n_layers <= reference.cfg.n_layers:
        raise ValueError(f"n_layers must be in 1..{reference.cfg.n_layers} (the reference's depth), got {n_layers}")
    with _own_rng():
        cfg = HookedTransformerConfig(**{**reference.cfg.to_dict(), "n_layers": n_layers,
                                         "model_name": f"inheritune-{n_layers}L-of-{reference.cfg.n_layers}L"})
    student = gpt2_model(cfg, seed=seed, tokenizer=reference.tokenizer, device=reference.cfg.device)
    _copy_blocks(student, reference, inherited_names(reference, n_layers))
    student.lens_heads_meta["source"] = (f"Inheritune: blocks 0..{n_layers - 1}, W_E, W_U, b_U of "
                                         f"{reference.cfg.model_name}; rest fresh init seed {seed}")
    return student


def grow(reference: HookedTransformer, n_layers: int, *, student: HookedTransformer | None = None,
         seed: int = 0) -> HookedTransformer:
    """A larger student of ``n_layers`` layers.

    Without ``student``: a fresh re-inheritance of ``n_layers`` reference layers (what the authors' logs fit).
    With ``student``: keep the trained student (all its tensors) and append reference blocks
    ``student.n_layers..n_layers-1``.
    """
    grown = inherit(reference, n_layers, seed=seed)
    if student is not None:
        if student.cfg.n_layers >= n_layers:
            raise ValueError(f"grow to {n_layers} layers needs a student with fewer layers, got {student.cfg.n_layers}")
        keep = [k for k, _ in student.named_parameters() if not k.startswith("blocks.")]
        _copy_blocks(grown, student, keep + inherited_names(student, student.cfg.n_layers))
        grown.lens_heads_meta["source"] += f"; blocks 0..{student.cfg.n_layers - 1} and embeddings from the trained student"
    return grown


# ---------------------------------------------------------------- the whole procedure


@dataclass
class InherituneConfig:
    """Sizes and schedule of an Inheritune run. ``train`` is used for every stage (same steps for each)."""

    ref_layers: int = 8
    student_layers: int = 4
    grow_by: int = 2
    max_layers: int | None = None  # largest student; default ref_layers - 1
    d_model: int = 128
    n_heads: int = 4
    n_ctx: int = 128
    d_vocab: int = 50257
    train: TrainConfig = field(default_factory=TrainConfig)
    grow_from: str = "reference"  # "reference": fresh re-inheritance; "student": keep the trained student
    baselines: bool = True  # same-size scratch models for 1x and 2x steps
    rank_inputs: int = 32  # N validation windows for attention rank
    rank_len: int = 64  # T tokens each
    rank_every: int | None = None  # also track rank during training every this many steps
    seed: int = 0
    device: str | None = None


@dataclass
class Stage:
    name: str
    kind: str  # "reference" | "student" | "scratch"
    n_layers: int
    steps: int
    tokens_seen: int
    val_loss: float
    rank: dict  # RankProfile.to_dict() after training
    rank_at_init: dict  # before training (fresh init; for students: right after inheritance)
    history: list[dict]
    wall_time_s: float


@dataclass
class InherituneResult:
    """All stages of an Inheritune run: reference, each student growth stage, same-size scratch baselines."""

    stages: list[Stage]
    reference_val_loss: float
    final_layers: int
    meta: dict

    def to_dataframe(self) -> pd.DataFrame:
        rows = []
        for s in self.stages:
            rows.append({"stage": s.name, "kind": s.kind, "n_layers": s.n_layers, "steps": s.steps,
                         "tokens_seen": s.tokens_seen, "val_loss": s.val_loss,
                         "val_loss_minus_reference": s.val_loss - self.reference_val_loss,
                         "mean_max_rank": float(np.mean(s.rank["max_rank"])),
                         "min_max_rank": float(np.min(s.rank["max_rank"])),
                         "n_lazy_layers": int(np.sum(s.rank["lazy"])), "wall_time_s": s.wall_time_s})
        return pd.DataFrame(rows)

    def to_dict(self) -> dict:
        return asdict(self)


def rank_tokens(corpus, n: int, length: int) -> torch.Tensor:
    """The fixed validation windows every stage's attention rank is measured on."""
    return eval_windows(corpus.val, n, length - 1)


def _rank(model, tokens) -> dict:
    profile: RankProfile = attention_rank(model, tokens, average=False, progress=False)
    return profile.to_dict()


def run_inheritune(config: InherituneConfig, corpus, *, out_dir: str | Path, tokenizer=None,
                   progress: bool = True) -> InherituneResult:
    """Train a reference, inherit its first layers, train, grow while worse than the reference, and train
    same-size scratch baselines for 1x and 2x the steps; attention rank of every layer at every stage.

    Every stage trains in its own folder under ``out_dir`` and resumes; a finished run only reloads."""
    out = Path(out_dir)
    c = config
    max_layers = c.max_layers or c.ref_layers - 1
    cfg = gpt2_config(c.ref_layers, d_model=c.d_model, n_heads=c.n_heads, n_ctx=c.n_ctx, d_vocab=c.d_vocab)
    tokens = rank_tokens(corpus, c.rank_inputs, c.rank_len)
    callbacks = [RankTracker(tokens, every=c.rank_every)] if c.rank_every else []
    stages: list[Stage] = []

    def run_stage(name, kind, model, train_cfg) -> Stage:
        at_init = _rank(model, tokens)  # fresh init, or for students: just inherited
        result: TrainResult = train(model, corpus, train_cfg, out_dir=out / name, callbacks=callbacks,
                                    progress=progress, desc=name)
        stage = Stage(name=name, kind=kind, n_layers=model.cfg.n_layers, steps=result.steps,
                      tokens_seen=result.tokens_seen, val_loss=result.val_loss, rank=_rank(model, tokens),
                      rank_at_init=at_init, history=result.history, wall_time_s=result.wall_time_s)
        stages.append(stage)
        atomic_write_json(out / "stages.json", [asdict(s) for s in stages])
        return stage

    reference = gpt2_model(cfg, seed=c.seed, tokenizer=tokenizer, device=c.device)
    ref = run_stage(f"reference_{c.ref_layers}L", "reference", reference, c.train)

    n, student, prev = c.student_layers, None, None
    while True:
        if c.grow_from == "student" and prev is not None:
            student = grow(reference, n, student=student, seed=c.seed + n)
        else:
            student = inherit(reference, n, seed=c.seed + n)
        prev = run_stage(f"student_{n}L", "student", student, c.train)
        if prev.val_loss <= ref.val_loss or n + c.grow_by > max_layers:
            break
        n += c.grow_by

    if c.baselines:
        scratch_cfg = gpt2_config(n, d_model=c.d_model, n_heads=c.n_heads, n_ctx=c.n_ctx, d_vocab=c.d_vocab)
        for mult in (1, 2):
            train_cfg = TrainConfig(**{**asdict(c.train), "steps": mult * c.train.steps})
            run_stage(f"scratch_{n}L_{mult}x", "scratch", gpt2_model(scratch_cfg, seed=c.seed + 1000 + n,
                                                                      tokenizer=tokenizer, device=c.device), train_cfg)

    result = InherituneResult(stages=stages, reference_val_loss=ref.val_loss, final_layers=n,
                              meta={"config": asdict(c), "corpus": dict(getattr(corpus, "meta", {})),
                                    "rank": {"n_inputs": c.rank_inputs, "length": c.rank_len,
                                             "mode": "mean over inputs of per-input ranks (not averaged first)"},
                                    "student_rule": "grow while student val loss > reference val loss"})
    atomic_write_json(out / "result.json", result.to_dict())
    return result


def load_result(out_dir: str | Path) -> InherituneResult:
    """Read a finished run's ``result.json``."""
    data = json.loads((Path(out_dir) / "result.json").read_text())
    return InherituneResult(stages=[Stage(**s) for s in data["stages"]], reference_val_loss=data["reference_val_loss"],
                            final_layers=data["final_layers"], meta=data["meta"])
