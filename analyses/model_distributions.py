"""Head-score distributions across models: does a short fine-tune move them, compared with a different model?

    python analyses/model_distributions.py        # SmolLM2-135M-Instruct, a fine-tuned copy made here, gemma-3-270m
    python analyses/model_distributions.py --models allenai/OLMo-2-1124-7B,allenai/OLMo-2-1124-7B-SFT,\
allenai/OLMo-2-1124-7B-DPO,allenai/OLMo-2-1124-7B-Instruct --task mmlu --split test --n 500 --threads 0

Steps:
1. **Fine-tune** (where ``--models`` names ``finetuned``): the first model (a local Hugging Face folder or the
   embedded one) fine-tuned on ``--train-task``'s ``--train-split`` laid out as it is evaluated (the item's prompt,
   then its gold answer; loss on the answer's tokens), ``--steps`` steps of ``--batch-size`` examples
   (:mod:`lens_heads.training.finetune`); the held-out loss on the gold answers of the scored items every
   ``--eval-every`` steps. The weights go to ``--cache`` (safetensors), never into the repository; a rerun reuses them.
2. **Scores and accuracy** of every model on the same items (``--task``, ``--split``, ``--n``, ``--seed``; lm-eval
   rows, no chat template, raw weight basis), kept in ``--out`` and reused by a rerun.
3. **The comparison** (:func:`lens_heads.compare_distributions`) of every model against ``--reference`` (default:
   the first): distances per score pooled, per relative depth and per layer, the excess over the swapped null with
   bootstrap intervals and permutation tests, the difference between the models' distances from the reference, and
   per-head rank and zeroing overlap where the shapes match.

Outputs in ``--figures`` (stem ``distributions_<task>``, or ``distributions_<tag>`` with ``--tag``): ``.json`` (settings,
models, data, the fine-tune with its loss curves, accuracies, every table), ``_distances.csv``, ``_versus.csv``,
``_heads.csv``, ``_cdf.png/.html`` (one panel per score, one curve per model, pooled; the HTML's menu switches to a
relative-depth bin or a layer) and ``_finetune.png/.html`` (the loss curves).
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from lens_heads import compare_distributions, evaluate, load_model, load_task, score_heads
from lens_heads.evaluation.results import EvalResult
from lens_heads.heads.scores import SCORE_NAMES
from lens_heads.heads.scoring import HeadScores
from lens_heads.models.embedded import DEFAULT_MODEL, EMBEDDED, cache_dir, embedded_model_folder
from lens_heads.models.loading import model_meta
from lens_heads.plumbing.io import atomic_write_json, atomic_write_text, safe_name
from lens_heads.plumbing.provenance import write_record
from lens_heads.plumbing.settings import from_args, option
from lens_heads.stats import calling
from lens_heads.training.config import TrainConfig
from lens_heads.training.example_data import examples
from lens_heads.training.finetune import finetune
from lens_heads.training.options import train_options
from lens_heads.viz.export import save_figure
from lens_heads.viz.score_figures import score_cdfs
from lens_heads.viz.training_figures import loss_curves

ROOT = Path(__file__).resolve().parents[1]
FINETUNED = "finetuned"


# the fine-tune's flags: the training config's fields at the preset's values, 100 steps at lr 5e-5
FINETUNE = {k: v for k, v in asdict(TrainConfig.finetune(steps=100, lr=5e-5)).items() if k != "seed"}


@dataclass(frozen=True)
class DistributionSettings(train_options(leave_out=("seed",), **FINETUNE)):
    """Which models, which items, the fine-tune and the statistics (each field is a ``--flag``)."""

    models: tuple[str, ...] = option((DEFAULT_MODEL, FINETUNED, "gemma-3-270m"),
                                     f"comma-separated model names or folders; '{FINETUNED}': the first model "
                                     "fine-tuned here (step 1)")
    reference: str | None = option(None, "the model every other is compared with (default: the first)")
    task: str = option("arc_easy", "the items every model is scored on")
    split: str | None = option("validation", "their split")
    n: int | None = option(200, "items, sampled by --seed, or 'all'", parse=lambda t: None if t == "all" else int(t))
    seed: int = option(0, "item sample, bootstrap and permutation seed")
    train_task: str = option("arc_easy", "the fine-tune's items")
    train_split: str = option("test", "their split (not the scored one)")
    train_n: int | None = option(None, "fine-tune items (default: all of the split)",
                                 parse=lambda t: None if t == "all" else int(t))
    n_resamples: int = option(500, "bootstrap replicates and permutations (the comparison's CPU time grows "
                              "linearly with them)")
    depth_bins: int = option(3, "relative-depth bins (early, middle, late)")
    shares: tuple[float, ...] = option((0.1, 0.3), "target shares of the zeroing overlaps")
    score_batch_size: int = option(16, "rows per forward when scoring and evaluating")
    out: str = option(str(ROOT / "runs" / "model_distributions"), "folder of resumable scores and accuracies")
    cache: str = option(str(cache_dir() / "finetuned"), "where fine-tuned weights go (outside the repository)")
    figures: str = option(str(ROOT / "figures"), "where tables and figures go")
    tag: str = option("", "output stem distributions_<tag> (default distributions_<task>)")
    threads: int | None = option(1, "torch CPU threads (0: torch's choice)", parse=int)
    no_png: bool = option(False, "write HTML figures only (PNG needs Chromium)")


def parse_args(argv=None) -> DistributionSettings:
    return from_args(DistributionSettings, argv, description=__doc__,
                     formatter_class=argparse.RawDescriptionHelpFormatter)


def base_folder(name: str) -> Path:
    """The Hugging Face folder of a model the fine-tune starts from."""
    if name.lower() in EMBEDDED:
        return embedded_model_folder(name.lower())
    if Path(name).is_dir():
        return Path(name)
    raise SystemExit(f"the fine-tune starts from a local folder or an embedded model, not {name!r}")


def run_finetune(args: DistributionSettings, scored) -> tuple[str, dict]:
    """Step 1: the fine-tuned copy of the first model; its folder and its record."""
    base = args.models[0]
    model = load_model(base)
    train_task = load_task(args.train_task, split=args.train_split, n=args.train_n, seed=args.seed)
    train, held_out = examples(model, train_task), examples(model, scored)
    del model
    gc.collect()
    cfg = args.train_config(seed=args.seed)
    folder = Path(args.cache) / f"{safe_name(base)}-{args.train_task}-{args.train_split}-s{args.steps}-seed{args.seed}"
    t = time.perf_counter()
    result = finetune(base_folder(base), train, held_out, folder, cfg,
                      describe=dict(train=train_task.meta(), held_out=scored.meta(),
                                    format="the task's lm-eval prompt, then its gold answer"))
    print(f"[finetune] {folder} ({time.perf_counter() - t:.0f} s): held-out loss {result.eval_loss[0]:.3f} -> "
          f"{result.eval_loss[-1]:.3f}")
    return str(folder), dict(folder=str(folder), config=asdict(result.config), train_loss=result.train_loss,
                             eval_steps=result.eval_steps, eval_loss=result.eval_loss, meta=result.meta)


def scores_and_accuracy(name: str, label: str, task, args: DistributionSettings
                        ) -> tuple[HeadScores, dict, EvalResult]:
    """Step 2 for one model: its scores on the task's rows and its accuracy, from ``--out`` where kept."""
    out = Path(args.out) / safe_name(label)
    key = dict(model=name, task=task.meta(), version=1)
    path, acc_path = out / "scores.safetensors", out / "accuracy.json"
    if path.exists() and acc_path.exists() and json.loads(acc_path.read_text()).get("key") == key:
        stored = json.loads(acc_path.read_text())
        return HeadScores.load(path), dict(stored["accuracy"], model=stored["model"]), EvalResult.from_dict(
            stored["records"])
    model = load_model(name)
    t = time.perf_counter()
    scores = score_heads(model, task, batch_size=args.score_batch_size)
    score_s = time.perf_counter() - t
    result = evaluate(model, task, batch_size=args.score_batch_size)
    low, high = result.ci95
    accuracy = dict(accuracy=result.accuracy, ci95=[low, high], chance=result.chance, n=result.n,
                    ci_method="wilson 95%", score_wall_s=score_s, eval_wall_s=result.meta["wall_s"])
    out.mkdir(parents=True, exist_ok=True)
    scores.save(path)
    atomic_write_json(acc_path, dict(key=key, accuracy=accuracy, model=model_meta(model),
                                     records=result.to_dict()))
    print(f"[{label}] accuracy {100 * result.accuracy:.1f}% [{100 * low:.1f}, {100 * high:.1f}], scored in "
          f"{score_s:.0f} s")
    meta = model_meta(model)
    del model
    gc.collect()
    return scores, dict(accuracy, model=meta), result


