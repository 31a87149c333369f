"""Is a 20-item attribution ranking a better pruning guide than the twelve head scores, and at what cost?

    OMP_NUM_THREADS=1 nice -n 5 python analyses/attribution_ranking.py --threads 1            # both tasks
    python analyses/attribution_ranking.py --tasks piqa --n 12 --calibration-n 4 --fractions 0,.1 --no-per-input \
        --figures /tmp/fig                                                                     # a smoke run

Per task in ``--tasks``, against the sweep recorded in ``--figures`` (``sweep_<task>.json`` with its units file):

1. **Items.** The sweep's ``--n`` items (seed ``--seed``, the sweep's split); the **calibration** items are the first
   ``--calibration-n`` of the same seeded draw (``load_task(task, n=calibration_n, seed)``: a subset of the sweep's
   items, and the ranking items of ``analyses/head_effects.py``), the **held-out** items the sweep's others.
2. **Attribution ranking** on the calibration items (``lens_heads.sweep.rankings.attribution_ranking``:
   attribution patching of the answer KL, heads by mean |effect|, smallest first), with its CPU cost.
3. **Curves on the held-out items** (``ranking_sweep``, resumable under ``--out``): static zeroing in the
   attribution order, the same heads mean-ablated (means over the calibration rows), the ablation oracle's order
   (``head_effects_<task>.json``, measured on the same calibration items) and, unless ``--no-per-input``, each
   held-out input zeroed by its own attribution (which costs a backward pass per input).
4. **Joined** with the recorded sweep's curves restricted to the held-out items (each score's per-input curve,
   AHON (LN)'s static curve, random) on one baseline; percentile-bootstrap intervals over the held-out items for
   every curve's summaries (paired across curves), and every curve tested against the attribution ranking's static
   curve (paired bootstrap interval, permutation p-value, Benjamini-Hochberg).

Outputs in ``--figures``: ``attribution_ranking_<task>.json`` (model, data, calibration and held-out items, seed,
weight basis, chance, costs, the orders, summaries and tests), ``attribution_ranking_<task>.csv`` (every curve
point), ``attribution_ranking_<task>_summary.csv``, ``attribution_ranking_<task>_tests.csv``,
``attribution_ranking_<task>_units.json.gz`` (the measured units with per-item records) and
``attribution_ranking_<task>.png/.html`` (the curves). For a model other than the embedded one, ``<task>`` reads
``<model>_<task>`` in every name, the recorded sweep's included, as ``analyses/sweep.py`` names its files.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from lens_heads.data.tasks import load_task
from lens_heads.experiments.attribution import AttributionRanking, attribution_ranking, held_out
from lens_heads.experiments.effects import HeadEffects, task_means
from lens_heads.experiments.task_runs import TaskRunSettings, recorded_name, split_of
from lens_heads.models.loading import load_model, model_meta
from lens_heads.plumbing.cache import Cache
from lens_heads.plumbing.io import atomic_write_text
from lens_heads.plumbing.provenance import write_record
from lens_heads.plumbing.settings import from_args, option
from lens_heads.sweep.compare import read_sweep_record
from lens_heads.sweep.intervals import kl_at
from lens_heads.sweep.rankings import Ranking, join_heldout, ranking_sweep
from lens_heads.sweep.result import SweepResult
from lens_heads.sweep.unit_store import save_units
from lens_heads.viz.export import save_figure
from lens_heads.viz.sweep_figures import ablation_curves

ROOT = Path(__file__).resolve().parents[1]
ATTRIBUTION = "attribution"
MEAN = "attribution, mean-ablated"
ORACLE = "oracle"
PER_INPUT = "attribution"  # its curve is the per-input one: "attribution (per input)"
REFERENCE = f"{ATTRIBUTION} (static)"
SUMMARIES = ("accuracy_auc", "kl_auc")


@dataclass(frozen=True)
class RankingSettings(TaskRunSettings):
    """What one run measures and writes (each field is a ``--flag``)."""

    n: int = option(200, "the recorded sweep's items per task (calibration and held-out together)")
    calibration_n: int = option(20, "calibration items (the attribution ranking's)")
    seed: int = option(0, "the sweep's sampling seed, and the bootstrap's")
    fractions: tuple[float, ...] = option((0.0, .05, .1, .2, .3), "target shares of heads zeroed (the sweep's)")
    no_per_input: bool = option(False, "leave out the per-input variant (each held-out input's own attribution)")
    no_mean: bool = option(False, "leave out the mean-ablated attribution curve (a rerun without this flag adds it)")
    no_oracle: bool = option(False, "leave out the ablation oracle's curve (a rerun without this flag adds it)")
    n_boot: int = option(2000, "bootstrap resamples and permutations over the held-out items")
    batch_size: int = option(16, "forward rows per batch")
    out: str = option(str(ROOT / "runs" / "attribution_ranking"), "resumable units")


def parse_args(argv=None) -> RankingSettings:
    return from_args(RankingSettings, argv, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)


def recorded_oracle(figures: Path, key: str, calibration, seed: int) -> list | None:
    """The ablation oracle's order from ``head_effects_<task>.json`` where it ranked the same calibration items."""
    path = figures / f"head_effects_{key}.json"
    if not path.exists():
        return None
    result = json.loads(path.read_text())
    data = result.get("data", {})
    if (data.get("n"), data.get("seed")) != (len(calibration), seed):
        return None
    return [tuple(h) for h in result["oracle"]["order"]]


