"""The Inheritune paper's claims against its baselines, measured at CPU scale over several training seeds.

    OMP_NUM_THREADS=1 nice python analyses/inheritune_baselines.py                   # 3 seeds, the defaults below
    OMP_NUM_THREADS=1 nice python analyses/inheritune_baselines.py --preset growth   # growth at GPT-2 CPU scale
    OMP_NUM_THREADS=1 nice python analyses/inheritune_baselines.py --preset half_width  # the two half widths only
    OMP_NUM_THREADS=1 nice python analyses/inheritune_baselines.py --preset inheritance  # later layers, attn/MLP only
    OMP_NUM_THREADS=1 nice python analyses/inheritune_baselines.py --preset stacking     # two rounds
    OMP_NUM_THREADS=1 nice python analyses/inheritune_baselines.py --preset growth_reference  # growth, re-inherited

The ``growth`` preset (`GROWTH_PRESET`) trains the reference longer than a student stage, so that the first student
does not match it and the loop grows (2 -> 4 -> ... layers, up to all 8 of the reference), and compares the final
student with same-size scratch at 1x and 2x a stage's steps only; it writes ``inheritune_growth*`` instead of
``inheritune_baselines*``, with every seed's growth stages (``meta["growth"]["stages"]``) and the figure
``inheritune_growth_rank_stages`` (max attention rank per layer at every stage, one panel per seed). The
``growth_reference`` preset is the same loop with every size re-inherited from the reference and trained with a full
schedule (``--grow-from reference``), written to ``inheritune_growth_reference*``. Every other preset writes its own
files too (`STEMS`).

For each seed, `run_inheritune` trains (each stage resumable, in ``--runs/seed_<s>``): the reference, the Inheritune
student, same-size scratch for 1x and 2x the steps, stacking and hybrid stacking (from one half-depth source),
two rounds of stacking (a quarter-depth source stacked to half, trained, stacked again), half
width as the authors ran it (a fresh model at half the width) and lens_heads' variant (that model, trained, widened
function-preservingly and trained again), logit distillation and DistilBERT, all at the student's size with the same loop and steps.
Then, each cached under ``--runs/extras`` so that a rerun (or a larger one, with other flags) computes only what is
missing:

- validation loss against steps for every method (the runs' histories) and the final loss per validation window;
- the final-loss comparison of every method with Inheritune, paired over training seeds (the seed is the unit that
  is resampled: n = the number of seeds) and, as a second view, paired over validation windows, each window's loss
  averaged over the seeds (the variation between windows, with the trainings averaged out);
- "converges faster": for each method against Inheritune, the loss both reach (the worse of the two final losses),
  the steps each needs to reach it (linear between the recorded validation points) and their ratio, with its
  interval over seeds;
- zero-shot accuracy on the paper's tasks with chance, and paired tests against Inheritune over items (each item's
  correctness averaged over the seeds: the same items are evaluated for every seed);
- the attention-rank profile (max rank over heads per layer) of every model: "no lazy layers".

Comparisons are called by the project's rule (`lens_heads.stats.calling`). Writes ``inheritune_baselines.json``
(everything, with settings), ``inheritune_baselines.csv`` (one row per method), ``inheritune_baselines_tests.csv``
(every paired test) and the figures ``inheritune_baselines_val_loss`` and ``inheritune_baselines_rank`` (PNG + HTML).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd

from lens_heads.data.rows import within_context
from lens_heads.data.tasks import load_task
from lens_heads.evaluation.evaluate import evaluate
from lens_heads.growth.gpt2 import PADDED_VOCAB, GPT2Options, gpt2_config, gpt2_model
from lens_heads.growth.inheritune_comparisons import (
    compared,
    convergence_tests,
    label,
    loss_tests,
    method_table,
    per_seed_table,
    zero_shot_tests,
)
from lens_heads.growth.inheritune_config import InherituneConfig
from lens_heads.growth.inheritune_measures import uniform_causal_levels
from lens_heads.growth.inheritune_result import Stage
from lens_heads.growth.inheritune_run import run_inheritune
from lens_heads.growth.zero_shot import PAPER_TASKS
from lens_heads.plumbing.cache import keyed
from lens_heads.plumbing.io import atomic_write_text
from lens_heads.plumbing.provenance import write_record
from lens_heads.plumbing.settings import from_args, option
from lens_heads.stats.calling import RULE
from lens_heads.training.checkpoints import load_model_state
from lens_heads.training.corpus import gpt2_tokenizer, load_corpus
from lens_heads.training.distill import DistillConfig
from lens_heads.training.options import train_options
from lens_heads.training.windows import eval_windows, window_losses
from lens_heads.viz.inheritune_figures import curves_figure, growth_rank_figure, rank_figure

BASELINES = ("stacking", "hybrid_stacking", "stacking_2rnd", "half_width", "half_width_widened", "distill_logit",
             "distill_distilbert")


# each preset writes its own files
STEMS = {"all": "inheritune_baselines", "half_width": "inheritune_half_width", "inheritance": "inheritune_inheritance",
         "stacking": "inheritune_stacking", "growth": "inheritune_growth",
         "growth_reference": "inheritune_growth_reference"}


@dataclass(frozen=True)
class BaselineSettings(train_options(leave_out=("seed", "checkpoint_every"), steps=80, batch_size=4, seq_len=128,
                                     warmup_steps=8, lr=2e-3, min_lr=2e-4, eval_every=10, eval_batches=4)):
    """The CPU preset's model (d_model 64, 4 heads, context 128, the authors' GPT-2) at the depth ratio of the paper's
    XL run (an 8-layer reference, 4-layer students that do not grow), with a shorter schedule (80 steps of 4 x 128
    tokens) so that three seeds of every baseline fit in about half an hour of one CPU core."""

    preset: str = option("all", "base settings: every baseline, half_width (its two half-width rows only), "
                         "inheritance (later layers, attention only, MLP only), stacking (two rounds), growth "
                         "(a longer-trained reference, students grown, scratch beside them) or growth_reference (the "
                         "same, each size re-inherited); flags given explicitly override them",
                         choices=tuple(STEMS))
    seeds: str = option("0,1,2", "training seeds (comma list): every model of the run is trained once per seed")
    ref_layers: int = option(8, "reference depth")
    student_layers: int = option(4, "first student depth (the baselines' where it does not grow)")
    grow_by: int = option(1, "layers added per growth stage")
    max_layers: int | None = option(None, "deepest student (default: --student-layers, no growth)", parse=int)
    ref_steps: int | None = option(None, "reference's training steps (default: --steps, as every stage)", parse=int)
    grow_from: str = option("student", "growth: keep the trained student and append the reference's next blocks "
                            "(the paper's recipe) or re-inherit from the reference at each size",
                            choices=("student", "reference"))
    d_model: int = option(64, "width")
    heads: int = option(4, "attention heads")
    baselines: str = option(",".join(BASELINES), "comma list of the baselines beside same-size scratch")
    no_scratch: bool = option(False, "leave same-size scratch (1x and 2x the steps) out")
    distill_temperature: float = option(2.0, "distillation temperature T (> 0)")
    distill_alpha: float = option(0.5, "logit distillation: weight of the T^2 KL term, the LM loss gets the rest")
    rank_inputs: int = option(32, "validation windows for attention rank (N)")
    rank_len: int = option(100, "tokens per rank window (T)")
    loss_windows: int = option(64, "validation windows whose final losses are compared item by item")
    eval_tasks: str = option(",".join(PAPER_TASKS), "zero-shot tasks ('' to skip)")
    eval_n: int = option(30, "items per zero-shot task (the same items for every seed)")
    n_resamples: int = option(2000, "bootstrap and permutation resamples")
    runs: str = option("runs/inheritune_baselines", "training runs and cached measurements (resumable)")
    figures: str = option("figures", "where tables and figures go")
    no_png: bool = option(False, "HTML figures only")
    no_progress: bool = option(False, "no progress bars")

    def __post_init__(self):
        DistillConfig.logit(temperature=self.distill_temperature, kd_weight=self.distill_alpha)  # refused here
        if self.rank_len > self.seq_len:
            raise ValueError(f"--rank-len {self.rank_len} exceeds the context --seq-len {self.seq_len}")
        if len(self.seed_list) < 2:
            raise ValueError("give at least 2 --seeds: the comparisons resample seeds")

    @property
    def stem(self) -> str:
        """The file names' stem: each preset its own files."""
        return STEMS[self.preset]

    @property
    def seed_list(self) -> list[int]:
        return [int(s) for s in self.seeds.split(",") if s.strip()]


