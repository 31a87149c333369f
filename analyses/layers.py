"""Whole layers: lazy layers meet inactive heads, and whole-layer removal in the order of five rankings.

Per task (the same items for everything; lm-eval rows, the sweep's):

1. **Per-layer scores** (``lh.layer_scores``): ShortGPT's Block Influence, the attention rank in both of the library's
   aggregations (the mean of per-input ranks on the items' prompts, and the rank of their averaged matrix), AHON and
   AHON (LN) layer means and the share of each layer's AHON (LN) values below the pooled 30% threshold.
2. **Each layer removed alone**, its attention (all its heads and b_O) and its whole block: KL from the unablated
   answers, the gold answer's log-prob change and the accuracy change, with bootstrap intervals over items. The
   measured effect orders the layers for the oracle.
3. **Lazy layers meet inactive heads**: per layer, beside 1 and 2, the share of its heads each score zeroed at
   10/20/30% in the recorded sweep (``figures/sweep_<task>_units.json.gz``, its n) and the sum of its heads'
   single-head ablation effects (``figures/head_effects_<task>.csv``, n=20); the lazy layers' removal against the
   mean of the other layers' (paired over items).
4. **Removal curves**: remove the first k layers of each ranking (attention, and whole blocks): Block Influence
   (lowest first), attention rank (lowest first), AHON layer mean (lowest first) and the share of AHON (LN)-inactive
   values (highest first; attention only), the oracle (smallest measured effect first) and random orders (one per
   seed; their mean is the random curve). Equal compute: k x n_heads heads zeroed by ``--head-score`` (the best head
   score of the recorded sweeps by KL AUC; its static ranking by mean over these rows). Paired tests of every
   ranking against random, the oracle and the head score.

Units resume from ``--out``. Writes to ``--figures``: ``layers_<task>.csv`` (per layer), ``layers_<task>.png``
(aligned panels), ``layer_removal_<task>.csv`` (every curve point with intervals), ``layer_removal_<task>.png``,
``layer_removal_tests_<task>.csv`` (paired differences) and ``layers_<task>.json`` (settings, data, orders, the
lazy-layer tests, layer scores). For a model other than the embedded one, ``<task>`` reads ``<model>_<task>`` in
every name, recorded inputs included (``sweep_gemma-3-270m_arc_easy_units.json.gz``), as ``analyses/sweep.py`` names
its files.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from lens_heads import layer_scores, load_model, load_task, score_heads
from lens_heads.ablation.specs import LayerRemoval
from lens_heads.experiments.layer_ranking import LayerScores
from lens_heads.experiments.layer_removal import (
    RemovalCurves,
    head_plan,
    random_orders,
    ranking_plans,
    removal_curves,
    zeroed_by_layer,
)
from lens_heads.experiments.task_runs import TaskRunSettings, recorded_name, split_of
from lens_heads.heads.scores import SCORE_NAMES, most_inactive
from lens_heads.heads.scoring import HeadScores
from lens_heads.models.loading import model_meta
from lens_heads.plumbing.io import atomic_write_json, atomic_write_text
from lens_heads.plumbing.provenance import write_record
from lens_heads.plumbing.settings import from_args, option
from lens_heads.stats import calling, inference
from lens_heads.sweep.result import SweepResult
from lens_heads.sweep.unit_store import read_units
from lens_heads.viz.export import save_figure
from lens_heads.viz.layer_figures import layer_panels, layer_removal_curves

ROOT = Path(__file__).resolve().parents[1]
ORACLE = "oracle (measured layer effect)"
RANKINGS = {"attention": ("Block Influence", "attention rank", "AHON layer mean", "AHON (LN) zero share"),
            "block": ("Block Influence", "attention rank")}
SHARES = (0.1, 0.2, 0.3)


@dataclass(frozen=True)
class LayersSettings(TaskRunSettings):
    """What one run measures and writes (each field is a ``--flag``)."""

    n: int = option(200, "items per task (the same items for every measurement)")
    seed: int = option(0, "sampling and bootstrap seed")
    split: str | None = option(None, "the evaluated split (default: the recorded sweep's, so the zero shares and the "
                               "removals are measured on the same items)")
    counts: tuple[int, ...] = option((1, 2, 4, 8), "numbers of layers removed on each curve")
    parts: tuple[str, ...] = option(("attention", "block"), "what of a layer is removed: attention, block or both "
                                    "(comma-separated)", parse=lambda text: _parts(text))
    random_seeds: tuple[int, ...] = option((0, 1, 2), "seeds of the random layer orders")
    head_score: str = option("AHON (LN)", "the head score whose static ranking zeroes as many heads as k layers hold",
                             choices=SCORE_NAMES)
    n_boot: int = option(2000, "bootstrap resamples (and permutations) over items")
    batch_size: int = option(8, "forward rows per batch")
    chunk: int = option(12, "units sharing one pass over the items")
    out: str = option(str(ROOT / "runs" / "layer_removal"), "resumable units")


def _parts(text: str) -> tuple[str, ...]:
    parts = tuple(p.strip() for p in text.split(",") if p.strip())
    if not parts or any(p not in RANKINGS for p in parts):
        raise ValueError(f"parts: choose from {', '.join(RANKINGS)} (comma-separated), got {text!r}")
    return parts


def parse_args(argv=None) -> LayersSettings:
    return from_args(LayersSettings, argv, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)


def cached_scores(model, task, folder: Path, args) -> tuple[HeadScores, LayerScores]:
    """The task's head scores and layer scores, kept in ``folder`` (a rerun reads them back)."""
    head_path, layer_path = folder / "head_scores.safetensors", folder / "layer_scores.json"
    if head_path.exists():
        scores = HeadScores.load(head_path)
    else:
        scores = score_heads(model, task, batch_size=args.batch_size)
        scores.save(head_path)
    if layer_path.exists():
        return scores, LayerScores.from_dict(json.loads(layer_path.read_text()))
    layers = layer_scores(model, task, scores=scores, batch_size=args.batch_size)
    atomic_write_json(layer_path, layers.to_dict())
    return scores, layers


