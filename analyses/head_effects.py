"""Does a score find the heads that do nothing? Ground-truth effect of every head, and each score's agreement with it.

    python analyses/head_effects.py --threads 1           # embedded SmolLM2-135M, ARC-Easy and PIQA, n=20 each:
                                                          # about 65 CPU-minutes (measured; below)
    python analyses/head_effects.py --tasks piqa --n 4 --heldout-n 8 --fractions 0,.1   # a smoke run

Per task in ``--tasks``:

1. **Ranking items**: ``--n`` items (seed ``--seed``); the twelve scores of every head on them
   (``lens_heads.score_heads``).
2. **Head effects** on the same items (``lens_heads.head_effects``): ``ablation`` (zero one head, evaluate again:
   30 x 9 = 270 evaluations, resumable under ``--out``) and ``attribution`` (attribution patching, one forward and
   backward pass per batch); wall and CPU seconds of each are recorded side by side.
3. **Agreement** of each score with the ablation effects and with the attribution estimates, for the KL and the gold
   log-likelihood metrics (``lens_heads.experiments.agreement.score_agreement``: Spearman, Kendall, precision@k, bootstrap 95%
   intervals over items), and the rank correlation of attribution with ablation.
4. **Oracle curve**: heads zeroed for every input in the order of their measured ablation effect (KL, smallest
   first), on the ranking items (fitted to them) and on ``--heldout-n`` other items (the next items of the same
   seeded draw, so the held-out items are part of the recorded sweep's n=200 sample), drawn over the recorded sweep
   curves of ``figures/sweep_<task>.csv`` where that file exists.

Cost: ablating every head cost 99 (ARC-Easy) and 80 (PIQA) CPU seconds per ranking item on one thread in the
recorded run (a layer's heads share the forward below them; ``benchmarks/bench_effects.py`` times it beside
attribution, docs/records/benchmarks.md), attribution 1-2 CPU seconds per item, the oracle one evaluation of the ranking
and held-out items per fraction: the defaults came to 65 CPU minutes for both tasks; two hours of 2 cores allow
about n=60.

Outputs in ``--figures``: ``head_effects_<task>.json`` (model, data, n, seed, weight basis, timings, tables),
``head_effects_agreement_<task>.csv``, ``head_effects_<task>.csv`` (per head: mean and size with intervals, both
methods), ``head_effects_agreement_<task>.png`` (correlations with intervals), ``head_effects_scatter_<task>.png``
(score vs effect per score), ``head_effects_attribution_<task>.png`` (attribution vs ablation per head),
``head_effects_oracle_<task>.png/.html`` (the sweep figure with the oracle curves). For a model other than the
embedded one, ``<task>`` reads ``<model>_<task>`` in every name and resumable folder, as ``analyses/sweep.py`` names
its files.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd
import torch

from lens_heads import head_effects, load_model, load_task, score_heads
from lens_heads.data.rows import PROTOCOLS
from lens_heads.experiments.agreement import score_agreement
from lens_heads.experiments.effects import HeadEffects, oracle_sweep
from lens_heads.experiments.task_runs import TaskRunSettings, recorded_name, sweep_split
from lens_heads.models.loading import model_meta
from lens_heads.plumbing.io import atomic_write_json, atomic_write_text
from lens_heads.plumbing.provenance import write_record
from lens_heads.plumbing.settings import from_args, option
from lens_heads.stats.inference import kendall, spearman
from lens_heads.viz.export import save_figure
from lens_heads.viz.score_figures import agreement_bars, score_vs_effect
from lens_heads.viz.sweep_figures import ablation_curves

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("ablation", "attribution")
AGREEMENT_METRICS = ("kl", "gold_logprob")


def _at_least(low: int):
    def parse(text: str) -> int:
        value = int(text)
        if value < low:
            raise ValueError(f"expected at least {low} (intervals need two ranking items, the oracle one held-out "
                             f"item), got {value}")
        return value

    return parse


@dataclass(frozen=True)
class EffectsSettings(TaskRunSettings):
    """What one run measures and writes (each field is a ``--flag``)."""

    n: int = option(20, "ranking items per task", parse=_at_least(2))
    split: str | None = option(None, "the evaluated split (default: the recorded sweep's in --figures, whose curves "
                               "the oracle is drawn beside; the task's own where none is recorded)")
    heldout_n: int = option(32, "held-out items for the oracle curve", parse=_at_least(1))
    protocol: str = option("lm-eval", "forward rows: lm-eval's (as the sweep) or TransformerLens's ('tl')",
                           choices=PROTOCOLS)
    fractions: tuple[float, ...] = option((0.0, .05, .1, .2, .3), "shares of heads the oracle zeroes")
    n_boot: int = option(1000, "bootstrap resamples of the items")
    seed: int = option(0, "sampling and bootstrap seed")
    batch_size: int = option(16, "forward rows per batch")
    out: str = option(str(ROOT / "runs" / "head_effects"), "resumable units")
    redraw: bool = option(False, "draw the oracle figures again from the recorded head_effects_<task>.json over the "
                                 "sweep now in --figures (no model, nothing measured)")


def parse_args(argv=None) -> EffectsSettings:
    return from_args(EffectsSettings, argv, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)


def effects_of(model, task, key: str, method: str, args) -> tuple[HeadEffects, dict]:
    """Each method's effects, kept in --out (ablation resumes per head), with the wall and CPU seconds it took."""
    folder = Path(args.out) / key / f"{method}-n{len(task)}-seed{args.seed}-{args.protocol}"
    stored = folder / "effects.safetensors"
    if stored.exists():
        effects = HeadEffects.load(stored)
        return effects, effects.meta["cost"]
    wall, cpu = time.perf_counter(), time.process_time()
    effects = head_effects(model, task, method=method, metric="kl", batch_size=args.batch_size, protocol=args.protocol,
                           out_dir=folder / "heads" if method != "attribution" else None)
    cost = dict(wall_s=time.perf_counter() - wall, cpu_s=time.process_time() - cpu,
                units_run=effects.meta.get("units_run"), threads=torch.get_num_threads())
    effects.meta["cost"] = cost
    effects.save(stored)
    return effects, cost


