"""An Inheritune run (Sanyal et al., arXiv 2404.08634): train a reference, inherit its first layers, train, grow
while worse than the reference, then the baselines at the final student size, each stage in its own resumable
folder; `planned_stages` is the same run's cost before it runs."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, cast

import pandas as pd
import torch

from lens_heads.collapse.rank import RankProfile, attention_rank
from lens_heads.collapse.rank_tracker import RankTracker
from lens_heads.growth.gpt2 import gpt2_config, gpt2_model
from lens_heads.growth.inherit import distilbert_init, grow, hybrid_stack, inherit, inherit_later_layers, stack
from lens_heads.growth.inheritune_config import (
    BASELINE_METHODS,
    DISTILLATIONS,
    GROWTH,
    STACKINGS,
    WIDTH_BASELINES,
    InherituneConfig,
    check_config,
    half_width_shape,
    reference_train,
)
from lens_heads.growth.inheritune_result import InherituneResult, Stage
from lens_heads.growth.widen import widen
from lens_heads.plumbing.errors import InputError
from lens_heads.plumbing.io import atomic_write_json
from lens_heads.training.budget import teacher_flops, training_flops
from lens_heads.training.config import TrainConfig
from lens_heads.training.distill import Distillation
from lens_heads.training.loop import TrainResult, train
from lens_heads.training.windows import eval_windows

if TYPE_CHECKING:  # TransformerLens 3.9 only
    from transformer_lens import HookedTransformer


def rank_tokens(corpus, n: int, length: int) -> torch.Tensor:
    """The fixed validation windows every stage's attention rank is measured on."""
    return eval_windows(corpus.val, n, length - 1)


def _rank(model, tokens, average: bool) -> dict:
    profile: RankProfile = attention_rank(model, tokens, average=average, progress=False)
    return profile.to_dict()


def run_inheritune(config: InherituneConfig, corpus, *, out_dir: str | Path, tokenizer=None,
                   progress: bool = True) -> InherituneResult:
    """Train a reference, inherit its first layers, train, grow while worse than the reference, then the
    baselines at the final student size: same-size scratch for 1x and 2x the steps and ``config.ablations``;
    attention rank of every layer at every stage, FLOPs of every stage.

    Every stage trains in its own folder under ``out_dir`` and resumes; a finished run only reloads."""
    c = config
    max_layers = check_config(c)
    run = _Stages(c, corpus, Path(out_dir), tokenizer, progress)
    reference = run.fresh(c.ref_layers, c.seed)
    ref_cfg = reference_train(c)
    ref = run.train(f"reference_{c.ref_layers}L", "reference", reference, ref_cfg,
                    method=f"scratch (the reference), {ref_cfg.steps} steps")
    n = _students(run, reference, ref, max_layers)
    if c.baselines:
        for mult in (1, 2):
            train_cfg = TrainConfig(**{**asdict(c.train_config), "steps": mult * c.train_config.steps})
            run.train(f"scratch_{n}L_{mult}x", "scratch", run.fresh(n, c.seed + 1000 + n), train_cfg,
                      method=f"fresh init, {mult}x the steps")
    for ablation in c.ablations:
        _ablation(run, reference, ref, ablation, n)
    result = InherituneResult(stages=run.stages, reference_val_loss=ref.val_loss, final_layers=n,
                              meta=_meta(c, corpus, ref, run.stages))
    atomic_write_json(run.out / "result.json", result.to_dict())
    return result


def gpt2_shape(n_layers: int, d_model: int, n_heads: int, d_vocab: int) -> SimpleNamespace:
    """A GPT-2's shape (n_layers, d_model, n_heads, d_head, d_mlp, d_vocab), as the FLOP counts read it."""
    return SimpleNamespace(n_layers=n_layers, d_model=d_model, n_heads=n_heads, d_head=d_model // n_heads,
                           d_mlp=4 * d_model, d_vocab=d_vocab)


def reference_shape(config: InherituneConfig) -> SimpleNamespace:
    """The reference GPT-2's shape (:func:`gpt2_shape`)."""
    return gpt2_shape(config.ref_layers, config.d_model, config.n_heads, config.d_vocab)


