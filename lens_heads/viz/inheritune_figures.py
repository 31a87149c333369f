"""The figures of the Inheritune analyses, each as PNG and HTML. analyses/inheritune.py: validation loss curves,
attention rank per layer at every stage, the reference's rank during training and the rank profile of the embedded
SmolLM2 and its growth loop. analyses/inheritune_baselines.py: every method's loss curve and rank profile over the training seeds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from lens_heads.growth.inheritune_comparisons import INHERITUNE, compared, label
from lens_heads.viz.export import save_figure


def wrap(text: str, width: int = 150) -> str:
    """Plotly titles do not wrap: break long lines with <br>."""
    import textwrap

    return "<br>".join(textwrap.wrap(text, width))


def write_figure(fig, stem: Path) -> list[str]:
    return save_figure(fig, stem, width=1100, height=600, scale=1.5)


STAGE_COLORS = {"reference": "#222222", "student": "#d62728", "scratch": "#1f77b4", "stack_source": "#aaaaaa",
                "width_source": "#cccccc"}
ABLATION_COLORS = {"later_layers": "#ff7f0e", "attention_only": "#2ca02c", "mlp_only": "#9467bd",
                   # by prefix, longest first: half_width_widened before half_width
                   "stacking": "#8c564b", "hybrid_stacking": "#e377c2", "half_width_widened": "#c49c94",
                   "half_width": "#7f7f7f",
                   "distill_logit": "#bcbd22", "distill_distilbert": "#17becf"}
GROWTH_REDS = ["#fc9272", "#ef3b2c", "#a50f15", "#67000d"]  # growth stages, lighter to darker
SCRATCH_DASHES = {"scratch_1x": "dot", "scratch_2x": "dash"}


def color(stage) -> str:
    return next(c for k, c in ABLATION_COLORS.items() if stage.name.startswith(k)) if stage.kind == "ablation" \
        else STAGE_COLORS[stage.kind]


def dash(stage) -> str:  # the two scratch baselines (1x and 2x steps) apart, in every figure
    return next((d for k, d in SCRATCH_DASHES.items() if stage.name.endswith(k.split("_")[1])), "dot") \
        if stage.kind == "scratch" else "solid"


def figures(result, smollm: dict | None, out: Path, subtitle: str, uniform: dict) -> list[str]:
    """Validation loss curves, rank per layer at every stage, the reference's rank during training and the SmolLM2
    rank profile, each as HTML and PNG."""
    written = val_loss_figure(result, out, subtitle) + rank_figures(result, out, subtitle, uniform)
    if smollm:
        written += smollm_figure(smollm, out)
    return written


def val_loss_figure(result, out: Path, subtitle: str) -> list[str]:
    import plotly.graph_objects as go

    fig = go.Figure()
    for s in result.stages:
        h = [r for r in s.history if "val_loss" in r]
        fig.add_scatter(x=[r["tokens_seen"] for r in h], y=[r["val_loss"] for r in h], mode="lines+markers",
                        name=f"{s.name} ({s.n_layers}L)", line=dict(color=color(s), dash=dash(s),
                                                                     width=3 if s.kind == "reference" else 2),
                        opacity=1.0 if s.n_layers == result.final_layers or s.kind == "reference" else 0.5)
    fig.add_hline(y=result.reference_val_loss, line=dict(color="#222222", dash="dot", width=1),
                  annotation_text=f"reference final {result.reference_val_loss:.3f}")
    fig.update_layout(title=f"Validation loss: reference, Inheritune students, same-size scratch, ablations<br><sup>{subtitle}</sup>",
                      xaxis_title="tokens seen by the model (students: own training only)", yaxis_title="validation loss",
                      template="plotly_white")
    return write_figure(fig, out / "inheritune_val_loss")


def rank_figures(result, out: Path, subtitle: str, uniform: dict) -> list[str]:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("max rank over heads (after training)",
                                                        "mean rank over heads (after training)"))
    for s in result.stages:
        for col, key in ((1, "max_rank"), (2, "mean_rank")):
            fig.add_scatter(x=list(range(s.n_layers)), y=s.rank[key], mode="lines+markers", name=s.name,
                            legendgroup=s.name, showlegend=col == 1, line=dict(color=color(s), dash=dash(s)),
                            row=1, col=col)
        if s.kind in ("student", "reference"):
            fig.add_scatter(x=list(range(s.n_layers)), y=s.rank_at_init["max_rank"], mode="markers",
                            marker=dict(symbol="x", size=9, color=color(s)),
                            name=f"{s.name} {'at inheritance' if s.kind == 'student' else 'at init'}", row=1, col=1)
    for col in (1, 2):
        fig.add_hline(y=uniform["rank"], line=dict(color="grey", dash="dot", width=1), row=1, col=col,
                      annotation_text=f"uniform causal averaging: rank {uniform['rank']}")
    meta = result.meta["rank"]
    fig.update_layout(title=f"Attention rank per layer at every stage ({meta['n_inputs']} validation windows)<br>"
                            f"<sup>{wrap(meta['definition'])}<br>{subtitle}</sup>", margin=dict(t=170),
                      template="plotly_white")
    fig.update_xaxes(title_text="layer")
    fig.update_yaxes(title_text="approximate rank", row=1, col=1)
    written = write_figure(fig, out / "inheritune_rank_per_layer")

    ref = result.stages[0]
    tracked = [r for r in ref.history if "max_rank" in r]
    if tracked:
        z = np.array([r["max_rank"] for r in tracked]).T
        fig = go.Figure(go.Heatmap(z=z, x=[r["step"] for r in tracked], y=list(range(z.shape[0])),
                                   colorbar=dict(title="max rank"), colorscale="Viridis"))
        fig.update_layout(title=f"Reference: max attention rank per layer during training<br><sup>"
                                f"{wrap(result.meta['rank']['definition'])}<br>{subtitle}</sup>", margin=dict(t=170),
                          xaxis_title="step", yaxis_title="layer", template="plotly_white")
        written += write_figure(fig, out / "inheritune_rank_during_training")
    return written


def smollm_figure(smollm: dict, out: Path) -> list[str]:
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("approximate rank per layer",
                                                        "key columns holding 90% of the mass (m*)"))
    for mode, line_dash in (("per_input", "solid"), ("averaged", "dash")):
        p = smollm[mode]
        how = f"aggregation {p.get('aggregation', 'rank' if mode == 'per_input' else 'matrix')!r}"
        layers = list(range(len(p["max_rank"])))
        fig.add_scatter(x=layers, y=p["max_rank"], name=f"max over heads ({how})", line=dict(dash=line_dash, color="#d62728"),
                        row=1, col=1)
        fig.add_scatter(x=layers, y=p["mean_rank"], name=f"mean over heads ({how})", line=dict(dash=line_dash, color="#1f77b4"),
                        row=1, col=1)
        fig.add_scatter(x=layers, y=p["mass_columns"], name=f"m* ({how})", line=dict(dash=line_dash, color="#2ca02c"),
                        row=1, col=2)
    paper = smollm["averaged"]  # the paper's aggregation marks the lazy layers
    lazy = [i for i, flag in enumerate(paper["lazy"]) if flag]
    fig.add_scatter(x=lazy, y=[paper["max_rank"][i] for i in lazy], mode="markers", name="lazy layer",
                    marker=dict(symbol="circle-open", size=14, color="black"), row=1, col=1)
    m = paper["meta"]
    fig.update_layout(title=f"SmolLM2-135M-Instruct (embedded): attention rank profile, N={m['n_inputs']} texts of "
                            f"T={m['max_length']} tokens (held-out SOTU text)<br><sup>averaged (paper's): "
                            f"{wrap(paper.get('definition', '') + '; per_input: ranks of each input matrix, averaged')}"
                            f"<br>{wrap(paper['lazy_rule'])}</sup>", margin=dict(t=190), template="plotly_white")
    fig.update_xaxes(title_text="layer")
    return write_figure(fig, out / "smollm2_rank_profile")


# ---------------------------------------------------------------- the baselines over seeds


def curves_figure(runs: dict[int, dict], out: Path, subtitle: str, png: bool,
                  stem: str = "inheritune_baselines") -> list[str]:
    """Validation loss against steps, mean over seeds with the seeds' range as a band, every method."""
    import plotly.graph_objects as go

    fig = go.Figure()
    palette = ["#222222", "#d62728", "#1f77b4", "#aec7e8", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
               "#ff7f0e", "#2ca02c", "#9467bd"]
    curves: dict[str, list[pd.Series]] = {}
    for run in runs.values():
        for s in compared(run["result"]):
            h = [r for r in s.history if "val_loss" in r]
            curves.setdefault(label(s), []).append(pd.Series([r["val_loss"] for r in h], index=[r["step"] for r in h]))
    for i, (m, series) in enumerate(curves.items()):
        df = pd.concat(series, axis=1)
        c = palette[i % len(palette)]
        x = list(df.index)
        fig.add_scatter(x=x + x[::-1], y=list(df.max(axis=1)) + list(df.min(axis=1))[::-1], fill="toself", mode="lines",
                        fillcolor=c, opacity=0.15, line=dict(width=0), showlegend=False, hoverinfo="skip")
        fig.add_scatter(x=x, y=df.mean(axis=1), mode="lines", name=m,
                        line=dict(color=c, width=3 if m == INHERITUNE else 1.5))
    finals = [v for series in curves.values() for sr in series for v in sr.iloc[-1:]]
    warm = [v for series in curves.values() for sr in series for v in sr.iloc[:1] if v < max(finals) + 2]
    top = max(warm + finals) + 0.2  # the warm starts' first points; the fresh inits start far above (ln of vocab)
    fig.update_layout(title=f"Validation loss against steps, mean over {len(runs)} seeds (band: min to max; y axis "
                            f"cut at {top:.1f}, the fresh initialisations start near 10.8)<br><sup>{subtitle}</sup>",
                      xaxis_title="step of the model's own training (warm starts' sources not counted)",
                      yaxis_title="validation loss", yaxis_range=[min(finals) - 0.1, top], template="plotly_white")
    return save_figure(fig, out / f"{stem}_val_loss", png=png, width=1100, height=600, scale=1.5)