# growth at GPT-2 CPU scale: at width 32 the vocabulary (50304) is nearly all of a step's cost, so depth is cheap;
# a reference trained 5x a stage's steps is one the first students do not match. Students may grow up to the
# reference's own depth, so that "grow until it matches" is tested past any depth the paper reports. Its planned
# FLOPs (3 seeds) are about half the baselines table's: a quarter of an hour of one quiet core at that recording's rate
GROWTH_PRESET = dict(preset="growth", ref_layers=8, student_layers=2, grow_by=2, max_layers=8, d_model=32, heads=2,
                     steps=80, ref_steps=400, warmup_steps=8, baselines="", runs="runs/inheritune_growth")
# the same loop, each size a fresh re-inheritance with a full schedule (what the authors' logs fit), in its own runs
# (its students share the default's names)
# (its students share the default's names); against the reference only: scratch beside the grown student, and
# zero-shot, are the default's record's
GROWTH_REFERENCE_PRESET = {**GROWTH_PRESET, "preset": "growth_reference", "grow_from": "reference",
                           "runs": "runs/inheritune_growth_reference", "no_scratch": True, "eval_tasks": ""}
# subsets of the baselines beside Inheritune, in the baselines' runs (a full run reuses them): the two half widths
# (with scratch); what lazy layers hold (the paper's inheritance ablations) and two rounds of stacking, final losses
# only (one round, scratch and every zero-shot score are the full baselines table's, same seeds and settings)
HALF_WIDTH_PRESET = dict(preset="half_width", baselines="half_width,half_width_widened")
INHERITANCE_PRESET = dict(preset="inheritance", baselines="later_layers,attention_only,mlp_only", no_scratch=True,
                          eval_tasks="")