def planned_stages(config: InherituneConfig, final_layers: int | None = None) -> pd.DataFrame:
    """The stages `run_inheritune` trains when its student ends at ``final_layers`` layers (default: the largest it
    may grow to, the costliest case), in its order, each with its tokens and FLOPs: a run's cost before it runs."""
    c = config
    max_layers = check_config(c)
    final = max_layers if final_layers is None else final_layers
    if not c.student_layers <= final <= max_layers or (final - c.student_layers) % c.grow_by:
        raise InputError(f"final_layers={final} is not a size the students reach ({c.student_layers} + k x "
                         f"{c.grow_by}, at most {max_layers})")
    tokens, seq = c.train_config.steps * c.train_config.tokens_per_step, c.train_config.seq_len
    rows: list[dict] = []
    ref = reference_shape(c)

    def add(name: str, n_layers: int, d_model: int = c.d_model, n_heads: int = c.n_heads, steps_x: float = 1,
            teacher: bool = False) -> None:
        shape = gpt2_shape(n_layers, d_model, n_heads, c.d_vocab)
        rows.append({"stage": name, "n_layers": n_layers, "d_model": d_model, "tokens": round(steps_x * tokens),
                     "flops": training_flops(shape, round(steps_x * tokens), seq),
                     "teacher_flops": teacher_flops(ref, round(steps_x * tokens), seq) if teacher else 0.0})

    add(f"reference_{c.ref_layers}L", c.ref_layers, steps_x=reference_train(c).steps / c.train_config.steps)
    for n in range(c.student_layers, final + 1, c.grow_by):
        add(f"student_{n}L", n)
    n = final
    if c.baselines:
        add(f"scratch_{n}L_1x", n)
        add(f"scratch_{n}L_2x", n, steps_x=2)
    for ablation in c.ablations:
        if ablation in STACKINGS:
            sources = stacking_sources(ablation, n)
            if sources is None:
                continue
            for name, depth in sources:
                if not any(r["stage"] == name for r in rows):  # one half-depth source serves two warm starts
                    add(name, depth)
        elif ablation in WIDTH_BASELINES:
            d_half, h_half = half_width_shape(c.d_model, c.n_heads)
            trained = f"half_width_{n}L" if "half_width" in c.ablations else f"width_source_{n}L_{d_half}d"
            if not any(r["stage"] == trained for r in rows):  # one half-width model serves both
                add(trained, n, d_half, h_half)
            if ablation == "half_width":
                continue
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
        self.width_stage = cast(Stage, None)  # the trained half-width model's stage, once `_half_width` ran

    def fresh(self, n_layers: int, seed: int, d_model: int | None = None,
              n_heads: int | None = None) -> HookedTransformer:
        c = self.c
        return gpt2_model(gpt2_config(n_layers, d_model=d_model or c.d_model, n_heads=n_heads or c.n_heads,
                                      n_ctx=c.n_ctx, d_vocab=c.d_vocab),
                          seed=seed, options=c.options, tokenizer=self.tokenizer, device=c.device)

    def train(self, name: str, kind: str, model: HookedTransformer, train_cfg: TrainConfig | None = None, *,
              objective: Distillation | None = None, built_from: tuple[str, ...] = (), method: str = "") -> Stage:
        average = self.c.rank_average
        cfg = train_cfg or self.c.train_config
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
                      built_from=list(built_from), d_model=model.cfg.d_model, n_heads=model.cfg.n_heads,
                      method=method)
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
    elif ablation in STACKINGS and stacking_sources(ablation, n) is not None:
        _stacking(run, ablation, n, seed, method)
    elif ablation in WIDTH_BASELINES:
        source, src = _half_width(run, n, as_baseline=ablation == "half_width" or "half_width" in c.ablations)
        if ablation == "half_width_widened":
            wide = widen(source, d_model=c.d_model, n_heads=c.n_heads, seed=seed, noise=c.widen_noise)
            run.train(f"half_width_widened_{n}L", "ablation", wide, built_from=(src.name,), method=method)
    elif ablation == "distill_logit":
        objective = Distillation(reference, c.distill_logit)
        run.train(f"distill_logit_{n}L", "ablation", run.fresh(n, c.seed + 4000 + n), objective=objective,
                  built_from=(ref.name,), method=f"{method}; {c.distill_logit.to_dict()}")
    elif ablation == "distill_distilbert":
        objective = Distillation(reference, c.distill_distilbert)
        run.train(f"distill_distilbert_{n}L", "ablation", distilbert_init(reference, n, seed=seed),
                  objective=objective, built_from=(ref.name,), method=f"{method}; {c.distill_distilbert.to_dict()}")


