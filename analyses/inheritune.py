"""Attention rank collapse and Inheritune, reproduced at CPU scale (or at paper scale on a GPU).

    OMP_NUM_THREADS=1 python analyses/inheritune.py                      # CPU scale on one core
    OMP_NUM_THREADS=1 python analyses/inheritune.py --preset cpu-medium  # the gpt2-medium depth ratios at CPU scale
    OMP_NUM_THREADS=1 python analyses/inheritune.py --preset smollm2     # inherit from the embedded SmolLM2
    python analyses/inheritune.py --preset gpt2-medium --device cuda     # the paper's 24-layer run on OpenWebText
    python analyses/inheritune.py --preset gpt2-xl --device cuda         # the paper's 48-layer run
    python analyses/inheritune.py --preset gpt2-xl --plan                # its stages, FLOPs and GPU-hours; no training

The GPT-2 is the authors' (lens_heads.growth.gpt2: 1/(l+1) attention scaling, no biases, tied embeddings, vocabulary
50304, scaled residual init; ``--architecture transformer-lens`` for TransformerLens's GPT-2). Rows: reference,
Inheritune students (growth stages: by default the trained student grows by the reference's next blocks,
``--grow-from reference`` re-inherits), same-size scratch (1x, 2x steps) and the paper's baselines and ablations
(later layers, attention only, MLP only, stacking, hybrid stacking, half width and its widened variant, logit
distillation, DistilBERT),
each with its FLOPs. The ``smollm2`` preset skips the GPT-2 runs and runs the paper's growth loop from the embedded
SmolLM2-135M (`lens_heads.growth.growth_loop`): its first k layers (k: `lens_heads.growth.k_rule` on its own rank profile), trained on SOTU text in
SmolLM2's tokenizer, grown by its next ``--grow-by`` blocks until the student matches it or reaches
``--max-layers``, a same-size random init and a same-FLOPs scratch beside every size, seeds ``--smollm-seeds``;
attention rank per layer at every stage in both aggregations; the comparisons by the calling rule
(``smollm2_growth.{csv,json}``, ``smollm2_growth_tests.csv``; ``smollm2_growth_rank_tests.csv``: does a re-added lazy
layer's rank rise with training; figure ``smollm2_growth_rank``).

Writes to ``--figures`` (default ``figures/``): ``inheritune_results.csv`` (one row per stage),
``inheritune_results.json`` (everything, with settings), and PNG + HTML figures: validation loss curves,
attention rank per layer at every stage, rank during training, and the rank profile of the embedded SmolLM2.
Training runs live in ``--runs`` (default ``runs/inheritune``) and resume when interrupted.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import cast

import pandas as pd
import torch

from lens_heads.collapse.rank import attention_rank
from lens_heads.growth.gpt2 import PADDED_VOCAB, GPT2Options
from lens_heads.growth.growth_calls import growth_tests, lazy_rank_tests, readded_lazy_layers
from lens_heads.growth.growth_loop import GrowthLoopConfig, planned_loop, run_growth_loop, stage_table
from lens_heads.growth.inheritune_config import ABLATIONS, InherituneConfig
from lens_heads.growth.inheritune_measures import smollm_profile, uniform_causal_levels, zero_shot
from lens_heads.growth.inheritune_result import load_result
from lens_heads.growth.inheritune_run import planned_stages, reference_shape, run_inheritune
from lens_heads.growth.k_rule import K_RULE, KChoice, choose_k
from lens_heads.growth.zero_shot import PAPER_TASKS
from lens_heads.plumbing.cache import keyed
from lens_heads.plumbing.errors import InputError
from lens_heads.plumbing.io import atomic_write_text
from lens_heads.plumbing.provenance import write_record
from lens_heads.plumbing.settings import from_args, option
from lens_heads.stats.calling import RULE
from lens_heads.training.budget import GPU_PEAK_FLOPS, GPUProjection, projection_from_record, weights
from lens_heads.training.config import TrainConfig
from lens_heads.training.corpus import gpt2_tokenizer, load_corpus
from lens_heads.training.distill import DistillConfig
from lens_heads.training.options import train_options
from lens_heads.training.windows import eval_windows
from lens_heads.viz.inheritune_figures import figures, growth_loop_figure, smollm_figure

GPU_RECORD = "docs/records/gpu_check.json"  # relative to the working folder, else to the repository
ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class InherituneSettings(train_options(leave_out=("seed", "checkpoint_every"), steps=200, batch_size=8, seq_len=128,
                                       warmup_steps=20, lr=2e-3, min_lr=2e-4, eval_every=50)):
    """One run's settings; the defaults are the ``cpu`` preset (one CPU core, OMP_NUM_THREADS=1: the reference,
    students, scratch baselines and the paper's baselines and ablations, 200 steps of 8x128 tokens each; the GPT-2
    vocabulary (50304) dominates the cost at this width)."""

    preset: str = option("cpu", "base settings; flags given explicitly override them",
                         choices=("cpu", "cpu-medium", "cpu-xl", "gpt2-medium", "gpt2-xl", "smollm2"))
    ref_layers: int = option(8, "reference depth")
    student_layers: int = option(4, "first student depth")
    grow_by: int = option(2, "layers added per growth stage")
    max_layers: int | None = option(None, "deepest student (default: the reference's depth, so that the loop's \"grow "
                                    "until it matches\" is tested past the depth the paper reports)", parse=int)
    d_model: int = option(64, "width")
    heads: int = option(4, "attention heads")
    rank_every: int = option(50, "steps between rank measurements of the reference (0: never)")
    corpus: str = option("sotu", "training text: sotu or openwebtext")
    architecture: str = option("authors", "GPT-2 as the Inheritune authors build it or TransformerLens's GPT-2",
                               choices=("authors", "transformer-lens"))
    vocab: int = option(PADDED_VOCAB, "vocabulary rows (GPT-2's 50257 padded to 50304)")
    rank_per_input: bool = option(False, "rank as the mean of per-input ranks instead of the paper's rank of the "
                                  "averaged matrix")
    ablations: str = option(",".join(ABLATIONS), f"comma list of {ABLATIONS} ('' for none)")
    smollm_k: int | None = option(None, "smollm2 preset: first student's layers (default: the k rule on SmolLM2's own "
                                  "rank profile, lens_heads.growth.k_rule)", parse=int)
    smollm_seeds: str = option("0,1,2", "smollm2 preset: training seeds of the growth loop (comma list)")
    smollm_windows: int = option(64, "smollm2 preset: validation windows the paired tests resample")
    n_resamples: int = option(2000, "bootstrap and permutation resamples")
    grow_from: str = option("student", "growth: keep the trained student and append the reference's next blocks "
                            "(the paper's recipe) or re-inherit from the reference at each size",
                            choices=("student", "reference"))
    distill_temperature: float = option(2.0, "distillation baselines: temperature T of the soft targets (> 0)")
    distill_alpha: float = option(0.5, "logit distillation: weight of the T^2 KL term (the language-model loss gets "
                                  "1 - alpha); DistilBERT's weights are its own (5 soft, 2 LM, 1 cosine)")
    widen_noise: float = option(1e-3, "half-width warm start: std of the noise on the second copy of each weight")
    plan: bool = option(False, "print every stage's tokens and FLOPs and the projected GPU-hours, write them to "
                        "--figures/inheritune_plan_<preset>.csv, then stop")
    gpu_peak_tflops: float = option(GPU_PEAK_FLOPS / 1e12, "--plan: the GPU's dense bf16 peak (TFLOP/s)")
    gpu_record: str = option(GPU_RECORD, "--plan: a GPU check's record (benchmarks/gpu_check.py); the training share "
                             "it measured on this preset's shape sets the GPU-hours, and where it has none the CPU "
                             "evaluator's share is assumed (the plan says which)")
    gpu_fraction: float | None = option(None, "--plan: the share of that peak training reaches, overriding "
                                        "--gpu-record", parse=float)
    rank_inputs: int = option(100, "validation windows for attention rank (N)")
    rank_len: int = option(100, "tokens per window (T, at most --seq)")
    smollm_inputs: int = option(32, "SmolLM2 rank profile: N texts (0 to skip)")
    smollm_len: int = option(100, "SmolLM2 rank profile: T tokens each")
    eval_tasks: str = option(",".join(PAPER_TASKS), "zero-shot tasks for the trained models ('' to skip); each is "
                             f"scored by the paper's metric {PAPER_TASKS}, tasks lens_heads does not ship are listed "
                             "as such")
    eval_n: int = option(200, "items per zero-shot task")
    device: str = option(help="torch device", default_factory=lambda: "cuda" if torch.cuda.is_available() else "cpu")
    seed: int = option(0, "seed")
    runs: str = option("runs/inheritune", "training runs (resumable) and cached extra measurements")
    figures: str = option("figures", "where tables and figures go")
    label: str = option("", "note written into the figures, e.g. 'reduced settings'")
    no_progress: bool = option(False, "no progress bars")

    def __post_init__(self):
        if self.rank_len > self.seq_len:
            raise ValueError(f"--rank-len {self.rank_len} is longer than the models' context --seq-len {self.seq_len}")
        distill_configs(self)  # a temperature <= 0 or a mixing weight outside 0..1 is refused here
        if self.gpu_fraction is not None and not 0 < self.gpu_fraction <= 1:
            raise ValueError(f"--gpu-fraction {self.gpu_fraction}: give a share of the peak in (0, 1], e.g. 0.4")
        if self.preset in GPU_PRESETS and torch.device(self.device).type != "cuda" and not self.plan:
            raise InputError(f"--preset {self.preset} trains {GPU_PRESETS[self.preset]}, which needs a CUDA GPU "
                             f"(--device cuda; this run asked for {self.device!r}). On a CPU use --preset "
                             f"{'cpu-medium' if self.preset == 'gpt2-medium' else 'cpu-xl'} (the same depth ratios at "
                             "CPU scale), or add --plan to see its cost")


GPU_PRESETS = {"gpt2-medium": "a 24-layer GPT-2 medium reference and 12..16-layer students on OpenWebText",
               "gpt2-xl": "a 48-layer GPT-2 XL reference and 24-layer students on OpenWebText"}

# the student depth the paper reports matching its reference (24 -> 16, 48 -> 24): an outcome to test, so no preset
# stops there; every GPT-2 preset may grow its students up to the reference's own depth
PAPER_DEPTHS = {"gpt2-medium": 16, "gpt2-xl": 24}

PRESETS = {
    "cpu": dict(preset="cpu"),  # the defaults
    # the paper-scale presets' depth ratios at the cpu preset's width and schedule: medium's 24 -> 12.. by 2 as
    # 12 -> 6.. by 1, XL's 48 -> 24.. as 8 -> 4..
    "cpu-medium": dict(preset="cpu-medium", ref_layers=12, student_layers=6, grow_by=1, max_layers=12),
    "cpu-xl": dict(preset="cpu-xl", ref_layers=8, student_layers=4, grow_by=2, max_layers=8),
    # the paper's GPT-2 medium run (authors' train_iniheritune.py: lr 2e-4 cosine to 1e-5 over 100K steps, 2000
    # warm-up steps, 2 sequences x 8 accumulation steps x 3 GPUs of 1024 tokens = 49K tokens a step)
    # students from 12 layers growing by 2 (12, 14, 16 in the authors' logs), up to all 24
    "gpt2-medium": dict(preset="gpt2-medium", ref_layers=24, student_layers=12, grow_by=2, max_layers=24,
                        d_model=1024, heads=16, seq_len=1024, batch_size=12, grad_accum=4, steps=100_000,
                        warmup_steps=2000, lr=2e-4, min_lr=1e-5, eval_every=1000, eval_batches=50, rank_every=5000, corpus="openwebtext",
                        amp=True, eval_n=1000, smollm_inputs=100),
    # the paper's 48 -> 24 (GPT-2 XL: d 1600, 25 heads); the same 49K tokens a step as 4 sequences x 12 accumulation
    # steps (a 48-layer model's activations at 12 x 1024 tokens exceed one GPU's memory without checkpointing)
    "gpt2-xl": dict(preset="gpt2-xl", ref_layers=48, student_layers=24, grow_by=2, max_layers=48, d_model=1600,
                    heads=25, seq_len=1024, batch_size=4, grad_accum=12, steps=100_000, warmup_steps=2000, lr=2e-4,
                    min_lr=1e-5, eval_every=1000, eval_batches=50, rank_every=5000, corpus="openwebtext", amp=True, eval_n=1000,
                    smollm_inputs=100),
    # the growth loop from SmolLM2: students from k layers (the k rule), grown 2 blocks a round up to all 30
    "smollm2": dict(preset="smollm2", ref_layers=30, student_layers=0, grow_by=2, max_layers=30, d_model=576,
                    heads=9, batch_size=4, steps=100, warmup_steps=10, lr=3e-4, min_lr=3e-5, eval_every=25, rank_every=0,
                    rank_inputs=32, eval_n=100),
}


def parse_args(argv=None) -> InherituneSettings:
    """The settings: ``--preset NAME`` (or ``--NAME``) picks a preset, flags given explicitly override it."""
    return from_args(InherituneSettings, argv, presets=PRESETS, description=__doc__,
                     formatter_class=argparse.RawDescriptionHelpFormatter)


def train_config(a) -> TrainConfig:
    return a.train_config(checkpoint_every=a.eval_every)


def distill_configs(a) -> tuple[DistillConfig, DistillConfig]:
    """The logit-distillation and DistilBERT losses at ``--distill-temperature`` (and ``--distill-alpha``)."""
    return (DistillConfig.logit(temperature=a.distill_temperature, kd_weight=a.distill_alpha),
            DistillConfig.distilbert(temperature=a.distill_temperature))


def build_config(a) -> InherituneConfig:
    options = GPT2Options() if a.architecture == "authors" else GPT2Options.transformer_lens()
    logit, distilbert = distill_configs(a)
    return InherituneConfig(ref_layers=a.ref_layers, student_layers=a.student_layers, grow_by=a.grow_by,
                            max_layers=a.max_layers or a.ref_layers, d_model=a.d_model, n_heads=a.heads, n_ctx=a.seq_len,
                            train_config=train_config(a),
                            d_vocab=a.vocab, rank_average=not a.rank_per_input, options=options,
                            grow_from=a.grow_from, rank_inputs=a.rank_inputs, rank_len=a.rank_len,
                            ablations=tuple(x for x in a.ablations.split(",") if x), distill_logit=logit,
                            distill_distilbert=distilbert, widen_noise=a.widen_noise,
                            rank_every=a.rank_every, seed=a.seed, device=a.device)


def plan(a) -> pd.DataFrame:
    """Every stage the run trains (the students grown to --max-layers, the costliest case) with its tokens, FLOPs
    and GPU-hours at a share of --gpu-peak-tflops (:func:`gpu_projection`): the share and its source are columns."""
    table = planned_stages(build_config(a))
    total = table["flops"] + table["teacher_flops"]
    whole = gpu_projection(a, float(total.sum()))  # one share (and one read of the record) for every stage
    table["gpu_hours"] = [replace(whole, flops=f).gpu_hours for f in total]
    return table.assign(gpu_peak_tflops=a.gpu_peak_tflops, gpu_fraction=whole.fraction,
                        gpu_fraction_source=whole.source)


def gpu_projection(a, flops: float) -> GPUProjection:
    """``flops`` in GPU-hours at --gpu-fraction where given, else at the training share --gpu-record measured on this
    preset's shape, else at the evaluator's share it measured on the model nearest the reference in size, assumed
    for training (``lens_heads.training.budget.projection_from_record``)."""
    peak = a.gpu_peak_tflops * 1e12
    if a.gpu_fraction is not None:
        return GPUProjection(flops, peak, a.gpu_fraction, f"given: --gpu-fraction {a.gpu_fraction:g}")
    return projection_from_record(flops, gpu_record(a.gpu_record), a.preset, peak=peak,
                                  n_params=weights(reference_shape(build_config(a))))


def gpu_record(path: str) -> dict:
    """The GPU check's record at ``path`` (a relative path not found here is read from the repository)."""
    where = Path(path)
    if not where.is_absolute() and not where.exists():
        where = ROOT / where
    if not where.exists():
        raise InputError(f"--gpu-record {path}: no such file; give a GPU check's gpu_check.json "
                         "(benchmarks/gpu_check.py) or set the share with --gpu-fraction")
    try:
        return json.loads(where.read_text())
    except json.JSONDecodeError as e:
        raise InputError(f"--gpu-record {path} is not JSON ({e}): give a GPU check's gpu_check.json") from None


