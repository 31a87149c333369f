"""Page sections from stage results: prose, tables and figures of one stage each. Nothing here computes a number
the stage did not return."""

from __future__ import annotations

import math

import pandas as pd

from lens_heads.report.config import ReportConfig
from lens_heads.report.findings import summary_table
from lens_heads.report.layer_stages import LayersResult, RankResult
from lens_heads.report.render import Figure, Raw, Section, Table, Text
from lens_heads.report.stage_result import StageResult
from lens_heads.report.stages import AttentionResult, EffectsResult, ExplorerResult, ScoresResult
from lens_heads.report.sweep_stages import AblationResult, CompareResult, points_table


def not_done(title: str, status: str, reason: str) -> Section:
    """A stage that failed, was not run (a stage it needs did not finish) or was skipped says so under its title,
    with no numbers."""
    what = {"failed": f"This stage failed with {reason}. See results.json for the traceback.",
            "not run": f"Not run: it {reason}, which did not finish (see the Run table)."}.get(
        status, f"Skipped ({reason}).")
    return Section(f"{title} ({status})", [Text(what, "note" if status == "skipped" else "unavailable")])


def effects_skipped(task: str) -> Section:
    return Section(f"Head effects on {task}", [Text(
        "Skipped under --quick. The full report measures every head's effect on the task (attribution patching) and "
        "how well each score ranks the heads by it; analyses/head_effects.py does the same with one ablation per "
        "head.", "note")], anchor=f"effects-{task}")


def model_card(r: StageResult, config: ReportConfig) -> Section:
    own = [f"your items from {config.task_file} ({config.task_format} format)"] if config.task_file else []
    settings = (f"Settings: tasks {', '.join([*config.tasks, *own])}; {config.n} items per task; rank profile on "
                f"{config.rank_n} inputs; target fractions {', '.join(f'{f:g}' for f in config.fractions)}; "
                f"ablation scores {', '.join(config.scores)}; seed {config.seed}; batch size {config.batch_size}"
                f"{'; --quick preset' if config.quick else ''}.")
    return Section("Model card", [Table(r.tables["model_card"]), Text(settings, "note")], anchor="model-card")


def scores(r: ScoresResult, weight_basis: str) -> Section:
    task, t, n_in = r.task, r.task.name, r.numbers["n_inputs"]
    blocks = [
        Text(f"Each of the twelve scores of every attention head, averaged over the {n_in} forward rows of "
             f"{len(task)} {t} items ({task.split} split, seed {task.seed}; "
             f"{r.scores.meta.get('data', {}).get('protocol', 'lm-eval')} rows, the tokens the evaluation runs), in "
             f"the {weight_basis} weight basis. Colours run so that the inactive side is dark for every score (high "
             "AWFT, low for the rest). Hover for values."),
        Figure(r.figures[f"score_heatmaps_{t}"]),
        Text("Per-layer spread of each score over all (input, head) values: whiskers are min and max, the box the "
             "quartiles, the dashed line the mean. Pick the score in the menu."),
        Figure(r.figures[f"score_distributions_{t}"]),
        Table(r.tables[f"thresholds_{t}"], caption="Thresholds that put each target fraction of pooled (input, "
                                                   "layer, head) values on the inactive side")]
    if r.reused:
        blocks.append(Text("Scores reused from this folder's cache (same model, data and settings).", "note"))
    return Section(f"Head scores on {t}", blocks, anchor=f"scores-{t}")


def ablation(r: AblationResult) -> Section:
    t, task, base = r.task.name, r.task, r.numbers["baseline"]
    chance, protocol = r.numbers["chance"], r.numbers["protocol"]
    lo, hi = base.get("ci95") or (math.nan, math.nan)
    return Section(f"Ablation sweep on {t}", [
        Text(f"Baseline accuracy {100 * base['accuracy']:.1f}% (95% CI {100 * lo:.1f}-{100 * hi:.1f}, "
             f"n={base.get('n', len(task))}) beside chance {100 * chance:.1f}%, on {protocol} "
             f"rows; thresholds from an unablated pass over the same rows. Heads whose score for a row "
             f"crosses the threshold of the target fraction are zeroed (z := 0 before W_O) in the same forward pass; "
             f"the random baseline zeroes each (input, layer, head) with the same probability. The x axis is the "
             f"realised share zeroed."),
        Figure(r.figures[f"ablation_{t}"]),
        Table(summary_table(r.tables[f"ablation_summary_{t}"]), caption=(
            "Each number with its 95% interval [low, high] (bootstrap over items, paired across curves). % of heads "
            "zeroable within 1 accuracy point by the authors' rule (last crossing of baseline - 1 in order of target "
            "fraction, interpolated; 0 where a curve never meets it) and by the censored rule (the measured range's "
            "end where the curve ends within 1 point: a lower bound), the normalised AUC of accuracy (%) over "
            "realised % zeroed and its rank; the normalised AUC of the paired KL from the unablated answers (nats, "
            "lower is better), the low-variance ranking, and its rank")),
        Table(points_table(r.tables[f"ablation_{t}"]), caption="Every point against the unablated run on the same "
                                                               "items (paired)", float_format="{:.3g}"),
        Text(f"With {len(task)} items one accuracy point is well inside the noise: read the paired differences and "
             f"the gold answer's log-prob change alongside (all columns in ablation_{t}.csv).", "note"),
    ], anchor=f"ablation-{t}")


