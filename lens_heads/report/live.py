"""report.html while the run goes: written when the first stage finishes and after every stage, and between stages
as the running stage's progress bar moves.

Each finished section is complete; the stage that is running says so, with its progress (units done of units and
the time left estimated from the units so far, read from its progress bar) and the later ones say they are queued.
The page reloads itself every ``RELOAD_SECONDS`` keeping its scroll position, and says so at the top. A run that
stops (SIGTERM, Ctrl-C, an error outside the stages) leaves a page saying it stopped and how to resume. The finished
page is not written here: the pipeline renders it as before, with no banner and no reload.

Every write goes through a temporary file and a rename (:func:`lens_heads.plumbing.io.atomic_write_text`), so a
reader, or a process killed with -9 between writes, never leaves a half-written page.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from tqdm.std import tqdm

from lens_heads.plumbing.io import atomic_write_text
from lens_heads.report.render import Banner, Rendered, Section, Text, page_html, rendered

RELOAD_SECONDS = 12  # the page's own reload
WATCH_SECONDS = 10.0  # how often the running stage's progress is looked at (and the page rewritten if it moved)


@dataclass(frozen=True)
class Progress:
    """The running stage's outermost progress bar: ``done`` of ``total`` units, and the seconds left at the rate of
    the units done so far in this run (None before the first)."""

    desc: str
    done: int
    total: int
    unit: str
    seconds_left: float | None


def bar_progress() -> Progress | None:
    """The outermost open progress bar with a total (tqdm keeps every open bar; a disabled one, under
    ``--no-progress``, counts nothing and is not kept)."""
    bars = [b for b in list(tqdm._instances) if getattr(b, "total", None) and not getattr(b, "disable", True)]
    if not bars:
        return None
    bar = min(bars, key=lambda b: (abs(getattr(b, "pos", 0)), getattr(b, "start_t", 0.0)))
    done, total = int(bar.n), int(bar.total)
    ran = done - int(getattr(bar, "initial", 0) or 0)  # units reused from the cache took no time
    elapsed = time.time() - bar.start_t
    left = elapsed / ran * (total - done) if ran > 0 else None
    return Progress(str(bar.desc or "").rstrip(": "), done, total, str(bar.unit), left)


def duration(seconds: float) -> str:
    """``"about 40 s"``, ``"about 7 min"``, ``"about 1 h 20 min"``."""
    if seconds < 90:
        return f"about {max(5, round(seconds / 5) * 5):.0f} s"
    minutes = round(seconds / 60)
    return f"about {minutes} min" if minutes < 90 else f"about {minutes // 60} h {minutes % 60} min"


def running_text(progress: Progress | None, seconds: float) -> str:
    """What a running stage's section says."""
    so_far = f"Running for {duration(seconds).removeprefix('about ')}"
    if progress is None:
        return f"{so_far}; its progress is shown where progress bars are on (not under --no-progress)."
    left = (f"; {duration(progress.seconds_left)} left at the rate of the units so far"
            if progress.seconds_left is not None else "; the time left is known once a unit has finished")
    what = f" ({progress.desc})" if progress.desc else ""
    return f"{so_far}: {progress.done} of {progress.total} {progress.unit}s done{what}{left}."


@dataclass(frozen=True)
class Planned:
    """A stage the run will reach: its name in the Run table, its title and anchor on the page."""

    name: str
    title: str
    anchor: str
    skipped: Section | None = None  # known before it is reached (--quick): its note, shown from the first page
    skip_reason: str = ""


