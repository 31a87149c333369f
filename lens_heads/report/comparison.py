"""The report's comparison stage: when the report holds more than one sweep (its own tasks and the ``--compare``
inputs), rank the scores per (model, task) and compare the rankings (``lens_heads.compare``)."""

from __future__ import annotations

import pandas as pd

from lens_heads.compare import METRICS, compare_sweeps
from lens_heads import plots as figures
from lens_heads.report.render import Figure, Section, Table, Text
from lens_heads.sweep import table2

TOP_K = 5


def stage_compare(out, sweeps, config) -> dict:
    """Ranks heatmap, Spearman heatmap and pair table of ``sweeps`` (SweepResults or RecordedSweeps) into ``out``
    (the pipeline's ``Outputs``); both rankings: by the AUC of accuracy and by the AUC of the paired KL."""
    comparisons = {m: compare_sweeps(sweeps, metric=m, top_k=TOP_K) for m in METRICS}
    acc, kl = comparisons["accuracy"], comparisons["kl"]
    inputs = pd.DataFrame([{k: d[k] for k in ("model", "task", "split", "shots", "n", "seed", "weight_basis",
                                              "baseline_accuracy", "chance", "source")} for d in acc.sweeps])
    pairs = pd.concat([c.pairs().assign(ranking=m) for m, c in comparisons.items()], ignore_index=True)
    out.tables["compare_ranks"] = pd.concat([c.to_dataframe().assign(ranking=m) for m, c in comparisons.items()],
                                            ignore_index=True)
    out.tables["compare_pairs"] = pairs
    out.tables["compare_inputs"] = inputs
    paper_table = table2(sweeps)
    out.tables["compare_table2"] = paper_table
    rank_fig = figures.rank_heatmap(acc.rank_table(), title="Rank by normalised AUC of accuracy, 1 = best")
    spearman_fig = figures.correlation_heatmap(
        acc.spearman_table(), title=f"Spearman correlation of the rankings ({len(acc.curves)} curves)")
    out.pngs["compare_ranks"] = rank_fig
    out.pngs["compare_spearman"] = spearman_fig
    out.results["compare"] = {
        "inputs": inputs.to_dict(orient="records"), "curves": list(acc.curves), "dropped": acc.dropped,
        "top_k": acc.top_k, "table2": paper_table.to_dict(orient="records"),
        **{m: {"what": METRICS[m], "ranks": c.rank_table().reset_index().to_dict(orient="records"),
               "spearman": c.spearman_table().to_dict(), "pairs": c.pairs().to_dict(orient="records")}
           for m, c in comparisons.items()}}
    dropped = "; ".join(f"{label}: {', '.join(curves)}" for label, curves in acc.dropped.items())
    shown = ["model_a", "task_a", "model_b", "task_b", "ranking", "spearman", "top_k_overlap", "shared_top_k"]
    blocks = [
        Text(f"{len(sweeps)} sweeps, one per (model, task). Within each, every curve (the scores and random "
             f"zeroing) is ranked by its normalised AUC over realised % zeroed: by accuracy (the paper's ranking, "
             f"higher is better) and by the paired KL from the unablated answers (lower is better); ties share "
             f"their average rank. Between every pair: the Spearman correlation of the rankings over the "
             f"{len(acc.curves)} curves all sweeps have, and how many of the top {acc.top_k} they share."
             + (f" Left out (not in every sweep): {dropped}." if dropped else "")),
        Table(inputs, caption="What went in: model, data, sample, weight basis, unablated accuracy beside chance",
              float_format="{:.3g}"),
        Figure(rank_fig),
        Figure(spearman_fig),
        Table(pairs[shown], caption=f"Agreement between every pair of (model, task): Spearman correlation and "
                                    f"top-{acc.top_k} overlap, for both rankings", float_format="{:.3f}"),
        Table(kl.rank_table().reset_index(), caption="Ranks by the normalised AUC of the paired KL, 1 = best",
              float_format="{:g}"),
        Table(paper_table, caption="The paper's Table 2: % of heads zeroable within 1 accuracy point (authors' "
                                   "rule: last crossing of baseline - 1, 0 if none), AWFT beside the best other "
                                   "curve, random included", float_format="{:.1f}"),
    ]
    blocks.append(Text("Each AUC carries the sampling noise of its sweep's items (see n above): ranks of curves "
                       "whose AUCs differ by less than that noise can swap between runs.", "note"))
    out.sections.append(Section("Comparison of sweeps across models and tasks", blocks, anchor="compare"))
    return out.results["compare"]
