"""Inheritune (Sanyal et al., arXiv 2404.08634): a smaller GPT-2 that inherits the potent early layers of a
larger one, is trained, and grows while it is worse than its reference.

The student copies the reference's token embedding ``embed.W_E``, blocks ``0..n-1`` (attention, MLP, both
LayerNorms) and unembedding ``unembed.W_U``/``unembed.b_U``; the position embedding and the final LayerNorm stay
at fresh initialisation, as in the authors' code. (TransformerLens GPT-2 keeps W_E and W_U as separate tensors;
GPT-2 ties them. Both are copied, so a student starts with the reference's tie or lack of it.)
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, cast

import numpy as np
import pandas as pd
import torch

from lens_heads.collapse.gpt2 import (  # noqa: F401
    GPT2_SIZES,
    PADDED_VOCAB,
    GPT2Options,
    gpt2_config,
    gpt2_model,
    gpt2_options,
    own_rng,
)
from lens_heads.collapse.rank import RankProfile, attention_rank
from lens_heads.collapse.train import RankTracker, TrainConfig, TrainResult, eval_windows, train
from lens_heads.data.rows import within_context
from lens_heads.data.tasks import INHERITUNE_SCORINGS, TASKS, load_task
from lens_heads.evaluation.evaluate import evaluate
from lens_heads.models.backends import hooked_transformer
from lens_heads.plumbing.errors import InputError
from lens_heads.plumbing.io import atomic_write_json

if TYPE_CHECKING:  # TransformerLens 3.9 only
    from transformer_lens import HookedTransformer

BLOCK_PARTS = ("ln1", "ln2", "attn", "mlp")
# what "inheriting attention only / MLP only / both" copies of a block: each sub-layer with the LayerNorm before it
PARTS = {"both": BLOCK_PARTS, "attention": ("ln1", "attn"), "mlp": ("ln2", "mlp")}


def _check_gpt2(model: HookedTransformer, role: str) -> GPT2Options:
    try:
        return gpt2_options(model)
    except ValueError as err:
        raise InputError(f"the {role} must be GPT-2-shaped: {err}") from None


def _check_depth(n_layers: int, limit: int, what: str) -> None:
    if not 0 < n_layers <= limit:
        raise InputError(f"n_layers must be in 1..{limit} ({what}), got {n_layers}: a student cannot have more "
                         "layers than its reference")


def inherited_names(model: HookedTransformer, n_layers: int, *, parts: str = "both") -> list[str]:
    """State-dict names of ``model`` that a student of ``n_layers`` layers takes (layer by layer, ``parts`` of each
    block): the token embedding (with a tied model also its unembedding), the unembedding (``W_U``, ``b_U``) where
    it is a tensor of its own, and blocks ``0..n_layers-1``."""
    if parts not in PARTS:
        raise InputError(f"parts must be one of {sorted(PARTS)}, got {parts!r}")
    state = model.state_dict()
    names: list[str] = [k for k in ("embed.W_E", "unembed.W_U", "unembed.b_U") if k in state]
    names += [k for k in state for layer in range(n_layers)
              if any(k.startswith(f"blocks.{layer}.{part}.") for part in PARTS[parts])]
    return names


def _copy(target: HookedTransformer, source: HookedTransformer, names: list[str],
          rename=lambda name: name) -> None:
    """``target[name] = source[rename(name)]`` for each state-dict ``name``."""
    src, dst = source.state_dict(), target.state_dict()
    with torch.no_grad():
        for name in names:
            dst[name].copy_(src[rename(name)])


def _block_from(mapping: dict[int, int]):
    """Rename ``blocks.{i}.x`` to ``blocks.{mapping[i]}.x`` (other names unchanged)."""
    def rename(name: str) -> str:
        if not name.startswith("blocks."):
            return name
        _, i, rest = name.split(".", 2)
        return f"blocks.{mapping[int(i)]}.{rest}"
    return rename


def _meta_of(model: HookedTransformer) -> dict:
    """The ``lens_heads_meta`` dict `gpt2_model` and `same_size_random` set on the model (not an nn.Module attribute
    mypy can see)."""
    return cast(dict, model.lens_heads_meta)


def _sized_like(model: HookedTransformer, n_layers: int, name: str, seed: int) -> HookedTransformer:
    _, HookedTransformerConfig = hooked_transformer()
    with own_rng():
        cfg = HookedTransformerConfig(**{**model.cfg.to_dict(), "n_layers": n_layers, "model_name": name})
    return gpt2_model(cfg, seed=seed, options=gpt2_options(model), tokenizer=model.tokenizer, device=model.cfg.device)


def inherit(reference: HookedTransformer, n_layers: int, *, seed: int = 0, layers: list[int] | None = None,
            parts: str = "both") -> HookedTransformer:
    """A GPT-2 student of ``n_layers`` layers: the reference's token embedding (and unembedding), its first
    ``n_layers`` blocks, with position embedding and final LayerNorm at fresh init (seed ``seed``), as the
    authors' code does. Built with the reference's `GPT2Options`.

    Ablations: ``layers`` picks the reference blocks that student blocks ``0..n-1`` take (default: the first n);
    ``parts="attention"`` / ``"mlp"`` copies only that sub-layer (with its LayerNorm) of each block.
    """
    _check_gpt2(reference, "reference")
    _check_depth(n_layers, reference.cfg.n_layers, "the reference's depth")
    layers = list(range(n_layers)) if layers is None else list(layers)
    if len(layers) != n_layers or not all(0 <= l < reference.cfg.n_layers for l in layers):
        raise InputError(f"layers must name {n_layers} reference blocks in 0..{reference.cfg.n_layers - 1}, got {layers}")
    student = _sized_like(reference, n_layers, f"inheritune-{n_layers}L-of-{reference.cfg.n_layers}L", seed)
    _copy(student, reference, inherited_names(student, n_layers, parts=parts), _block_from(dict(enumerate(layers))))
    _meta_of(student)["source"] = (f"Inheritune: {PARTS[parts]} of blocks {layers} (as blocks 0..{n_layers - 1}), "
                                   f"token embedding and unembedding of {reference.cfg.model_name}; "
                                   f"rest fresh init seed {seed}")
    return student


def inherit_later_layers(reference: HookedTransformer, n_layers: int, *, seed: int = 0) -> HookedTransformer:
    """Ablation: the student takes the reference's last ``n_layers`` blocks (the lazy ones) instead of the first."""
    _check_depth(n_layers, reference.cfg.n_layers, "the reference's depth")
    return inherit(reference, n_layers, seed=seed, layers=list(range(reference.cfg.n_layers - n_layers,
                                                                       reference.cfg.n_layers)))


