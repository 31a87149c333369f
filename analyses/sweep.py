"""The inactive-heads sweep on the embedded model: zero heads per input by each score, against random zeroing.

    python analyses/sweep.py        # embedded SmolLM2-135M on ARC-Easy and PIQA, n=200, all twelve scores, shares
                                    # 5-30%; figures/ holds a smaller run of it (command in figures/README.md)
    python analyses/sweep.py --n 64 --fractions 0,.1,.2,.3 --scores "AHON (LN),AWFT"   # a quick look
    python analyses/sweep.py --model gpt2-medium --tasks mmlu --n 1000 --fractions 0,.05,.1,.15,.2,.25,.3
    python analyses/sweep.py --authors    # the authors' grid: 13 scores (the twelve and LTHON (HN)), random drawn
                                          # per row, shares 0-30% by 5 (outputs sweep_<task>_authors.*)
    torchrun --nproc_per_node=8 analyses/sweep.py --model Qwen/Qwen2.5-0.5B --tasks mmlu ...   # 8 GPUs share the
                                    # units (rank 0 writes); in a SLURM job array each task runs its share into --out
                                    # and a final plain run merges them

Steps:
1. **Baseline against chance** on every task in ``--check-tasks`` (``--check-n`` items each; MMLU in its 5-shot
   letter format): a model at chance has nothing to lose, so the sweep runs only on tasks whose 95% Wilson interval
   lies above chance (``--force`` overrides).
2. **The sweep** (``lens_heads.sweep.run.run_sweep``) on each remaining task in ``--tasks``, rows laid out by
   ``--protocol`` (lm-eval's by default): thresholds from the unablated pooled CDF of each score on the evaluated
   rows (``--calibration``), per-input threshold zeroing at each target fraction,
   the random baseline, and the static pruning view for ``--static-scores``. Units are kept under ``--out`` and a
   rerun skips the finished ones (interrupt and rerun freely).
3. **Outputs** in ``--figures`` (default ``figures/``): ``sweep_<task>.csv`` (every curve point: realised % zeroed,
   accuracy with its Wilson interval, paired difference with the baseline on the same items and its interval, the
   companion metrics: change of the gold answer's log-likelihood and KL from the unablated answer distribution),
   ``sweep_<task>.json`` (table, summary, settings, and the target check: how far each threshold unit's realised
   share lands from its target, and whether ties or the cascade moved it), ``sweep_<task>_summary.csv`` (every
   curve's summaries with 95% bootstrap intervals over items, paired across curves), ``sweep_<task>_tests.csv``
   (every curve against random and against the best: paired difference, interval, permutation p-value, verdict),
   ``sweep_<task>_units.json.gz`` (every unit with its per-item records: the summaries and intervals recompute
   from it through ``lens_heads.read_sweep_record``), ``sweep_<task>.png/.html`` (accuracy
   and the two companions vs % zeroed per score, random baseline dashed with its 95% intervals), and
   ``sweep_baselines.csv`` (step 1). For a model other than the embedded default the names carry the model:
   ``sweep_<model>_<task>.*``, ``sweep_<model>_baselines.csv``.
"""


import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from lens_heads import load_model, load_task
from lens_heads.ablation.hooks import DRAWS
from lens_heads.data.chat import parse_chat_setting, resolve_chat_template
from lens_heads.data.rows import PROTOCOLS
from lens_heads.data.tasks import INACTIVE_HEADS_TASKS
from lens_heads.evaluation.batching import AUTO, parse_batch_size
from lens_heads.evaluation.evaluate import evaluate
from lens_heads.evaluation.results import EvalResult
from lens_heads.experiments.task_runs import recorded_name
from lens_heads.heads.scores import SCORE_NAMES, score_names
from lens_heads.models.embedded import DEFAULT_MODEL
from lens_heads.models.loading import model_meta
from lens_heads.plumbing import distributed
from lens_heads.plumbing.io import atomic_write_json, atomic_write_text
from lens_heads.plumbing.provenance import write_record
from lens_heads.plumbing.settings import from_args, option
from lens_heads.stats import calling
from lens_heads.sweep.calibration import CALIBRATIONS
from lens_heads.sweep.compare import UNITS_SUFFIX
from lens_heads.sweep.intervals import TESTED
from lens_heads.sweep.run import run_sweep
from lens_heads.sweep.unit_store import save_units
from lens_heads.viz.export import save_figure
from lens_heads.viz.sweep_figures import ablation_curves