def stored_ranking(model, items, folder: Path, label: str, protocol: str, args) -> AttributionRanking:
    """:func:`attribution_ranking` on ``items``, kept in ``folder`` with its cost (a rerun reads it back)."""
    def write(path: Path) -> None:
        ranking = attribution_ranking(model, items, batch_size=args.batch_size, protocol=protocol)
        ranking.effects.meta["cost"] = dict(ranking.cost(), threads=torch.get_num_threads())
        ranking.effects.save(path)

    key = dict(model=model_meta(model)["name"], items=[it.id for it in items], protocol=protocol, metric="kl")
    effects = Cache(folder).file(label, key, ".safetensors", write, HeadEffects.load)
    return AttributionRanking(effects, wall_s=effects.meta["cost"]["wall_s"], cpu_s=effects.meta["cost"]["cpu_s"])


def measure(model, key: str, task, calibration, heldout, recorded: SweepResult, args) -> tuple[SweepResult, dict]:
    """The ranking curves on the held-out items, and what each ranking cost."""
    folder = Path(args.out) / key / f"n{len(task)}-cal{len(calibration)}-seed{args.seed}"
    protocol = recorded.meta.get("protocol", "lm-eval")
    ranking = stored_ranking(model, calibration, folder, "calibration_attribution", protocol, args)
    costs = {ATTRIBUTION: ranking.effects.meta["cost"]}
    rankings = [ranking.ranking(ATTRIBUTION)]
    oracle = recorded_oracle(Path(args.figures), key, calibration, args.seed)
    if oracle is not None and not args.no_oracle:
        rankings.append(Ranking(ORACLE, order=tuple(oracle)))
        costs[ORACLE] = json.loads((Path(args.figures) / f"head_effects_{key}.json").read_text())["costs"]["ablation"]
    if not args.no_mean:
        rankings.append(ranking.ranking(MEAN, ablation="mean"))
    if not args.no_per_input:  # each held-out input ranked by its own attribution: a backward pass per input
        own = stored_ranking(model, heldout, folder, "per_input_attribution", protocol, args)
        costs["per_input"] = own.effects.meta["cost"]
        rankings.append(Ranking(PER_INPUT, per_input=tuple(map(tuple, own.effects.input_orders()))))
    means = task_means(model, calibration, batch_size=args.batch_size, protocol=protocol)  # always: they key the run
    measured = ranking_sweep(model, heldout, rankings, fractions=args.fractions, means=means,
                             out_dir=folder / "units", batch_size=args.batch_size, protocol=protocol)
    costs["unit_wall_s"] = {u.key: u.wall_s for u in measured.units}  # one evaluation of the held-out items each
    return measured, dict(costs=costs, orders={r.name: [list(h) for h in r.order] for r in rankings
                                              if r.order is not None})