def stack(source: HookedTransformer, n_layers: int, *, seed: int = 0) -> HookedTransformer:
    """Stacking baseline: a deeper model whose block i starts as the trained ``source`` block ``i % depth``
    (the shallow stack repeated), every other tensor (embeddings, final LayerNorm) taken from ``source``."""
    _check_gpt2(source, "source")
    depth = source.cfg.n_layers
    if n_layers <= depth:
        raise InputError(f"stacking grows a model: n_layers must exceed the source's {depth} layers, got {n_layers}")
    stacked = _sized_like(source, n_layers, f"stacked-{n_layers}L-of-{depth}L", seed)
    _copy(stacked, source, list(stacked.state_dict()), _block_from({i: i % depth for i in range(n_layers)}))
    _meta_of(stacked)["source"] = f"stacking: blocks 0..{depth - 1} of {source.cfg.model_name} repeated"
    return stacked


def same_size_random(reference: HookedTransformer, n_layers: int, *, seed: int = 0) -> HookedTransformer:
    """Any architecture: a fresh TransformerLens initialisation of ``reference``'s configuration at ``n_layers``
    layers (the same-size random-init baseline)."""
    _check_depth(n_layers, reference.cfg.n_layers, "the reference's depth")
    HookedTransformer, HookedTransformerConfig = hooked_transformer()
    with own_rng():
        # init_weights: a loaded pretrained model's config turns initialisation off (its weights are loaded)
        cfg = HookedTransformerConfig(**{**reference.cfg.to_dict(), "n_layers": n_layers, "seed": seed,
                                         "init_weights": True,
                                         "model_name": f"random-{n_layers}L-like-{reference.cfg.model_name}"})
        model = HookedTransformer(cfg, tokenizer=reference.tokenizer)
    model.eval()
    model.lens_heads_meta = {"name": cfg.model_name, "source": f"fresh init seed {seed} ({cfg.init_mode})",
                             "weight_basis": "raw (no weight processing)", "dtype": str(cfg.dtype).replace("torch.", "")}
    return model