ROOT = Path(__file__).resolve().parents[1]
CHECK_TASKS = INACTIVE_HEADS_TASKS
TOLERANCE = 2.0  # points: the realised share of heads zeroed should land this close to its target


@dataclass(frozen=True)
class SweepSettings:
    """What one run sweeps, checks and writes (each field is a ``--flag``)."""

    model: str = option(DEFAULT_MODEL, "model name (the embedded SmolLM2-135M by default)")
    tasks: tuple[str, ...] = option(("arc_easy", "piqa"), "comma-separated tasks to sweep")
    n: int | None = option(200, "items per swept task, sampled by --seed, or 'all' (under torchrun say --items: "
                           "torchrun takes --n for an abbreviation of its own options)",
                           parse=lambda t: None if t == "all" else int(t), aliases=("--items",))
    scores: tuple[str, ...] = option(tuple(SCORE_NAMES), "comma-separated score names, or 'all' (the twelve)",
                                     parse=score_names)
    fractions: tuple[float, ...] = option((0.0, .05, .1, .15, .2, .25, .3), "target shares of heads to zero")
    static_scores: tuple[str, ...] = option(("AHON (LN)",), "comma-separated scores for the static pruning view "
                                            "('' for none)", parse=score_names)
    no_random: bool = option(False, "skip the random baseline")
    random: str = option("per_item", "the random baseline's draw: once per item (all choices lose the same heads) or "
                         "once per forward row (the authors')", choices=DRAWS)
    check_tasks: tuple[str, ...] = option(CHECK_TASKS, "tasks whose baseline is checked vs chance ('' for none)")
    check_n: int = option(100, "items per task for the baseline check")
    check_n_mmlu: int = option(60, "items for MMLU's check (5-shot prompts are long)")
    force: bool = option(False, "sweep the --tasks even where the baseline is at chance")
    out: str = option(str(ROOT / "runs" / "sweep"), "folder of resumable units")
    figures: str = option(str(ROOT / "figures"), "where tables and figures go")
    protocol: str = option("lm-eval", "forward rows: lm-eval's (the paper's) or TransformerLens's ('tl')",
                           choices=PROTOCOLS)
    apply_chat_template: bool | str = option("off", "the tokenizer's chat template: off, on (lm-eval's "
                                             "--apply_chat_template --fewshot_as_multiturn, the authors' run of "
                                             "instruct models), single_turn (without --fewshot_as_multiturn) or auto "
                                             "(on for -Instruct/-chat/-SFT/-DPO model names, as the authors' script)",
                                             parse=parse_chat_setting)
    split: str | None = option(None, "evaluated split (default: the task's; ARC-Easy's is test, and the recorded "
                               "ARC-Easy sweeps read validation)")
    tag: str = option("", "appended to the output names (sweep_<task>_<tag>.*), for a variant beside a record")
    calibration: str = option("rows", "thresholds from the evaluated rows (the paper's) or the item prompts",
                              choices=CALIBRATIONS)
    batch_size: int | str = option(16, "forward rows per batch, or 'auto' (the largest that fits)", parse=parse_batch_size)
    seed: int = option(0, "sampling and random-baseline seed")
    threads: int | None = option(None, "torch CPU threads (default: torch's choice)", parse=int)
    dtype: str = option("float32", "weights and activations (scores and log-likelihoods are float32 anyway)",
                        choices=("float32", "bfloat16", "float16"))
    no_png: bool = option(False, "write HTML figures only (PNG needs Chromium)")
    n_resamples: int = option(2000, "bootstrap replicates (and permutations) for the summaries' intervals and the "
                              "paired tests; seeded by --seed")


# The authors' grid (their figures' 13 score curves and the random baseline): every target share from 0 to 30% by
# 5, the twelve scores and LTHON (HN), random zeroing drawn per forward row, no static view.
PRESETS = {"authors": dict(scores=tuple(SCORE_NAMES) + ("LTHON (HN)",), fractions=(0.0, .05, .1, .15, .2, .25, .3),
                           random="per_row", static_scores=(), tag="authors",
                           out=str(ROOT / "runs" / "sweep_authors"))}


def parse_args(argv=None) -> SweepSettings:
    return from_args(SweepSettings, argv, presets=PRESETS, description=__doc__,
                     formatter_class=argparse.RawDescriptionHelpFormatter)


# ---------------------------------------------------------------- step 1: baselines against chance