STACKING_PRESET = dict(preset="stacking", baselines="stacking_2rnd", no_scratch=True, eval_tasks="")
PRESETS = {"all": dict(preset="all"), "growth": GROWTH_PRESET, "growth_reference": GROWTH_REFERENCE_PRESET,
           "half_width": HALF_WIDTH_PRESET, "inheritance": INHERITANCE_PRESET, "stacking": STACKING_PRESET}


def parse_args(argv=None) -> BaselineSettings:
    return from_args(BaselineSettings, argv, presets=PRESETS, description=__doc__)


def build_config(a: BaselineSettings, seed: int) -> InherituneConfig:
    train_config = a.train_config(checkpoint_every=max(a.eval_every, 50), seed=seed)
    return InherituneConfig(ref_layers=a.ref_layers, student_layers=a.student_layers, grow_by=a.grow_by,
                            max_layers=a.max_layers or a.student_layers, ref_steps=a.ref_steps, grow_from=a.grow_from,
                            d_model=a.d_model, n_heads=a.heads, n_ctx=a.seq_len,
                            d_vocab=PADDED_VOCAB, train_config=train_config, ablations=tuple(x for x in a.baselines.split(",") if x),
                            distill_logit=DistillConfig.logit(a.distill_temperature, a.distill_alpha),
                            distill_distilbert=DistillConfig.distilbert(a.distill_temperature),
                            rank_inputs=a.rank_inputs, rank_len=a.rank_len, baselines=not a.no_scratch, seed=seed)


def load_stage(a: BaselineSettings, folder: Path, stage: Stage, tokenizer):
    cfg = gpt2_config(stage.n_layers, d_model=stage.d_model or a.d_model, n_heads=stage.n_heads or a.heads,
                      n_ctx=a.seq_len, d_vocab=PADDED_VOCAB)
    model = gpt2_model(cfg, seed=0, options=GPT2Options(), tokenizer=tokenizer)
    load_model_state(model, folder / stage.name / "final" / "model.safetensors")
    return model


def zero_shot_items(a: BaselineSettings, model) -> dict:
    """Per task: each evaluated item's correctness under the paper's metric, with chance and the items dropped as
    longer than the context."""
    out = {}
    for task_name in [t for t in a.eval_tasks.split(",") if t]:
        metric = PAPER_TASKS.get(task_name, "sum")
        fitting, dropped = within_context(model, load_task(task_name, n=a.eval_n, seed=0, shots=0))
        res = evaluate(model, fitting, batch_size=16, progress=False, primary=metric)
        out[task_name] = {"metric": metric, "chance": res.chance, "dropped": dropped,
                          "ids": [it.id for it in res.items], "correct": [bool(it.correct(metric)) for it in res.items]}
    return out


def measure_seed(a: BaselineSettings, seed: int, corpus, tokenizer) -> dict:
    """Train (or reload) one seed's run, then its per-window losses and zero-shot items, each cached."""
    folder = Path(a.runs) / f"seed_{seed}"
    result = run_inheritune(build_config(a, seed), corpus, out_dir=folder, tokenizer=tokenizer,
                            progress=not a.no_progress)
    windows = eval_windows(corpus.val, a.loss_windows, a.seq_len)
    per_stage = {}
    for stage in compared(result):
        key = {"seed": seed, "stage": stage.name, "val_loss": stage.val_loss, "windows": a.loss_windows,
               "seq": a.seq_len, "tasks": a.eval_tasks, "n": a.eval_n}
        per_stage[stage.name] = keyed(Path(a.runs) / "extras" / f"seed_{seed}_{stage.name}.json", key,
                                      lambda stage=stage: _measure(a, folder, stage, windows, tokenizer))
    return {"result": result, "measured": per_stage}


