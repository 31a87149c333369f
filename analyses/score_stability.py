"""Are the twelve head scores stable across tasks? Score every head on five tasks, compare the tasks pairwise.

    python analyses/score_stability.py                                  # SmolLM2 and gemma-3-270m, 64 items a task
    python analyses/score_stability.py --models smollm2-135m --n 32     # one model, fewer items

Each (model, task) is scored once (``score_heads``) and its scores kept in ``--scores`` (outside the repository,
written atomically), so a killed run resumes with the tasks still missing. Then, per model, score and pair of tasks
(:mod:`lens_heads.heads.stability`): the Spearman correlation of the per-head means over all heads and within
each layer, and the Jaccard overlap of the 10% most inactive heads, each with its bootstrap interval over items; and
the inactive-heads paper's claim "AHON (LN) is more stable than AWFT" called by the rule, paired over task pairs.

Writes to ``--out`` (default ``figures/``):
  score_stability.csv            per model, score and pair of tasks: the statistics with their intervals
  score_stability_layers.csv     per model, score, pair of tasks and layer: Spearman over that layer's heads
  score_stability_scores.csv     per model and score: each statistic's mean over the task pairs, with its interval
  score_stability_tests.csv      per model and statistic: AHON (LN) against AWFT, mean over task pairs, called by
                                 the rule (the p-values adjusted over the whole table)
  score_stability.json           settings, models, tasks (items, rows, tokens), CPU and commit
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from lens_heads import load_model, load_task
from lens_heads.heads.scoring import HeadScores, score_heads
from lens_heads.models.embedded import cache_dir
from lens_heads.plumbing.cache import Cache
from lens_heads.plumbing.io import atomic_write_text, slug
from lens_heads.plumbing.provenance import write_record
from lens_heads.plumbing.settings import from_args, option
from lens_heads.stats.calling import call_table

ROOT = Path(__file__).resolve().parents[1]
TASKS = ("arc_easy", "piqa", "winogrande", "hellaswag", "mmlu")
LONG = ("mmlu",)  # few-shot prompts of hundreds of tokens


@dataclass(frozen=True)
class StabilitySettings:
    """The models, the tasks and their samples, the statistics' settings and where the outputs go."""

    models: tuple[str, ...] = option(("smollm2-135m", "gemma-3-270m"), "models, scored one after the other")
    tasks: tuple[str, ...] = option(TASKS, "tasks compared pairwise (each at its default shots: MMLU 5-shot)")
    n: int = option(64, "items per task (a random sample by --seed)")
    seed: int = option(0, "seed of the item samples and of the bootstrap and permutation resamples")
    fraction: float = option(0.1, "share of heads that counts as the most inactive (Jaccard overlap)")
    n_resamples: int = option(2000, "bootstrap and permutation resamples")
    batch_size: int = option(16, "rows per forward pass of the scoring (short tasks: per-pass overhead dominates)")
    batch_size_long: int = option(2, "rows per forward pass on MMLU 5-shot (~750 tokens a row)")
    threads: int = option(2, "torch CPU threads of the scoring")
    score_only: bool = option(False, "score the tasks (filling --scores) and stop")
    out: Path = option(ROOT / "figures", "where the tables go", parse=Path)
    scores: Path = option(help="where each (model, task)'s scores are kept for resuming (LENS_HEADS_CACHE/"
                               "score_stability)", parse=Path, default_factory=lambda: cache_dir() / "score_stability")


def task_scores(model: Callable[[], Any], model_name: str, task_name: str, args: StabilitySettings) -> HeadScores:
    """One task's scores, from ``--scores`` where this exact sample was scored before (``model()`` loads the model
    only where it is not)."""
    task = load_task(task_name, n=args.n, seed=args.seed)
    key = dict(model=model_name, task=task_name, n=len(task), shots=task.shots, seed=args.seed)

    def compute(path: Path) -> None:
        t = time.perf_counter()
        size = args.batch_size_long if task_name in LONG else args.batch_size
        result = score_heads(model(), task, batch_size=size)
        print(f"[{model_name} {task_name}] {len(task)} items ({task.shots}-shot), {result.meta['data']['n_rows']} "
              f"rows, {result.meta['data']['n_tokens']} tokens, {time.perf_counter() - t:.0f} s", flush=True)
        result.save(path)

    return Cache(args.scores).file(f"{slug(model_name.lower())}-{task_name}", key, ".safetensors", compute,
                                   HeadScores.load)


def main(argv=None) -> None:
    args = from_args(StabilitySettings, argv, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    if len(args.tasks) < 2:
        sys.exit("stability compares tasks pairwise: give at least two --tasks")
    torch.set_num_threads(args.threads)
    sets: dict[str, dict[str, HeadScores]] = {}
    for name in args.models:  # one model in memory at a time, loaded only for tasks not scored yet
        sets[name] = {task: task_scores(functools.partial(_loaded, name), name, task, args) for task in args.tasks}
        _loaded.cache_clear()
    if args.score_only:
        print(f"scores of {len(args.models)} model(s) x {len(args.tasks)} tasks are in {args.scores}")
        return
    from lens_heads.heads.stability import stability

    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    results = {name: stability(s, fraction=args.fraction, n_resamples=args.n_resamples, seed=args.seed)
               for name, s in sets.items()}
    tables = {kind: _stacked(results, kind) for kind in ("pairs", "layers", "scores", "tests")}
    tables["tests"] = call_table(tables["tests"].drop(columns=["p_adjusted", "verdict"]))  # one family: the table
    atomic_write_text(out / "score_stability.csv", tables["pairs"].to_csv(index=False, float_format="%.4f"))
    atomic_write_text(out / "score_stability_layers.csv", tables["layers"].to_csv(index=False, float_format="%.4f"))
    atomic_write_text(out / "score_stability_scores.csv", tables["scores"].to_csv(index=False, float_format="%.4f"))
    atomic_write_text(out / "score_stability_tests.csv", tables["tests"].to_csv(index=False, float_format="%.6g"))
    write_record(out / "score_stability.json", dict(
        script="analyses/score_stability.py", argv=sys.argv[1:] if argv is None else list(argv),
        settings={k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k not in ("out", "scores")},
        models={name: r.meta() for name, r in results.items()},
        data={name: {task: {k: v for k, v in s.meta["data"].items() if k != "row_items"} for task, s in ts.items()}
              for name, ts in sets.items()}))
    tests = tables["tests"]
    print(tests[["model", "statistic", "a", "b", "difference", "low", "high", "p_value", "verdict"]]
          .to_string(index=False))
    print(f"\nwrote score_stability.csv, score_stability_layers.csv, score_stability_tests.csv and .json to {out}")


@functools.lru_cache(maxsize=1)
def _loaded(name: str):
    return load_model(name)


def _stacked(results: dict, kind: str):
    import pandas as pd

    return pd.concat([r.to_dataframe(kind).assign(model=name) for name, r in results.items()], ignore_index=True) \
        .pipe(lambda df: df[["model"] + [c for c in df.columns if c != "model"]])


if __name__ == "__main__":
    main()
