"""The report pipeline: load the model, run each analysis stage through the library, write the output folder.

Stages, in order: model card; head scores (``lens_heads.score_heads``) with heatmaps, per-layer distributions and
thresholds; the ablation sweep (``lens_heads.sweep.run_sweep``) with its random baseline; where the report holds more
than one sweep (several tasks, or recorded sweeps given with ``--compare``), their comparison (``lens_heads.compare``);
the attention-rank profile (``lens_heads.attention_rank``); attention patterns of the most and least active heads
(circuitsvis). Every stage only calls the library and formats what comes back. Finished stage outputs are cached in
``<out>/cache`` and reused on a rerun with the same settings; a stage whose library module is missing is reported as
unavailable, never faked.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import math
import platform
import sys
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from lens_heads import distributed
from lens_heads.compare import read_sweep
from lens_heads.io import atomic_write_json, atomic_write_text
from lens_heads.models import load_model, model_meta
from lens_heads import plots as figures
from lens_heads.report import attention
from lens_heads.report.cache import StageCache
from lens_heads.report.comparison import stage_compare
from lens_heads.report.config import ACTIVITY_SCORE, ReportConfig
from lens_heads.report.render import Figure, Raw, Section, Table, Text, render_page
from lens_heads.tasks import load_task

class StageUnavailable(RuntimeError):
    """A library module a stage needs is not installed / not written yet."""


def library(module: str):
    """Import a lens_heads module, or say plainly that the stage can't run without it."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name and module.startswith(e.name):
            raise StageUnavailable(f"module {module} is not part of this lens_heads installation") from None
        raise


@dataclass
class Outputs:
    """What the stages produce: results.json content, page sections, CSV tables and PNG figures."""

    results: dict
    sections: list[Section] = field(default_factory=list)
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    pngs: dict[str, object] = field(default_factory=dict)