def smollm_loop_config(a, own_rank: dict, n_layers: int) -> tuple[GrowthLoopConfig, KChoice | None]:
    """The growth loop's settings from the flags: k = ``--smollm-k``, or `choose_k` on the reference's own rank
    profile (``own_rank``: the paper's aggregation, on the loop's rank windows) with what it flagged."""
    choice = None if a.smollm_k else choose_k(own_rank)
    k = a.smollm_k or cast(KChoice, choice).k
    seeds = tuple(int(x) for x in a.smollm_seeds.split(",") if x.strip())
    return GrowthLoopConfig(start_layers=k, train_config=train_config(a), grow_by=a.grow_by, max_layers=a.max_layers or n_layers,
                            seeds=seeds, rank_inputs=a.rank_inputs, rank_len=a.rank_len,
                            loss_windows=a.smollm_windows), choice


def own_rank_profile(reference, corpus, a) -> dict:
    """The reference's rank profile in the paper's aggregation on the windows the loop measures every stage's rank
    on (`run_growth_loop` records the same profile as its reference's)."""
    tokens = eval_windows(corpus.val, a.rank_inputs, a.rank_len - 1)
    return attention_rank(reference, tokens, average=True, progress=False).to_dict()


# what a cached zero-shot row holds: caches of rows without their split are computed again
ZERO_SHOT_ROWS = "with split and acc_norm"