def run_task(model, name: str, args) -> dict:
    figures, key = Path(args.figures), recorded_name(args.model, name)
    recorded = read_sweep_record(figures / f"sweep_{key}.json")
    split = split_of(recorded)
    task = load_task(name, n=args.n, seed=args.seed, split=split)
    calibration = load_task(name, n=args.calibration_n, seed=args.seed, split=split)
    heldout = held_out(task, calibration)
    measured, extra = measure(model, key, task, calibration, heldout, recorded, args)
    joined = join_heldout(recorded, measured)
    shares = [p for p in args.fractions if p > 0]
    intervals = joined.intervals(mode="all", shares=shares, n_resamples=args.n_boot, seed=args.seed)
    tests = intervals.versus(REFERENCE, summaries=SUMMARIES + tuple(kl_at(100 * s) for s in shares))
    summary = intervals.to_dataframe()
    table = joined.to_dataframe()
    stem = figures / f"attribution_ranking_{key}"
    atomic_write_text(stem.with_suffix(".csv"), table.to_csv(index=False, float_format="%.6g"))
    atomic_write_text(figures / f"{stem.name}_summary.csv", summary.to_csv(index=False, float_format="%.6g"))
    atomic_write_text(figures / f"{stem.name}_tests.csv", tests.to_csv(index=False, float_format="%.6g"))
    save_units(measured, figures / f"{stem.name}_units.json.gz")
    meta = model_meta(model)
    what = (f"{meta['name']} on {name} ({task.split}, {task.format}, weight basis {meta['weight_basis']}, seed "
            f"{args.seed}): {len(heldout)} held-out items, rankings from {len(calibration)} calibration items")
    figure_table = table.copy()
    ours = figure_table["score"].isin([ATTRIBUTION, MEAN, ORACLE])
    figure_table.loc[ours, "mode"] = "reference"  # drawn beside every score's row
    save_figure(ablation_curves(figure_table, baseline=100 * joined.baseline.accuracy, chance=joined.baseline.chance,
                                title=what), stem, png=not args.no_png, plotlyjs="cdn")
    result = dict(
        what="heads zeroed statically in the order of a 20-item attribution ranking (and mean-ablated, and per "
             "input by each input's own attribution) against the recorded sweep's curves, the ablation oracle and "
             "random, on held-out items",
        model=meta, weight_basis=meta["weight_basis"], protocol=measured.meta["protocol"], data=task.meta(),
        calibration=dict(calibration.meta(), item_ids=[it.id for it in calibration]),
        heldout=dict(heldout.meta(), item_ids=[it.id for it in heldout]), seed=args.seed, chance=heldout.chance,
        baseline=dict(accuracy=joined.baseline.accuracy, ci95=list(joined.baseline.ci95), n=joined.baseline.n),
        baseline_max_abs_logprob_diff=joined.meta["baseline_max_abs_logprob_diff"],
        recorded_sweep=f"sweep_{key}.json", fractions=list(args.fractions), intervals=intervals.meta,
        threads=torch.get_num_threads(), **extra,
        summary=summary.to_dict(orient="records"), tests=tests.to_dict(orient="records"))
    write_record(stem.with_suffix(".json"), result)
    shown = summary[["curve", "accuracy_auc", "kl_auc"] + [kl_at(100 * s) for s in shares]]
    print(shown.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(tests[["a", "b", "summary", "difference", "low", "high", "p_adjusted", "verdict"]].to_string(index=False))
    return result


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model, start = load_model(args.model), time.perf_counter()
    recorded = [run_task(model, name, args)["data"]["task"] for name in args.tasks]
    print(f"{', '.join(recorded)}: done in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