def build_report(config: ReportConfig, *, model=None, log=None) -> dict:
    """Run every stage for ``config`` and write the report folder; returns the ``results.json`` content."""
    main_process = distributed.is_main()  # under torchrun every rank computes, rank 0 alone writes
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True) if main_process else None)
    out_dir = Path(config.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cache = StageCache(out_dir)
    torch.manual_seed(config.seed)
    started, cpu_started = time.perf_counter(), time.process_time()

    log(f"[report] loading {config.model} ...")
    t0 = time.perf_counter()
    if model is None:
        model = load_model(config.model, device=config.device, dtype=config.dtype)
    meta = model_meta(model)
    out = Outputs(results={
        "report_format": 1,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "settings": config.to_dict(),
        "versions": versions(),
        "machine": {"platform": platform.platform(), "cpus": _cpus(), "torch_threads": torch.get_num_threads()},
        "model": meta,
        "weight_basis": meta.get("weight_basis", "unknown"),
        "stages": {"load_model": {"status": "done", "seconds": round(time.perf_counter() - t0, 2)}},
    })
    model_card(out, meta, config)
    cache_key = {"model": meta.get("source", meta.get("name")), "name": config.model, "dtype": str(config.dtype),
                 "basis": meta.get("weight_basis"), "seed": config.seed}

    tasks = {}
    for name in config.tasks:
        tasks[name] = load_task(name, n=config.n, seed=config.seed)
    out.results["data"] = {name: task.meta() for name, task in tasks.items()}

    scores_by_task = {}
    for name, task in tasks.items():
        scores_by_task[name] = run_stage(out, f"scores:{name}", log, lambda: stage_scores(
            out, model, task, config, cache, cache_key))
    sweeps = []
    for name, task in tasks.items():
        sweeps.append(run_stage(out, f"ablation:{name}", log, lambda: stage_ablation(
            out, model, task, scores_by_task[name], config, cache, cache_key)))
    sweeps = [s for s in sweeps if s is not None]
    if len(sweeps) + len(config.compare) > 1:
        run_stage(out, "compare", log, lambda: stage_compare(
            out, sweeps + [read_sweep(path) for path in config.compare], config))
    for name, task in tasks.items():
        run_stage(out, f"effects:{name}", log, lambda: stage_effects(
            out, model, task, scores_by_task[name], config, cache, cache_key))
    first = next(iter(tasks.values()))
    run_stage(out, "rank", log, lambda: stage_rank(out, model, first, config, cache, cache_key))
    first_scores = next((s for s in scores_by_task.values() if s is not None), None)
    run_stage(out, "attention", log, lambda: stage_attention(out, model, first_scores, config))

    if main_process:
        write_outputs(out, out_dir, config, log)
    out.results["stages"]["total"] = {"status": "done", "seconds": round(time.perf_counter() - started, 1),
                                      "cpu_seconds": round(time.process_time() - cpu_started, 1)}
    if main_process:
        atomic_write_json(out_dir / "results.json", out.results)
    log(f"[report] done in {time.perf_counter() - started:.0f} s: {out_dir / 'report.html'}")
    return out.results


def run_stage(out: Outputs, name: str, log, fn):
    """Run one stage; record its status and time. A missing library module or a failing stage is shown as such."""
    log(f"[report] stage {name} ...")
    t0, c0 = time.perf_counter(), time.process_time()
    entry: dict = {"status": "done"}
    value = None
    try:
        value = fn()
    except StageUnavailable as e:
        entry = {"status": "unavailable", "reason": str(e)}
        out.sections.append(Section(f"{_stage_title(name)} (unavailable)", [Text(
            f"This stage did not run: {e}. No numbers are shown for it.", "unavailable")]))
    except (KeyboardInterrupt, MemoryError):
        raise
    except Exception as e:  # a stage's bug must not lose the other stages' work; it is shown and exits non-zero
        entry = {"status": "failed", "reason": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
        log(f"[report] stage {name} FAILED: {type(e).__name__}: {e}")
        out.sections.append(Section(f"{_stage_title(name)} (failed)", [Text(
            f"This stage failed with {type(e).__name__}: {e}. See results.json for the traceback.", "unavailable")]))
    # CPU seconds (all threads) beside wall seconds: on a shared machine the wall time says little.
    entry.update(seconds=round(time.perf_counter() - t0, 2), cpu_seconds=round(time.process_time() - c0, 2))
    out.results["stages"][name] = entry
    if entry["status"] != "done":
        log(f"[report] stage {name}: {entry['status']} ({entry['reason']})")
    return value


def _stage_title(name: str) -> str:
    kind, _, task = name.partition(":")
    titles = {"scores": "Head scores", "ablation": "Ablation sweep", "rank": "Attention rank",
              "attention": "Attention patterns", "compare": "Comparison of sweeps"}
    return titles.get(kind, kind) + (f" on {task}" if task else "")


# ---------------------------------------------------------------- model card


def model_card(out: Outputs, meta: dict, config: ReportConfig) -> None:
    rows = [("model", meta.get("name")), ("source", meta.get("source")), ("layers", meta["n_layers"]),
            ("query heads per layer", meta["n_heads"]), ("key/value heads per layer", meta["n_kv_heads"]),
            ("attention heads in all", meta["n_layers"] * meta["n_heads"]), ("d_model", meta["d_model"]),
            ("d_head", meta["d_head"]), ("context length", meta["n_ctx"]),
            ("parameters (a tied unembedding counted once)", f"{meta['n_params']:,}"),
            ("weight basis", meta.get("weight_basis")),
            ("dtype", meta.get("dtype", config.dtype))]
    df = pd.DataFrame(rows, columns=["property", "value"])
    df["value"] = df["value"].astype(str)
    out.tables["model_card"] = df
    settings = (f"Settings: tasks {', '.join(config.tasks)}; {config.n} items per task; rank profile on "
                f"{config.rank_n} inputs; target fractions {', '.join(f'{f:g}' for f in config.fractions)}; "
                f"ablation scores {', '.join(config.scores)}; seed {config.seed}; batch size {config.batch_size}"
                f"{'; --quick preset' if config.quick else ''}.")
    out.sections.append(Section("Model card", [Table(df), Text(settings, "note")], anchor="model-card"))


# ---------------------------------------------------------------- head scores


def stage_scores(out: Outputs, model, task, config: ReportConfig, cache: StageCache, base_key: dict):
    """Score every head on the task's items (cached), then heatmaps, per-layer distributions and thresholds."""
    scores_mod = library("lens_heads.scores")
    scoring = library("lens_heads.head_scores")
    distributions = library("lens_heads.distributions")
    key = {**base_key, "stage": "scores", "data": task.meta(), "score_names": list(scores_mod.SCORE_NAMES)}
    path = cache.path("scores", key, ".safetensors")
    reused = cache.load_json("scores", key) is not None and path.exists()
    if reused:
        scores = scoring.HeadScores.load(path)
    else:
        scores = scoring.score_heads(model, task, batch_size=config.batch_size, progress=config.progress)
        if distributed.is_main():
            scores.save(path)
            cache.save_json("scores", key, {"file": path.name})  # written last: marks the stage as finished

    values = scores.values.float()  # [input, layer, head, score]
    names = list(scores.names)
    mean = values.mean(0)  # [layer, head, score]
    dist = distributions.layer_summary(scores, names)
    summary = {name: {"q0": g["min"].to_numpy(), "q25": g["q25"].to_numpy(), "q50": g["q50"].to_numpy(),
                      "q75": g["q75"].to_numpy(), "q100": g["max"].to_numpy(), "mean": g["mean"].to_numpy()}
               for name, g in ((n, dist[dist["score"] == n].sort_values("layer")) for n in names)}
    thresholds = {name: {float(f): float(t) for f, t in
                         distributions.thresholds(scores, name, list(config.fractions)).items()} for name in names}

    t = task.name
    n_in, n_layers, n_heads = values.shape[:3]
    out.results.setdefault("scores", {})[t] = {
        "data": task.meta(), "n_inputs": n_in, "names": names, "direction": dict(scores.direction),
        "meta": _jsonable(scores.meta), "reused_from_cache": reused,
        "mean_per_head": {name: mean[..., i].tolist() for i, name in enumerate(names)},
        "per_layer": {name: {k: v.tolist() for k, v in s.items()} for name, s in summary.items()},
        "thresholds": {name: {str(f): v for f, v in th.items()} for name, th in thresholds.items()},
    }

    layer, head = np.meshgrid(np.arange(n_layers), np.arange(n_heads), indexing="ij")
    table = pd.DataFrame({"layer": layer.ravel(), "head": head.ravel()})
    for i, name in enumerate(names):
        table[name] = mean[..., i].reshape(-1).numpy()
    out.tables[f"head_scores_{t}"] = table
    out.tables[f"layer_distributions_{t}"] = dist

    heat = figures.score_heatmaps({n: mean[..., i].numpy() for i, n in enumerate(names)}, dict(scores.direction),
                                  title=f"Mean head scores on {t} (n={n_in}); dark = inactive side")
    distfig = figures.layer_distributions(summary, title=f"Per-layer distribution over inputs and heads ({t})")
    out.pngs[f"score_heatmaps_{t}"] = heat
    out.pngs[f"score_distributions_{t}"] = distfig
    blocks = [
        Text(f"Each of the twelve scores of every attention head, averaged over the {n_in} forward rows of "
             f"{len(task)} {t} items ({task.split} split, seed {task.seed}; "
             f"{scores.meta.get('data', {}).get('protocol', 'lm-eval')} rows, the tokens the evaluation runs), in "
             f"the {out.results['weight_basis']} weight basis. Colours "
             "run so that the inactive side is dark for every score (high AWFT, low for the rest). Hover for values."),
        Figure(heat),
        Text("Per-layer spread of each score over all (input, head) values: whiskers are min and max, the box the "
             "quartiles, the dashed line the mean. Pick the score in the menu."),
        Figure(distfig),
    ]
    th = pd.DataFrame([{"score": n, **{f"{100 * f:g}%": v for f, v in thresholds[n].items()}} for n in names])
    out.tables[f"thresholds_{t}"] = th
    blocks.append(Table(th, caption="Thresholds that put each target fraction of pooled (input, layer, head) "
                                    "values on the inactive side"))
    if reused:
        blocks.append(Text("Scores reused from this folder's cache (same model, data and settings).", "note"))
    out.sections.append(Section(f"Head scores on {t}", blocks, anchor=f"scores-{t}"))
    return scores


# ---------------------------------------------------------------- ablation sweep


def stage_ablation(out: Outputs, model, task, scores, config: ReportConfig, cache: StageCache, base_key: dict):
    """Zero heads chosen by each score at each target fraction, with the random baseline (``run_sweep``)."""
    sweep = library("lens_heads.sweep")
    key = {**base_key, "stage": "sweep", "data": task.meta(), "scores": list(config.scores),
           "fractions": list(config.fractions)}
    folder = cache.folder("sweep", key)
    kwargs = dict(scores=list(config.scores), fractions=tuple(config.fractions), out_dir=folder, seed=config.seed,
                  batch_size=config.batch_size, progress=config.progress)
    if scores is not None:
        kwargs["calibration"] = scores
    result = sweep.run_sweep(model, task, **kwargs)
    df = result.to_dataframe()
    t = task.name
    out.tables[f"ablation_{t}"] = df
    zeroable = result.zeroable_within(1.0)
    auc = result.normalised_auc()
    baseline = _baseline(result)
    chance = task.chance
    summary = result.summary(1.0)
    ranking = [str(s) for s in summary["score"]]
    out.tables[f"ablation_summary_{t}"] = summary
    out.results.setdefault("ablation", {})[t] = {
        "data": task.meta(), "baseline": baseline, "chance": chance,
        "protocol": result.meta["protocol"], "zeroable_rule": "authors",
        "zeroable_within_1_point": zeroable, "zeroable_within_1_point_censored": result.zeroable_within(
            1.0, rule="censored"), "table2": result.table2(1.0), "normalised_auc": auc, "auc_ranking": ranking,
        "normalised_auc_kl": result.normalised_auc(metric="kl"),
        "curves": _jsonable(df.to_dict(orient="records")), "meta": _jsonable(getattr(result, "meta", {})),
    }
    fig = figures.ablation_curves(df, baseline=100 * baseline["accuracy"], chance=chance,
                                  title=f"Zeroing heads on {t} (n={len(task)}): accuracy vs share zeroed")
    out.pngs[f"ablation_{t}"] = fig
    lo, hi = baseline.get("ci95") or (math.nan, math.nan)
    out.sections.append(Section(f"Ablation sweep on {t}", [
        Text(f"Baseline accuracy {100 * baseline['accuracy']:.1f}% (95% CI {100 * lo:.1f}-{100 * hi:.1f}, "
             f"n={baseline.get('n', len(task))}) beside chance {100 * chance:.1f}%, on {result.meta['protocol']} "
             f"rows; thresholds from an unablated pass over the same rows. Heads whose score for a row "
             f"crosses the threshold of the target fraction are zeroed (z := 0 before W_O) in the same forward pass; "
             f"the random baseline zeroes each (input, layer, head) with the same probability. The x axis is the "
             f"realised share zeroed."),
        Figure(fig),
        Table(summary, caption="% of heads zeroable within 1 accuracy point by the authors' rule (last crossing of "
                               "baseline - 1 in order of target fraction, interpolated; 0 where a curve never meets "
                               "it) and by the censored rule (the measured range's end where the curve never drops, "
                               "a lower bound: never_drops), the normalised AUC of accuracy (%) over realised % "
                               "zeroed, ranked; "
                               "beside it the normalised AUC of the paired KL from the unablated answers (nats, "
                               "lower is better), the low-variance ranking",
              float_format="{:.3g}"),
        Table(_points_table(df), caption="Every point against the unablated run on the same items (paired)",
              float_format="{:.3g}"),
        Text(f"With {len(task)} items one accuracy point is well inside the noise: read the paired differences and "
             f"the gold answer's log-prob change alongside (all columns in ablation_{t}.csv).", "note"),
    ], anchor=f"ablation-{t}"))
    return result


def _baseline(result) -> dict:
    base = result.baseline
    return {"accuracy": float(base.accuracy), "ci95": [float(x) for x in base.ci95], "n": int(base.n)}


def _points_table(df: pd.DataFrame) -> pd.DataFrame:
    """The sweep's curve points as read on the page: accuracies and paired differences in points, with intervals."""
    rows = df[df["target_fraction"] > 0]
    out = pd.DataFrame({
        "curve": rows["score"], "target %": 100 * rows["target_fraction"],
        "realised %": 100 * rows["realised_fraction"], "accuracy %": 100 * rows["accuracy"],
        "paired diff (points)": 100 * rows["paired_diff"],
        "95% CI": [f"{100 * a:+.1f} .. {100 * b:+.1f}" for a, b in zip(rows["paired_low"], rows["paired_high"])]})
    if "gold_logprob_change" in rows:
        out["gold log-prob change"] = rows["gold_logprob_change"]
    return out


# ---------------------------------------------------------------- head effects and each score's agreement


def stage_effects(out: Outputs, model, task, scores, config: ReportConfig, cache: StageCache, base_key: dict):
    """Attribution-patching effect of every head on the task's items and each score's rank agreement with it;
    skipped with a note under --quick."""
    t = task.name
    if config.quick:
        out.sections.append(Section(f"Head effects on {t}", [Text(
            "Skipped under --quick. The full report measures every head's effect on the task (attribution "
            "patching) and how well each score ranks the heads by it; analyses/head_effects.py does the same with "
            "one ablation per head.", "note")], anchor=f"effects-{t}"))
        out.results.setdefault("effects", {})[t] = {"status": "skipped", "reason": "--quick"}
        return None
    if scores is None:
        raise StageUnavailable("it needs the head scores, which did not run")
    effects_mod = library("lens_heads.effects")
    agreement_mod = library("lens_heads.agreement")
    key = {**base_key, "stage": "effects", "data": task.meta(), "method": "attribution"}
    path = cache.path("effects", key, ".safetensors")
    if cache.load_json("effects", key) is not None and path.exists():
        effects = effects_mod.HeadEffects.load(path)
    else:
        effects = effects_mod.head_effects(model, task, method="attribution", metric="kl",
                                           batch_size=config.batch_size, progress=config.progress)
        effects.save(path)
        cache.save_json("effects", key, {"file": path.name})
    agreement = agreement_mod.score_agreement(scores, effects, n_boot=200, seed=config.seed)
    table = agreement.to_dataframe()
    out.tables[f"effects_agreement_{t}"] = table
    out.tables[f"effects_{t}"] = effects.to_dataframe()
    size = effects.size().numpy()
    mean = {name: scores.mean(name).numpy() for name in scores.names}
    scatter = figures.score_vs_effect(mean, size, dict(scores.direction),
                                      effect_label="KL when zeroed (attribution)",
                                      title=f"Mean score vs measured effect of each head on {t} (n={len(task)})")
    bars = figures.agreement_bars(table, title=f"Rank agreement of each score with the head effects on {t}")
    out.pngs[f"effects_scatter_{t}"], out.pngs[f"effects_agreement_{t}"] = scatter, bars
    out.results.setdefault("effects", {})[t] = {
        "status": "done", "method": "attribution", "metric": "kl", "agreement": _jsonable(table.to_dict("records")),
        "agreement_meta": _jsonable(agreement.meta), "size_per_head": size.tolist(),
        "meta": _jsonable(effects.meta)}
    shown = table[["score", "spearman", "spearman_low", "spearman_high", "kendall", "spearman_per_input",
                   "precision_at_10pct", "precision_at_30pct"]]
    chance = agreement.meta["precision_chance"]
    out.sections.append(Section(f"Head effects on {t}", [
        Text(f"The effect of each head on these {len(task)} items, estimated by attribution patching (first-order "
             "Taylor expansion of zeroing the head's output, from one forward and backward pass per batch): KL "
             "from the intact answer distribution, mean of the absolute per-item values. Each score's Spearman and "
             "Kendall correlation between its activity (the score, negated where high means inactive) and that "
             "effect; positive = the score calls inactive the heads whose removal changes little. Precision@k: of "
             f"the k heads a score calls most inactive, the share among the k with the smallest effect (chance "
             f"{chance['precision_at_10pct']:.2f} at 10%, {chance['precision_at_30pct']:.2f} at 30%). Intervals: "
             "bootstrap over items, 95%."),
        Figure(bars), Table(shown, caption="Agreement with the head effects (every column in "
                                           f"effects_agreement_{t}.csv)", float_format="{:.3g}"),
        Figure(scatter),
        Text("Attribution is a linear estimate: analyses/head_effects.py measures the same with one ablation per "
             "head and compares the two.", "note"),
    ], anchor=f"effects-{t}"))
    return effects


# ---------------------------------------------------------------- attention rank


def stage_rank(out: Outputs, model, task, config: ReportConfig, cache: StageCache, base_key: dict):
    """Approximate rank (90% energy) of every head's attention, per layer; lazy layers marked by the library's rule."""
    rank = library("lens_heads.rank")
    inputs = [item.prompt for item in task][: config.rank_n]
    key = {**base_key, "stage": "rank", "data": task.meta(), "rank_n": len(inputs)}
    profile = cache.load_json("rank", key)
    if profile is None:
        # per-input ranks: item prompts differ in length, and the averaged matrix would cut all to the shortest
        p = rank.attention_rank(model, inputs, average=False, batch_size=config.batch_size, progress=config.progress)
        profile = _jsonable(p.to_dict())
        if distributed.is_main():
            cache.save_json("rank", key, profile)
    m = profile.get("meta", {})
    profile = {**profile, "inputs": {"task": task.name, "n": len(inputs), "what": "item prompts",
                                     "mean_length": m.get("mean_length"), "min_length": m.get("min_length"),
                                     "max_length": m.get("max_length")}}
    out.results["rank"] = profile
    n_layers = len(profile["max_rank"])
    df = pd.DataFrame({"layer": range(n_layers), "max_rank": profile["max_rank"], "mean_rank": profile["mean_rank"],
                       "mass_columns": profile["mass_columns"], "lazy": profile["lazy"]})
    out.tables["rank_profile"] = df
    fig = figures.rank_profile(profile["max_rank"], profile["mean_rank"], profile["mass_columns"], profile["lazy"],
                               title=f"Attention rank per layer ({len(inputs)} {task.name} prompts)")
    out.pngs["rank_profile"] = fig
    lazy = [l for l in range(n_layers) if profile["lazy"][l]]
    out.sections.append(Section("Attention rank per layer", [
        Text(f"Approximate rank of each head's attention matrix (smallest k whose top-k singular values hold 90% of "
             f"the squared spectral energy), on {len(inputs)} {task.name} prompts of {m.get('min_length')}-"
             f"{m.get('max_length')} tokens ({m.get('mode', 'per-input ranks')}); per layer the max and mean over "
             f"heads, and the number of key columns holding 90% of the attention mass. Lazy layers: "
             f"{', '.join(map(str, lazy)) if lazy else 'none'}. Rule: {profile['lazy_rule']}"),
        Figure(fig),
    ], anchor="rank"))
    return profile


# ---------------------------------------------------------------- attention patterns


def stage_attention(out: Outputs, model, scores, config: ReportConfig):
    """circuitsvis patterns of the most and least active heads (by mean AHON (LN)) on each example prompt."""
    if scores is None:
        raise StageUnavailable("it needs the head scores, which did not run")
    scoring = library("lens_heads.head_scores")
    names = list(scores.names)
    activity = ACTIVITY_SCORE if ACTIVITY_SCORE in names else names[0]
    idx = names.index(activity)
    mean = scores.values[..., idx].float().mean(0)
    picked = attention.pick_heads(mean, scores.direction[activity], config.heads_shown)
    heads = picked["most active"] + picked["least active"]
    roles = ["most active"] * len(picked["most active"]) + ["least active"] * len(picked["least active"])
    blocks = [Text(f"Attention patterns of the {len(picked['most active'])} most and {len(picked['least active'])} "
                   f"least active heads by mean {activity} over the scored items, on each example prompt. Click a "
                   "head to enlarge it; hover a cell for the source and destination tokens.")]
    prompts_out, rows = [], []
    for p, prompt in enumerate(config.prompts):
        tokens = attention.prompt_tokens(model, prompt)
        toks = attention.str_tokens(model, tokens)
        patterns = attention.head_patterns(model, tokens, heads)
        prompt_scores = scoring.score_heads(model, [prompt], progress=False).values[0, ..., idx]
        labels = [f"L{l}H{h} {role} ({activity} {prompt_scores[l, h]:.3g})" for (l, h), role in zip(heads, roles)]
        for (l, h), role in zip(heads, roles):
            rows.append({"prompt": p, "layer": l, "head": h, "role": role, f"mean {activity}": float(mean[l, h]),
                         f"{activity} on prompt": float(prompt_scores[l, h])})
        prompts_out.append({"text": prompt, "tokens": toks, "heads": [
            {"layer": l, "head": h, "role": role, "mean_score": float(mean[l, h]),
             "prompt_score": float(prompt_scores[l, h])} for (l, h), role in zip(heads, roles)]})
        blocks.append(Text(f"Prompt {p + 1}: {prompt}"))
        blocks.append(Raw(attention.render_attention(toks, patterns, labels)))
    df = pd.DataFrame(rows)
    out.tables["attention_heads"] = df
    blocks.append(Table(df, caption=f"Heads shown and their {activity}"))
    out.results["attention"] = {"score": activity, "direction": scores.direction[activity],
                                "k": config.heads_shown, "prompts": prompts_out}
    out.sections.append(Section("Attention patterns", blocks, anchor="attention"))


# ---------------------------------------------------------------- writing


def write_outputs(out: Outputs, out_dir: Path, config: ReportConfig, log) -> None:
    """CSV tables, PNG figures and report.html (results.json is written last by the caller)."""
    files = []
    for name, df in out.tables.items():
        atomic_write_text(out_dir / f"{name}.csv", df.to_csv(index=False))
        files.append(f"{name}.csv")
    if config.png and out.pngs:
        t0 = time.perf_counter()
        try:
            with figures.png_writer() as write:
                for name, fig in out.pngs.items():
                    write(fig, out_dir / f"{name}.png")
                    files.append(f"{name}.png")
            out.results["stages"]["png"] = {"status": "done", "seconds": round(time.perf_counter() - t0, 2),
                                            "cpu_seconds": None}
        except Exception as e:  # no Chromium: the HTML report does not need one
            reason = f"{type(e).__name__}: {e}".splitlines()[0]
            # Not a failed analysis: the numbers, CSVs and report.html are complete; say it and what to do.
            out.results["stages"]["png"] = {"status": "skipped", "reason": reason,
                                            "what_to_do": "install Chromium (apt-get install chromium)"}
            log(f"[report] PNG figures skipped ({reason}); install Chromium for kaleido (apt-get install chromium)")
    meta = out.results["model"]
    subtitle = (f"{meta.get('name')} — {meta.get('n_layers')} layers x {meta.get('n_heads')} heads — "
                f"{out.results['weight_basis']} — seed {config.seed} — lens_heads "
                f"{out.results['versions'].get('lens_heads')} — {out.results['created']}")
    page = render_page(f"lens_heads report: {meta.get('name')}", subtitle, out.sections + [_run_section(out)])
    atomic_write_text(out_dir / "report.html", page)
    files += ["report.html", "results.json"]
    out.results["files"] = files


def _run_section(out: Outputs) -> Section:
    rows = [{"stage": k, "status": v["status"], "seconds": v.get("seconds"), "CPU seconds": v.get("cpu_seconds"),
             "note": v.get("reason", "")}
            for k, v in out.results["stages"].items()]
    versions_df = pd.DataFrame(sorted(out.results["versions"].items()), columns=["package", "version"])
    return Section("Run", [Table(pd.DataFrame(rows), caption="Stages"), Table(versions_df, caption="Versions"),
                           Text("Every number on this page is in results.json beside this file; tables are also "
                                "written as CSV and figures as PNG.", "note")], anchor="run")


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in ("lens_heads", "torch", "transformer_lens", "transformers", "numpy", "pandas", "plotly", "kaleido",
                "circuitsvis"):
        try:
            out[pkg] = importlib.metadata.version(pkg.replace("_", "-"))
        except importlib.metadata.PackageNotFoundError:
            try:
                out[pkg] = importlib.metadata.version(pkg)
            except importlib.metadata.PackageNotFoundError:
                out[pkg] = "not installed"
    return out


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _list(x) -> list:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().tolist()
    if isinstance(x, np.ndarray):
        return x.tolist()
    return list(x)


def _jsonable(obj):
    """Plain JSON types for results.json (tensors and arrays become lists, unknown objects strings)."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (torch.Tensor, np.ndarray)):
        return _jsonable(obj.tolist())
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return float(obj)
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    return str(obj)
