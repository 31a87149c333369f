"""The report's stages of whole layers: per-layer scores with the attention of whole layers removed in the order of
each ranking (against a random order), and the attention rank of every layer with its lazy layers."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from lens_heads.collapse.rank import attention_rank
from lens_heads.data.items import Task
from lens_heads.experiments.layer_ranking import layer_scores
from lens_heads.experiments.layer_removal import random_orders, ranking_plans, removal_curves
from lens_heads.heads.scoring import HeadScores
from lens_heads.models.nonfinite import refuse_nonfinite_forward
from lens_heads.plumbing import distributed
from lens_heads.plumbing.cache import Cache
from lens_heads.report.config import ReportConfig
from lens_heads.report.stage_result import StageResult, jsonable
from lens_heads.report.sweep_stages import INTERVAL_RESAMPLES
from lens_heads.viz.layer_figures import layer_removal_curves, rank_profile


@dataclass(frozen=True)
class LayersResult(StageResult):
    task: Task = field(kw_only=True)


LAYER_COUNTS = (1, 2, 4)  # layers removed on each curve
LAYER_RANKINGS = ("Block Influence", "attention rank", "AHON (LN) zero share")


def layers_stage(model, task, scores: HeadScores, config: ReportConfig, cache: Cache,
                 base_key: dict) -> LayersResult:
    """Per-layer scores on the task (``lh.layer_scores``) and the attention of 1, 2 and 4 layers (those fewer than
    the model has) removed in the order of each ranking and of a random order (units kept in the cache folder),
    each ranking against random."""
    layers = layer_scores(model, task, scores=scores, settings=config.evaluation, progress=config.progress)
    randoms = random_orders(layers.n_layers, (config.seed,))
    random = next(iter(randoms))
    orders = {**{name: layers.order(name) for name in LAYER_RANKINGS}, **randoms}
    counts = [k for k in LAYER_COUNTS if k < layers.n_layers]  # a model of few layers keeps at least one
    plans = ranking_plans(model, orders, counts, part="attention")
    folder = cache.path(f"layers-{task.name}", {**base_key, "data": task.meta()})
    curves = removal_curves(model, task, plans, out_dir=folder, settings=config.evaluation,
                            progress=config.progress)
    table = curves.to_dataframe(n_resamples=INTERVAL_RESAMPLES, seed=config.seed)
    table["part"], table["ranking"] = "attention", [c.rsplit(" · ", 1)[0] for c in table["curve"]]
    table["style"] = ["random" if r == random else "" for r in table["ranking"]]
    tests = pd.concat([curves.difference(f"{name} · attention", f"{random} · attention", metric,
                                         n_resamples=INTERVAL_RESAMPLES, seed=config.seed)
                       for name in LAYER_RANKINGS for metric in ("kl", "gold_logprob_change")], ignore_index=True)
    t = task.name
    numbers = {"data": task.meta(), "layer_scores": jsonable(layers.to_dict()), "orders": orders,
               "counts": counts, "curves": jsonable(table.to_dict(orient="records")),
               "tests": jsonable(tests.to_dict(orient="records")), "lazy_layers": layers.lazy.nonzero()[0].tolist()}
    fig = layer_removal_curves(table, title=f"Removing the attention of whole layers on {t} (n={len(task)})")
    return LayersResult(numbers, {f"layer_scores_{t}": layers.to_dataframe(), f"layer_removal_{t}": table,
                                  f"layer_removal_tests_{t}": tests}, {f"layer_removal_{t}": fig}, task=task)


@dataclass(frozen=True)
class RankResult(StageResult):
    task: Task = field(kw_only=True)


def rank_stage(model, task, config: ReportConfig, cache: Cache, base_key: dict) -> RankResult:
    """Approximate rank (90% energy) of every head's attention on the first task's item prompts, per layer; lazy
    layers marked by the library's rule."""
    inputs = [item.prompt for item in task][: config.rank_n]
    key = {**base_key, "stage": "rank", "data": task.meta(), "rank_n": len(inputs)}

    def compute():
        # attention_rank reads NaN patterns as rank 0 (a "lazy" layer): refuse a model whose forward is not finite
        refuse_nonfinite_forward(model, [model.to_tokens(text)[0].tolist() for text in inputs], "attention rank")
        # per-input ranks: item prompts differ in length, and the averaged matrix would cut all to the shortest
        profile = attention_rank(model, inputs, average=False, batch_size=config.batch_size,
                                 progress=config.progress)
        return jsonable(profile.to_dict())

    profile = cache.json("rank", key, compute) if distributed.is_main() else compute()
    m = profile.get("meta", {})
    profile = {**profile, "inputs": {"task": task.name, "n": len(inputs), "what": "item prompts",
                                     "mean_length": m.get("mean_length"), "min_length": m.get("min_length"),
                                     "max_length": m.get("max_length")}}
    aggregation = profile.get("aggregation", "rank")  # profiles cached before aggregations were named: "rank"
    df = pd.DataFrame({"layer": range(len(profile["max_rank"])), "max_rank": profile["max_rank"],
                       "mean_rank": profile["mean_rank"], "mass_columns": profile["mass_columns"],
                       "lazy": profile["lazy"], "aggregation": aggregation})
    fig = rank_profile(profile["max_rank"], profile["mean_rank"], profile["mass_columns"], profile["lazy"],
                       title=f"Attention rank per layer ({len(inputs)} {task.name} prompts)",
                       aggregation=aggregation)
    return RankResult(profile, {"rank_profile": df}, {"rank_profile": fig}, task=task)
