"""Figures of whole layers: attention rank per layer with its lazy layers, the panels where lazy layers meet inactive
heads, and the curves of removing layers. Any label that could come from data goes through
:func:`lens_heads.viz.escape.esc` first."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from lens_heads.viz.escape import esc
from lens_heads.viz.palette import PALETTE


def rank_profile(max_rank, mean_rank, mass_columns, lazy, *, title: str = "", aggregation: str = "",
                 max_rank_sd=None, mean_rank_sd=None) -> go.Figure:
    """Attention rank per layer (max and mean over heads) and the 90%-mass key columns; lazy layers marked. The
    aggregation over inputs (``lens_heads.collapse.rank.AGGREGATIONS``) is named in the title; ``max_rank_sd`` and
    ``mean_rank_sd`` (the ``"layer_rank"`` aggregation) are drawn as one-standard-deviation error bars."""
    layers = list(range(len(max_rank)))
    fig = go.Figure()
    band = lambda sd: None if sd is None else dict(type="data", array=list(sd), visible=True)  # noqa: E731
    fig.add_trace(go.Bar(x=layers, y=list(max_rank), name="max rank over heads", marker_color="#1f77b4",
                         error_y=band(max_rank_sd)))
    fig.add_trace(go.Scatter(x=layers, y=list(mean_rank), name="mean rank over heads", mode="lines+markers",
                             line=dict(color="#ff7f0e"), error_y=band(mean_rank_sd)))
    if mass_columns is not None:
        fig.add_trace(go.Scatter(x=layers, y=list(mass_columns), name="key columns holding 90% mass",
                                 mode="lines+markers", line=dict(color="#2ca02c", dash="dot")))
    if aggregation:
        title = f"{title} [aggregation: {aggregation}" + ("; bars: ±1 sd over inputs]" if max_rank_sd is not None
                                                          else "]")
    lazy_layers = [l for l in layers if lazy[l]]
    if lazy_layers:
        fig.add_trace(go.Scatter(x=lazy_layers, y=[max_rank[l] for l in lazy_layers], mode="markers",
                                 name="lazy layer", marker=dict(symbol="x", size=13, color="#d62728")))
    for l in lazy_layers:
        fig.add_vrect(x0=l - 0.5, x1=l + 0.5, fillcolor="#d62728", opacity=0.08, line_width=0)
    fig.update_layout(title=esc(title), xaxis_title="layer", yaxis_title="approximate rank (90% energy)",
                      height=430, width=1200, margin=dict(t=70, l=60, r=20, b=40))
    return fig


def layer_panels(table, zero_shares, *, title: str = "", fraction: float = 0.3) -> go.Figure:
    """Lazy layers meet inactive heads, layers on x in aligned panels: attention rank (max and mean over heads, both
    aggregations, lazy layers shaded), the share of each layer's heads each score zeroes at ``fraction`` (a
    heatmap, scores x layers), the layer's summed single-head ablation effect, and the effect of removing the layer's
    attention (all its heads at once) or whole block with 95% intervals: KL and the gold answer's log-prob change.

    ``table``: one row per layer with ``max_rank``, ``mean_rank``, ``max_rank_averaged``, ``lazy``,
    ``summed_head_kl``, ``attention_kl`` (+ ``_low``/``_high``), ``attention_gold_logprob_change`` (+ ...) and the
    ``block_`` columns where blocks were removed; ``zero_shares``: scores (index) x layers (columns), shares in [0, 1]."""
    layers = list(table["layer"])
    fig = make_subplots(rows=5, cols=1, shared_xaxes=True, vertical_spacing=0.035, subplot_titles=[
        "attention rank (90% energy)", f"share of the layer's heads each score zeroes at {fraction:.0%}",
        "summed single-head ablation effect (KL)", "removing the layer: KL(unablated || removed)",
        "removing the layer: gold log-prob change"], row_heights=[0.2, 0.3, 0.15, 0.175, 0.175])
    for column, name, colour in (("max_rank", "max over heads (per-input ranks)", "#1f77b4"),
                                 ("mean_rank", "mean over heads (per-input ranks)", "#ff7f0e"),
                                 ("max_rank_averaged", "max over heads (input-averaged matrix)", "#2ca02c")):
        if column in table:
            fig.add_trace(go.Scatter(x=layers, y=table[column], name=esc(name), mode="lines+markers",
                                     line=dict(color=colour)), row=1, col=1)
    for layer in [l for l, lazy in zip(layers, table["lazy"]) if lazy]:
        fig.add_vrect(x0=layer - 0.5, x1=layer + 0.5, fillcolor="#d62728", opacity=0.08, line_width=0)
    fig.add_trace(go.Heatmap(z=zero_shares.to_numpy(dtype=float), x=[int(c) for c in zero_shares.columns],
                             y=[esc(s) for s in zero_shares.index], colorscale="Viridis", zmin=0, zmax=1,
                             colorbar=dict(title="share", len=0.28, y=0.62),
                             hovertemplate="%{y}, layer %{x}: %{z:.2f}<extra></extra>"), row=2, col=1)
    fig.add_trace(go.Bar(x=layers, y=table["summed_head_kl"], name="sum of single-head KLs", marker_color="#7f7f7f"),
                  row=3, col=1)
    for r, metric in ((4, "kl"), (5, "gold_logprob_change")):
        for part, colour in (("attention", "#9467bd"), ("block", "#8c564b")):
            if f"{part}_{metric}" not in table:
                continue
            y = table[f"{part}_{metric}"]
            fig.add_trace(go.Scatter(
                x=layers, y=y, mode="markers+lines", line=dict(color=colour, width=1), legendgroup=part,
                name=f"remove the layer's {part}" + (" (all heads and b_O)" if part == "attention" else ""),
                showlegend=r == 4, error_y=dict(type="data", symmetric=False,
                                                array=(table[f"{part}_{metric}_high"] - y).tolist(),
                                                arrayminus=(y - table[f"{part}_{metric}_low"]).tolist())),
                row=r, col=1)
    fig.update_yaxes(type="log", row=4, col=1)
    fig.update_xaxes(title_text="layer", row=5, col=1, dtick=1)
    fig.update_layout(title=esc(title), height=1350, width=1200, legend=dict(font=dict(size=11)),
                      margin=dict(t=90, l=110, r=20, b=50))
    return fig


def layer_removal_curves(table, *, title: str = "") -> go.Figure:
    """Accuracy, the gold answer's paired log-prob change and the paired KL against the number of layers removed,
    one row per part removed (attention, whole block), one line per ranking with its 95% intervals as error bars;
    random (the mean over seeds) dashed black and each seed's order thin grey without intervals, the oracle grey,
    heads zeroed by a head score (as many heads as the layers' attention holds) dotted. ``table``: :meth:`lens_heads.experiments.layer_removal.RemovalCurves
    .to_dataframe` with ``part`` and ``ranking`` columns (``style``: "random", "random seed", "oracle", "heads" or
    "")."""
    panels = (("accuracy", "accuracy (%)", 100.0), ("gold_logprob_change", "gold log-prob change (nats)", 1.0),
              ("kl", "KL(unablated || removed) (nats)", 1.0))
    parts = list(dict.fromkeys(table["part"]))
    fig = make_subplots(rows=len(parts), cols=3, horizontal_spacing=0.06, vertical_spacing=0.12,
                        subplot_titles=[f"{esc(part)}: {p[1]}" for part in parts for p in panels])
    rankings = [r for r in dict.fromkeys(table["ranking"])]
    for r, part in enumerate(parts, start=1):
        for ranking in rankings:
            points = table[(table["part"] == part) & (table["ranking"] == ranking)].sort_values("k")
            if points.empty:
                continue
            style = str(points["style"].iloc[0])
            line = (dict(color="black", width=2.5, dash="dash") if style == "random" else
                    dict(color="#aaa", width=1, dash="dot") if style == "random seed" else
                    dict(color="#555", width=3) if style == "oracle" else
                    dict(color=PALETTE[rankings.index(ranking) % len(PALETTE)], width=2,
                         dash="dot" if style == "heads" else "solid"))
            for c, (column, _, scale) in enumerate(panels, start=1):
                y = scale * points[column]
                fig.add_trace(go.Scatter(
                    x=points["k"], y=y, mode="lines+markers", name=esc(ranking), legendgroup=esc(ranking),
                    showlegend=c == 1 and r == 1 or (c == 1 and style == "heads"), line=line,
                    error_y=None if style == "random seed" else dict(
                        type="data", symmetric=False, array=(scale * points[f"{column}_high"] - y).tolist(),
                        arrayminus=(y - scale * points[f"{column}_low"]).tolist(), thickness=1, width=2),
                    hovertemplate=f"{esc(ranking)}<br>%{{x}} removed: %{{y:.3g}}<extra></extra>"), row=r, col=c)
        base = 100 * float(table["baseline_accuracy"].iloc[0])
        fig.add_hline(y=base, line=dict(color="black", width=1), annotation_text=f"baseline {base:.1f}%", row=r,
                      col=1)
        fig.add_hline(y=100 * float(table["chance"].iloc[0]), line=dict(color="#c00", width=1, dash="dot"),
                      annotation_text="chance", annotation_position="bottom right", row=r, col=1)
    fig.update_xaxes(title_text="layers removed (k)", row=len(parts))
    fig.update_layout(title=esc(title), height=430 * len(parts) + 90, width=1500, legend=dict(font=dict(size=11)),
                      margin=dict(t=90, l=60, r=20, b=50))
    return fig