def inherit_first_layers(reference: HookedTransformer, n_layers: int, *, seed: int = 0,
                         fresh: tuple[str, ...] = ("ln_final.",)) -> HookedTransformer:
    """Inheritune for any architecture (the Llama-shaped embedded SmolLM2 included; `inherit` is the GPT-2 one):
    ``reference``'s configuration at ``n_layers`` layers, taking every tensor of the token embedding, blocks
    ``0..n_layers-1`` and the unembedding; tensors whose names start with ``fresh`` (default: the final norm, as
    the authors' code leaves it) keep the fresh init of `same_size_random` with ``seed``."""
    student = same_size_random(reference, n_layers, seed=seed)
    student.cfg.model_name = f"inheritune-{n_layers}L-of-{reference.cfg.model_name}"
    _copy(student, reference, [k for k in student.state_dict() if not k.startswith(fresh)])
    _meta_of(student).update(name=student.cfg.model_name, source=(
        f"Inheritune: embedding, blocks 0..{n_layers - 1}, unembedding of {reference.cfg.model_name}; {fresh} "
        f"fresh init seed {seed}"), weight_basis=getattr(reference, "lens_heads_meta", {}).get("weight_basis", "raw"))
    return student


def grow(reference: HookedTransformer, n_layers: int, *, student: HookedTransformer | None = None,
         seed: int = 0) -> HookedTransformer:
    """A larger student of ``n_layers`` layers (at most the reference's depth).

    Without ``student``: a fresh re-inheritance of ``n_layers`` reference layers (what the authors' logs fit).
    With ``student``: keep the trained student (all its tensors) and append reference blocks
    ``student.n_layers..n_layers-1``.
    """
    _check_depth(n_layers, reference.cfg.n_layers, "growing cannot pass the reference's depth")
    grown = inherit(reference, n_layers, seed=seed)
    if student is not None:
        if student.cfg.n_layers >= n_layers:
            raise InputError(f"grow to {n_layers} layers needs a student with fewer layers, got {student.cfg.n_layers}")
        _copy(grown, student, [k for k in student.state_dict()])
        _meta_of(grown)["source"] += f"; blocks 0..{student.cfg.n_layers - 1} and embeddings from the trained student"
    return grown


# ---------------------------------------------------------------- the whole procedure

ABLATIONS = ("later_layers", "attention_only", "mlp_only", "stacking")
GROW_FROM = ("reference", "student")  # re-inherit from the reference at each size, or keep the trained student


@dataclass
class InherituneConfig:
    """Sizes and schedule of an Inheritune run. ``train`` is used for every stage (same steps for each).

    ``ablations``: the paper's baselines at the final student size, each one stage (a row of the table):
    ``"later_layers"`` (inherit the reference's last blocks), ``"attention_only"``, ``"mlp_only"`` (inherit one
    sub-layer of each of the first blocks) and ``"stacking"`` (a scratch model of half the depth, trained, then
    stacked to the full student depth and trained again). ``options``: the GPT-2 architecture (authors' default).
    """

    ref_layers: int = 8
    student_layers: int = 4
    grow_by: int = 2
    max_layers: int | None = None  # largest student; default ref_layers - 1
    d_model: int = 128
    n_heads: int = 4
    n_ctx: int = 128
    d_vocab: int = PADDED_VOCAB
    options: GPT2Options = field(default_factory=GPT2Options)
    train: TrainConfig = field(default_factory=TrainConfig)
    grow_from: str = "reference"  # "reference": fresh re-inheritance; "student": keep the trained student
    baselines: bool = True  # same-size scratch models for 1x and 2x steps
    ablations: tuple[str, ...] = ABLATIONS
    rank_inputs: int = 32  # N validation windows for attention rank
    rank_len: int = 64  # T tokens each
    rank_every: int | None = None  # also track rank during training every this many steps
    rank_average: bool = True  # the paper's rank: of the input-averaged matrix (False: mean of per-input ranks)
    seed: int = 0
    device: str | None = None

    def __post_init__(self):
        _check_config(self)  # refused where it is built, not stages later


