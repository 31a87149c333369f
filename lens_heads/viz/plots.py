"""Plotly figures of lens_heads results: pure functions from result numbers to ``go.Figure``, plus PNG export.

Used by the report, the analyses and the notebooks. No text from data enters a figure unescaped: plotly reads a
subset of HTML in labels, so any label that could come from data goes through :func:`lens_heads.viz.escape.esc` first. Sweep curves are told
apart by the table's columns (``curve``, ``score``, ``mode``), never by parsing a curve's label.
"""

from __future__ import annotations

import sys
import time
import warnings
from contextlib import contextmanager
from pathlib import Path

import plotly.graph_objects as go
import plotly.io as pio
from plotly.subplots import make_subplots

from lens_heads.plumbing.io import atomic_write_bytes, atomic_write_text
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


class PngUnavailable(RuntimeError):
    """PNG export can't run here: kaleido, or the Chromium it drives, is not installed. The only PNG error a caller
    may pass over (the numbers and HTML don't need the PNGs); any other error is a bug in a figure."""


def png_unavailable() -> str | None:
    """Why PNG export can't run here (kaleido or its Chromium missing), or None where it can. Chromium is looked up
    as kaleido looks it up (``BROWSER_PATH``, ``PATH``, kaleido's own download): kaleido's figure server, started
    without one, would leave every figure waiting for a browser that never comes."""
    try:
        import kaleido  # noqa: F401  (only PNG export needs it)
        from choreographer.browsers.chromium import Chromium  # kaleido's browser driver, installed with it
    except ImportError as e:
        return f"kaleido is not installed ({e}): pip install 'kaleido>=1'"
    path = Chromium.find_browser(skip_local=False)
    if not path or not Path(path).is_file():
        return "no Chromium for kaleido: install it (apt-get install chromium, or kaleido_get_chrome)"
    return None


def check_png() -> None:
    """Raise :class:`PngUnavailable` (saying what to install) where PNG export can't run."""
    missing = png_unavailable()
    if missing:
        raise PngUnavailable(missing)


@contextmanager
def png_writer():
    """Yields ``write(fig, path)``; one headless Chromium serves every figure (the first one costs seconds).
    Raises :class:`PngUnavailable` at once where kaleido or Chromium is missing."""
    check_png()
    import kaleido  # deferred: only PNG export needs its Chromium driver

    started = False
    try:
        kaleido.start_sync_server(silence_warnings=True)
        started = True
    except Exception as e:  # an old kaleido without the server: plotly starts a Chromium per figure (slower)
        warnings.warn(f"kaleido's figure server did not start ({type(e).__name__}: {e}); each PNG starts its own "
                      "Chromium instead (slower)", RuntimeWarning, stacklevel=3)

    def write(fig: go.Figure, path: str | Path) -> Path:
        return atomic_write_bytes(path, png_bytes(fig))

    try:
        yield write
    finally:
        if started:
            kaleido.stop_sync_server(silence_warnings=True)


def png_bytes(fig: go.Figure, *, width: int | None = None, height: int | None = None, scale: float = 1) -> bytes:
    """The figure as PNG (kaleido, which drives a headless Chromium; :class:`PngUnavailable` where either is
    missing)."""
    check_png()
    for attempt in range(3):  # the first figure can race Chromium's page load on a busy machine
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # "kopts ignored when using a server"
                return pio.to_image(fig, format="png", width=width or fig.layout.width or 1200,
                                    height=height or fig.layout.height or 500, scale=scale)
        except Exception:
            if attempt == 2:
                raise
            time.sleep(2.0 * (attempt + 1))
    raise AssertionError("unreachable: the last attempt returns or raises")


def save_figure(fig: go.Figure, stem: str | Path, *, png: bool = True, plotlyjs: bool | str = True,
                **image) -> list[str]:
    """``stem.html`` (self-contained with ``plotlyjs=True``) and, with ``png``, ``stem.png`` (``image``: width,
    height, scale), each written atomically. Where PNG export can't run (no Chromium, :class:`PngUnavailable`) the
    PNG is skipped with a line on stderr, so a run never loses its numbers to a missing browser; any other error
    drawing it is raised. The names written."""
    stem = Path(stem)
    atomic_write_text(stem.with_suffix(".html"), fig.to_html(include_plotlyjs=plotlyjs, full_html=True))
    written = [stem.with_suffix(".html").name]
    if png:
        try:
            atomic_write_bytes(stem.with_suffix(".png"), png_bytes(fig, **image))
            written.append(stem.with_suffix(".png").name)
        except PngUnavailable as e:
            print(f"PNG for {stem.name} not written ({e}); or pass --no-png", file=sys.stderr)
    return written


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


def loss_curves(train_loss, eval_steps, eval_loss, *, title: str = "") -> go.Figure:
    """A training run's loss per step (each step's batch) and its held-out loss where it was measured."""
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=list(range(1, len(train_loss) + 1)), y=list(train_loss), mode="lines",
                             name="training batch", line=dict(color=PALETTE[0], width=1)))
    fig.add_trace(go.Scatter(x=list(eval_steps), y=list(eval_loss), mode="lines+markers", name="held out",
                             line=dict(color=PALETTE[1], width=2)))
    fig.update_xaxes(title_text="step")
    fig.update_yaxes(title_text="loss (nats per answer token)")
    fig.update_layout(title=esc(title), width=900, height=450)
    return fig