def main(argv=None):
    a = parse_args(argv)
    if a.plan and a.preset != "smollm2":  # the smollm2 plan needs the model's rank profile (its k)
        return main_plan(a)
    if torch.device(a.device).type == "cuda" and not torch.cuda.is_available():
        raise InputError(f"--device {a.device}: this machine has no CUDA GPU (torch {torch.__version__}); run the "
                         f"{a.preset} preset on a GPU machine, or use a cpu preset")
    torch.manual_seed(a.seed)
    out = Path(a.figures)
    out.mkdir(parents=True, exist_ok=True)
    runs = Path(a.runs)
    started = time.time()
    corpus = load_corpus(a.corpus)
    tokenizer = gpt2_tokenizer()
    smollm = keyed(runs / "extras" / "smollm2_rank.json", {"n": a.smollm_inputs, "len": a.smollm_len, "with": "definition"},
                    lambda: smollm_profile(corpus, tokenizer, a.smollm_inputs, a.smollm_len)) if a.smollm_inputs else None
    if a.preset == "smollm2":
        return main_smollm(a, runs, out, smollm, started)
    return main_gpt2(a, runs, out, smollm, started, corpus, tokenizer)


def main_plan(a) -> pd.DataFrame:
    """``--plan``: every stage's tokens, FLOPs and GPU-hours and their total, printed and written to
    ``inheritune_plan_<preset>.csv``; nothing is trained."""
    table = plan(a)
    print(table.to_string(index=False))
    Path(a.figures).mkdir(parents=True, exist_ok=True)
    atomic_write_text(Path(a.figures) / f"inheritune_plan_{a.preset}.csv", table.to_csv(index=False))
    total = gpu_projection(a, float((table["flops"] + table["teacher_flops"]).sum()))
    print(f"{a.preset}: {len(table)} stages, {total.describe()}")
    return table