def single_layer_effects(model, task, folder: Path, args) -> tuple[RemovalCurves, pd.DataFrame]:
    """Each layer's attention and block removed alone: the curves (one point each) and one row per (part, layer)."""
    specs = [LayerRemoval((layer,), part=part) for part in args.parts for layer in range(model.cfg.n_layers)]
    curves = removal_curves(model, task, {"each layer alone": specs}, out_dir=folder, batch_size=args.batch_size,
                            chunk=args.chunk)
    table = curves.to_dataframe(n_resamples=args.n_boot, seed=args.seed)
    by = {s.ranked_by: s for s in specs}
    table["part"] = [by[c].part for c in table["curve"]]
    table["layer"] = [by[c].layers[0] for c in table["curve"]]
    return curves, table


def orders_of(layers: LayerScores, effects: pd.DataFrame, args) -> dict[str, dict[str, list[int]]]:
    """Per part, every ranking's order of the layers (the first removed first)."""
    out = {}
    for part in args.parts:
        names, mine = RANKINGS[part], effects[effects["part"] == part]
        oracle = [int(layer) for layer in mine.sort_values(["kl", "layer"])["layer"]]
        out[part] = {**{name: layers.order(name) for name in names}, ORACLE: oracle,
                     **random_orders(layers.n_layers, args.random_seeds)}
    return out


def head_order(scores: HeadScores, name: str) -> list[tuple[int, int]]:
    """Every head, the most inactive by its mean score over the rows first (the sweep's static ranking)."""
    mean = scores.mean(name)
    return most_inactive(mean, scores.direction[name], mean.numel())


def removal(model, task, folder: Path, orders: dict, scores: HeadScores, args) -> tuple[RemovalCurves, dict]:
    """Every ranking's curve per part, the random orders' mean, the head score's equal-compute curve."""
    plans, style = {}, {}
    for part, by_name in orders.items():
        plans.update(ranking_plans(model, by_name, args.counts, part=part))
        for name in by_name:
            style[f"{name} · {part}"] = (part, name, "random seed" if name.startswith("random") else
                                         "oracle" if name == ORACLE else "")
    heads = f"{args.head_score} heads (static)"
    plans[heads] = head_plan(model, head_order(scores, args.head_score), args.counts, label=heads)
    style[heads] = ("attention", heads, "heads")
    curves = removal_curves(model, task, plans, out_dir=folder, batch_size=args.batch_size, chunk=args.chunk)
    for part in orders:
        label = f"random (mean of {len(args.random_seeds)} seeds) · {part}"
        curves.mean_of([f"random (seed {s}) · {part}" for s in args.random_seeds], label)
        style[label] = (part, label.rsplit(" · ", 1)[0], "random")
    return curves, style