@dataclass
class Stage:
    name: str
    kind: str  # "reference" | "student" | "scratch" | "ablation" (incl. stacking) | "stack_source"
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


def _rank(model, tokens, average: bool) -> dict:
    profile: RankProfile = attention_rank(model, tokens, average=average, progress=False)
    return profile.to_dict()


def _check_config(c: InherituneConfig) -> int:
    """The largest student size; errors for sizes the reference cannot provide."""
    max_layers = c.max_layers or c.ref_layers - 1
    if max_layers > c.ref_layers:
        raise InputError(f"max_layers={max_layers} exceeds the reference's {c.ref_layers} layers: growing cannot "
                         "pass the reference")
    if not 0 < c.student_layers <= max_layers:
        raise InputError(f"student_layers={c.student_layers} must be in 1..{max_layers} (max_layers)")
    unknown = set(c.ablations) - set(ABLATIONS)
    if unknown:
        raise InputError(f"unknown ablations {sorted(unknown)}: choose from {ABLATIONS}")
    if c.grow_by < 1:  # growing by 0 would train the same size forever
        raise InputError(f"grow_by={c.grow_by} must be at least 1 (layers added per growth stage)")
    if c.grow_from not in GROW_FROM:
        raise InputError(f"grow_from={c.grow_from!r} must be one of {GROW_FROM}")
    return max_layers


def run_inheritune(config: InherituneConfig, corpus, *, out_dir: str | Path, tokenizer=None,
                   progress: bool = True) -> InherituneResult:
    """Train a reference, inherit its first layers, train, grow while worse than the reference, then the
    baselines at the final student size: same-size scratch for 1x and 2x the steps and ``config.ablations``;
    attention rank of every layer at every stage.

    Every stage trains in its own folder under ``out_dir`` and resumes; a finished run only reloads."""
    c = config
    max_layers = _check_config(c)
    run = _Stages(c, corpus, Path(out_dir), tokenizer, progress)
    reference = run.fresh(c.ref_layers, c.seed)
    ref = run.train(f"reference_{c.ref_layers}L", "reference", reference)
    n = _students(run, reference, ref.val_loss, max_layers)
    if c.baselines:
        for mult in (1, 2):
            train_cfg = TrainConfig(**{**asdict(c.train), "steps": mult * c.train.steps})
            run.train(f"scratch_{n}L_{mult}x", "scratch", run.fresh(n, c.seed + 1000 + n), train_cfg)
    for ablation in c.ablations:
        _ablation(run, reference, ablation, n)
    result = InherituneResult(stages=run.stages, reference_val_loss=ref.val_loss, final_layers=n,
                              meta=_meta(c, corpus, ref))
    atomic_write_json(run.out / "result.json", result.to_dict())
    return result


class _Stages:
    """The stages of one run, trained in order, each in its own resumable folder under ``out``; ``stages.json``
    is rewritten as each finishes."""

    def __init__(self, config: InherituneConfig, corpus, out: Path, tokenizer, progress: bool):
        self.c, self.corpus, self.out, self.tokenizer, self.progress = config, corpus, out, tokenizer, progress
        self.tokens = rank_tokens(corpus, config.rank_inputs, config.rank_len)
        self.callbacks = ([RankTracker(self.tokens, every=config.rank_every, average=config.rank_average)]
                          if config.rank_every else [])
        self.stages: list[Stage] = []

    def fresh(self, n_layers: int, seed: int) -> HookedTransformer:
        c = self.c
        return gpt2_model(gpt2_config(n_layers, d_model=c.d_model, n_heads=c.n_heads, n_ctx=c.n_ctx,
                                      d_vocab=c.d_vocab),
                          seed=seed, options=c.options, tokenizer=self.tokenizer, device=c.device)

    def train(self, name: str, kind: str, model: HookedTransformer, train_cfg: TrainConfig | None = None) -> Stage:
        average = self.c.rank_average
        at_init = _rank(model, self.tokens, average)  # fresh init, or for students: just inherited
        result: TrainResult = train(model, self.corpus, train_cfg or self.c.train, out_dir=self.out / name,
                                    callbacks=self.callbacks, progress=self.progress, desc=name)
        stage = Stage(name=name, kind=kind, n_layers=model.cfg.n_layers, steps=result.steps,
                      tokens_seen=result.tokens_seen, val_loss=result.val_loss,
                      rank=_rank(model, self.tokens, average), rank_at_init=at_init, history=result.history,
                      wall_time_s=result.wall_time_s)
        self.stages.append(stage)
        atomic_write_json(self.out / "stages.json", [asdict(s) for s in self.stages])
        return stage


