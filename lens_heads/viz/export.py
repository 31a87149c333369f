"""Figures to files: each figure's self-contained HTML and its PNG, which kaleido draws by driving a headless
Chromium. Where kaleido or Chromium is missing, :func:`save_figure` skips the PNG alone (:class:`PngUnavailable`),
so a run never loses its numbers to a missing browser. The figures themselves are in the ``*_figures`` modules."""

from __future__ import annotations

import sys
import time
import warnings
from contextlib import contextmanager
from pathlib import Path

import plotly.graph_objects as go
import plotly.io as pio

from lens_heads.plumbing.io import atomic_write_bytes, atomic_write_text


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