def effects(r: EffectsResult) -> Section:
    t, chance = r.task.name, r.precision_chance
    table = r.tables[f"effects_agreement_{t}"]
    shown = table[["score", "spearman", "spearman_low", "spearman_high", "kendall", "spearman_per_input",
                   "precision_at_10pct", "precision_at_30pct"]]
    return Section(f"Head effects on {t}", [
        Text(f"The effect of each head on these {len(r.task)} items, estimated by attribution patching (first-order "
             "Taylor expansion of zeroing the head's output, from one forward and backward pass per batch): KL "
             "from the intact answer distribution, mean of the absolute per-item values. Each score's Spearman and "
             "Kendall correlation between its activity (the score, negated where high means inactive) and that "
             "effect; positive = the score calls inactive the heads whose removal changes little. Precision@k: of "
             f"the k heads a score calls most inactive, the share among the k with the smallest effect (chance "
             f"{chance['precision_at_10pct']:.2f} at 10%, {chance['precision_at_30pct']:.2f} at 30%). Intervals: "
             "bootstrap over items, 95%."),
        Figure(r.figures[f"effects_agreement_{t}"]),
        Table(shown, caption=f"Agreement with the head effects (every column in effects_agreement_{t}.csv)",
              float_format="{:.3g}"),
        Figure(r.figures[f"effects_scatter_{t}"]),
        Text("Attribution is a linear estimate: analyses/head_effects.py measures the same with one ablation per "
             "head and compares the two.", "note"),
    ], anchor=f"effects-{t}")


def layers_skipped() -> Section:
    return Section("Whole layers", [Text(
        "Skipped under --quick. The full report scores every layer (Block Influence, attention rank, AHON (LN)) and "
        "removes the attention of 1, 2 and 4 layers in each ranking's order against a random order; "
        "analyses/layers.py does the same with whole blocks, the measured-effect oracle and the equal-compute head "
        "comparison.", "note")], anchor="layers")


# the per-layer columns the page shows, under short headings (the CSV keeps them all)
LAYER_COLUMNS = {"layer": "layer", "block_influence": "Block Influence", "attention_influence": "BI, attention",
                 "max_rank": "max rank", "max_rank_averaged": "max rank, mean matrix", "ahon_mean": "AHON mean",
                 "ahon_ln_zero_share": "AHON (LN) zero share", "lazy": "lazy"}


def layers(r: LayersResult) -> Section:
    t, n = r.task.name, len(r.task)
    lazy = r.numbers["lazy_layers"]
    tests = r.tables[f"layer_removal_tests_{t}"]
    shown = tests[["a", "b", "metric", "k", "difference", "low", "high", "p_value", "p_adjusted", "verdict"]].copy()
    for side in ("a", "b"):  # every curve here removes attention: the part is in the caption
        shown[side] = shown[side].str.replace(" · attention", "", regex=False)
    per_layer = r.tables[f"layer_scores_{t}"][list(LAYER_COLUMNS)].rename(columns=LAYER_COLUMNS)
    return Section(f"Whole layers on {t}", [
        Text(f"Per layer on these {n} items: Block Influence (ShortGPT: 1 - cos of the residual stream before and "
             "after the block, mean over tokens), the attention rank (max over heads of the approximate rank at 90% "
             "energy, per-input ranks of the item prompts, and of their averaged matrix) and the share of the "
             "layer's AHON (LN) values below the pooled 30% threshold. The layer mean of AHON (LN) is 1 in every "
             f"layer by construction, so it cannot rank layers. Lazy layers by the rank rule: "
             f"{', '.join(map(str, lazy)) if lazy else 'none'}. Then the attention of the first 1, 2 and 4 layers "
             "of each ranking (lowest Block Influence, lowest rank, most AHON (LN)-inactive first) is removed "
             "(hook_attn_out := 0: every head and b_O), beside a random order; intervals: bootstrap over items, "
             "95%."),
        Figure(r.figures[f"layer_removal_{t}"]),
        Table(shown, caption="Each ranking minus the random order on the same items, attention removed (KL: lower is "
                             "better; gold "
                             "log-prob change: higher is better); 'mean' averages over the counts removed",
              float_format="{:.3g}"),
        Table(per_layer, caption=f"Per-layer scores (every column in layer_scores_{t}.csv; the layer mean of "
                                 "AHON (LN) is 1 by construction)", float_format="{:.3g}"),
    ], anchor=f"layers-{t}")