def check_baselines(model, args) -> pd.DataFrame:
    """Unablated accuracy of every check task beside chance; each task's result is kept in --out and reused."""
    rows = []
    for name in args.check_tasks:
        n = args.check_n_mmlu if name == "mmlu" else args.check_n
        task = load_task(name, n=n, seed=args.seed)
        chat = resolve_chat_template(model, parse_chat_setting(args.apply_chat_template))
        path = Path(args.out) / "baselines" / (f"{name}-{task.split}-n{len(task)}-shots{task.shots}-seed{args.seed}-"
                                               f"{args.protocol}{_chat_suffix(chat)}.json")
        if path.exists():
            result = EvalResult.from_dict(json.loads(path.read_text()))
        else:
            t = time.perf_counter()
            # 5-shot MMLU rows are ~750 tokens: smaller batches keep the attention patterns' memory in bounds
            small = args.batch_size if args.batch_size == AUTO else min(args.batch_size, 4)
            result = evaluate(model, task, batch_size=small if name == "mmlu" else args.batch_size,
                              protocol=args.protocol, apply_chat_template=chat)
            if distributed.is_main():
                atomic_write_json(path, result.to_dict())
                print(f"[baseline] {name}: {time.perf_counter() - t:.0f} s")
        low, high = result.ci95
        chosen = pd.Series([it.chosen() for it in result.items]).value_counts(normalize=True)
        rows.append(dict(task=name, split=task.split, shots=task.shots, format=task.format, n=result.n,
                         accuracy=result.accuracy, ci_low=low, ci_high=high, chance=result.chance,
                         accuracy_per_token=result.accuracy_by("per_token"),
                         accuracy_per_char=result.accuracy_by("per_char"),
                         most_chosen_share=float(chosen.iloc[0]), above_chance=bool(low > result.chance)))
        if distributed.is_main():
            print(f"[baseline] {name:10s} {100 * result.accuracy:5.1f}% [{100 * low:.1f}, {100 * high:.1f}] "
                  f"chance {100 * result.chance:.1f}%  n={result.n}  above chance: {low > result.chance}")
    return pd.DataFrame(rows)


# ---------------------------------------------------------------- step 3: outputs


def _chat_suffix(chat: bool | str) -> str:
    return {False: "", True: "-chat", "single_turn": "-chat1"}[chat]