def heldout_items(task, n: int, heldout_n: int, seed: int):
    """The next ``heldout_n`` items of the same seeded draw: disjoint from the first ``n``."""
    wider = load_task(task.name, n=n + heldout_n, seed=seed, split=task.split)
    ranked = {it.id for it in task}
    return replace(wider, items=[it for it in wider if it.id not in ranked])


def write_figure(fig, path: Path, args) -> None:
    save_figure(fig, path, png=not args.no_png, plotlyjs="cdn")


def agreement_of(scores, effects: dict, args) -> tuple[pd.DataFrame, dict, dict]:
    """Each score's rank agreement with each method's per-head effects (one table, with its meta), and how well
    attribution's effect sizes agree with ablation's."""
    tables = []
    for method in METHODS:
        for metric in AGREEMENT_METRICS:
            a = score_agreement(scores, effects[method], metric=metric, n_boot=args.n_boot, seed=args.seed)
            tables.append(a.to_dataframe().assign(method=method, metric=metric))
    sizes = {m: {metric: effects[m].size(metric).reshape(-1).numpy() for metric in AGREEMENT_METRICS}
             for m in ("attribution", "ablation")}
    attribution_vs_ablation = {
        metric: dict(spearman=float(spearman(sizes["attribution"][metric], sizes["ablation"][metric])),
                     kendall=kendall(sizes["attribution"][metric], sizes["ablation"][metric]))
        for metric in AGREEMENT_METRICS}
    return pd.concat(tables, ignore_index=True), a.meta, attribution_vs_ablation


def recorded_sweep(sweep_csv: Path) -> tuple[pd.DataFrame | None, str]:
    """The recorded sweep's curve table beside the oracle's (None where there is none) and its rows' protocol."""
    if not sweep_csv.exists():
        return None, "tl"
    meta_path = sweep_csv.with_suffix(".json")
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    # the sweep names its rows' protocol; a sweep that does not ran TransformerLens rows
    return pd.read_csv(sweep_csv), meta.get("protocol") or meta.get("sweep_meta", {}).get("fingerprint", {}).get(
        "protocol", "tl")


