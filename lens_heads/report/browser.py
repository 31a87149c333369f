"""Open a report in headless Chromium with the network cut: for the offline test and the README screenshot.

``python -m lens_heads.report.browser REPORT.html OUT.png`` writes a screenshot of the top of the report.
Needs the dev extra (``playwright``) and a Chromium (``/usr/bin/chromium`` from Debian, or Playwright's own).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from lens_heads.plumbing.io import atomic_write_bytes

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-default-apps", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]


@dataclass
class PageLog:
    """What a page did: every request, the ones leaving the machine (aborted), console messages, errors, dialogs."""

    requests: list[str] = field(default_factory=list)
    outside: list[str] = field(default_factory=list)
    console: list[tuple[str, str]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)

    @property
    def console_errors(self) -> list[str]:
        return [text for kind, text in self.console if kind == "error"]


def chromium_path() -> str | None:
    """The system Chromium, if any (Playwright's bundled browser is used otherwise)."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


@contextmanager
def offline_browser():
    """Yield a headless Chromium (the system's where there is one) for `offline_page`: one launch for many pages."""
    from playwright.sync_api import sync_playwright  # optional (browser checks, dev extras)

    with sync_playwright() as p:
        exe = chromium_path()
        browser = p.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS) if exe else \
            p.chromium.launch(args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@contextmanager
def offline_page(path: str | Path, *, width: int = 1360, height: int = 900, settle_ms: int = 2500, browser=None):
    """Yield ``(page, log)`` with ``path`` loaded; any request that is not a local file is aborted and recorded.
    ``browser``: one from `offline_browser` (default: a Chromium launched for this page alone). Each page has a
    context of its own: no cache, storage or history is shared between pages."""
    if browser is None:
        with offline_browser() as own, offline_page(path, width=width, height=height, settle_ms=settle_ms,
                                                    browser=own) as shown:
            yield shown
        return
    log = PageLog()
    context = browser.new_context(viewport={"width": width, "height": height}, offline=True)
    try:
        page = context.new_page()

        def route(r):
            url = r.request.url
            if url.startswith(("file:", "data:", "blob:", "about:")):
                r.continue_()
            else:
                log.outside.append(url)
                r.abort()

        def dialog(d):
            log.dialogs.append(d.message)
            d.dismiss()

        page.route("**/*", route)
        page.on("request", lambda r: log.requests.append(r.url))
        page.on("console", lambda m: log.console.append((m.type, m.text)))
        page.on("pageerror", lambda e: log.errors.append(str(e)))
        page.on("dialog", dialog)
        page.goto(Path(path).resolve().as_uri(), wait_until="load")
        page.wait_for_timeout(settle_ms)  # plotly and React render after load
        yield page, log
    finally:
        context.close()


def screenshot(report: str | Path, png: str | Path, *, width: int = 1360, height: int = 1500,
               at: str | None = None) -> Path:
    """A PNG of the top of the report (model card and the first figures), as shown in the README; ``at``: of the
    page scrolled to the section of that id instead (a running page's banner stays in view)."""
    with offline_page(report, width=width, height=height) as (page, log):
        if at is not None:
            page.evaluate("(id) => { const s = document.getElementById(id); const b = document.getElementById("
                          "'run-banner'); window.scrollTo(0, s.getBoundingClientRect().top + window.scrollY - "
                          "(b ? b.offsetHeight : 0) - 16); }", at)
            page.wait_for_timeout(500)
        data = page.screenshot(full_page=False)
    if log.outside or log.errors:
        raise RuntimeError(f"the report is not self-contained: outside requests {log.outside}, errors {log.errors}")
    return atomic_write_bytes(png, data)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lens_heads.report.browser",
                                description="Screenshot a report.html offline (headless Chromium).")
    p.add_argument("report", help="path to report.html")
    p.add_argument("png", help="where to write the screenshot")
    p.add_argument("--width", type=int, default=1360)
    p.add_argument("--height", type=int, default=1500)
    p.add_argument("--at", metavar="ID", help="scroll to the section of this id first (e.g. ablation-arc_easy)")
    args = p.parse_args(argv)
    print(screenshot(args.report, args.png, width=args.width, height=args.height, at=args.at))
    return 0


if __name__ == "__main__":
    sys.exit(main())
