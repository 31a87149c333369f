"""Figures of head-zeroing sweeps: accuracy and its paired companions against the share of heads zeroed, one curve
per score beside the reference curves (random, oracle), and how the curves place across models and tasks.

Sweep curves are told apart by the table's columns (``curve``, ``score``, ``mode``), never by parsing a curve's
label; any label that could come from data goes through :func:`lens_heads.viz.escape.esc` first.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from lens_heads.heads.scores import LN_NAMES, base_score
from lens_heads.stats.curves import RANDOM
from lens_heads.viz.escape import esc
from lens_heads.viz.palette import PALETTE

PANELS = (("accuracy", "accuracy (%)", 100.0),
          ("gold_logprob_change", "change of log P(gold) (nats, paired)", 1.0),
          ("kl", "KL(unablated || ablated) over the choices (nats)", 1.0),
          ("bits_per_byte_change", "change of the gold answer's bits per byte (paired)", 1.0))
INTERVALS = {"accuracy": ("ci_low", "ci_high"), "gold_logprob_change": ("gold_logprob_low", "gold_logprob_high"),
             "kl": ("kl_low", "kl_high"), "bits_per_byte_change": ("bits_per_byte_low", "bits_per_byte_high")}
REFERENCE_MODES = ("random", "oracle", "reference")  # curves that no score chooses: drawn in every row of the figure
REFERENCE_COLOURS = ("#8b0000", "#006400", "#b8860b", "#4b0082")


@dataclass(frozen=True)
class Curve:
    """One curve of a sweep table: its label, the score that chose its heads, and how it zeroes them."""

    label: str
    score: str
    mode: str  # "threshold" | "static" | "per_input" | "random" | "oracle" | "reference"

    @property
    def reference(self) -> bool:
        return self.mode in REFERENCE_MODES


def curve_labels(table):
    """Each row's curve label: its ``curve``, or its ``score`` where the table (or a recorded table concatenated
    with newer rows) has none."""
    return table["curve"].fillna(table["score"]) if "curve" in table.columns else table["score"]


def sweep_curves(table) -> list[Curve]:
    """The curves of a sweep table (:meth:`lens_heads.sweep.result.SweepResult.to_dataframe`), in order of appearance.

    ``curve`` is the label (``score`` where the table has no ``curve`` column); a curve's mode is that of its
    ablated points (the point at 0 is the shared unablated baseline). A table without ``mode`` holds threshold
    curves and the random one."""
    labels = curve_labels(table)
    modes = table["mode"] if "mode" in table.columns else [
        "random" if score == RANDOM else "threshold" for score in table["score"]]
    found: dict[str, Curve] = {}
    for label, score, mode in zip(labels.astype(str), table["score"].astype(str), modes):
        if label not in found or (found[label].mode == "baseline" and mode != "baseline"):
            found[label] = Curve(label, score, str(mode))
    return list(found.values())


def curve_style(curve: Curve, families: list[str], oracle_index: int = 0) -> dict:
    """Line style of a curve: random dashed black; oracle curves grey (solid, then dotted); other reference curves
    (a ranking drawn beside every score, ``oracle_index`` among them) dark colours; a score and its (LN) variant
    share their family's colour: solid LN, dash-dot base, dotted static."""
    if curve.mode == "random":
        return dict(color="black", width=2.5, dash="dash")
    if curve.mode == "oracle":
        return dict(color="#555", width=3, dash=("solid", "dot", "dash")[oracle_index % 3])
    if curve.mode == "reference":
        return dict(color=REFERENCE_COLOURS[oracle_index % len(REFERENCE_COLOURS)], width=3, dash="solid")
    colour = PALETTE[families.index(base_score(curve.score)) % len(PALETTE)]
    dash = "dot" if curve.mode == "static" else ("solid" if curve.score in LN_NAMES else "dashdot")
    return dict(color=colour, width=2, dash=dash)


def _curve_rows(curves: list[Curve]) -> dict[str, list[Curve]]:
    """Figure rows: with more than six scored curves, base scores and (LN) scores get a row each; the reference
    curves (random, oracle) appear in every row."""
    references = [c for c in curves if c.reference]
    scored = [c for c in curves if not c.reference]
    groups = {"": scored}
    if len(scored) > 6:
        groups = {"base scores": [c for c in scored if c.score not in LN_NAMES],
                  "layer-normalised (LN) scores": [c for c in scored if c.score in LN_NAMES]}
    return {g: cs + references for g, cs in groups.items() if cs} or {"": references}


def ablation_curves(table, *, baseline: float, chance: float, title: str = "") -> go.Figure:
    """Accuracy and the two paired companions (gold log-prob change, KL) against the realised % of heads zeroed.

    ``table``: :meth:`lens_heads.sweep.result.SweepResult.to_dataframe` (one row per curve point); a panel is drawn for
    each of :data:`PANELS` whose column the table has. The random curve is drawn with its 95% intervals.
    ``baseline`` and ``chance`` are in % (lines in the accuracy panel, where there is one)."""
    curves = sweep_curves(table)
    labels = curve_labels(table)
    groups = _curve_rows(curves)
    families = list(dict.fromkeys(base_score(c.score) for c in curves if not c.reference))
    oracles = {mode: [c.label for c in curves if c.mode == mode] for mode in ("oracle", "reference")}
    panels = [p for p in PANELS if p[0] in table.columns]
    fig = make_subplots(rows=len(groups), cols=len(panels), horizontal_spacing=0.06, vertical_spacing=0.12,
                        subplot_titles=[p[1] for _ in groups for p in panels])
    for r, (group, members) in enumerate(groups.items(), start=1):
        if group:
            fig.update_yaxes(title_text=group, row=r, col=1)
        for curve in members:
            points = table[labels.astype(str) == curve.label].sort_values(["realised_fraction", "target_fraction"])
            index = oracles[curve.mode].index(curve.label) if curve.mode in oracles else 0
            style = curve_style(curve, families, index)
            for c, panel in enumerate(panels, start=1):
                fig.add_trace(_curve_trace(points, curve, panel, style, legend=c == 1 and (
                    not curve.reference or r == 1)), row=r, col=c)
        if panels[0][0] == "accuracy":
            _reference_lines(fig, r, baseline, chance)
    fig.update_xaxes(title_text="realised % of (input, layer, head) zeroed", row=len(groups))
    fig.update_layout(title=esc(title), height=420 * len(groups) + 80, width=max(800, 500 * len(panels)),
                      legend=dict(font=dict(size=11)), margin=dict(t=90, l=60, r=20, b=50))
    return fig