def _measure(a: BaselineSettings, folder: Path, stage: Stage, windows, tokenizer) -> dict:
    model = load_stage(a, folder, stage, tokenizer)
    t0 = time.process_time()
    out = {"window_losses": window_losses(model, windows), "zero_shot": zero_shot_items(a, model)}
    out["cpu_s"] = time.process_time() - t0
    return out


def main(argv=None):
    a = parse_args(argv)
    started, cpu0 = time.time(), time.process_time()
    out = Path(a.figures)
    out.mkdir(parents=True, exist_ok=True)
    corpus, tokenizer = load_corpus("sotu"), gpt2_tokenizer()
    runs = {seed: measure_seed(a, seed, corpus, tokenizer) for seed in a.seed_list}
    table = per_seed_table(runs)
    tests = loss_tests(table, runs, a.n_resamples)
    speed = convergence_tests(table, a.n_resamples)
    accuracy, zs_tests = zero_shot_tests(table, runs, a.n_resamples)
    methods = method_table(table, tests, speed)
    print(methods.drop(columns=[c for c in methods if c.startswith("p_")]).to_string())
    # each table is its own family (BH within it), as its verdicts say
    all_tests = pd.concat([t.assign(table=name) for name, t in (("final loss", tests),
                                                                ("steps to the same loss", speed),
                                                                ("zero-shot", zs_tests)) if len(t)], ignore_index=True)
    uniform = uniform_causal_levels(a.rank_len)["rank"]
    students = (f"students {a.student_layers}L" if not a.max_layers else
                f"students {a.student_layers}L grown by {a.grow_by} up to {a.max_layers}L")
    ref_steps = f" (the reference {a.ref_steps})" if a.ref_steps else ""
    subtitle = (f"GPT-2 (authors') d_model {a.d_model}, {a.heads} heads, reference {a.ref_layers}L, {students}; "
                f"{a.steps} steps{ref_steps} of {a.batch_size}x{a.seq_len} SOTU tokens; seeds {a.seeds}")
    written = (curves_figure(runs, out, subtitle, not a.no_png, a.stem)
               + rank_figure(table, uniform, out, subtitle, not a.no_png, a.stem))
    if a.max_layers:
        written += growth_rank_figure(runs, uniform, out, subtitle, not a.no_png, a.stem)
    atomic_write_text(out / f"{a.stem}.csv", methods.to_csv(index=False))
    atomic_write_text(out / f"{a.stem}_tests.csv", all_tests.to_csv(index=False))
    cpu_train = float(sum(s.wall_time_s for r in runs.values() for s in r["result"].stages))
    write_record(out / f"{a.stem}.json", {
        "what": ("Inheritune against the paper's baselines at CPU scale, several training seeds" if not a.max_layers
                 else "Inheritune's growth loop at GPT-2 CPU scale against same-size scratch, several training seeds"),
        "settings": asdict(a), "calling_rule": RULE, "corpus": corpus.meta,
        "methods": methods.to_dict(orient="records"), "per_seed": table.to_dict(orient="records"),
        "final_loss_tests": tests.to_dict(orient="records"), "convergence_tests": speed.to_dict(orient="records"),
        "zero_shot_accuracy": accuracy.to_dict(orient="records"), "zero_shot_tests": zs_tests.to_dict(orient="records"),
        "stage_methods": {label(s): s.method for s in compared(runs[a.seed_list[0]]["result"])},
        "histories": {str(seed): {label(s): [{k: h[k] for k in ("step", "val_loss") if k in h} for h in s.history
                                             if "val_loss" in h] for s in compared(r["result"])}
                      for seed, r in runs.items()},
        "rank": {"definition": runs[a.seed_list[0]]["result"].meta["rank"], "uniform_causal_rank": uniform},
        "growth": {str(seed): r["result"].meta["growth"] for seed, r in runs.items()},
        "figures": written, "training_time_s": cpu_train,
        "wall_time_s": time.time() - started, "cpu_time_s_this_run": time.process_time() - cpu0,
    })
    print(f"wrote {a.stem}.{{csv,json}}, _tests.csv and {', '.join(written)} in {time.time() - started:.0f} s")
    return methods


if __name__ == "__main__":
    main()
