"""HTML escaping for every page and figure label lens_heads writes: text that came from data or tokens is
escaped before it reaches HTML (plotly labels read a subset of HTML too)."""

from __future__ import annotations

import html


def esc(text) -> str:
    """Escape any value for HTML text or attribute context."""
    return html.escape(str(text), quote=True)
