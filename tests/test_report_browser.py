"""Open the ``--quick`` report in headless Chromium with the network cut.

Every request that is not a local file is aborted and recorded; the page must make none, log no console error
and throw nothing; the plots must actually render (plotly SVGs, the circuitsvis head selector); the example
prompt that carries HTML markup must show as text (no <b> element, no alert).
"""

import pytest

from lens_heads.report.browser import offline_page
from report_run import MARKUP_PROMPT, quick_report

pytestmark = pytest.mark.browser

LOCAL = ("file:", "data:", "blob:", "about:")


@pytest.fixture(scope="module")
def page_and_log(tmp_path_factory):
    run = quick_report(tmp_path_factory)
    assert run.returncode == 0, run.stderr[-3000:]
    with offline_page(run.out / "report.html") as (page, log):
        yield run, page, log


def test_no_request_leaves_the_page(page_and_log):
    _, _, log = page_and_log
    assert log.outside == []
    assert [u for u in log.requests if not u.startswith(LOCAL)] == []


def test_renders_without_console_errors(page_and_log):
    _, page, log = page_and_log
    assert log.errors == [] and log.console_errors == [], (log.errors, log.console_errors)
    assert page.title().startswith("lens_heads report: smollm2-135m")


def test_plots_are_drawn(page_and_log):
    run, page, _ = page_and_log
    n_figures = len(list(run.out.glob("*.png")))  # every plotly figure also went to a PNG
    graphs = page.locator(".plotly-graph-div")
    assert graphs.count() == n_figures >= 3
    for i in range(graphs.count()):
        assert graphs.nth(i).locator("svg.main-svg").count() >= 1
        assert graphs.nth(i).bounding_box()["height"] > 200
    cv = page.locator(".circuitsvis")
    assert cv.count() == 1
    assert "Head Selector" in cv.inner_text() and "most active" in cv.inner_text()
    assert cv.locator("canvas").count() >= 1  # the zoomed pattern is drawn
    # Everything after the circuitsvis mount point stays outside it.
    assert page.locator(".circuitsvis table").count() == 0


def test_markup_in_the_prompt_shows_as_text(page_and_log):
    _, page, log = page_and_log
    assert log.dialogs == []  # the <script>alert(1)</script> in the prompt never ran
    assert page.locator("main b").count() == 0
    texts = page.locator("#attention p").all_inner_texts()
    assert f"Prompt 1: {MARKUP_PROMPT}" in texts


# Every element that draws or holds text must end inside its section's content box (1 px of rounding allowed).
OVERFLOW = """() => { const out = [];
  for (const s of document.querySelectorAll('main section')) {
    const right = s.getBoundingClientRect().right - parseFloat(getComputedStyle(s).paddingRight) + 1;
    if (s.scrollWidth > s.clientWidth + 1) out.push(['section', s.id, s.scrollWidth, s.clientWidth]);
    for (const e of s.querySelectorAll('table, figure, .plotly-graph-div, svg.main-svg, .lhx, .circuitsvis, p, canvas')) {
      const b = e.getBoundingClientRect();
      if (b.width > 0 && b.right > right) out.push([e.tagName, e.className, s.id, Math.round(b.right), Math.round(right)]);
    }
  }
  return out; }"""


@pytest.mark.parametrize("width", [1366, 1920])
def test_every_figure_and_table_fits_its_card(page_and_log, width):
    _, page, _ = page_and_log
    page.set_viewport_size({"width": width, "height": 1000})
    page.wait_for_timeout(1500)  # plotly's responsive figures follow the window
    try:
        assert page.evaluate("() => document.querySelector('main section').clientWidth") > 0.8 * min(width, 1280)
        assert page.evaluate(OVERFLOW) == []
        # and the check can see an overflow: a table made wider than its card is caught
        page.evaluate("() => { document.querySelector('#model-card table').style.width = '3000px'; }")
        assert page.evaluate(OVERFLOW) != []
    finally:
        page.evaluate("() => { document.querySelector('#model-card table').style.width = ''; }")


# The page itself never scrolls sideways: what is wider than its card scrolls in its own box.
PAGE_WIDTH = "() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]"


@pytest.mark.parametrize("width", [1366, 1920])
def test_the_page_never_scrolls_sideways(page_and_log, width):
    _, page, _ = page_and_log
    page.set_viewport_size({"width": width, "height": 1000})
    page.wait_for_timeout(1500)
    wide = "() => { const t = document.querySelector('#run table'); t.style.minWidth = '4000px'; }"
    try:
        scroll, client = page.evaluate(PAGE_WIDTH)
        assert scroll <= client, (scroll, client)
        page.evaluate(wide)  # a table far wider than the window: its box scrolls, the page does not
        scroll, client = page.evaluate(PAGE_WIDTH)
        assert scroll <= client, (scroll, client)
        box = page.evaluate("() => { const b = document.querySelector('#run table').parentElement; "
                            "return [b.className, b.scrollWidth, b.clientWidth, getComputedStyle(b).overflowX]; }")
        assert box[0] == "table-fit" and box[1] >= 4000 > box[2] and box[3] == "auto", box
    finally:
        page.evaluate("() => { document.querySelector('#run table').style.minWidth = ''; }")


def test_the_explorer_section_shows_the_clicked_head(page_and_log):
    _, page, _ = page_and_log
    page.click('#explorer .lhx-grid div[data-layer="2"][data-head="3"]')
    assert page.inner_text("#explorer .lhx-title") == "Head L2H3"
    menu = page.eval_on_selector_all("#explorer .lhx-score option", "os => os.map(o => o.value)")
    assert "AHON (LN)" in menu and any(m.startswith("effect: KL when zeroed") for m in menu)
    assert page.locator("#explorer .lhx-pattern td[data-value]").count() > 0