def rank_figure(table: pd.DataFrame, uniform_rank: int, out: Path, subtitle: str, png: bool,
                stem: str = "inheritune_baselines") -> list[str]:
    import plotly.graph_objects as go

    fig = go.Figure()
    for (m, depth), g in table.groupby(["method", "n_layers"], sort=False):  # grown students may end at other depths
        ranks = np.array(list(g["max_rank"]))
        bold = m == INHERITUNE or m.startswith(("reference", "scratch 1x"))
        name = m if table.loc[table["method"] == m, "n_layers"].nunique() == 1 else f"{m} {depth}L ({len(g)} seeds)"
        fig.add_scatter(x=list(range(ranks.shape[1])), y=ranks.mean(0), mode="lines+markers", name=name,
                        line=dict(width=3 if bold else 1, dash="solid" if bold else "dot"))
    fig.add_hline(y=uniform_rank, line=dict(color="grey", dash="dot"), annotation_text="uniform causal averaging")
    fig.add_hline(y=2, line=dict(color="black", dash="dash"), annotation_text="lazy: every head <= 2")
    fig.update_layout(title=f"Max attention rank over heads per layer, mean over seeds<br><sup>{subtitle}</sup>",
                      xaxis_title="layer", yaxis_title="approximate rank (90% energy)", template="plotly_white")
    return save_figure(fig, out / f"{stem}_rank", png=png, width=1100, height=600, scale=1.5)


