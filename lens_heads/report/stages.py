"""The report's stages of the model and its heads (model card, head scores, head effects, attention patterns, head
explorer); the sweeps' stages are in ``sweep_stages``, the whole layers' in ``layer_stages``. Each stage computes
through the library and returns a frozen result (``stage_result``: numbers for results.json, CSV tables, figures).
Nothing here writes the page: ``sections`` renders results; ``pipeline`` runs the stages.
A stage takes what it needs as required arguments (never recomputed in its place): the ablation
sweep, head effects, whole layers, attention patterns and explorer take the head scores of the scores stage, the
comparison the sweeps of the ablation stages; ``pipeline`` names those stages (``needs=``) and does not run a stage
whose inputs did not finish.

Finished work is kept in the report folder's ``cache/`` (:class:`lens_heads.plumbing.cache.Cache`), keyed by everything its
numbers depend on, so a rerun with the same settings reuses it. Under torchrun every rank computes and rank 0 alone
writes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from lens_heads.data.items import Task
from lens_heads.experiments.agreement import score_agreement
from lens_heads.experiments.effects import HeadEffects, head_effects
from lens_heads.heads.distributions import layer_summary, thresholds
from lens_heads.heads.scores import SCORE_NAMES
from lens_heads.heads.scoring import HeadScores, score_heads
from lens_heads.plumbing.cache import Cache
from lens_heads.report.config import ACTIVITY_SCORE, ReportConfig
from lens_heads.report.stage_result import StageResult, cached_file, jsonable
from lens_heads.viz import attention
from lens_heads.viz.explorer import Explorer, explore
from lens_heads.viz.score_figures import agreement_bars, layer_distributions, score_heatmaps, score_vs_effect

# ---------------------------------------------------------------- model card


def model_card(meta: dict, config: ReportConfig) -> StageResult:
    """The model's shape, size and weight basis as one table."""
    rows = [("model", meta.get("name")), ("source", meta.get("source")), ("layers", meta["n_layers"]),
            ("query heads per layer", meta["n_heads"]), ("key/value heads per layer", meta["n_kv_heads"]),
            ("attention heads in all", meta["n_layers"] * meta["n_heads"]), ("d_model", meta["d_model"]),
            ("d_head", meta["d_head"]), ("context length", meta["n_ctx"]),
            ("parameters (as the source counts them: a tied unembedding once)", f"{meta['n_params']:,}"),
            ("weight basis", meta.get("weight_basis")), ("dtype", meta.get("dtype", config.dtype))]
    df = pd.DataFrame(rows, columns=["property", "value"])
    df["value"] = df["value"].astype(str)
    return StageResult(numbers={}, tables={"model_card": df})


# ---------------------------------------------------------------- head scores


@dataclass(frozen=True)
class ScoresResult(StageResult):
    scores: HeadScores = field(kw_only=True)
    task: Task = field(kw_only=True)
    reused: bool = False


def score_stage(model, task, config: ReportConfig, cache: Cache, base_key: dict) -> ScoresResult:
    """Every head's twelve scores on the task's rows (cached), per-layer distributions and the thresholds of the
    target fractions."""
    key = {**base_key, "stage": "scores", "data": task.meta(), "score_names": list(SCORE_NAMES)}
    scores, reused = cached_file(cache, "scores", key, ".safetensors", lambda: score_heads(
        model, task, settings=config.evaluation, progress=config.progress), HeadScores.load)
    values = scores.values.float()  # [input, layer, head, score]
    names = list(scores.names)
    mean = values.mean(0)  # [layer, head, score]
    dist = layer_summary(scores, names)
    summary = {name: {"q0": g["min"].to_numpy(), "q25": g["q25"].to_numpy(), "q50": g["q50"].to_numpy(),
                      "q75": g["q75"].to_numpy(), "q100": g["max"].to_numpy(), "mean": g["mean"].to_numpy()}
               for name, g in ((n, dist[dist["score"] == n].sort_values("layer")) for n in names)}
    cuts = {name: {float(f): float(t) for f, t in thresholds(scores, name, list(config.fractions)).items()}
            for name in names}
    t, (n_in, n_layers, n_heads) = task.name, values.shape[:3]
    numbers = {"data": task.meta(), "n_inputs": n_in, "names": names, "direction": dict(scores.direction),
               "meta": jsonable(scores.meta), "reused_from_cache": reused,
               "mean_per_head": {name: mean[..., i].tolist() for i, name in enumerate(names)},
               "per_layer": {name: {k: v.tolist() for k, v in s.items()} for name, s in summary.items()},
               "thresholds": {name: {str(f): v for f, v in th.items()} for name, th in cuts.items()}}
    layer, head = np.meshgrid(np.arange(n_layers), np.arange(n_heads), indexing="ij")
    table = pd.DataFrame({"layer": layer.ravel(), "head": head.ravel(),
                          **{name: mean[..., i].reshape(-1).numpy() for i, name in enumerate(names)}})
    th = pd.DataFrame([{"score": n, **{f"{100 * f:g}%": v for f, v in cuts[n].items()}} for n in names])
    figures = {
        f"score_heatmaps_{t}": score_heatmaps(
            {n: mean[..., i].numpy() for i, n in enumerate(names)}, dict(scores.direction),
            title=f"Mean head scores on {t} (n={n_in}); dark = inactive side"),
        f"score_distributions_{t}": layer_distributions(
            summary, title=f"Per-layer distribution over inputs and heads ({t})")}
    tables = {f"head_scores_{t}": table, f"layer_distributions_{t}": dist, f"thresholds_{t}": th}
    return ScoresResult(numbers, tables, figures, scores=scores, task=task, reused=reused)