def rank(r: RankResult) -> Section:
    profile = r.numbers
    m, n = profile.get("meta", {}), profile["inputs"]["n"]
    lazy = [layer for layer, is_lazy in enumerate(profile["lazy"]) if is_lazy]
    return Section("Attention rank per layer", [
        Text(f"Approximate rank of each head's attention matrix (smallest k whose top-k singular values hold 90% of "
             f"the squared spectral energy), on {n} {r.task.name} prompts of {m.get('min_length')}-"
             f"{m.get('max_length')} tokens ({m.get('mode', 'per-input ranks')}); per layer the max and mean over "
             f"heads, and the number of key columns holding 90% of the attention mass. Lazy layers: "
             f"{', '.join(map(str, lazy)) if lazy else 'none'}. Rule: {profile['lazy_rule']}"),
        Figure(r.figures["rank_profile"]),
    ], anchor="rank")


def attention(r: AttentionResult) -> Section:
    a = r.numbers
    roles = [h["role"] for h in a["prompts"][0]["heads"]] if a["prompts"] else []
    blocks: list[Text | Raw | Table]
    blocks = [Text(f"Attention patterns of the {roles.count('most active')} most and {roles.count('least active')} "
                   f"least active heads by mean {a['score']} over the scored items, on each example prompt. Click a "
                   "head to enlarge it; hover a cell for the source and destination tokens.")]
    for p, (prompt, render) in enumerate(zip(a["prompts"], r.renders)):
        blocks += [Text(f"Prompt {p + 1}: {prompt['text']}"), Raw(render)]
    blocks.append(Table(r.tables["attention_heads"], caption=f"Heads shown and their {a['score']}"))
    return Section("Attention patterns", blocks, anchor="attention")


def explorer(r: ExplorerResult) -> Section:
    d = r.explorer.data
    return Section("Head explorer", [
        Text(f"Every head of the model: colour the [layer x head] map by any score (means over {d['scores_from']}) "
             f"or measured effect, and click a head to see its attention pattern on each example prompt (cut to "
             f"{d['max_tokens']} tokens), its score on each prompt, its rank among the heads by every map (1 = most "
             "inactive, or smallest effect) and its layer's attention rank. lens_heads.explore(model, prompts) "
             "gives the same view in a notebook."),
        Raw(r.explorer.to_html())], anchor="explorer")


def compare(r: CompareResult) -> Section:
    acc, kl = r.comparisons["accuracy"], r.comparisons["kl"]
    dropped = "; ".join(f"{label}: {', '.join(curves)}" for label, curves in acc.dropped.items())
    pairs = r.tables["compare_pairs"]
    shown = ["model_a", "task_a", "model_b", "task_b", "ranking", "spearman", "top_k_overlap", "shared_top_k"]
    return Section("Comparison of sweeps across models and tasks", [
        Text(f"{len(acc.sweeps)} sweeps, one per (model, task). Within each, every curve (the scores and random "
             f"zeroing) is ranked by its normalised AUC over realised % zeroed: by accuracy (the paper's ranking, "
             f"higher is better) and by the paired KL from the unablated answers (lower is better); ties share "
             f"their average rank. Between every pair: the Spearman correlation of the rankings over the "
             f"{len(acc.curves)} curves all sweeps have, and how many of the top {acc.top_k} they share."
             + (f" Left out (not in every sweep): {dropped}." if dropped else "")),
        Table(r.tables["compare_inputs"], caption="What went in: model, data, sample, weight basis, unablated "
                                                  "accuracy beside chance", float_format="{:.3g}"),
        Figure(r.figures["compare_ranks"]),
        Figure(r.figures["compare_spearman"]),
        Table(pairs[shown], caption=f"Agreement between every pair of (model, task): Spearman correlation and "
                                    f"top-{acc.top_k} overlap, for both rankings", float_format="{:.3f}"),
        Table(kl.rank_table().reset_index(), caption="Ranks by the normalised AUC of the paired KL, 1 = best",
              float_format="{:g}"),
        Table(r.tables["compare_table2"], caption="The paper's Table 2: % of heads zeroable within 1 accuracy point "
                                                  "(authors' rule: last crossing of baseline - 1, 0 if none), AWFT "
                                                  "beside the best other curve, random included",
              float_format="{:.1f}"),
        Text("Each AUC carries the sampling noise of its sweep's items (see n above): ranks of curves whose AUCs "
             "differ by less than that noise can swap between runs.", "note"),
    ], anchor="compare")


def run(stages: dict, versions: dict) -> Section:
    """The stages' status and timing, and the package versions."""
    rows = [{"stage": k, "status": v["status"], "seconds": v.get("seconds"), "CPU seconds": v.get("cpu_seconds"),
             "note": v.get("reason", "")} for k, v in stages.items()]
    versions_df = pd.DataFrame(sorted(versions.items()), columns=["package", "version"])
    return Section("Run", [Table(pd.DataFrame(rows), caption="Stages"), Table(versions_df, caption="Versions"),
                           Text("Every number on this page is in results.json beside this file; tables are also "
                                "written as CSV and figures as PNG.", "note")], anchor="run")