def growth_rank_figure(runs: dict[int, dict], uniform_rank: int, out: Path, subtitle: str, png: bool,
                       stem: str) -> list[str]:
    """Max attention rank over heads per layer at every stage of the growth loop (x: inherited, right after
    inheritance or growth; line: after the stage's training), one panel per seed, beside the reference and scratch."""
    from plotly.subplots import make_subplots

    seeds = sorted(runs)
    fig = make_subplots(rows=1, cols=len(seeds), subplot_titles=[f"seed {s}" for s in seeds], shared_yaxes=True)
    for col, seed in enumerate(seeds, start=1):
        students = [s for s in runs[seed]["result"].stages if s.kind == "student"]
        for s in runs[seed]["result"].stages:
            if s.kind not in ("reference", "student", "scratch"):
                continue
            x = list(range(s.n_layers))
            c = GROWTH_REDS[students.index(s) % len(GROWTH_REDS)] if s.kind == "student" else color(s)
            fig.add_scatter(x=x, y=s.rank["max_rank"], mode="lines+markers", name=s.name, legendgroup=s.name,
                            showlegend=col == 1, line=dict(color=c, dash=dash(s),
                                                           width=1 if s.kind == "scratch" else 2), row=1, col=col)
            if s.kind == "student":
                fig.add_scatter(x=x, y=s.rank_at_init["max_rank"], mode="markers", legendgroup=s.name,
                                marker=dict(symbol="x", size=8, color=c), showlegend=False, row=1, col=col)
        fig.add_hline(y=uniform_rank, line=dict(color="grey", dash="dot", width=1), row=1, col=col)
        fig.add_hline(y=2, line=dict(color="black", dash="dash", width=1), row=1, col=col)
    fig.update_layout(title=f"Max attention rank per layer at every growth stage (x: at inheritance or growth; "
                            f"dotted: uniform causal averaging, dashed: lazy)<br><sup>{wrap(subtitle)}</sup>",
                      margin=dict(t=130), template="plotly_white")
    fig.update_xaxes(title_text="layer")
    fig.update_yaxes(title_text="approximate rank (90% energy)", col=1)
    return save_figure(fig, out / f"{stem}_rank_stages", png=png, width=1400, height=600, scale=1.5)


