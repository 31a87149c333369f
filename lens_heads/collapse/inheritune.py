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
from types import SimpleNamespace
from typing import TYPE_CHECKING, cast

import numpy as np
import pandas as pd
import torch

from lens_heads.collapse.budget import teacher_flops, training_flops
from lens_heads.collapse.distill import Distillation, DistillConfig
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
from lens_heads.collapse.widen import widen
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


def hybrid_stack(source: HookedTransformer, n_layers: int, *, seed: int = 0) -> HookedTransformer:
    """Hybrid stacking baseline: a deeper model holding the trained ``source`` blocks once, spread evenly (block i
    at depth ``i * n_layers // depth``, so 0, 2, 4, ... when the depth doubles) with freshly initialised blocks
    (seed ``seed``) between them; embeddings and final LayerNorm from ``source``.

    Stacking (Gong et al. 2019, "Efficient training of BERT by progressively stacking"; `stack`) repeats every
    trained block. Sanyal et al. report a "hybrid stacking" warm start too, but their public code holds no script
    for it: this is lens_heads' definition (trained blocks stacked depth-wise with fresh blocks interleaved), not
    checked against theirs."""
    _check_gpt2(source, "source")
    depth = source.cfg.n_layers
    if not depth < n_layers <= 2 * depth:
        raise InputError(f"hybrid stacking adds at most one fresh block per trained one: n_layers must be in "
                         f"{depth + 1}..{2 * depth} for a {depth}-layer source, got {n_layers}")
    hybrid = _sized_like(source, n_layers, f"hybrid-stacked-{n_layers}L-of-{depth}L", seed)
    at = {i * n_layers // depth: i for i in range(depth)}  # target block <- source block
    names = [k for k in hybrid.state_dict() if not k.startswith("blocks.") or int(k.split(".")[1]) in at]
    _copy(hybrid, source, names, _block_from(at))
    _meta_of(hybrid)["source"] = (f"hybrid stacking: blocks 0..{depth - 1} of {source.cfg.model_name} at depths "
                                  f"{sorted(at)}, fresh blocks (seed {seed}) at the others")
    return hybrid


def distilbert_layers(ref_layers: int, n_layers: int) -> list[int]:
    """The reference blocks a DistilBERT-style student of ``n_layers`` takes: evenly spaced from the first to the
    last (every other one when the depth halves, up to rounding: 12 -> 6 gives 0, 2, 4, 7, 9, 11, the blocks
    DistilBERT and DistilGPT-2 were initialised from)."""
    _check_depth(n_layers, ref_layers, "the reference's depth")
    if n_layers == 1:
        return [0]
    return [int(x) for x in np.round(np.linspace(0, ref_layers - 1, n_layers))]


def distilbert_init(reference: HookedTransformer, n_layers: int, *, seed: int = 0) -> HookedTransformer:
    """A student initialised as DistilBERT was (Sanh et al. 2019): the reference's blocks `distilbert_layers`,
    and every other tensor of the reference too (token and position embeddings, final LayerNorm, unembedding)."""
    student = inherit(reference, n_layers, seed=seed, layers=distilbert_layers(reference.cfg.n_layers, n_layers))
    _copy(student, reference, [k for k in student.state_dict() if k.startswith(("pos_embed.", "ln_final."))])
    _meta_of(student)["source"] = (f"DistilBERT-style: blocks {distilbert_layers(reference.cfg.n_layers, n_layers)}"
                                   f", embeddings, final LayerNorm and unembedding of {reference.cfg.model_name}")
    return student


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

    With ``student`` (the paper's recipe, `run_inheritune`'s default): keep the trained student (all its tensors)
    and append reference blocks ``student.n_layers..n_layers-1``. Without: a fresh re-inheritance of ``n_layers``
    reference layers (what the authors' logs fit).
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

# the paper's baselines and ablations at the final student size, each one stage (or a source stage and one)
INHERITANCE_ABLATIONS = ("later_layers", "attention_only", "mlp_only")
WARM_STARTS = ("stacking", "hybrid_stacking", "half_width")
DISTILLATIONS = ("distill_logit", "distill_distilbert")
ABLATIONS = INHERITANCE_ABLATIONS + WARM_STARTS + DISTILLATIONS
GROW_FROM = ("student", "reference")  # keep the trained student and append reference blocks, or re-inherit
GROWTH = {"student": "the trained student grown by the reference's next blocks (the paper's recipe)",
          "reference": "a fresh re-inheritance of the reference's first blocks at each size (what the authors' "
                       "logs fit)"}
BASELINE_METHODS = {
    "later_layers": "inherit the reference's last n blocks (the lazy ones)",
    "attention_only": "inherit ln1 + attention of the first n blocks, the rest fresh",
    "mlp_only": "inherit ln2 + MLP of the first n blocks, the rest fresh",
    "stacking": "scratch n/2 layers trained, its blocks repeated to n, trained (Gong et al. 2019)",
    "hybrid_stacking": "the same n/2-layer source's blocks at even depths, fresh blocks between, trained",
    "half_width": "scratch n layers at half the width trained, doubled function-preservingly (Net2WiderNet), trained",
    "distill_logit": "fresh n layers trained on the reference's logits (T^2 KL at temperature T) mixed with the LM loss",
    "distill_distilbert": "DistilBERT: evenly spaced reference blocks + embeddings, trained with soft, LM and cosine "
                          "losses",
}


@dataclass
class InherituneConfig:
    """Sizes and schedule of an Inheritune run. ``train`` is used for every stage (same steps for each).

    ``grow_from``: ``"student"`` (default, the paper's recipe) keeps the trained student and appends the
    reference's next blocks; ``"reference"`` re-inherits the first n blocks at each size.
    ``ablations``: the paper's baselines and ablations at the final student size (`BASELINE_METHODS`), each one
    stage (a row of the table), trained with the same loop and steps; the warm starts first train their source
    (``stack_source``: scratch at half the depth, shared by stacking and hybrid stacking; ``width_source``: scratch
    at half the width), whose budget the table adds to theirs. ``distill_logit`` / ``distill_distilbert``: the
    losses of the two distillation baselines (the trained reference is the teacher). ``widen_noise``: the noise that
    breaks the copies' symmetry in the half-width warm start. ``options``: the GPT-2 architecture (authors' default).
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
    grow_from: str = "student"
    baselines: bool = True  # same-size scratch models for 1x and 2x steps
    ablations: tuple[str, ...] = ABLATIONS
    distill_logit: DistillConfig = field(default_factory=DistillConfig.logit)
    distill_distilbert: DistillConfig = field(default_factory=DistillConfig.distilbert)
    widen_noise: float = 1e-3
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
    kind: str  # "reference" | "student" | "scratch" | "ablation" (baselines too) | "stack_source" | "width_source"
    n_layers: int
    steps: int
    tokens_seen: int
    val_loss: float
    rank: dict  # RankProfile.to_dict() after training
    rank_at_init: dict  # before training (fresh init; for students: right after inheritance)
    history: list[dict]
    wall_time_s: float
    # budget: FLOPs of this stage's own training (`lens_heads.collapse.budget`), of a teacher's forwards
    # (distillation), and the stages whose trained weights it starts from (their budgets are not in these)
    flops: float = float("nan")
    teacher_flops: float = 0.0
    built_from: list[str] = field(default_factory=list)
    d_model: int | None = None
    method: str = ""


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
    if "half_width" in c.ablations:
        half_width_shape(c.d_model, c.n_heads)
    return max_layers


def half_width_shape(d_model: int, n_heads: int) -> tuple[int, int]:
    """(d_model, n_heads) of the half-width source of a ``d_model``-wide model with ``n_heads`` heads: half the
    heads at the same d_head, or (an odd number of heads, as GPT-2 XL's 25) the same heads at half the d_head."""
    if d_model % 2:
        raise InputError(f"d_model={d_model} is odd: the half-width warm start needs a width that halves (or "
                         "leave half_width out of the ablations)")
    # an even width with an odd number of heads has an even d_head
    return (d_model // 2, n_heads // 2) if n_heads % 2 == 0 else (d_model // 2, n_heads)


def run_inheritune(config: InherituneConfig, corpus, *, out_dir: str | Path, tokenizer=None,
                   progress: bool = True) -> InherituneResult:
    """Train a reference, inherit its first layers, train, grow while worse than the reference, then the
    baselines at the final student size: same-size scratch for 1x and 2x the steps and ``config.ablations``;
    attention rank of every layer at every stage, FLOPs of every stage.

    Every stage trains in its own folder under ``out_dir`` and resumes; a finished run only reloads."""
    c = config
    max_layers = _check_config(c)
    run = _Stages(c, corpus, Path(out_dir), tokenizer, progress)
    reference = run.fresh(c.ref_layers, c.seed)
    ref = run.train(f"reference_{c.ref_layers}L", "reference", reference, method="scratch (the reference)")
    n = _students(run, reference, ref, max_layers)
    if c.baselines:
        for mult in (1, 2):
            train_cfg = TrainConfig(**{**asdict(c.train), "steps": mult * c.train.steps})
            run.train(f"scratch_{n}L_{mult}x", "scratch", run.fresh(n, c.seed + 1000 + n), train_cfg,
                      method=f"fresh init, {mult}x the steps")
    for ablation in c.ablations:
        _ablation(run, reference, ref, ablation, n)
    result = InherituneResult(stages=run.stages, reference_val_loss=ref.val_loss, final_layers=n,
                              meta=_meta(c, corpus, ref))
    atomic_write_json(run.out / "result.json", result.to_dict())
    return result


def planned_stages(config: InherituneConfig, final_layers: int | None = None) -> pd.DataFrame:
    """The stages `run_inheritune` trains when its student ends at ``final_layers`` layers (default: the largest it
    may grow to, the costliest case), in its order, each with its tokens and FLOPs: a run's cost before it runs."""
    c = config
    max_layers = _check_config(c)
    final = max_layers if final_layers is None else final_layers
    if not c.student_layers <= final <= max_layers or (final - c.student_layers) % c.grow_by:
        raise InputError(f"final_layers={final} is not a size the students reach ({c.student_layers} + k x "
                         f"{c.grow_by}, at most {max_layers})")
    tokens, seq = c.train.steps * c.train.tokens_per_step, c.train.seq_len
    rows: list[dict] = []

    def add(name: str, n_layers: int, d_model: int = c.d_model, n_heads: int = c.n_heads, steps_x: int = 1,
            teacher: bool = False) -> None:
        shape = SimpleNamespace(n_layers=n_layers, d_model=d_model, n_heads=n_heads, d_head=d_model // n_heads,
                                d_mlp=4 * d_model, d_vocab=c.d_vocab)
        ref = SimpleNamespace(n_layers=c.ref_layers, d_model=c.d_model, n_heads=c.n_heads,
                              d_head=c.d_model // c.n_heads, d_mlp=4 * c.d_model, d_vocab=c.d_vocab)
        rows.append({"stage": name, "n_layers": n_layers, "d_model": d_model, "tokens": steps_x * tokens,
                     "flops": training_flops(shape, steps_x * tokens, seq),
                     "teacher_flops": teacher_flops(ref, steps_x * tokens, seq) if teacher else 0.0})

    add(f"reference_{c.ref_layers}L", c.ref_layers)
    for n in range(c.student_layers, final + 1, c.grow_by):
        add(f"student_{n}L", n)
    n = final
    if c.baselines:
        add(f"scratch_{n}L_1x", n)
        add(f"scratch_{n}L_2x", n, steps_x=2)
    for ablation in c.ablations:
        if ablation in ("stacking", "hybrid_stacking"):
            if n < 2:
                continue
            if not any(r["stage"] == f"stack_source_{n // 2}L" for r in rows):
                add(f"stack_source_{n // 2}L", n // 2)
        elif ablation == "half_width":
            d_half, h_half = half_width_shape(c.d_model, c.n_heads)
            add(f"width_source_{n}L_{d_half}d", n, d_half, h_half)
        add(f"{ablation}_{n}L", n, teacher=ablation in DISTILLATIONS)
    return pd.DataFrame(rows)


class _Stages:
    """The stages of one run, trained in order, each in its own resumable folder under ``out``; ``stages.json``
    is rewritten as each finishes."""

    def __init__(self, config: InherituneConfig, corpus, out: Path, tokenizer, progress: bool):
        self.c, self.corpus, self.out, self.tokenizer, self.progress = config, corpus, out, tokenizer, progress
        self.tokens = rank_tokens(corpus, config.rank_inputs, config.rank_len)
        self.callbacks = ([RankTracker(self.tokens, every=config.rank_every, average=config.rank_average)]
                          if config.rank_every else [])
        self.stages: list[Stage] = []
        self.sources: dict[str, HookedTransformer] = {}  # trained warm-start sources, by stage name

    def fresh(self, n_layers: int, seed: int, d_model: int | None = None,
              n_heads: int | None = None) -> HookedTransformer:
        c = self.c
        return gpt2_model(gpt2_config(n_layers, d_model=d_model or c.d_model, n_heads=n_heads or c.n_heads,
                                      n_ctx=c.n_ctx, d_vocab=c.d_vocab),
                          seed=seed, options=c.options, tokenizer=self.tokenizer, device=c.device)

    def train(self, name: str, kind: str, model: HookedTransformer, train_cfg: TrainConfig | None = None, *,
              objective: Distillation | None = None, built_from: tuple[str, ...] = (), method: str = "") -> Stage:
        average = self.c.rank_average
        cfg = train_cfg or self.c.train
        at_init = _rank(model, self.tokens, average)  # fresh init, or for students: just inherited
        result: TrainResult = train(model, self.corpus, cfg, out_dir=self.out / name, callbacks=self.callbacks,
                                    objective=objective, progress=self.progress, desc=name)
        teacher = (teacher_flops(objective.teacher.cfg, result.tokens_seen, cfg.seq_len)
                   if objective is not None else 0.0)
        stage = Stage(name=name, kind=kind, n_layers=model.cfg.n_layers, steps=result.steps,
                      tokens_seen=result.tokens_seen, val_loss=result.val_loss,
                      rank=_rank(model, self.tokens, average), rank_at_init=at_init, history=result.history,
                      wall_time_s=result.wall_time_s,
                      flops=training_flops(model.cfg, result.tokens_seen, cfg.seq_len), teacher_flops=teacher,
                      built_from=list(built_from), d_model=model.cfg.d_model, method=method)
        self.stages.append(stage)
        atomic_write_json(self.out / "stages.json", [asdict(s) for s in self.stages])
        return stage


def _students(run: _Stages, reference: HookedTransformer, ref: Stage, max_layers: int) -> int:
    """Inherit the first n layers and train; grow by ``grow_by`` while worse than the reference (by
    ``grow_from``). The final n."""
    c = run.c
    n, student, prev = c.student_layers, None, None
    built: tuple[str, ...]
    while True:
        if c.grow_from == "student" and prev is not None:
            student = grow(reference, n, student=student, seed=c.seed + n)
            built, how = (prev.name, ref.name), f"{GROWTH['student']}: {prev.name} + reference blocks {prev.n_layers}..{n - 1}"
        else:
            student = inherit(reference, n, seed=c.seed + n)
            built, how = (ref.name,), f"Inheritune: reference blocks 0..{n - 1} + embeddings"
        prev = run.train(f"student_{n}L", "student", student, built_from=built, method=how)
        if prev.val_loss <= ref.val_loss or n + c.grow_by > max_layers:
            return n
        n += c.grow_by


def _ablation(run: _Stages, reference: HookedTransformer, ref: Stage, ablation: str, n: int) -> None:
    """One of the paper's baselines or ablations at the final student size ``n``."""
    c = run.c
    seed, method = c.seed + n, BASELINE_METHODS[ablation]
    if ablation == "later_layers":
        run.train(f"later_layers_{n}L", "ablation", inherit_later_layers(reference, n, seed=seed),
                  built_from=(ref.name,), method=method)
    elif ablation in ("attention_only", "mlp_only"):
        parts = ablation.removesuffix("_only")
        run.train(f"{ablation}_{n}L", "ablation", inherit(reference, n, seed=seed, parts=parts),
                  built_from=(ref.name,), method=method)
    elif ablation in ("stacking", "hybrid_stacking") and n >= 2:
        name = f"stack_source_{n // 2}L"
        if name not in run.sources:  # one source for both depth warm starts, trained once
            run.sources[name] = run.fresh(n // 2, c.seed + 2000 + n)
            run.train(name, "stack_source", run.sources[name], method="fresh init at half the depth")
        source = run.sources[name]
        grown = stack(source, n, seed=seed) if ablation == "stacking" else hybrid_stack(source, n, seed=seed)
        run.train(f"{ablation}_{n}L", "ablation", grown, built_from=(name,), method=method)
    elif ablation == "half_width":
        d_half, h_half = half_width_shape(c.d_model, c.n_heads)
        source = run.fresh(n, c.seed + 3000 + n, d_model=d_half, n_heads=h_half)
        src = run.train(f"width_source_{n}L_{d_half}d", "width_source", source,
                        method=f"fresh init at half the width ({d_half}d, {h_half} heads)")
        wide = widen(source, d_model=c.d_model, n_heads=c.n_heads, seed=seed, noise=c.widen_noise)
        run.train(f"half_width_{n}L", "ablation", wide, built_from=(src.name,), method=method)
    elif ablation == "distill_logit":
        objective = Distillation(reference, c.distill_logit)
        run.train(f"distill_logit_{n}L", "ablation", run.fresh(n, c.seed + 4000 + n), objective=objective,
                  built_from=(ref.name,), method=f"{method}; {c.distill_logit.to_dict()}")
    elif ablation == "distill_distilbert":
        objective = Distillation(reference, c.distill_distilbert)
        run.train(f"distill_distilbert_{n}L", "ablation", distilbert_init(reference, n, seed=seed),
                  objective=objective, built_from=(ref.name,), method=f"{method}; {c.distill_distilbert.to_dict()}")


def _meta(c: InherituneConfig, corpus, ref: Stage) -> dict:
    return {"config": asdict(c), "corpus": dict(getattr(corpus, "meta", {})),
            "rank": {"n_inputs": c.rank_inputs, "length": c.rank_len, "mode": ref.rank["meta"]["mode"],
                     "definition": ref.rank["definition"], "lazy_rule": ref.rank["lazy_rule"]},
            "student_rule": "grow while student val loss > reference val loss",
            "growth": {"grow_from": c.grow_from, "what": GROWTH[c.grow_from]},
            "budget": "FLOPs: 3 x forward per training token, teacher forwards added for distillation "
                      "(lens_heads.collapse.budget); total_flops adds the stages a warm start was built from, "
                      "all but the shared reference",
            "ablations": {k: BASELINE_METHODS[k] for k in c.ablations}}


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