def oracle_curves(model, key: str, task, heldout, order, args) -> dict:
    """The oracle's static curve on the ranking items and on the held-out ones, each resumable in its folder."""
    oracles = {}
    for label, items in (("oracle (ranking items)", task), ("oracle (held-out items)", heldout)):
        oracles[label] = oracle_sweep(model, items, order, fractions=args.fractions, label=label,
                                      batch_size=args.batch_size, protocol=args.protocol,
                                      out_dir=Path(args.out) / key / f"oracle-{'held' if 'held' in label else 'rank'}"
                                                                      f"-n{len(task)}-seed{args.seed}-{args.protocol}")
    return oracles


def write_scatters(scores, effects: dict, what: str, spearman_kl: str, cost_ratio: float, scatter: Path,
                   attribution: Path, args) -> None:
    """Per head: each score's mean against its ablation KL, and attribution's estimate against ablation's."""
    n = len(effects["ablation"])
    write_figure(score_vs_effect({s: scores.mean(s).numpy() for s in scores.names},
                                 effects["ablation"].size("kl").numpy(), dict(scores.direction),
                                 effect_label="ablation KL (mean over items)",
                                 title=f"{what}: mean score vs ablation effect per head (n={n})"), scatter, args)
    write_figure(score_vs_effect({f"attribution ({m})": effects["attribution"].size(m).numpy()
                                  for m in AGREEMENT_METRICS[:1]}, effects["ablation"].size("kl").numpy(),
                                 {}, effect_label="ablation KL",
                                 title=f"{what}: attribution estimate vs ablation per head (Spearman "
                                       f"{spearman_kl}; ablation cost {cost_ratio:.0f}x attribution in CPU time)"),
                 attribution, args)


def write_oracle_figure(what: str, key: str, n_items: int, protocol: str, oracle_table: pd.DataFrame,
                        recorded, recorded_protocol: str, args) -> None:
    """The recorded sweep's curves (where figures/ holds one for the task) with the oracle curves beside them."""
    curves = pd.concat([recorded, oracle_table], ignore_index=True) if recorded is not None else oracle_table
    base = recorded[recorded["target_fraction"] == 0].iloc[0] if recorded is not None else oracle_table.iloc[0]
    held = oracle_table[oracle_table["score"] == "oracle (held-out items)"]
    heldout = held[held["target_fraction"] == 0].iloc[0]
    title = (f"{what}: recorded sweep (n={int(base['n'])}, {recorded_protocol} rows; the oracle: "
             f"{protocol} rows) with the oracle (heads zeroed in order of measured ablation KL on {n_items} ranking "
             f"items; also on {int(heldout['n'])} held-out items, baseline {100 * heldout['accuracy']:.1f}%)")
    write_figure(ablation_curves(curves, baseline=100 * float(base["accuracy"]), chance=float(base["chance"]),
                                 title=title), Path(args.figures) / f"head_effects_oracle_{key}", args)


def redraw_oracle_figure(key: str, args) -> None:
    """The oracle figure drawn again from the recorded ``head_effects_<task>.json`` over the sweep now recorded in
    figures/ (no model needed); the JSON's ``recorded_sweep`` entry is updated to say which sweep it shows."""
    figures = Path(args.figures)
    path = figures / f"head_effects_{key}.json"
    result = json.loads(path.read_text())
    oracle_table = pd.DataFrame(result["oracle"]["table"]).sort_values(["score", "target_fraction"], kind="stable")
    sweep_csv = figures / f"sweep_{key}.csv"
    recorded, recorded_protocol = recorded_sweep(sweep_csv)
    what = what_of(result["model"]["name"], result["data"]["task"], result["data"], result["weight_basis"],
                   result["seed"])
    write_oracle_figure(what, key, result["n"], result["protocol"], oracle_table, recorded, recorded_protocol, args)
    result["recorded_sweep"] = dict(file=sweep_csv.name, protocol=recorded_protocol) if recorded is not None else None
    atomic_write_json(path, result)  # not write_record: the numbers, and so their provenance, are the recorded run's


def what_of(model: str, name: str, data: dict, weight_basis: str, seed: int) -> str:
    return f"{model} on {name} ({data['split']}, {data['format']}, weight basis {weight_basis}, seed {seed})"