def write_outputs(result, task, args, baselines: pd.DataFrame, model) -> None:
    figures = Path(args.figures)
    figures.mkdir(parents=True, exist_ok=True)
    stem = figures / output_name(args.model, task.name, args.tag)
    table = result.to_dataframe()
    atomic_write_text(f"{stem}.csv", table.to_csv(index=False, float_format="%.6g"))
    save_units(result, f"{stem}{UNITS_SUFFIX}")
    intervals = result.intervals(n_resamples=args.n_resamples, seed=args.seed)
    summary, check = result.summary(intervals=intervals), result.target_check(TOLERANCE)
    tests = calling.call_table(pd.concat([intervals.versus(ref, TESTED).assign(reference=ref)
                                          for ref in ("random", "best")], ignore_index=True))  # one family
    atomic_write_text(f"{stem}_summary.csv", summary.to_csv(index=False, float_format="%.6g"))
    atomic_write_text(f"{stem}_tests.csv", tests.to_csv(index=False, float_format="%.6g"))
    static = result.zeroable_within(mode="static") if args.static_scores else {}
    low, high = result.baseline.ci95
    write_record(f"{stem}.json", dict(
        what="inactive-heads sweep: per-input threshold zeroing of heads on hook_z (z := 0 before W_O), random "
             "baseline, static pruning view",
        model=model_meta(model), task=task.meta(), protocol=args.protocol,
        apply_chat_template=result.meta["apply_chat_template"], chat_template=result.meta["chat_template"],
        calibration=args.calibration, random_draw=args.random,
        seed=args.seed, fractions=args.fractions, scores=args.scores,
        static_scores=args.static_scores,
        **result.headline(1.0),
        primary_metric="argmax of summed continuation log-likelihood (lm-eval acc)",
        paired_method="normal approximation on per-item paired differences, 95%",
        static_zeroable_within_1_point_pct=static, summary=summary.to_dict(orient="records"),
        intervals=dict(intervals.meta, table=intervals.to_dataframe().to_dict(orient="records")),
        tests=dict(what="every curve against random and against the best curve of each summary: paired "
                        "difference (curve - reference) with its bootstrap interval, permutation p-value and "
                        "Benjamini-Hochberg adjusted p over the table; the verdict by the calling rule",
                   calling_rule=calling.RULE,
                   table=tests.to_dict(orient="records")),
        units_file=Path(f"{stem}{UNITS_SUFFIX}").name,
        target_check=check.to_dict(orient="records"),
        target_check_rule=f"realised share within {TOLERANCE:g} points of the target; otherwise the cause is "
                          "the larger of 'ties' (the unablated share already misses) and 'cascade' (scoring "
                          "on the ablated stream moves it)",
        baselines_vs_chance=baselines.to_dict(orient="records"), sweep_meta=result.meta,
        table=table.to_dict(orient="records")))
    meta = model_meta(model)
    title = (f"{meta['name']} on {task.name} ({task.split}, {task.shots}-shot {task.format}, n={len(task)}, seed "
             f"{args.seed}; {args.protocol} rows{_chat_title(result.meta['chat_template'])}; weight "
             f"basis {meta['weight_basis']}): baseline {100 * result.baseline.accuracy:.1f}% "
             f"[{100 * low:.1f}, {100 * high:.1f}], chance {100 * result.baseline.chance:.0f}%")
    fig = ablation_curves(table, baseline=100 * result.baseline.accuracy, chance=result.baseline.chance,
                          title=title)
    save_figure(fig, stem, png=not args.no_png)
    print(summary.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    print(tests.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    print(target_misses(check))


def target_misses(check: pd.DataFrame) -> str:
    """One line per score: its largest miss of the target share, and the cause where it exceeds the tolerance."""
    lines = [f"realised vs target share (tolerance {TOLERANCE:g} points):"]
    for score, rows in check.groupby("score", sort=False):
        worst = rows.loc[rows["miss_points"].abs().idxmax()]
        verdict = "within" if rows["within"].all() else f"misses ({worst['cause']})"
        lines.append(f"  {score:<12} largest miss {worst['miss_points']:+.1f} at {worst['target_pct']:g}%: {verdict}")
    return "\n".join(lines)


def _chat_title(chat: bool | str) -> str:
    return {False: "", True: ", chat template (multi-turn few-shot)", "single_turn": ", chat template (one turn)"}[chat]


def output_name(model: str, what: str, tag: str = "") -> str:
    """``sweep_<what>`` for the embedded default model, ``sweep_<model>_<what>`` for any other; ``_<tag>`` after."""
    name = f"sweep_{recorded_name(model, what)}"
    return f"{name}_{tag}" if tag else name


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_model(args.model, dtype=args.dtype)  # under torchrun: on this rank's GPU (cuda:LOCAL_RANK) or the CPU
    main_process = distributed.is_main()  # only it writes tables and figures
    if args.check_tasks:
        baselines = check_baselines(model, args)
        if main_process:
            atomic_write_text(Path(args.figures) / f"{output_name(args.model, 'baselines', args.tag)}.csv",
                              baselines.to_csv(index=False, float_format="%.4g"))
    else:  # no check this run: the sweep's own baseline unit still says where chance lies
        baselines = pd.DataFrame()
    for name in args.tasks:
        row = baselines[baselines["task"] == name] if len(baselines) else pd.DataFrame()
        if len(row) and not bool(row["above_chance"].iloc[0]) and not args.force:
            print(f"[sweep] skipping {name}: its baseline is not clearly above chance (pass --force to sweep anyway)")
            continue
        task = load_task(name, n=args.n, seed=args.seed, split=args.split)
        t = time.perf_counter()
        result = run_sweep(model, task, scores=args.scores, fractions=args.fractions, out_dir=Path(args.out) / name,
                           seed=args.seed, batch_size=args.batch_size, random_baseline=not args.no_random,
                           static_scores=args.static_scores, protocol=args.protocol,
                           apply_chat_template=parse_chat_setting(args.apply_chat_template),
                           calibration=args.calibration, random=args.random)
        if result is None:
            print(f"[sweep] {name}: this job array task's units are done in {Path(args.out) / name}; once every "
                  "task has finished, run the same command outside the array to merge them and write the figures")
            continue
        if main_process:
            print(f"[sweep] {name}: {len(result.units)} units ({result.meta['units_run']} run now) in "
                  f"{time.perf_counter() - t:.0f} s")
            write_outputs(result, task, args, baselines, model)


if __name__ == "__main__":
    main()
