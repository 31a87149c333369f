"""Open the ``--quick`` report in headless Chromium with the network cut.

Every request that is not a local file is aborted and recorded; the page must make none, log no console error
and throw nothing; the plots must actually render (plotly SVGs, the circuitsvis head selector); the example
prompt that carries HTML markup must show as text (no <b> element, no alert).
"""

import pytest

from lens_heads.report.browser import offline_page
from report_run import MARKUP_PROMPT, quick_report

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
