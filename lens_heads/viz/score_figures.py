"""Figures of head scores: each score per layer and head, its distribution per layer and across models, and scores
against the measured effect of zeroing each head. Any label that could come from data goes through
:func:`lens_heads.viz.escape.esc` first (plotly reads a subset of HTML in labels)."""

from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from lens_heads.viz.escape import esc
from lens_heads.viz.palette import PALETTE


def score_heatmaps(mean_scores: dict[str, np.ndarray], direction: dict[str, str], title: str = "") -> go.Figure:
    """One layer x head heatmap per score (mean over inputs). Dark = the inactive side, for every score."""
    names = list(mean_scores)
    cols = 4 if len(names) > 3 else len(names)
    rows = math.ceil(len(names) / cols)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[esc(n) for n in names], horizontal_spacing=0.04,
                        vertical_spacing=0.1 if rows > 1 else 0.2)
    for i, name in enumerate(names):
        z = np.asarray(mean_scores[name])
        fig.add_trace(go.Heatmap(
            z=z, x=list(range(z.shape[1])), y=list(range(z.shape[0])), colorscale="Viridis", showscale=False,
            reversescale=direction.get(name) == ">",
            hovertemplate=f"{esc(name)}<br>layer %{{y}} head %{{x}}<br>%{{z:.4g}}<extra></extra>"),
            row=i // cols + 1, col=i % cols + 1)
    fig.update_xaxes(title_text="head", title_standoff=2)
    fig.update_yaxes(title_text="layer", autorange="reversed", title_standoff=2)
    fig.update_layout(title=esc(title), height=330 * rows + 60, width=1200, margin=dict(t=80, l=50, r=20, b=40))
    return fig


def layer_distributions(summary: dict[str, dict[str, np.ndarray]], title: str = "") -> go.Figure:
    """Per-layer box plots of each score over (input, head) values; a menu switches the score.

    ``summary[score]`` holds per-layer arrays ``q0, q25, q50, q75, q100`` (and ``mean``)."""
    names = list(summary)
    fig = go.Figure()
    for i, name in enumerate(names):
        s = summary[name]
        layers = list(range(len(s["q50"])))
        fig.add_trace(go.Box(
            x=layers, q1=s["q25"], median=s["q50"], q3=s["q75"], lowerfence=s["q0"], upperfence=s["q100"],
            mean=s.get("mean"), boxmean=s.get("mean") is not None, name=esc(name), visible=i == 0,
            marker_color=PALETTE[i % len(PALETTE)], hoverinfo="x+y"))
    buttons = [dict(label=esc(n), method="update",
                    args=[{"visible": [j == i for j in range(len(names))]}, {"yaxis.title.text": esc(n)}])
               for i, n in enumerate(names)]
    fig.update_layout(
        title=esc(title), height=430, width=1200, showlegend=False, xaxis_title="layer",
        yaxis_title=esc(names[0]) if names else "",
        updatemenus=[dict(buttons=buttons, direction="down", x=1.0, xanchor="right", y=1.15, yanchor="top")],
        margin=dict(t=80, l=60, r=20, b=40))
    return fig


def score_vs_effect(mean_scores: dict[str, np.ndarray], size: np.ndarray, direction: dict[str, str], *,
                    effect_label: str, title: str = "") -> go.Figure:
    """One scatter per score: each head's mean score (x) against its measured effect size (y, log scale where all
    are positive). The inactive side of each score is named under its panel."""
    names = list(mean_scores)
    cols = 4 if len(names) > 3 else len(names)
    rows = math.ceil(len(names) / cols)
    size = np.asarray(size, dtype=float)
    layers, heads = np.meshgrid(range(size.shape[0]), range(size.shape[1]), indexing="ij")
    fig = make_subplots(rows=rows, cols=cols, horizontal_spacing=0.05, vertical_spacing=0.12 if rows > 1 else 0.2,
                        subplot_titles=[f"{esc(n)} (inactive: {'low' if direction.get(n) == '<' else 'high'})"
                                        for n in names])
    for i, name in enumerate(names):
        fig.add_trace(go.Scatter(
            x=np.asarray(mean_scores[name], dtype=float).reshape(-1), y=size.reshape(-1), mode="markers",
            marker=dict(size=5, color=layers.reshape(-1), colorscale="Viridis", opacity=0.75,
                        showscale=i == 0, colorbar=dict(title="layer", len=0.5)),
            customdata=np.stack([layers.reshape(-1), heads.reshape(-1)], -1), showlegend=False,
            hovertemplate=f"{esc(name)} %{{x:.4g}}<br>L%{{customdata[0]}}H%{{customdata[1]}}: effect %{{y:.3g}}"
                          "<extra></extra>"), row=i // cols + 1, col=i % cols + 1)
    fig.update_yaxes(type="log" if bool((size > 0).all()) else "linear")
    fig.update_yaxes(title_text=esc(effect_label), col=1)
    fig.update_layout(title=esc(title), height=300 * rows + 90, width=1300, margin=dict(t=90, l=70, r=20, b=40))
    return fig


def agreement_bars(table, *, title: str = "") -> go.Figure:
    """Per score: Spearman and Kendall correlation with the effect size (mean over items) and the per-input
    Spearman, each with its 95% interval (``table``: :meth:`lens_heads.experiments.agreement.Agreement.to_dataframe`)."""
    fig = go.Figure()
    labels = [esc(s) for s in table["score"]]
    for k, (column, name) in enumerate((("spearman", "Spearman (means over items)"),
                                        ("kendall", "Kendall tau-b (means over items)"),
                                        ("spearman_per_input", "Spearman per input (mean)"))):
        y = np.asarray(table[column], dtype=float)
        fig.add_trace(go.Bar(
            x=labels, y=y, name=name, marker_color=PALETTE[k],
            error_y=dict(type="data", symmetric=False, array=np.asarray(table[f"{column}_high"]) - y,
                         arrayminus=y - np.asarray(table[f"{column}_low"]))))
    fig.add_hline(y=0, line=dict(color="black", width=1))
    fig.update_layout(title=esc(title), barmode="group", height=460, width=1300, yaxis_title="rank correlation",
                      yaxis_range=[-1, 1], margin=dict(t=80, l=60, r=20, b=90), legend=dict(orientation="h", y=1.08))
    return fig


def score_cdfs(cdfs: dict, models: list[str], *, title: str = "", cols: int = 4) -> go.Figure:
    """The empirical CDF of each score (one panel each), one curve per model: pooled over every (row, layer, head)
    value; the menu switches to a relative-depth bin or a single layer (models of another depth have no curve in a
    layer view: their layers are compared by depth). The reference (the first model) is drawn wide and pale under
    the others; the raw norm scores on a log axis. ``cdfs[view][level][score][model] = (x, F(x))`` (the
    ``cdfs`` of :class:`lens_heads.experiments.compare_distributions.DistributionComparison`)."""
    views = [(view, level) for view in ("pooled", "depth", "layer") for level in sorted(cdfs.get(view, {}))]
    names = list(cdfs["pooled"][0]) if "pooled" in cdfs else list(next(iter(next(iter(cdfs.values())).values())))
    rows = math.ceil(len(names) / cols)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[esc(n) for n in names], horizontal_spacing=0.05,
                        vertical_spacing=0.09)
    owner = []
    for v, (view, level) in enumerate(views):
        for i, name in enumerate(names):
            for m, model in enumerate(models):
                curve = cdfs[view][level].get(name, {}).get(model)
                if curve is None:
                    continue
                x, q = curve
                fig.add_trace(go.Scatter(x=x, y=q, mode="lines", name=esc(model), legendgroup=esc(model),
                                         showlegend=i == 0, visible=v == 0,
                                         line=dict(color=PALETTE[m % len(PALETTE)], width=4 if m == 0 else 1.6),
                                         opacity=0.45 if m == 0 else 1.0,
                                         hovertemplate=f"{esc(model)}<br>%{{x:.4g}}: F = %{{y:.3f}}<extra></extra>"),
                              row=i // cols + 1, col=i % cols + 1)
                owner.append(v)
    labels = [_view_label(view, level, len(cdfs.get("depth", {}))) for view, level in views]
    fig.update_layout(updatemenus=[dict(buttons=[
        dict(label=esc(label), method="update",
             args=[{"visible": [o == v for o in owner]}, {"title.text": esc(f"{title} [{label}]")}])
        for v, label in enumerate(labels)], x=1.0, xanchor="right", y=1.08, yanchor="bottom")] if len(views) > 1
        else [])
    fig.update_yaxes(range=[0, 1], title_text="F", title_standoff=2)
    for i, name in enumerate(names):  # raw norms of different models differ by orders of magnitude
        if name in RAW_NORMS:
            fig.update_xaxes(type="log", row=i // cols + 1, col=i % cols + 1)
    fig.update_layout(title=esc(f"{title} [{labels[0]}]") if views else esc(title), height=300 * rows + 90,
                      width=1400, margin=dict(t=100, l=50, r=20, b=40), legend=dict(orientation="h", y=-0.05))
    return fig


RAW_NORMS = ("FTVVN", "AVVN", "LTHON", "AHON")


def _view_label(view: str, level: int, depth_bins: int) -> str:
    if view == "pooled":
        return "pooled over every layer"
    if view == "depth":
        return f"relative depth {level + 1}/{depth_bins}"
    return f"layer {level}"