class LivePage:
    """Writes ``path`` as the run goes (see the module docstring).

    ``head(finished)``: the sections above the stages (findings, model card) from the finished stages' runs;
    ``section(run)``: a finished stage's section; ``run_table(entries)``: the Run section from the stage table so far.
    Writes start at the first stage that finishes; a watcher thread rewrites the page between stages where the
    running stage's progress moved. Call :meth:`close` before the finished page is written, so nothing of the run's
    pages comes after it.
    """

    def __init__(self, path: Path, title: str, subtitle: str, plan: list[Planned], *, head: Callable[[list], list],
                 section: Callable[[Any], Section | None], run_table: Callable[[dict], Section],
                 resume: str, watch_seconds: float | None = None):
        self.path, self.title, self.subtitle, self.plan = Path(path), title, subtitle, plan
        self._head, self._section, self._run_table, self.resume = head, section, run_table, resume
        self.note = ""  # a line the banner adds (the run's expected end)
        self._lock, self._writing = threading.Lock(), threading.Lock()
        self._done: list = []  # the runs of the finished stages, in order
        self._parts: dict[str, Rendered] = {}  # each finished stage's section, rendered once
        self._head_parts: list[Rendered] = []
        self._running: tuple[str, float] | None = None  # (name, start time)
        self._last = ""
        self.writes = 0
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, args=(watch_seconds or WATCH_SECONDS,), daemon=True,
                                         name="lens_heads report page")

    # ---------------------------------------------------------------- the pipeline's calls

    def started(self, name: str) -> None:
        with self._lock:
            self._running = (name, time.perf_counter())
        if self._done:
            self._refresh()

    def finished(self, ran) -> None:
        section = self._section(ran)
        with self._lock:
            self._done.append(ran)
            self._running = None
            if section is not None:
                self._parts[ran.name] = rendered(section)
            self._head_parts = [rendered(s) for s in self._head(self._done)]
        self._refresh()
        if not self._watcher.is_alive() and not self._stop.is_set():
            self._watcher.start()

    def stopped(self, why: str) -> None:
        """The last page of a run that stopped: what finished, what did not, and how to resume."""
        self.close()
        if not self._done:
            return  # nothing finished: no page was written, none is started now
        banner = Banner(f"The run stopped ({why}) before it finished: the sections that finished are complete, the "
                        f"others were not computed. {self.resume}", kind="stopped")
        self._refresh(banner, stopped=True)

    def close(self) -> None:
        self._stop.set()
        if self._watcher.is_alive():
            self._watcher.join()

    # ---------------------------------------------------------------- the page

    def _watch(self, every: float) -> None:
        while not self._stop.wait(every):
            self._refresh()

    def _page(self, banner: Banner | None = None, stopped: bool = False) -> str:
        with self._lock:
            done = {r.name: r for r in self._done}
            running, parts, head = self._running, dict(self._parts), list(self._head_parts)
        progress = bar_progress() if running else None
        body, entries = list(head), {}
        for planned in self.plan:
            if planned.name in done:
                entries[planned.name] = done[planned.name].entry()
                if planned.name in parts:
                    body.append(parts[planned.name])
                continue
            if planned.skipped is not None:
                entries[planned.name] = {"status": "skipped", "seconds": None, "cpu_seconds": None,
                                         "reason": planned.skip_reason}
                body.append(rendered(planned.skipped))
                continue
            if running is not None and planned.name == running[0]:
                status = "stopped" if stopped else "running"
                text = ("Stopped while running; the run resumes from the units it finished."
                        if stopped else running_text(progress, time.perf_counter() - running[1]))
            else:
                status = "not run" if stopped else "queued"
                text = ("Not run: the run stopped before it." if stopped
                        else "Queued: runs after the stages above.")
            entries[planned.name] = {"status": status, "seconds": None, "cpu_seconds": None}
            body.append(rendered(Section(f"{planned.title} ({status})", [Text(text, "note")],
                                         anchor=planned.anchor)))
        body.append(rendered(self._run_table(entries)))
        if banner is None:
            banner = Banner(f"This run is still going: the finished sections below are complete and the others say "
                            f"running or queued. The page reloads itself every {RELOAD_SECONDS} s."
                            + (f" {self.note}" if self.note else ""), reload_seconds=RELOAD_SECONDS)
        return page_html(self.title, self.subtitle, body, banner)

    def _refresh(self, banner: Banner | None = None, stopped: bool = False) -> None:
        with self._writing:  # composed and written in one go: an older page never lands after a newer one
            html = self._page(banner, stopped)
            if html != self._last:
                atomic_write_text(self.path, html)
                self._last, self.writes = html, self.writes + 1