def main_gpt2(a, runs: Path, out: Path, smollm: dict | None, started: float, corpus, tokenizer) -> None:
    """The GPT-2 presets: every stage trained (or reloaded), the trained models' zero-shot accuracy, the figures and
    ``inheritune_results.csv/json``."""
    config = build_config(a)
    print(f"corpus: {corpus}\nconfig: {json.dumps(asdict(config))}")
    result = run_inheritune(config, corpus, out_dir=runs, tokenizer=tokenizer, progress=not a.no_progress)
    result = load_result(runs)  # the same numbers whether trained now or reloaded
    table = result.to_dataframe()
    print(table.to_string())

    evals = keyed(runs / "extras" / "zero_shot.json", {"tasks": a.eval_tasks, "n": a.eval_n, "seed": a.seed,
                                                        "rows": ZERO_SHOT_ROWS},
                   lambda: zero_shot(a, runs, result, tokenizer, config.options))
    table = with_zero_shot(table, evals)

    subtitle = (f"{a.preset} preset: GPT-2 d_model {a.d_model}, {a.heads} heads, {a.steps} steps of {a.batch_size * a.grad_accum}x"
                f"{a.seq_len} tokens, corpus {corpus.meta.get('name')}, seed {a.seed}" + (f"; {a.label}" if a.label else ""))
    uniform = uniform_causal_levels(a.rank_len)
    written = figures(result, smollm, out, subtitle, uniform)
    atomic_write_text(out / "inheritune_results.csv", table.to_csv(index=False))
    write_record(out / "inheritune_results.json", {
        "what": "Inheritune at small scale: reference, students (growth stages), same-size scratch baselines, ablations",
        "architecture": config.options.to_dict(),
        "settings": asdict(a), "corpus": corpus.meta, "table": table.to_dict(orient="records"),
        "reference_val_loss": result.reference_val_loss, "final_student_layers": result.final_layers,
        "stages": [{k: v for k, v in asdict(s).items() if k != "history"} for s in result.stages],
        "histories": {s.name: s.history for s in result.stages}, "smollm2_rank": smollm, "zero_shot": evals,
        "rank_method": result.meta["rank"], "rank_definition": result.meta["rank"]["definition"],
        "lazy_rule": result.stages[0].rank["lazy_rule"], "ablations": result.meta["ablations"],
        "uniform_causal_attention": uniform,
        "figures": written,
        "wall_time_s": time.time() - started,
    })
    print(f"wrote {', '.join(written)} and inheritune_results.csv/json to {out} in {time.time() - started:.0f} s")