def growth_loop_figure(record: dict, out: Path, subtitle: str) -> list[str]:
    """SmolLM2's growth loop: max attention rank per layer of the reference and of every student stage at its
    inheritance or growth (dotted) and after training (mean over seeds), in both aggregations."""
    from plotly.subplots import make_subplots

    aggs = (("averaged", "rank of the input-averaged matrix (the paper's)"), ("per_input", "mean of per-input ranks"))
    fig = make_subplots(rows=1, cols=2, subplot_titles=[t for _, t in aggs], shared_yaxes=True)
    ref = record["reference"]
    sizes = sorted({s["n_layers"] for s in record["stages"] if s["kind"] == "student"})
    for col, (agg, _) in enumerate(aggs, start=1):
        fig.add_scatter(x=list(range(ref["n_layers"])), y=ref["rank"][agg]["max_rank"], mode="lines+markers",
                        name="reference", legendgroup="reference", showlegend=col == 1, line=dict(color="#222222"),
                        row=1, col=col)
        for i, n in enumerate(sizes):
            stages = [s for s in record["stages"] if s["kind"] == "student" and s["n_layers"] == n]
            c = GROWTH_REDS[i % len(GROWTH_REDS)]
            for when, key, dash in (("after training", "rank", "solid"), ("at growth", "rank_at_init", "dot")):
                ranks = np.mean([s[key][agg]["max_rank"] for s in stages], axis=0)
                fig.add_scatter(x=list(range(n)), y=ranks, mode="lines+markers", name=f"Inheritune {n}L, {when}",
                                legendgroup=f"{n}{key}", showlegend=col == 1, line=dict(color=c, dash=dash),
                                row=1, col=col)
    for layer, lazy in enumerate(ref["rank"]["averaged"]["lazy"]):
        if lazy:  # the blocks the question is about: lazy in the reference, re-added by growth
            fig.add_vrect(x0=layer - 0.5, x1=layer + 0.5, fillcolor="#999999", opacity=0.15, line_width=0,
                          row="all", col="all")
    fig.update_layout(title=f"Max attention rank per layer at every growth stage, mean over seeds (shaded: the "
                            f"reference's lazy layers)<br>"
                            f"<sup>{wrap(subtitle)}</sup>", margin=dict(t=130), template="plotly_white")
    fig.update_xaxes(title_text="layer")
    fig.update_yaxes(title_text="approximate rank (90% energy)", col=1)
    return write_figure(fig, out / "smollm2_growth_rank")
