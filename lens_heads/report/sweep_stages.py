"""The report's stages of zeroing sweeps: each task's ablation sweep with its intervals and the paired tests the
findings rest on, and the comparison of every sweep's curves across models and tasks."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from lens_heads.data.items import Task
from lens_heads.heads.scoring import HeadScores
from lens_heads.plumbing.cache import Cache
from lens_heads.plumbing.errors import InputError
from lens_heads.report.config import ReportConfig
from lens_heads.report.stage_result import StageResult, jsonable
from lens_heads.sweep.compare import METRICS, SweepComparison, compare_by_metric
from lens_heads.sweep.run import run_sweep
from lens_heads.sweep.table2 import table2
from lens_heads.viz.sweep_figures import ablation_curves, correlation_heatmap, rank_heatmap

COMPARE_TOP_K = 5
INTERVAL_RESAMPLES = 1000  # bootstrap replicates (and permutations) of the sweep's intervals and tests


@dataclass(frozen=True)
class AblationResult(StageResult):
    sweep: object = None
    task: Task = field(kw_only=True)
    intervals: object = None  # lens_heads.sweep.intervals.SweepIntervals
    tests: dict = field(default_factory=dict)  # the paired differences the findings rest on (SweepIntervals.difference)


def headline_tests(iv) -> dict:
    """The paired differences the findings state, one family called by the one rule: the best curve by KL AUC
    against the runner-up and against random, and the best by % zeroable within 1 point (authors' rule) against
    random."""
    scores = [c for c in iv.curves if c != "random"]
    pairs: dict[str, tuple[str, str, str]] = {}
    if not scores:
        return {}
    by_kl = sorted(scores, key=lambda c: iv.interval(c, "kl_auc").estimate)
    if len(by_kl) > 1:
        pairs["best_vs_second_kl"] = (by_kl[0], by_kl[1], "kl_auc")
    if "random" in iv.curves:
        pairs["best_vs_random_kl"] = (by_kl[0], "random", "kl_auc")
        best_zero = max(scores, key=lambda c: iv.interval(c, "zeroable_authors").estimate)
        pairs["best_vs_random_zeroable"] = (best_zero, "random", "zeroable_authors")
    table = iv.differences(list(pairs.values()))
    return {key: row for key, row in zip(pairs, table.to_dict("records"))}


def ablation_stage(model, task, scores: HeadScores, config: ReportConfig, cache: Cache,
                   base_key: dict) -> AblationResult:
    """Zero the heads each score picks at each target fraction, beside random zeroing (``run_sweep``, which keeps
    each finished unit in its folder and resumes from it); thresholds from the scores stage's ``scores`` of the
    same rows."""
    folder = cache.path(f"sweep-{task.name}", {**base_key, "data": task.meta()})
    result = run_sweep(model, task, scores=list(config.scores), fractions=tuple(config.fractions), out_dir=folder,
                       seed=config.seed, settings=config.evaluation, progress=config.progress,
                       calibration=scores)
    if result is None:
        raise InputError(f"the sweep on {task.name} has units left to other tasks of the job array "
                         "(SLURM_ARRAY_TASK_ID): once every task is done, a run without the array reuses them all")
    shares = sorted({0.1, *(f for f in config.fractions if f > 0)})  # the summary's KL at 10% among them
    iv = result.intervals(1.0, shares=shares, n_resamples=INTERVAL_RESAMPLES, seed=config.seed)
    tests = headline_tests(iv)
    df, summary, t = result.to_dataframe(), result.summary(1.0, intervals=iv), task.name
    numbers = {
        "data": task.meta(), **result.headline(1.0), "chance": task.chance, "protocol": result.meta["protocol"],
        "auc_ranking": [str(s) for s in summary["score"]],
        "curves": jsonable(df.to_dict(orient="records")), "meta": jsonable(result.meta),
        "intervals": jsonable(iv.to_dataframe().to_dict(orient="records")), "intervals_meta": jsonable(iv.meta),
        "tests": jsonable(tests)}
    fig = ablation_curves(df, baseline=100 * result.baseline.accuracy, chance=task.chance,
                          title=f"Zeroing heads on {t} (n={len(task)}): accuracy vs share zeroed")
    tables = {f"ablation_{t}": df, f"ablation_summary_{t}": summary}
    return AblationResult(numbers, tables, {f"ablation_{t}": fig}, sweep=result, task=task, intervals=iv,
                          tests=tests)


def points_table(df: pd.DataFrame) -> pd.DataFrame:
    """The sweep's curve points as read on the page: accuracies and paired differences in points, with intervals."""
    rows = df[df["target_fraction"] > 0]
    out = pd.DataFrame({
        "curve": rows["curve"] if "curve" in rows else rows["score"], "target %": 100 * rows["target_fraction"],
        "realised %": 100 * rows["realised_fraction"], "accuracy %": 100 * rows["accuracy"],
        "paired diff (points)": 100 * rows["paired_diff"],
        "95% CI": [f"{100 * a:+.1f} .. {100 * b:+.1f}" for a, b in zip(rows["paired_low"], rows["paired_high"])]})
    if "gold_logprob_change" in rows:
        out["gold log-prob change"] = rows["gold_logprob_change"]
    return out


@dataclass(frozen=True)
class CompareResult(StageResult):
    comparisons: dict[str, SweepComparison] = field(kw_only=True)  # by metric


def compare_stage(sweeps: list) -> CompareResult:
    """Rank the curves of every sweep (SweepResults or RecordedSweeps, one per (model, task)) by the AUC of
    accuracy and by the AUC of the paired KL, and compare the rankings between sweeps."""
    comparisons = compare_by_metric(sweeps, top_k=COMPARE_TOP_K)
    acc = comparisons["accuracy"]
    inputs = pd.DataFrame([{k: d[k] for k in ("model", "task", "split", "shots", "n", "seed", "weight_basis",
                                              "baseline_accuracy", "chance", "source")} for d in acc.sweeps])
    paper_table = table2(sweeps)
    tables = {
        "compare_ranks": pd.concat([c.to_dataframe().assign(ranking=m) for m, c in comparisons.items()],
                                   ignore_index=True),
        "compare_pairs": pd.concat([c.pairs().assign(ranking=m) for m, c in comparisons.items()], ignore_index=True),
        "compare_inputs": inputs, "compare_table2": paper_table}
    figures = {"compare_ranks": rank_heatmap(acc.rank_table(), low=acc.rank_table("rank_low"),
                                             high=acc.rank_table("rank_high"),
                                             title="Rank by normalised AUC of accuracy, 1 = best"),
               "compare_spearman": correlation_heatmap(acc.spearman_table(), title=(
                   f"Spearman correlation of the rankings ({len(acc.curves)} curves)"))}
    numbers = {
        "inputs": inputs.to_dict(orient="records"), "curves": list(acc.curves), "dropped": acc.dropped,
        "top_k": acc.top_k, "table2": paper_table.to_dict(orient="records"),
        **{m: {"what": METRICS[m], "ranks": c.rank_table().reset_index().to_dict(orient="records"),
               "spearman": c.spearman_table().to_dict(), "pairs": c.pairs().to_dict(orient="records")}
           for m, c in comparisons.items()}}
    return CompareResult(numbers, tables, figures, comparisons=comparisons)
