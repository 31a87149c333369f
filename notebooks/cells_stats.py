"""The cells of the notebook on statistics: a sweep's intervals, a paired difference and the calling rule's verdict
on it (written by ``make_notebooks.py``; edit the cells here)."""

from nbformat.v4 import new_code_cell, new_markdown_cell

STATISTICS = [
    new_markdown_cell("""# How sure is a finding? A sweep's intervals, a paired difference and the calling rule

A curve of accuracy against the share of heads zeroed is measured on a sample of items, so every number read off it
has an interval: here a small sweep on the embedded SmolLM2-135M-Instruct (12 ARC-Easy items, heads zeroed by AHON
(LN) and by AVVN at 10% and 30%, against random zeroing drawn per item), its summaries with 95% bootstrap intervals
over items (paired across the curves: every curve ran on the same items), one paired difference, and the verdict of
the one rule that calls every comparison in lens_heads (`lens_heads.stats.calling`). Twelve items make wide
intervals: the point is how to read them (the recorded sweeps use 200 items)."""),
    new_code_cell("""import tempfile
import lens_heads as lh
from lens_heads.stats import calling
from lens_heads.viz.sweep_figures import ablation_curves

tmp = tempfile.TemporaryDirectory()  # the sweep's folder, removed when the kernel stops
model = lh.load_model()
task = lh.load_task("arc_easy", n=12, seed=0)
sweep = lh.run_sweep(model, task, scores=["AHON (LN)", "AVVN"], fractions=[0.1, 0.3], out_dir=tmp.name,
                     progress=False)
print(sweep.baseline)"""),
    new_code_cell("""ablation_curves(sweep.to_dataframe(), baseline=100 * sweep.baseline.accuracy, chance=task.chance,
                title=f"Zeroing heads on ARC-Easy (n={len(task)}): accuracy, gold log-prob change and KL")"""),
    new_markdown_cell("""## Every summary with its interval

Normalised AUC of accuracy and of KL, the KL at 10% of heads, and the share zeroable within one point, each with a
95% percentile-bootstrap interval over items (`_low`, `_high`); the items are resampled once for all curves, so
the intervals of a difference between curves are paired."""),
    new_code_cell("""iv = sweep.intervals()
columns = ["score", "normalised_auc_pct", "normalised_auc_pct_low", "normalised_auc_pct_high",
           "normalised_auc_kl", "normalised_auc_kl_low", "normalised_auc_kl_high"]
sweep.summary(intervals=iv)[columns].round(3)"""),
    new_markdown_cell("""## One paired difference, and what the rule says about it

AHON (LN) against random by KL AUC (lower is better: a cheaper removal): the difference on the same items, its
paired bootstrap interval and a paired permutation p-value. The rule:"""),
    new_code_cell("""print(calling.RULE)
row = iv.difference("AHON (LN)", "random", "kl_auc")
print(calling.sentence(row, "KL AUC", lower_is_better=True))"""),
    new_markdown_cell("""A table of comparisons is one family: its p-values are Benjamini-Hochberg adjusted together before the rule
calls each row. Every curve against random, by accuracy AUC and KL AUC:"""),
    new_code_cell("""tests = iv.versus("random", ["accuracy_auc", "kl_auc"])
tests[["a", "b", "summary", "difference", "low", "high", "p_value", "p_adjusted", "verdict"]].round(3)"""),
    new_markdown_cell("""## One point of a curve: a paired difference of two evaluations

The same pairing for two single evaluations: the 30% point of AHON (LN)'s curve against the unablated baseline,
per item (accuracy, the gold answer's log-probability, and the KL between the two answer distributions)."""),
    new_code_cell("""point = sweep.curves()["AHON (LN)"][-1]
d = lh.paired_difference(point.result, sweep.baseline)
print(f"AHON (LN), {point.realised_fraction:.1%} of heads zeroed: accuracy {point.result.accuracy:.1%} "
      f"against {sweep.baseline.accuracy:.1%}")
print(f"paired accuracy difference {d.mean:+.3f} (95% CI {d.ci95[0]:+.3f}..{d.ci95[1]:+.3f}, {d.method})")
print(f"gold log-prob change {d.gold_logprob_change.mean:+.3f} "
      f"(95% CI {d.gold_logprob_change.ci95[0]:+.3f}..{d.gold_logprob_change.ci95[1]:+.3f}), KL {d.kl.mean:.3f}")"""),
]