def with_zero_shot(table: pd.DataFrame, evals: list[dict]) -> pd.DataFrame:
    """``table`` with a ``zero_shot_{task}`` column per available task (the paper's metric for each)."""
    done = [r for r in evals if r.get("available")]
    if not done:
        return table
    acc = pd.DataFrame(done).pivot(index="stage", columns="task", values="accuracy").add_prefix("zero_shot_")
    return table.merge(acc, left_on="stage", right_index=True, how="left")


def smollm_plan(a, reference, config: GrowthLoopConfig, out: Path) -> pd.DataFrame:
    """``--plan`` for the growth loop: every training of one seed when no student matches (the costliest case), its
    steps, tokens and FLOPs, written to ``inheritune_plan_smollm2.csv``; nothing is trained."""
    table = pd.DataFrame(planned_loop(reference.cfg, config))
    print(table.to_string(index=False))
    atomic_write_text(out / "inheritune_plan_smollm2.csv", table.assign(seeds=len(config.seeds)).to_csv(index=False))
    print(f"smollm2 growth loop: {len(table)} trainings a seed, {len(config.seeds)} seeds, "
          f"{table['flops'].sum() * len(config.seeds):.3g} FLOPs")
    return table


def main_smollm(a, runs: Path, out: Path, smollm: dict | None, started: float):
    """The paper's growth loop from the embedded SmolLM2 (`lens_heads.growth.growth_loop`), its comparisons by the
    calling rule, the rank figure; ``smollm2_growth.{csv,json}`` and ``smollm2_growth_tests.csv``."""
    from lens_heads import load_model

    if smollm is None:
        raise SystemExit("the smollm2 preset needs the rank profile: --smollm-inputs must be > 0")
    reference = load_model(device=a.device)
    corpus = load_corpus("sotu", tokenizer=reference.tokenizer)
    own = keyed(runs / "extras" / "smollm2_own_rank.json", {"n": a.rank_inputs, "len": a.rank_len},
                lambda: own_rank_profile(reference, corpus, a))
    config, choice = smollm_loop_config(a, own, reference.cfg.n_layers)
    k_rule = f"--smollm-k {a.smollm_k}" if choice is None else (
        f"{K_RULE}; the profile flags layers {list(choice.flagged)}")
    if a.plan:
        return smollm_plan(a, reference, config, out)
    print(f"SmolLM2 growth loop: first {config.start_layers} of {reference.cfg.n_layers} layers ({k_rule}), grown "
          f"by {config.grow_by}, {config.train_config.steps} steps of {config.train_config.tokens_per_step} tokens a stage, seeds "
          f"{config.seeds}; corpus {corpus}")
    record = run_growth_loop(reference, corpus, config, out_dir=runs / "smollm2_growth", progress=not a.no_progress)
    tests, rank_tests = growth_tests(record, a.n_resamples), lazy_rank_tests(record, a.n_resamples)
    table = pd.DataFrame(stage_table(record))
    print(table.drop(columns=["lazy_per_input"]).to_string())
    subtitle = (f"SmolLM2-135M reference ({reference.cfg.n_layers}L), students from {config.start_layers}L "
                f"({k_rule}) grown by {config.grow_by}; {config.train_config.steps} steps of {config.train_config.batch_size}x"
                f"{config.train_config.seq_len} SOTU tokens a stage; seeds {a.smollm_seeds}")
    written = smollm_figure(smollm, out) + growth_loop_figure(record, out, subtitle)
    atomic_write_text(out / "smollm2_growth.csv", table.to_csv(index=False))
    atomic_write_text(out / "smollm2_growth_tests.csv", tests.to_csv(index=False))
    atomic_write_text(out / "smollm2_growth_rank_tests.csv", rank_tests.to_csv(index=False))
    write_record(out / "smollm2_growth.json", {
        "what": "The paper's growth loop from the embedded SmolLM2-135M: its first k layers, trained, grown by its "
                "next blocks until the student matches it or reaches --max-layers, beside a same-size random init "
                "and a same-FLOPs scratch at every size, several seeds",
        "settings": asdict(a), "k_rule": k_rule, "k_choice": choice.to_dict() if choice else None,
        "calling_rule": RULE, "corpus": corpus.meta,
        "token_budget_per_stage": config.train_config.steps * config.train_config.tokens_per_step,
        "model": reference.lens_heads_meta, **record, "tests": tests.to_dict(orient="records"),
        "readded_lazy_layers": {str(n): layers for n, layers in readded_lazy_layers(record).items()},
        "rank_tests": rank_tests.to_dict(orient="records"),
        "smollm2_rank": smollm, "figures": written, "wall_time_s": time.time() - started,
    })
    print(f"wrote {', '.join(written)} and smollm2_growth.csv/json, _tests.csv, _rank_tests.csv to {out} in "
          f"{time.time() - started:.0f} s")
    return record


if __name__ == "__main__":
    main()