def _curve_trace(points, curve: Curve, panel, style: dict, legend: bool) -> go.Scatter:
    """One curve in one panel; the random curve carries its 95% intervals as error bars."""
    column, _, scale = panel
    low, high = INTERVALS[column]
    y = scale * points[column]
    err = dict(type="data", symmetric=False, array=(scale * points[high] - y).tolist(),
               arrayminus=(y - scale * points[low]).tolist(), thickness=1, width=2) \
        if curve.mode == "random" and high in points else None
    name = esc(curve.label)
    return go.Scatter(x=100 * points["realised_fraction"], y=y, mode="lines+markers", name=name, legendgroup=name,
                      line=style, marker=dict(size=5), error_y=err, showlegend=legend,
                      hovertemplate=f"{name}<br>%{{x:.1f}}% zeroed: %{{y:.3g}}<extra></extra>")


def _reference_lines(fig: go.Figure, row: int, baseline: float, chance: float) -> None:
    """The unablated baseline, the 1-point line below it and chance, in the accuracy panel of ``row``."""
    fig.add_hline(y=baseline, line=dict(color="black", width=1), annotation_text=f"baseline {baseline:.1f}%",
                  row=row, col=1)
    fig.add_hline(y=baseline - 1, line=dict(color="black", width=1, dash="dot"), annotation_text="baseline - 1",
                  annotation_position="bottom right", row=row, col=1)
    fig.add_hline(y=100 * chance, line=dict(color="#c00", width=1, dash="dot"),
                  annotation_text=f"chance {100 * chance:.1f}%", row=row, col=1)


def rank_heatmap(ranks, *, low=None, high=None, wide: float = 4.0, title: str = "") -> go.Figure:
    """Rank of each curve (rows) within each (model, task) (columns), 1 = best; the number is written in the cell,
    with its 95% interval in the hover where ``low``/``high`` are given, and marked ``~`` where the interval spans
    more than ``wide`` ranks (the data hardly place that curve).

    ``ranks``, ``low``, ``high``: :meth:`lens_heads.sweep.compare.SweepComparison.rank_table` (DataFrames, curves x model /
    task; ``rank_table("rank_low")`` and ``("rank_high")`` for the interval)."""
    curves, columns = [str(c) for c in ranks.index], [str(c) for c in ranks.columns]
    z = ranks.to_numpy(dtype=float)
    lo = np.full_like(z, np.nan) if low is None else low.loc[ranks.index, ranks.columns].to_numpy(dtype=float)
    hi = np.full_like(z, np.nan) if high is None else high.loc[ranks.index, ranks.columns].to_numpy(dtype=float)
    text = [[f"{v:g}" + ("~" if h - l > wide else "") for v, l, h in zip(*row)] for row in zip(z, lo, hi)]
    span = [[f"[{l:g}, {h:g}]" if np.isfinite(l) else "no interval" for l, h in zip(*row)] for row in zip(lo, hi)]
    fig = go.Figure(go.Heatmap(
        z=z, x=[esc(c) for c in columns], y=[esc(c) for c in curves], colorscale="Viridis_r", zmin=1,
        zmax=len(curves), text=text, customdata=span, texttemplate="%{text}", colorbar=dict(title="rank"),
        hovertemplate="%{y} on %{x}: rank %{z:g}, 95% interval %{customdata}<extra></extra>"))
    if low is not None:
        fig.add_annotation(text=f"~ : the rank's 95% interval spans more than {wide:g} ranks", showarrow=False,
                           xref="paper", yref="paper", x=0, y=-0.12, xanchor="left", font=dict(size=11))
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(title=dict(text=esc(title), font=dict(size=14)), height=max(360, 32 * len(curves) + 160),
                      width=max(720, 170 * len(columns) + 300), margin=dict(t=80, l=120, r=20, b=80))
    return fig


def correlation_heatmap(matrix, *, title: str = "", label: str = "Spearman") -> go.Figure:
    """A symmetric correlation matrix (a square DataFrame) on a diverging -1..1 scale, values in the cells."""
    names = [esc(str(c)) for c in matrix.columns]
    z = matrix.to_numpy(dtype=float)
    fig = go.Figure(go.Heatmap(
        z=z, x=names, y=names, colorscale="RdBu", zmin=-1, zmax=1, text=[[f"{v:.2f}" for v in row] for row in z],
        texttemplate="%{text}", colorbar=dict(title=esc(label)),
        hovertemplate=f"%{{y}} vs %{{x}}: {esc(label)} %{{z:.3f}}<extra></extra>"))
    fig.update_yaxes(autorange="reversed")
    side = max(560, 150 * len(names) + 260)
    fig.update_layout(title=dict(text=esc(title), font=dict(size=14)), height=side, width=side + 160,
                      margin=dict(t=80, l=160, r=20, b=120))
    return fig