def _students(run: _Stages, reference: HookedTransformer, reference_loss: float, max_layers: int) -> int:
    """Inherit the first n layers and train; grow by ``grow_by`` while worse than the reference. The final n."""
    c = run.c
    n, student, prev = c.student_layers, None, None
    while True:
        if c.grow_from == "student" and prev is not None:
            student = grow(reference, n, student=student, seed=c.seed + n)
        else:
            student = inherit(reference, n, seed=c.seed + n)
        prev = run.train(f"student_{n}L", "student", student)
        if prev.val_loss <= reference_loss or n + c.grow_by > max_layers:
            return n
        n += c.grow_by


def _ablation(run: _Stages, reference: HookedTransformer, ablation: str, n: int) -> None:
    """One of the paper's ablations at the final student size ``n``."""
    seed = run.c.seed + n
    if ablation == "later_layers":
        run.train(f"later_layers_{n}L", "ablation", inherit_later_layers(reference, n, seed=seed))
    elif ablation in ("attention_only", "mlp_only"):
        parts = ablation.removesuffix("_only")
        run.train(f"{ablation}_{n}L", "ablation", inherit(reference, n, seed=seed, parts=parts))
    elif ablation == "stacking" and n >= 2:
        source = run.fresh(n // 2, run.c.seed + 2000 + n)
        run.train(f"stack_source_{n // 2}L", "stack_source", source)
        run.train(f"stacking_{n}L", "ablation", stack(source, n, seed=seed))


def _meta(c: InherituneConfig, corpus, ref: Stage) -> dict:
    return {"config": asdict(c), "corpus": dict(getattr(corpus, "meta", {})),
            "rank": {"n_inputs": c.rank_inputs, "length": c.rank_len, "mode": ref.rank["meta"]["mode"],
                     "definition": ref.rank["definition"], "lazy_rule": ref.rank["lazy_rule"]},
            "student_rule": "grow while student val loss > reference val loss",
            "ablations": {"later_layers": "inherit the reference's last n blocks",
                          "attention_only": "inherit ln1 + attention of the first n blocks",
                          "mlp_only": "inherit ln2 + MLP of the first n blocks",
                          "stacking": "scratch n/2 layers trained, repeated to n, trained"}}


# ---------------------------------------------------------------- zero-shot evaluation

# The paper's zero-shot tasks and the accuracy reported for each (lm-eval names: "sum" = acc, "per_char" =
# acc_norm, which the paper reports for HellaSwag), from the task registry (TaskSpec.inheritune_scoring). A task
# asked for that lens_heads.data.tasks does not ship is reported as unavailable.
PAPER_TASKS = INHERITUNE_SCORINGS


def zero_shot(model: HookedTransformer, tasks: dict[str, str] | None = None, *, n: int | None = None, seed: int = 0,
              batch_size: int = 16) -> list[dict]:
    """Zero-shot accuracy of ``model`` on ``tasks`` ({task: metric}, default `PAPER_TASKS`), ``n`` items each
    (seeded sample); items longer than the model's context are dropped and counted."""
    rows = []
    for name, metric in (PAPER_TASKS if tasks is None else tasks).items():
        if name not in TASKS:
            rows.append({"task": name, "available": False, "note": f"not in lens_heads.data.tasks.TASKS {TASKS}"})
            continue
        fitting, dropped = within_context(model, load_task(name, n=n, seed=seed, shots=0))
        res = evaluate(model, fitting, batch_size=batch_size, progress=False, primary=metric)
        rows.append({**res.summary(), "available": True, "dropped_longer_than_context": dropped})
    return rows


def load_result(out_dir: str | Path) -> InherituneResult:
    """Read a finished run's ``result.json``."""
    data = json.loads((Path(out_dir) / "result.json").read_text())
    return InherituneResult(stages=[Stage(**s) for s in data["stages"]], reference_val_loss=data["reference_val_loss"],
                            final_layers=data["final_layers"], meta=data["meta"])
