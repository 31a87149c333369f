"""One model and task swept under two settings (the chat template, the split) on the same items: does the setting
change which heads are inactive? (``lens_heads.sweep.compare``: ``compare_settings``, ``compare_sweeps``,
``zeroed_head_overlap``)

    python analyses/compare_settings.py figures/sweep_arc_easy_n40.json figures/sweep_arc_easy_chat_n40.json \
        --name compare_chat_n40

The first sweep is ``a``, the second ``b``; both must hold per-item records (their ``_units.json.gz`` beside them)
of the same items. Outputs in ``--figures`` (default ``figures/``), named by ``--name``:

- ``<name>.csv``: per curve, its normalised AUC of accuracy and of the paired KL and its rank by each under ``a``
  and ``b``, the paired difference b - a with its 95% bootstrap interval (the same resampled items for both
  sweeps), for the AUCs a paired permutation p-value, and the verdict of the one calling rule (ranks: not tested);
- ``<name>_heads.csv``: per curve and target share, the heads zeroed on most rows under each setting, how many
  both zero (Jaccard) and the Spearman correlation of every head's share of rows zeroed (descriptive);
- ``<name>_versus_random.csv``: under each setting (``setting`` a or b), every curve against that setting's random
  curve on the common grid of target shares (accuracy AUC, KL AUC, % zeroable within 1 point): paired difference,
  interval, permutation p-value and verdict, both settings' tests one family; ``claims_change`` in the JSON lists the
  (curve, summary) pairs whose verdict differs between a and b (e.g. a random baseline drawn per item or per row);
- ``<name>.json``: the inputs (model, task, split, chat template, n, seed), the Spearman correlation of the two
  rankings (accuracy and KL) with its paired interval, the unablated model's change from a to b on the same items
  (``baseline_change``: paired accuracy, gold log-likelihood and KL with their intervals, the items each setting
  alone answers right), and both tables.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from lens_heads.evaluation.results import paired_difference, paired_values
from lens_heads.plumbing.io import atomic_write_text
from lens_heads.plumbing.provenance import write_record
from lens_heads.plumbing.settings import from_args, option
from lens_heads.stats import calling
from lens_heads.sweep.compare import (
    METRICS,
    common_grid,
    compare_settings,
    compare_sweeps,
    on_grid,
    read_sweep_record,
    zeroed_head_overlap,
)
from lens_heads.sweep.intervals import TESTED

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class SettingsComparison:
    """The two sweeps compared and where the comparison goes."""

    sweeps: tuple[str, ...] = option((), "two sweep_<task>.json files (with units) or run_sweep folders: a, then b",
                                     positional=True, metavar="SWEEP")
    name: str = option("compare_settings", "stem of the output files")
    majority: float = option(0.5, "a head counts as zeroed by a curve when zeroed on at least this share of rows")
    n_resamples: int = option(2000, "bootstrap replicates")
    seed: int = option(0, "bootstrap seed")
    figures: str = option(str(ROOT / "figures"), "where the tables go")

    def __post_init__(self):
        if len(self.sweeps) != 2:
            raise ValueError(f"give exactly two sweeps (a, then b), got {len(self.sweeps)}")


def main(argv=None) -> None:
    args = from_args(SettingsComparison, argv, description=__doc__,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    try:
        a, b = (read_sweep_record(p) for p in args.sweeps)
        # on their common grid once, so that every comparison below reads the same cached bootstrap of each sweep
        grid = common_grid([a, b])
        ga, gb = on_grid(a, grid), on_grid(b, grid)
        table = compare_settings(ga, gb, n_resamples=args.n_resamples, seed=args.seed)
        rankings = {m: compare_sweeps([ga, gb], metric=m, n_resamples=args.n_resamples, seed=args.seed)
                    for m in METRICS}
    except (OSError, ValueError) as e:
        sys.exit(f"compare_settings: {e}")
    versus = versus_random(ga, gb, n_resamples=args.n_resamples, seed=args.seed)
    changed = claims_change(versus)
    heads = zeroed_head_overlap(a, b, args.majority)
    baseline = baseline_change(a, b)
    out = Path(args.figures)
    atomic_write_text(out / f"{args.name}.csv", table.to_csv(index=False, float_format="%.6g"))
    atomic_write_text(out / f"{args.name}_heads.csv", heads.to_csv(index=False, float_format="%.4g"))
    atomic_write_text(out / f"{args.name}_versus_random.csv", versus.to_csv(index=False, float_format="%.6g"))
    spearman = {m: c.spearman_interval(0, 1) for m, c in rankings.items()}
    write_record(out / f"{args.name}.json", dict(
        what="one model and task under two settings on the same items: every curve's AUCs and ranks with paired "
             "differences (b - a) and their bootstrap intervals, the Spearman correlation of the two rankings, and "
             "the heads each zeroes",
        inputs=[str(p) for p in args.sweeps], a=rankings["accuracy"].sweeps[0], b=rankings["accuracy"].sweeps[1],
        intervals=rankings["accuracy"].intervals, baseline_change=baseline,
        spearman={m: dict(what=METRICS[m], estimate=s.estimate, low=s.low, high=s.high) for m, s in spearman.items()},
        curves=table.to_dict(orient="records"), zeroed_heads=heads.to_dict(orient="records"),
        versus_random=versus.to_dict(orient="records"), claims_change=changed, calling_rule=calling.RULE,
        zeroed_heads_rule=f"a head is zeroed by a curve when zeroed on at least {args.majority:g} of the rows; "
                          "descriptive, no interval"))
    print(f"baseline accuracy b - a: {baseline['paired_diff']:+.3f} [{baseline['paired_ci_low']:+.3f}, "
          f"{baseline['paired_ci_high']:+.3f}]; items right only under a: {baseline['right_only_a']}, only under b: "
          f"{baseline['right_only_b']}")
    for m, s in spearman.items():
        print(f"Spearman of the rankings by {METRICS[m]}: {s.estimate:.3f} [{s.low:.3f}, {s.high:.3f}]")
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    print(heads.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    print(f"verdicts against random that differ between a and b: {changed or 'none'}")


def versus_random(a, b, *, n_resamples: int, seed: int) -> pd.DataFrame:
    """Under each setting, every curve against its own random curve on the two sweeps' common grid, in the summaries
    a sweep tests (both settings' rows one family, called by the one rule)."""
    grid = common_grid([a, b])
    tables = []
    for setting, sweep in (("a", a), ("b", b)):
        intervals = on_grid(sweep, grid).intervals(n_resamples=n_resamples, seed=seed)
        if "random" in intervals.curves:
            tables.append(intervals.versus("random", TESTED).assign(setting=setting))
    if not tables:
        return pd.DataFrame()
    table = pd.concat(tables, ignore_index=True).drop(columns=["p_adjusted", "verdict"])
    return calling.call_table(table)


def claims_change(versus: pd.DataFrame) -> list[dict]:
    """The (curve, summary) pairs tested under both settings whose verdict against random differs between them."""
    if not len(versus) or set(versus["setting"]) != {"a", "b"}:
        return []
    by = versus.pivot_table(index=["a", "summary"], columns="setting", values="verdict", aggfunc="first").dropna()
    return [dict(curve=curve, summary=summary, a=row["a"], b=row["b"])
            for (curve, summary), row in by.iterrows() if row["a"] != row["b"]]


def baseline_change(a, b) -> dict:
    """The unablated model under b against a on the same items: the paired accuracy difference with its interval,
    and how many items each setting alone answers right."""
    under_a = {it.id: it for it in a.baseline.items}
    flips = paired_values([(it, under_a[it.id]) for it in b.baseline.items], a.baseline.primary)["accuracy"]
    return dict(paired_difference(b.baseline, a.baseline).to_dict(), right_only_a=int((flips < 0).sum()),
                right_only_b=int((flips > 0).sum()))


if __name__ == "__main__":
    main()