def run_task(model, name: str, args) -> dict:
    figures, key = Path(args.figures), recorded_name(args.model, name)
    task = load_task(name, n=args.n, seed=args.seed, split=args.split or sweep_split(args.figures, key))
    scores = score_heads(model, task, batch_size=args.batch_size, protocol=args.protocol)
    effects, costs = {}, {}
    for method in METHODS:
        effects[method], costs[method] = effects_of(model, task, key, method, args)
        print(f"[{name}] {method}: {costs[method]['wall_s']:.0f} s wall, {costs[method]['cpu_s']:.0f} s CPU")

    agreement, agreement_meta, attribution_vs_ablation = agreement_of(scores, effects, args)
    chance = agreement_meta["precision_chance"]
    cost_ratio = costs["ablation"]["cpu_s"] / max(costs["attribution"]["cpu_s"], 1e-9)

    order = effects["ablation"].order("kl")
    heldout = heldout_items(task, args.n, args.heldout_n, args.seed)
    oracles = oracle_curves(model, key, task, heldout, order, args)
    oracle_table = pd.concat([o.to_dataframe() for o in oracles.values()], ignore_index=True)
    oracle_table["mode"] = oracle_table["mode"].replace("static", "oracle")  # drawn as a reference, not a score

    meta = model_meta(model)
    per_head = pd.concat([effects[m].to_dataframe() for m in METHODS], ignore_index=True)
    stem = f"head_effects_{key}"
    atomic_write_text(figures / f"{stem}.csv", per_head.to_csv(index=False, float_format="%.6g"))
    atomic_write_text(figures / f"head_effects_agreement_{key}.csv", agreement.to_csv(index=False,
                                                                                       float_format="%.4g"))
    what = what_of(meta["name"], name, task.meta(), meta["weight_basis"], args.seed)
    sweep_csv = figures / f"sweep_{key}.csv"
    recorded, recorded_protocol = recorded_sweep(sweep_csv)
    write_oracle_figure(what, key, len(task), effects["ablation"].meta["protocol"], oracle_table, recorded,
                        recorded_protocol, args)
    shown = agreement[(agreement["method"] == "ablation") & (agreement["metric"] == "kl")]
    write_figure(agreement_bars(shown, title=f"{what}: rank agreement of each score with the ablation KL of each "
                                             f"head (n={len(task)} items, bootstrap 95%)"),
                 figures / f"head_effects_agreement_{key}", args)
    write_scatters(scores, effects, what, f"{attribution_vs_ablation['kl']['spearman']:.2f}", cost_ratio,
                   figures / f"head_effects_scatter_{key}", figures / f"head_effects_attribution_{key}", args)

    result = dict(
        what="ground-truth effect of every head (zeroed on hook_z at all positions; attribution patching beside "
             "it) and each score's rank agreement with it; oracle zeroing curve",
        model=meta, weight_basis=meta["weight_basis"], protocol=args.protocol, data=task.meta(),
        heldout_data=heldout.meta(), n=len(task),
        heldout_n=len(heldout), seed=args.seed, chance=task.chance, n_boot=args.n_boot,
        precision_chance=chance, agreement_meta=agreement_meta, costs=costs, cost_ratio_cpu=cost_ratio,
        attribution_vs_ablation=attribution_vs_ablation,
        baselines={m: effects[m].meta["baseline"] for m in METHODS},
        recorded_sweep=dict(file=sweep_csv.name, protocol=recorded_protocol) if recorded is not None else None,
        oracle=dict(fractions=args.fractions, order_metric="ablation kl (mean |per-item| over ranking items)",
                    order=[list(h) for h in order],
                    zeroable_within_1_point_pct={k: o.zeroable_within(1.0, mode="static") for k, o in oracles.items()},
                    normalised_auc_pct={k: o.normalised_auc(mode="static") for k, o in oracles.items()},
                    table=oracle_table.to_dict(orient="records")),
        agreement=agreement.to_dict(orient="records"))
    write_record(figures / f"{stem}.json", result)
    cols = ["score", "spearman", "spearman_low", "spearman_high", "kendall", "precision_at_10pct"]
    print(shown[cols].to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    print(f"[{name}] attribution vs ablation (KL sizes): Spearman {attribution_vs_ablation['kl']['spearman']:.2f}; "
          f"cost ratio (CPU) {cost_ratio:.0f}x")
    return result


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.redraw:
        for name in args.tasks:
            redraw_oracle_figure(recorded_name(args.model, name), args)
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_model(args.model)
    start = time.perf_counter()
    for name in args.tasks:
        run_task(model, name, args)
    print(f"done in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
