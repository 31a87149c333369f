"""The report as one self-contained HTML page.

A page is a list of sections; a section holds blocks. Every block that carries text from data, tokens or the
command line goes through ``html.escape`` here; the only raw HTML accepted is what this package builds itself
(``Raw``: plotly fragments and circuitsvis renders whose tokens were escaped before rendering). plotly.js is inlined
once in the head, and the page links to nothing outside itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
from plotly.offline import get_plotlyjs

from lens_heads.viz.escape import esc


@dataclass
class Text:
    """A paragraph of plain text (escaped)."""

    text: str
    kind: str = "p"  # "p" | "note" | "unavailable"


@dataclass
class Table:
    """A DataFrame shown as a table (cells and headers escaped)."""

    df: pd.DataFrame
    caption: str = ""
    float_format: str = "{:.4g}"


@dataclass
class Figure:
    """An interactive plotly figure."""

    fig: object
    caption: str = ""


@dataclass
class Raw:
    """HTML built by this package (never from data): circuitsvis renders with escaped tokens."""

    html: str


@dataclass
class Section:
    title: str
    blocks: list = field(default_factory=list)
    anchor: str = ""


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{background:#1d2330;color:#fff;padding:18px 32px}header h1{margin:0 0 4px;font-size:22px}
header p{margin:0;color:#c7cbd4;font-size:14px}
nav{padding:8px 32px;background:#e9ecf1;font-size:14px}nav a{margin-right:14px;color:#2a4d8f;text-decoration:none}
main{padding:8px 32px 48px;max-width:1280px}
section{background:#fff;border-radius:8px;padding:12px 20px 16px;margin:16px 0;box-shadow:0 1px 2px #0001}
h2{font-size:18px;margin:6px 0 10px}p{line-height:1.45;font-size:14px;max-width:980px}
p.note{color:#566072;font-size:13px}p.unavailable{background:#fff4e0;border-left:4px solid #e09a26;padding:8px}
table{border-collapse:collapse;font-size:13px;margin:6px 0 12px}caption{text-align:left;font-weight:600;padding:4px 0}
th,td{border-bottom:1px solid #e3e6eb;padding:3px 10px;text-align:right}th{background:#f0f2f5}
td:first-child,th:first-child{text-align:left}figcaption{font-size:13px;color:#566072}
figure{margin:8px 0;max-width:100%}.table-fit{max-width:100%;overflow-x:auto}
th{white-space:normal;vertical-align:bottom;max-width:160px}
body{overflow-wrap:break-word}section{overflow-x:auto}
p.finding{margin:4px 0;padding:6px 10px;background:#eef4ff;border-left:4px solid #2a4d8f;max-width:none}
"""


@dataclass(frozen=True)
class Banner:
    """A line above the page's sections while the run is going (``reload_seconds``: the page reloads itself that
    often, keeping its scroll position) or after it stopped (no reload)."""

    text: str
    kind: str = "running"  # "running" | "stopped"
    reload_seconds: int | None = None


@dataclass(frozen=True)
class Rendered:
    """One section as HTML, with the title and anchor the page's navigation shows."""

    title: str
    anchor: str
    html: str


def rendered(s: Section) -> Rendered:
    return Rendered(s.title, s.anchor or _anchor(s.title), _section(s))


def render_page(title: str, subtitle: str, sections: list[Section], banner: Banner | None = None) -> str:
    """The whole page as a string (``banner``: the run is still going or stopped; none on the finished page)."""
    return page_html(title, subtitle, [rendered(s) for s in sections], banner)


# Kept scroll position across the reloads of a page that is still being written: the browser's own restoration
# does not survive location.reload() on every engine; window.name stands in where storage is refused (file: URLs).
RELOAD_JS = """(function(){var k="lens_heads_scroll",ms=%d;
function put(v){try{sessionStorage.setItem(k,v)}catch(e){window.name=k+"="+v}}
function get(){try{return sessionStorage.getItem(k)}catch(e){var m=/^lens_heads_scroll=(\\d+)$/.exec(window.name);return m&&m[1]}}
if("scrollRestoration" in history)history.scrollRestoration="manual";
window.addEventListener("load",function(){var y=get();if(y!==null)window.scrollTo(0,+y)});
setTimeout(function(){put(String(Math.round(window.scrollY)));location.reload()},ms)})();"""