def removal_tests(curves: RemovalCurves, style: dict, args) -> pd.DataFrame:
    """Every ranking against the random mean and the oracle of its part, and the head score against every
    attention ranking (equal compute), in each metric: paired differences with BH-adjusted p-values."""
    pairs = []
    for curve, (part, name, kind) in style.items():
        if kind in ("random", "random seed", "heads"):
            continue
        random = next(c for c, (p, _, k) in style.items() if p == part and k == "random" and "mean" in c)
        pairs.append((curve, random))
        if kind != "oracle":
            pairs.append((curve, f"{ORACLE} · {part}"))
        if part == "attention":
            pairs.append((f"{args.head_score} heads (static)", curve))
    rows = [row for a, b in pairs for metric in ("kl", "gold_logprob_change", "accuracy_change")
            for row in curves.difference(a, b, metric, n_resamples=args.n_boot, seed=args.seed).to_dict("records")]
    return calling.call_table(pd.DataFrame(rows))  # the table is the family its p-values are adjusted over


def layer_table(layers: LayerScores, effects: pd.DataFrame, sweep: SweepResult, heads: pd.DataFrame, args
                ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Item 1's table, one row per layer: rank, the recorded sweep's zero shares, the recorded summed single-head
    effects, the layer's removal effects; and the zero shares as scores x layers at 30% for the figure."""
    table = layers.to_dataframe()
    for part in args.parts:
        mine = effects[effects["part"] == part].set_index("layer")
        for metric in ("kl", "gold_logprob_change", "accuracy_change"):
            for suffix in ("", "_low", "_high"):
                table[f"{part}_{metric}{suffix}"] = mine.loc[table["layer"], f"{metric}{suffix}"].to_numpy()
    heads = heads[heads["method"] == "ablation"]
    for metric in ("kl", "gold_logprob"):
        summed = heads[heads["metric"] == metric].groupby("layer")["mean"].sum()
        table[f"summed_head_{metric}"] = summed.loc[table["layer"]].to_numpy()
    shares = zeroed_by_layer(sweep)
    shares = shares[shares["target_fraction"].round(6).isin(SHARES)]
    for (curve, fraction), group in shares.groupby(["curve", "target_fraction"]):
        table[f"zeroed_{fraction:.0%}_{curve}"] = group.set_index("layer").loc[table["layer"], "share"].to_numpy()
    at = shares[np.isclose(shares["target_fraction"], max(SHARES))]
    grid = at.pivot(index="curve", columns="layer", values="share")
    return table, grid.loc[[c for c in [*SCORE_NAMES, "random"] if c in grid.index]]


def lazy_tests(single: RemovalCurves, layers: LayerScores, heads_n: int, task, args) -> list[dict]:
    """Per lazy layer and part: its removal against the mean removal of the other (not lazy) layers, paired over
    the items; and the same on the items that ranked the recorded head effects."""
    lazy = [int(layer) for layer in np.flatnonzero(layers.lazy)]
    rest = [layer for layer in range(layers.n_layers) if layer not in lazy]
    ids = [it.id for it in single.baseline.items]
    ranking_ids = {it.id for it in load_task(task.name, n=heads_n, seed=args.seed, split=task.split)}
    subsets = {f"all {len(ids)} items": np.arange(len(ids)),
               f"the {heads_n} head-effect items": np.array([i for i, x in enumerate(ids) if x in ranking_ids])}
    out = []
    for part in args.parts:
        for metric in ("kl", "gold_logprob_change"):
            others = np.mean([single.values(f"layers {layer} · {part}", metric)[0] for layer in rest], axis=0)
            for layer in lazy:
                mine = single.values(f"layers {layer} · {part}", metric)[0]
                for label, idx in subsets.items():
                    if len(idx) < 2:
                        continue
                    out.append(calling.paired_tests(mine[idx][None], others[idx][None], [f"layer {layer}"],
                                            metric != "kl", a=f"layer {layer} {part}", b=f"mean of the {len(rest)} "
                                            f"non-lazy layers", metric=metric, items=label,
                                            n_resamples=args.n_boot, seed=args.seed))
    return calling.call_table(pd.concat(out, ignore_index=True)).to_dict("records") if out else []


def write_figure(fig, path: Path, args) -> None:
    save_figure(fig, path, png=not args.no_png, plotlyjs="cdn")


def run_task(model, name: str, args) -> None:
    figures, key = Path(args.figures), recorded_name(args.model, name)
    sweep = read_units(figures / f"sweep_{key}_units.json.gz")  # the recorded inputs, read before any work
    heads = pd.read_csv(figures / f"head_effects_{key}.csv")
    split = args.split or split_of(sweep)
    task = load_task(name, n=args.n, seed=args.seed, split=split)
    folder = Path(args.out) / f"{key}-{split}-n{args.n}-seed{args.seed}-lm-eval"
    start, cpu = time.perf_counter(), time.process_time()
    scores, layers = cached_scores(model, task, folder, args)
    single, effects = single_layer_effects(model, task, folder, args)
    orders = orders_of(layers, effects, args)
    curves, style = removal(model, task, folder, orders, scores, args)
    table = curves.to_dataframe(n_resamples=args.n_boot, seed=args.seed)
    table.insert(1, "part", [style[c][0] for c in table["curve"]])
    table.insert(2, "ranking", [style[c][1] for c in table["curve"]])
    table.insert(3, "style", [style[c][2] for c in table["curve"]])
    tests = removal_tests(curves, style, args)
    per_layer, grid = layer_table(layers, effects, sweep, heads, args)
    heads_n = int(heads["n"].iloc[0])
    lazy = lazy_tests(single, layers, heads_n, task, args)

    meta = model_meta(model)
    base = single.baseline
    what = (f"{meta['name']} on {name} ({task.split}, n={len(task)}, seed {args.seed}, weight basis "
            f"{meta['weight_basis']}; baseline {100 * base.accuracy:.1f}%, chance {100 * task.chance:.0f}%)")
    atomic_write_text(figures / f"layers_{key}.csv", per_layer.to_csv(index=False, float_format="%.6g"))
    atomic_write_text(figures / f"layer_removal_{key}.csv", table.to_csv(index=False, float_format="%.6g"))
    atomic_write_text(figures / f"layer_removal_tests_{key}.csv", tests.to_csv(index=False, float_format="%.6g"))
    write_figure(layer_panels(per_layer, grid, title=f"Lazy layers meet inactive heads: {what}"),
                 figures / f"layers_{key}", args)
    write_figure(layer_removal_curves(table, title=f"Removing whole layers: {what}; 95% bootstrap intervals"),
                 figures / f"layer_removal_{key}", args)
    write_record(figures / f"layers_{key}.json", dict(
        what="per-layer scores, each layer removed alone, the recorded sweep's zero shares and head effects per "
             "layer, whole-layer removal curves in each ranking's order with paired tests",
        model=meta, weight_basis=meta["weight_basis"], data=task.meta(), n=len(task), seed=args.seed,
        protocol="lm-eval", chance=task.chance, settings=asdict(args),
        baseline=dict(accuracy=base.accuracy, ci95=list(base.ci95), n=base.n),
        intervals=dict(method=inference.BOOTSTRAP, n_resamples=args.n_boot, confidence=inference.CONFIDENCE,
                       tests=inference.PERMUTATION + "; Benjamini-Hochberg over each table's tests", calling_rule=calling.RULE),
        recorded_inputs=dict(zero_shares=f"sweep_{key}_units.json.gz (n={len(sweep.baseline.items)}, target shares "
                                         f"{list(SHARES)})",
                             head_effects=f"head_effects_{key}.csv (ablation, n={heads_n}, no per-item records: "
                                          "the summed effects have no interval)"),
        layer_scores=layers.to_dict(), orders=orders, head_order_score=args.head_score,
        lazy_layers=[int(x) for x in np.flatnonzero(layers.lazy)], lazy_tests=lazy,
        cost=dict(wall_s=time.perf_counter() - start, cpu_s=time.process_time() - cpu,
                  threads=torch.get_num_threads(), what="this invocation only: units and scores found in --out were "
                                                        "read back, not computed again")))
    print(f"[{name}] done: {time.process_time() - cpu:.0f} CPU s")


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_model(args.model)
    for name in args.tasks:
        run_task(model, name, args)


if __name__ == "__main__":
    main()