# ---------------------------------------------------------------- head effects and each score's agreement


@dataclass(frozen=True)
class EffectsResult(StageResult):
    task: Task = field(kw_only=True)
    precision_chance: dict = field(kw_only=True)


def effects_stage(model, task, scores: HeadScores, config: ReportConfig, cache: Cache,
                  base_key: dict) -> EffectsResult:
    """Attribution-patching effect (KL) of every head on the task's items (cached), and each score's rank agreement
    with it."""
    key = {**base_key, "stage": "effects", "data": task.meta(), "method": "attribution"}
    effects, _ = cached_file(cache, "effects", key, ".safetensors", lambda: head_effects(
        model, task, method="attribution", metric="kl", settings=config.evaluation, progress=config.progress),
        HeadEffects.load)
    agreement = score_agreement(scores, effects, n_boot=200, seed=config.seed)
    table, t = agreement.to_dataframe(), task.name
    size = effects.size().numpy()
    scatter = score_vs_effect({name: scores.mean(name).numpy() for name in scores.names}, size,
                              dict(scores.direction), effect_label="KL when zeroed (attribution)",
                              title=f"Mean score vs measured effect of each head on {t} (n={len(task)})")
    bars = agreement_bars(table, title=f"Rank agreement of each score with the head effects on {t}")
    numbers = {"status": "done", "method": "attribution", "metric": "kl",
               "agreement": jsonable(table.to_dict("records")), "agreement_meta": jsonable(agreement.meta),
               "size_per_head": size.tolist(), "meta": jsonable(effects.meta)}
    return EffectsResult(numbers, {f"effects_agreement_{t}": table, f"effects_{t}": effects.to_dataframe()},
                         {f"effects_agreement_{t}": bars, f"effects_scatter_{t}": scatter}, task=task,
                         precision_chance=agreement.meta["precision_chance"])


# ---------------------------------------------------------------- attention patterns


@dataclass(frozen=True)
class AttentionResult(StageResult):
    renders: tuple = ()  # per prompt: its circuitsvis HTML (built here from escaped-safe props)


def attention_stage(model, scores: HeadScores, config: ReportConfig) -> AttentionResult:
    """circuitsvis patterns of the most and least active heads (by mean AHON (LN)) on each example prompt."""
    names = list(scores.names)
    activity = ACTIVITY_SCORE if ACTIVITY_SCORE in names else names[0]
    idx = names.index(activity)
    mean = scores.values[..., idx].float().mean(0)
    picked = attention.pick_heads(mean, scores.direction[activity], config.heads_shown)
    heads = [(head, role) for role in ("most active", "least active") for head in picked[role]]
    prompts, rows, renders = [], [], []
    for p, prompt in enumerate(config.prompts):
        tokens = attention.prompt_tokens(model, prompt)
        toks = attention.str_tokens(model, tokens)
        patterns = attention.head_patterns(model, tokens, [head for head, _ in heads])
        on_prompt = score_heads(model, [prompt], progress=False).values[0, ..., idx]
        shown = [{"layer": l, "head": h, "role": role, "mean_score": float(mean[l, h]),
                  "prompt_score": float(on_prompt[l, h])} for (l, h), role in heads]
        rows += [{"prompt": p, "layer": d["layer"], "head": d["head"], "role": d["role"],
                  f"mean {activity}": d["mean_score"], f"{activity} on prompt": d["prompt_score"]} for d in shown]
        prompts.append({"text": prompt, "tokens": toks, "heads": shown})
        labels = [f"L{d['layer']}H{d['head']} {d['role']} ({activity} {d['prompt_score']:.3g})" for d in shown]
        renders.append(attention.render_attention(toks, patterns, labels))
    numbers = {"score": activity, "direction": scores.direction[activity], "k": config.heads_shown,
               "prompts": prompts}
    return AttentionResult(numbers, {"attention_heads": pd.DataFrame(rows)}, renders=tuple(renders))


# ---------------------------------------------------------------- head explorer


@dataclass(frozen=True)
class ExplorerResult(StageResult):
    explorer: Explorer = field(kw_only=True)


def explorer_stage(model, scores: HeadScores, effects: EffectsResult | None, rank: dict | None,
                   config: ReportConfig) -> ExplorerResult:
    """The interactive head explorer on the example prompts: heatmap means from the task's scores, the measured
    head effects where computed, and the rank stage's profile (``lens_heads.explore``)."""
    extra = {f"effect: KL when zeroed (attribution, {effects.task.name})": np.asarray(
        effects.numbers["size_per_head"])} if effects is not None else None
    explorer = explore(model, list(config.prompts), scores=scores, effects=extra, rank=rank,
                       score=ACTIVITY_SCORE if ACTIVITY_SCORE in scores.names else scores.names[0])
    numbers = {"prompts": len(explorer.data["prompts"]), "max_tokens": explorer.data["max_tokens"],
               "maps": list(explorer.data["maps"])}
    return ExplorerResult(numbers, explorer=explorer)