# in the banner's own style element, so the finished page (no banner) carries nothing of it
BANNER_CSS = """.banner{position:sticky;top:0;z-index:10;margin:0;padding:10px 32px;font-size:14px;border-bottom:1px solid #0002}
.banner p{margin:0;max-width:none}.banner.running{background:#eef4ff}.banner.stopped{background:#fff4e0}"""


def banner_html(banner: Banner) -> str:
    script = "" if banner.reload_seconds is None else f"<script>{RELOAD_JS % (1000 * banner.reload_seconds)}</script>"
    return (f'<style>{BANNER_CSS}</style><div class="banner {esc(banner.kind)}" id="run-banner">'
            f'<p>{esc(banner.text)}</p>{script}</div>\n')


def page_html(title: str, subtitle: str, parts: list[Rendered], banner: Banner | None = None) -> str:
    """The page from sections already rendered (a page rewritten while the run goes renders each finished section
    once)."""
    nav = "".join(f'<a href="#{esc(p.anchor)}">{esc(p.title)}</a>' for p in parts)
    body = "\n".join(p.html for p in parts)
    live = "" if banner is None else banner_html(banner)
    # The head says no outside request is wanted: plotly.js is inline and the CSP forbids network fetches.
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src 'unsafe-inline' 'unsafe-eval'; \
style-src 'unsafe-inline'; img-src data: blob:; font-src data:; connect-src 'none'">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{esc(title)}</title><style>{CSS}</style>
<script type="text/javascript">{get_plotlyjs()}</script>
</head><body>
<header><h1>{esc(title)}</h1><p>{esc(subtitle)}</p></header>
<nav>{nav}</nav>
{live}<main>
{body}
</main></body></html>
"""


def _anchor(title: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in title.lower()).strip("-")


def _section(s: Section) -> str:
    inner = "\n".join(_block(b) for b in s.blocks)
    return f'<section id="{esc(s.anchor or _anchor(s.title))}"><h2>{esc(s.title)}</h2>\n{inner}</section>'


def _block(b) -> str:
    if isinstance(b, Text):
        cls = "" if b.kind == "p" else f' class="{esc(b.kind)}"'
        return f"<p{cls}>{esc(b.text)}</p>"
    if isinstance(b, Table):
        return f'<div class="table-fit">{table_html(b.df, b.caption, b.float_format)}</div>'
    if isinstance(b, Figure):
        fig = go.Figure(b.fig)  # the page's copy follows its card's width; the PNG keeps the figure's own
        fig.layout.width = None
        fig.layout.autosize = True
        div = pio.to_html(fig, full_html=False, include_plotlyjs=False, include_mathjax=False,
                          config={"displaylogo": False, "responsive": True})
        cap = f"<figcaption>{esc(b.caption)}</figcaption>" if b.caption else ""
        return f"<figure>{div}{cap}</figure>"
    if isinstance(b, Raw):
        return b.html
    raise TypeError(f"unknown block {type(b).__name__}")


def table_html(df: pd.DataFrame, caption: str = "", float_format: str = "{:.4g}") -> str:
    """A DataFrame as an HTML table; every header and cell is escaped."""
    def cell(v) -> str:
        if isinstance(v, float):
            return "" if v != v else esc(float_format.format(v))
        return esc(v)

    head = "".join(f"<th>{esc(c)}</th>" for c in df.columns)
    rows = "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in row) + "</tr>"
                   for row in df.itertuples(index=False, name=None))
    cap = f"<caption>{esc(caption)}</caption>" if caption else ""
    return f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"