def accuracy_changes(results: dict[str, EvalResult], reference: str, args: DistributionSettings) -> pd.DataFrame:
    """Each model against the reference on the same items: the paired change of accuracy and of the gold answer's
    log-likelihood, with bootstrap intervals, permutation p-values and the one rule's verdict."""
    base = {it.id: it for it in results[reference].items}
    parts = []
    for label, result in results.items():
        if label == reference:
            continue
        pairs = [(it, base[it.id]) for it in result.items]
        x = np.array([[float(a.correct()) for a, _ in pairs], [a.gold_logprob for a, _ in pairs]])
        y = np.array([[float(b.correct()) for _, b in pairs], [b.gold_logprob for _, b in pairs]])
        parts.append(calling.paired_tests(x, y, ["accuracy", "gold log-likelihood"], True, a=label, b=reference,
                                          n_resamples=args.n_resamples, seed=args.seed))
    return calling.call_table(pd.concat(parts, ignore_index=True)) if parts else pd.DataFrame()


def write_outputs(args: DistributionSettings, comparison, accuracy: dict, changes: pd.DataFrame, tuned: dict | None,
                  labels: dict) -> None:
    figures = Path(args.figures)
    figures.mkdir(parents=True, exist_ok=True)
    stem = figures / f"distributions_{args.tag or args.task}"
    for part in ("distances", "versus", "heads"):
        atomic_write_text(f"{stem}_{part}.csv", getattr(comparison, part).to_csv(index=False, float_format="%.6g"))
    write_record(f"{stem}.json", dict(
        what="head-score distributions of several models on the same items: distances (Wasserstein-1, KS) pooled, "
             "per relative depth and per layer, excess over the swapped null with bootstrap intervals and "
             "permutation tests; the difference of two models' distances from the reference; per-head ranks and "
             "zeroing overlap",
        settings=asdict(args), models=labels, accuracy=accuracy, finetune=tuned, meta=comparison.meta,
        accuracy_change=dict(what="each model minus the reference on the same items (paired bootstrap interval over "
                                  "items, permutation p-value, Benjamini-Hochberg over the table)",
                             table=changes.to_dict(orient="records")),
        calling_rule=calling.RULE, distances=comparison.distances.to_dict(orient="records"),
        versus=comparison.versus.to_dict(orient="records"), heads=comparison.heads.to_dict(orient="records")))
    names = list(labels)
    title = (f"{args.task} ({args.split}, n={args.n}, seed {args.seed}; lm-eval rows, raw weight basis): "
             f"{', '.join(names)}")
    save_figure(score_cdfs(comparison.cdfs, names, title=title), f"{stem}_cdf", png=not args.no_png,
                width=1400, height=950)
    if tuned is not None:
        fig = loss_curves(tuned["train_loss"], tuned["eval_steps"], tuned["eval_loss"],
                          title=f"fine-tune of {args.models[0]} on {args.train_task} {args.train_split} "
                                f"(batch {args.batch_size}, lr {args.lr:g}): answer-token loss")
        save_figure(fig, f"{stem}_finetune", png=not args.no_png)
    pd.set_option("display.width", 200)
    print(comparison.summary("pooled", "ks").to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    print(comparison.versus[comparison.versus["view"] == "pooled"].to_string(
        index=False, float_format=lambda v: f"{v:.3g}"))
    print(comparison.heads.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    print(changes.to_string(index=False, float_format=lambda v: f"{v:.3g}"))


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    task = load_task(args.task, split=args.split, n=args.n, seed=args.seed)
    tuned, names = None, {}
    for name in args.models:
        if name == FINETUNED:
            folder, tuned = run_finetune(args, task)
            names[f"{args.models[0]} fine-tuned"] = folder
        else:
            names[name] = name
    score_sets, accuracy, results = {}, {}, {}
    for label, name in names.items():
        score_sets[label], accuracy[label], results[label] = scores_and_accuracy(name, label, task, args)
    t = time.process_time()
    comparison = compare_distributions(score_sets, reference=args.reference, names=SCORE_NAMES,
                                       depth_bins=args.depth_bins, shares=args.shares, n_resamples=args.n_resamples,
                                       seed=args.seed, progress=True)
    comparison.meta["cpu_s"] = time.process_time() - t
    changes = accuracy_changes(results, comparison.meta["reference"], args)
    write_outputs(args, comparison, accuracy, changes, tuned, names)


if __name__ == "__main__":
    main()
