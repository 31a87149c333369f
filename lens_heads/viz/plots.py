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

from lens_heads.plumbing.io import atomic_write_bytes, atomic_write_text
from lens_heads.viz.escape import esc
from lens_heads.viz.palette import PALETTE


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