def stacking_sources(ablation: str, n: int) -> list[tuple[str, int]] | None:
    """The stages (name, depth) a stacking warm start of depth ``n`` is built from, in training order: a scratch
    source at half the depth (stacking, hybrid stacking: one source for both), or for two rounds a scratch source at
    a quarter of the depth and its first round stacked to half. None where ``n`` is too shallow to halve (quarter)."""
    if ablation == "stacking_2rnd":
        return None if n < 4 else [(f"stack_source_{n // 4}L", n // 4), (f"stacking_round1_{n // 2}L", n // 2)]
    return None if n < 2 else [(f"stack_source_{n // 2}L", n // 2)]


def _stacking(run: _Stages, ablation: str, n: int, seed: int, method: str) -> None:
    """A stacking warm start of depth ``n``: its sources trained (once per run), then the stacked model trained."""
    c = run.c
    (src_name, depth), *rounds = cast(list, stacking_sources(ablation, n))
    if src_name not in run.sources:  # one source for both half-depth warm starts, trained once
        # the two sources' own seed offsets: their fresh inits share no draws
        run.sources[src_name] = run.fresh(depth, c.seed + (2500 if ablation == "stacking_2rnd" else 2000) + n)
        run.train(src_name, "stack_source", run.sources[src_name],
                  method=f"fresh init at {'a quarter of' if ablation == 'stacking_2rnd' else 'half'} the depth")
    built = src_name
    for round_name, round_depth in rounds:  # two rounds: the source stacked to half the depth, trained
        if round_name not in run.sources:
            run.sources[round_name] = stack(run.sources[built], round_depth, seed=seed)
            run.train(round_name, "stack_source", run.sources[round_name], built_from=(built,),
                      method=f"stacking round 1: {built} repeated to {round_depth} layers, trained")
        built = round_name
    source = run.sources[built]
    grown = hybrid_stack(source, n, seed=seed) if ablation == "hybrid_stacking" else stack(source, n, seed=seed)
    run.train(f"{ablation}_{n}L", "ablation", grown, built_from=(built,), method=method)


def _half_width(run: _Stages, n: int, as_baseline: bool) -> tuple[HookedTransformer, Stage]:
    """The trained ``n``-layer model at half the width, trained once per run: the authors' ``half_width`` baseline
    (a stage of the table) where it is asked for, else a ``width_source`` stage that only feeds the widened start."""
    c = run.c
    if "half_width" not in run.sources:
        d_half, h_half = half_width_shape(c.d_model, c.n_heads)
        model = run.fresh(n, c.seed + 3000 + n, d_model=d_half, n_heads=h_half)
        name, kind = (f"half_width_{n}L", "ablation") if as_baseline else (f"width_source_{n}L_{d_half}d",
                                                                          "width_source")
        how = f"fresh init at half the width ({d_half}d, {h_half} heads)"
        stage = run.train(name, kind, model, method=f"{BASELINE_METHODS['half_width']}: {how}" if as_baseline
                          else how)
        run.sources["half_width"] = model
        run.width_stage = stage
    return run.sources["half_width"], run.width_stage


def growth_stages(stages: list[Stage], reference: Stage) -> list[dict]:
    """The growth loop as it ran: each student size, its loss against the reference's, what the rule did next, and
    its training FLOPs (the students' sum is what the growth spent, whichever way each size was built)."""
    students = [s for s in stages if s.kind == "student"]
    out = []
    for i, s in enumerate(students):
        matched = s.val_loss <= reference.val_loss
        then = "grew" if i + 1 < len(students) else ("stopped: matched the reference" if matched else
                                                      "stopped: the deepest student allowed (max_layers)")
        out.append({"stage": s.name, "n_layers": s.n_layers, "val_loss": s.val_loss,
                    "reference_val_loss": reference.val_loss, "minus_reference": s.val_loss - reference.val_loss,
                    "matched": matched, "then": then, "built_from": list(s.built_from), "flops": s.flops,
                    "max_rank": list(s.rank["max_rank"]), "n_lazy_layers": int(sum(s.rank["lazy"]))})
    return out


def _meta(c: InherituneConfig, corpus, ref: Stage, stages: list[Stage]) -> dict:
    grown = growth_stages(stages, ref)
    return {"config": asdict(c), "corpus": dict(getattr(corpus, "meta", {})),
            "rank": {"n_inputs": c.rank_inputs, "length": c.rank_len, "mode": ref.rank["meta"]["mode"],
                     "definition": ref.rank["definition"], "lazy_rule": ref.rank["lazy_rule"]},
            "student_rule": "grow while student val loss > reference val loss",
            "growth": {"grow_from": c.grow_from, "what": GROWTH[c.grow_from], "stages": grown,
                       "times_grown": len(grown) - 1, "students_flops": float(sum(g["flops"] for g in grown)), "reference_steps": ref.steps, "student_steps": c.train_config.steps},
            "budget": "FLOPs: 3 x forward per training token, teacher forwards added for distillation "
                      "(lens_heads.training.budget); total_flops adds the stages a warm start was built from, "
                      "all but the shared reference",
            "ablations": {k: BASELINE_METHODS[k] for k in c.ablations}}
