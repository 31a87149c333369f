"""Compare recorded sweeps across models and tasks: rank of every score per (model, task), Spearman correlation of
the rankings and top-5 overlap between every pair (``lens_heads.sweep.compare.compare_sweeps``).

    python analyses/compare_sweeps.py figures/sweep_arc_easy.json figures/sweep_piqa.json   # the recorded run
    python analyses/compare_sweeps.py runs/sweep/arc_easy runs/sweep/piqa runs/gemma/arc_easy --top-k 3
    python analyses/compare_sweeps.py figures/sweep_arc_easy_authors.json figures/sweep_piqa_authors.json \
        --name compare_authors   # the authors' grid: compare_authors_table2.csv, ...

Each input is a ``sweep_<task>.json`` written by ``analyses/sweep.py`` or a ``run_sweep`` output folder; each must
be a different (model, task). Both rankings are computed: by the normalised AUC of accuracy (the paper's) and by the
normalised AUC of the paired KL (the low-variance companion), on the target shares every sweep measured (the
common grid), with 95% bootstrap intervals over items for every rank, correlation and Table 2 entry where a sweep
has per-item records (its ``sweep_<task>_units.json.gz`` beside the JSON). Outputs in ``--figures`` (default
``figures/``), each named with the prefix ``--name`` (default ``compare``):

- ``compare_ranks.csv``: per metric, (model, task) and curve: the normalised AUC and its rank (1 = best);
- ``compare_pairs.csv``: per metric and pair of (model, task): Spearman correlation, top-k overlap (count and
  intersection over union), shared curves;
- ``compare_spearman_<metric>.csv``: the correlation matrix;
- ``compare_table2.csv``: the paper's Table 2 (``lens_heads.sweep.table2.table2``): per (model, task), AWFT's % of heads
  zeroable within 1 accuracy point (authors' rule) beside the best other curve's, random included, and the
  paper's Average row (the mean over the sweeps; an interval only where every sweep has per-item records);
- ``compare_ranks_<metric>.png`` and ``compare_spearman_<metric>.png`` (and ``.html``): the two heatmaps;
- ``compare_sweeps.json``: what went in (model, task, sample, seed, weight basis, baseline, chance, source file) and
  every number above.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from lens_heads.plumbing.io import atomic_write_text
from lens_heads.plumbing.provenance import write_record
from lens_heads.plumbing.settings import from_args, option
from lens_heads.sweep.compare import METRICS, common_grid, compare_by_metric, on_grid, read_sweep_record
from lens_heads.sweep.table2 import table2
from lens_heads.viz.export import PngUnavailable, png_writer
from lens_heads.viz.sweep_figures import correlation_heatmap, rank_heatmap

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class CompareSettings:
    """The sweeps compared and where the comparison goes."""

    sweeps: tuple[str, ...] = option((), "sweep_<task>.json files or run_sweep output folders (at least two)",
                                     positional=True, metavar="SWEEP")
    top_k: int = option(5, "size of the top sets compared")
    n_resamples: int = option(2000, "bootstrap replicates for the intervals of ranks, correlations and Table 2")
    seed: int = option(0, "bootstrap seed")
    figures: str = option(str(ROOT / "figures"), "where tables and figures go")
    name: str = option("compare", "prefix of every output file: <name>_ranks.csv, <name>_table2.csv, "
                                  "<name>_sweeps.json, ... (keeps a second comparison beside the first)")
    no_png: bool = option(False, "write HTML figures only (PNG needs Chromium)")

    def __post_init__(self):
        if len(self.sweeps) < 2:
            raise ValueError("give at least two sweeps (one per model and task)")
        if not self.name or Path(self.name).name != self.name:
            raise ValueError(f"--name {self.name!r}: give a file-name prefix without a folder (use --figures)")


def parse_args(argv=None) -> CompareSettings:
    return from_args(CompareSettings, argv, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)


def main(argv=None) -> None:
    args = parse_args(argv)
    try:
        sweeps = [read_sweep_record(p) for p in args.sweeps]
        comparisons = compare_by_metric(sweeps, top_k=args.top_k, n_resamples=args.n_resamples, seed=args.seed)
        grid = common_grid(sweeps)
        paper_table = table2([on_grid(s, grid) for s in sweeps], n_resamples=args.n_resamples, seed=args.seed)
        paper_table["grid_pct"] = "/".join(f"{100 * p:g}" for p in grid if p > 0)
    except (OSError, ValueError) as e:
        sys.exit(f"compare_sweeps: {e}")
    out = Path(args.figures)
    first = next(iter(comparisons.values()))
    ranks = pd.concat([c.to_dataframe().assign(metric=m) for m, c in comparisons.items()], ignore_index=True)
    pairs = pd.concat([c.pairs().assign(metric=m) for m, c in comparisons.items()], ignore_index=True)
    atomic_write_text(out / f"{args.name}_ranks.csv", ranks.to_csv(index=False, float_format="%.6g"))
    atomic_write_text(out / f"{args.name}_pairs.csv", pairs.to_csv(index=False, float_format="%.4f"))
    atomic_write_text(out / f"{args.name}_table2.csv", paper_table.to_csv(index=False, float_format="%.6g"))
    figs = {}
    for m, c in comparisons.items():
        atomic_write_text(out / f"{args.name}_spearman_{m}.csv", c.spearman_table().to_csv(float_format="%.4f"))
        what = f"normalised AUC of {'accuracy' if m == 'accuracy' else 'the paired KL'}"
        figs[f"{args.name}_ranks_{m}"] = rank_heatmap(
            c.rank_table(), low=c.rank_table("rank_low"), high=c.rank_table("rank_high"),
            title=f"Rank by {what} per (model, task), 1 = best (common grid {_grid(c)}%)")
        figs[f"{args.name}_spearman_{m}"] = correlation_heatmap(
            c.spearman_table(), title=f"Spearman correlation of the rankings by {what} ({len(c.curves)} curves)")
    for name, fig in figs.items():
        fig.write_html(out / f"{name}.html", include_plotlyjs=True)
    if not args.no_png:
        try:
            with png_writer() as write:
                for name, fig in figs.items():
                    write(fig, out / f"{name}.png")
        except PngUnavailable as e:  # kaleido needs a Chromium: say so, keep the HTML
            print(f"PNG not written ({e}); or pass --no-png", file=sys.stderr)
    write_record(out / f"{args.name}_sweeps.json", dict(
        what="ranking of the head scores (and random zeroing) by normalised AUC per (model, task), Spearman "
             "correlation of the rankings and top-k overlap between every pair (lens_heads.sweep.compare)",
        inputs=[str(p) for p in args.sweeps], sweeps=list(first.sweeps), curves=list(first.curves),
        dropped=first.dropped, top_k=first.top_k, intervals=first.intervals,
        metrics={m: dict(what=METRICS[m], ranks=c.rank_table().reset_index().to_dict(orient="records"),
                         spearman=c.spearman_table().to_dict(), pairs=c.pairs().to_dict(orient="records"))
                 for m, c in comparisons.items()},
        table2=dict(what="% of heads zeroable within 1 accuracy point, authors' rule (last crossing of baseline - 1 "
                         "in order of realised share, 0 if none): AWFT beside the best other curve, random "
                         "included, on the target shares every sweep measured (grid_pct), with 95% bootstrap "
                         "intervals and the paired test AWFT - best where the sweep has per-item records",
                    rows=paper_table.to_dict(orient="records")),
        table=ranks.to_dict(orient="records")))
    print("== the paper's Table 2 (% zeroable within 1 point, authors' rule)")
    print(paper_table.to_string(index=False, float_format=lambda v: f"{v:.1f}"))
    for m, c in comparisons.items():
        print(f"\n== ranks by {METRICS[m]}")
        print(c.rank_table().to_string(float_format=lambda v: f"{v:g}"))
        print(c.pairs()[["model_a", "task_a", "model_b", "task_b", "spearman", "spearman_low", "spearman_high",
                         "top_k_overlap", "shared_top_k"]]
              .to_string(index=False, float_format=lambda v: f"{v:.3f}"))


def _grid(comparison) -> str:
    return "/".join(f"{p:g}" for p in comparison.intervals["grid"] if p > 0)


if __name__ == "__main__":
    main()
