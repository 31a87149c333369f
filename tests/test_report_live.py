"""report.html while the run goes (lens_heads.report.live): a page after every stage whose finished sections are
complete and whose others say running or queued; the finished page as the pipeline rendered it before (no banner,
no reload); the page a stopped run leaves; writes a kill -9 cannot tear; the long-run warning's arithmetic.

The run is the command line on a tiny random model (the plumbing, not the numbers); every write of the page is kept
by wrapping the writer, so each page the run wrote is checked, in Chromium too.
"""

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tqdm.auto import tqdm

from lens_heads.plumbing.signals import Stopped
from lens_heads.report import estimate, live, pipeline, render, sections, stages
from lens_heads.report.__main__ import main
from lens_heads.report.config import ReportConfig

ARGS = ["tiny", "--n", "3", "--rank-n", "2", "--fractions", "0,0.25", "--scores", "AWFT", "--no-png", "--no-progress"]
PLANNED = ["scores:arc_easy", "ablation:arc_easy", "effects:arc_easy", "rank", "layers", "attention", "explorer"]
# plotly's figure divs, the head explorer's root and circuitsvis' mount point take a fresh random id at every rendering
RANDOM_IDS = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|lhx-[0-9a-f]{12}"
                        r"|circuits-vis-[0-9a-f]{8}-[0-9a-f]{4}")


def same_figures(page: str) -> str:
    return RANDOM_IDS.sub("ID", page)


STATUS = re.compile(r'<h2>([^<]*) \((running|queued|stopped|not run)\)</h2>')


def tiny(monkeypatch):
    from conftest import text_model

    model = text_model(n_ctx=512)
    monkeypatch.setattr(pipeline, "load_model", lambda *args, **kwargs: model)
    monkeypatch.setattr(live, "WATCH_SECONDS", 3600.0)  # only the writes at stage boundaries: a fixed sequence
    return model


def kept_writes(monkeypatch) -> list[str]:
    pages: list[str] = []
    write = live.atomic_write_text

    def keep(path, html):
        pages.append(html)
        return write(path, html)

    monkeypatch.setattr(live, "atomic_write_text", keep)
    return pages


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The command on the tiny model: every page it wrote while running, the finished page, and the finished page
    rendered again by the pipeline's own page functions from what write_outputs was given."""
    mp = pytest.MonkeyPatch()
    try:
        tiny(mp)
        pages = kept_writes(mp)
        finals: list[str] = []
        write_outputs = pipeline.write_outputs

        def rendered_again(out_dir, config, card, ran, results, log):
            files, png = write_outputs(out_dir, config, card, ran, results, log)
            title, subtitle = pipeline.page_title(results["model"], config, results["weight_basis"],
                                                  results["versions"], results["created"])
            table = {**{r.name: r.entry() for r in ran}, **({"png": png} if png else {})}
            body = pipeline.page_sections(card, ran, config, results["weight_basis"]) + [
                sections.run(table, results["versions"])]
            finals.append(render.render_page(title, subtitle, body))
            return files, png

        mp.setattr(pipeline, "write_outputs", rendered_again)
        out = tmp_path_factory.mktemp("live") / "report"
        assert main([*ARGS, "--out", str(out)]) == 0
        # a copy: the patch stays on for the module, and later tests' own runs (a stopped one) write pages too
        yield out, list(pages), finals[0]
    finally:
        mp.undo()


def statuses(page: str) -> dict[str, str]:
    return {title: status for title, status in STATUS.findall(page)}


@pytest.mark.slow  # the report end to end on the tiny model: seconds of page writing
def test_a_page_after_every_stage_says_what_runs_and_what_is_queued(run):
    out, pages, _ = run
    assert len(pages) >= len(PLANNED) - 1  # from the end of the first stage on, at least one page per stage
    titles = ["Head scores on arc_easy", "Ablation sweep on arc_easy", "Head effects on arc_easy", "Attention rank",
              "Whole layers", "Attention patterns", "Head explorer"]
    first = pages[0]
    # the first page: the first stage finished, with its section complete, and every other stage queued
    assert 'id="scores-arc_easy"' in first and "plotly-graph-div" in first and 'id="model-card"' in first
    assert statuses(first) == {title: "queued" for title in titles[1:]}
    seen_running = set()
    for page in pages:
        assert 'id="run-banner"' in page and "reloads itself every 12 s" in page and "lens_heads_scroll" in page
        state = statuses(page)
        running = [t for t, s in state.items() if s == "running"]
        assert len(running) <= 1
        seen_running.update(running)
        # the stages before the running one are finished: none of them is pending, every later one is
        order = [t for t in titles if t in state]
        assert order == titles[len(titles) - len(order):], order
        assert page.rstrip().endswith("</html>")
    assert seen_running == set(titles[1:])
    # once the sweep has run, the banner tells the time left at its pace, and results.json keeps what it told
    revised = [i for i, page in enumerate(pages) if "at the pace ablation:arc_easy ran" in page]
    assert revised and "Ablation sweep on arc_easy" not in statuses(pages[revised[0]])  # finished before
    told = json.loads((out / "results.json").read_text())["estimate"]["revised"]
    assert told["after"] == "ablation:arc_easy" and told["pace"] > 0 and told["seconds_left"] >= 0


@pytest.mark.slow  # the report end to end on the tiny model: seconds of page writing
def test_the_finished_page_is_the_page_the_pipeline_renders_with_no_banner(run):
    out, pages, again = run
    final = (out / "report.html").read_text()
    assert same_figures(final) == same_figures(again)
    assert "run-banner" not in final and "lens_heads_scroll" not in final and "location.reload" not in final
    assert statuses(final) == {}
    assert pages[-1] != final  # the last running page came before it, and nothing came after


@pytest.mark.slow  # the report end to end on the tiny model: seconds of page writing
def test_the_finished_page_is_what_the_pipeline_wrote_without_live_pages(tmp_path, monkeypatch):
    """The same run with the live pages off (the path the report took before them): the same page but for the
    run's provenance (the time under the title, the stages' seconds in the Run table)."""
    tiny(monkeypatch)
    pages = kept_writes(monkeypatch)
    config = ReportConfig(model="tiny", out=str(tmp_path / "old"), n=3, rank_n=2, fractions=(0.0, 0.25),
                          scores=("AWFT",), png=False, progress=False)
    pipeline.build_report(config, live=False, log=lambda msg: None)
    assert pages == []
    new_config = ReportConfig(**{**config.__dict__, "out": str(tmp_path / "new")})
    pipeline.build_report(new_config, live=True, log=lambda msg: None)
    assert pages

    def without_provenance(path: Path) -> str:
        page = same_figures(path.read_text()).replace(str(path.parent), "OUT")
        page = re.sub(r"— \d{4}-\d\d-\d\dT[^<]*</p></header>", "— TIME</p></header>", page)
        run_table = page[page.index('<section id="run">'):]
        return page.replace(run_table, re.sub(r"<td>[\d.]+</td>", "<td>S</td>", run_table))

    assert without_provenance(tmp_path / "old" / "report.html") == without_provenance(tmp_path / "new" / "report.html")


@pytest.mark.parametrize("stop, words", [(KeyboardInterrupt(), "interrupted"),
                                         (Stopped(signal.SIGTERM), "SIGTERM, exit 143")])
@pytest.mark.slow  # the report end to end on the tiny model: seconds of page writing
def test_a_stopped_run_leaves_a_page_saying_so_and_how_to_resume(tmp_path, monkeypatch, stop, words):
    tiny(monkeypatch)
    pages = kept_writes(monkeypatch)

    def stopped(*args, **kwargs):
        raise stop

    monkeypatch.setattr(stages, "attention_stage", stopped)
    out = tmp_path / "report"
    with pytest.raises(SystemExit) as ended:
        main([*ARGS, "--out", str(out)])
    assert ended.value.code == (130 if isinstance(stop, KeyboardInterrupt) else 143)
    page = (out / "report.html").read_text()
    assert page == pages[-1]
    assert f"The run stopped ({words}) before it finished" in page
    assert f"python -m lens_heads.report {' '.join(ARGS)} --out {out}" in page and "to resume" in page
    assert "lens_heads_scroll" not in page  # a stopped page does not reload
    assert statuses(page) == {"Attention patterns": "stopped", "Head explorer": "not run"}
    assert 'id="rank"' in page and "plotly-graph-div" in page  # what finished is on it
    # the same command resumes: the stages finished before the stop come from the cache, and the page is complete
    monkeypatch.undo()
    tiny(monkeypatch)
    assert main([*ARGS, "--out", str(out)]) == 0
    assert "run-banner" not in (out / "report.html").read_text()


def test_no_page_before_the_first_stage_finishes(tmp_path, monkeypatch):
    tiny(monkeypatch)
    pages = kept_writes(monkeypatch)

    def broken(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(stages, "score_stage", broken)
    with pytest.raises(SystemExit):
        main([*ARGS, "--out", str(tmp_path / "report")])
    assert pages == [] and not (tmp_path / "report" / "report.html").exists()


def test_the_running_section_counts_the_units_of_its_progress_bar():
    bar = tqdm(total=40, desc="sweep arc_easy units", unit="unit", file=io.StringIO())
    try:
        bar.update(10)
        started = bar.start_t
        progress = live.bar_progress()
        elapsed = time.time() - started
        assert (progress.done, progress.total, progress.unit) == (10, 40, "unit")
        assert progress.seconds_left == pytest.approx(elapsed / 10 * 30, rel=0.05, abs=0.05)
        text = live.running_text(live.Progress("sweep arc_easy units", 10, 40, "unit", 420.0), 130)
        assert text == ("Running for 2 min: 10 of 40 units done (sweep arc_easy units); about 7 min left at the "
                        "rate of the units so far.")
    finally:
        bar.close()
    assert live.bar_progress() is None  # a closed bar is not the running stage's


def test_a_page_text_from_data_is_escaped():
    banner = render.Banner("stopped <script>alert(1)</script>", kind="stopped")
    page = render.page_html("t", "s", [render.rendered(render.Section("<b>x</b>", [render.Text("<i>y</i>")]))],
                            banner)
    assert "<script>alert(1)" not in page and "&lt;script&gt;" in page and "<b>x</b>" not in page


# ---------------------------------------------------------------- kill -9


KILLED = """
import sys
sys.path.insert(0, "tests")
from test_report_live import ARGS
from conftest import text_model
from lens_heads.report import live, pipeline
from lens_heads.report.__main__ import main
model = text_model(n_ctx=512)
pipeline.load_model = lambda *a, **k: model
live.WATCH_SECONDS = 0.05  # a write every 50 ms: the kill lands between (or during) writes
main([*ARGS, "--no-progress", "--out", sys.argv[1]])
"""


@pytest.mark.slow  # the report end to end on the tiny model: seconds of page writing
def test_a_page_survives_kill_9_whole(tmp_path):
    out = tmp_path / "report"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, "-c", KILLED, str(out)], cwd=Path(__file__).resolve().parents[1],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 300
        while not (out / "report.html").exists() and time.time() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert (out / "report.html").exists(), "no page was written"
        time.sleep(0.5)  # several rewrites in
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    page = (out / "report.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</main></body></html>")
    assert 'id="run-banner"' in page


# ---------------------------------------------------------------- the long-run warning


def test_the_estimate_counts_the_later_stages_in_forwards_of_each_kind():
    four = ("AWFT", "AHON (LN)", "AHON", "AEQD")
    config = ReportConfig(n=2, rank_n=4, fractions=(0.0, 0.1, 0.2, 0.3), scores=four)
    # the sweep: the baseline and 3 random units shared, 3 x 4 threshold units row by row; the layers: 3 counts x 4
    # orders shared; hooked: the rank profile's 4 prompts (2 passes of 2 items), effects 3, the layers' own 2
    got = estimate.passes(config, 1)
    assert (got.shared, got.rows, got.hooked) == (4 + 12, 12, 2 + 3 + 2)
    two = estimate.passes(config, 2)  # the layers and the rank profile run on the first task only
    assert (two.shared, two.rows, two.hooked) == (8 + 12, 24, 2 + 6 + 2)
    quick = estimate.passes(ReportConfig(n=2, rank_n=4, fractions=(0.0, 0.1), scores=four, quick=True), 1)
    assert (quick.shared, quick.rows, quick.hooked) == (2, 4, 2)


def test_the_estimate_prices_each_kind_at_its_flops():
    from conftest import text_model
    from lens_heads.data.rows import build_rows
    from lens_heads.data.tasks import load_task
    from lens_heads.evaluation.flops import forward_flops, path_flops

    model = text_model()
    task = load_task("arc_easy", n=3, seed=0)
    rows = build_rows(model, list(task))
    work = estimate.measured(model, rows, 3, scores_seconds=2.0, batch_size=8)
    scoring = forward_flops(model.cfg, [len(r.tokens) for r in rows], sum(len(r.tokens) for r in rows))
    assert work.flops_per_second == pytest.approx(scoring / 2.0)
    assert work.flops_per_item["hooked"] == pytest.approx(scoring / 3)
    assert work.flops_per_item["rows"] == pytest.approx(path_flops(model, rows) / 3)
    assert work.flops_per_item["shared"] < work.flops_per_item["rows"]  # an item's choices share its context
    eager = estimate.measured(model, rows, 3, scores_seconds=2.0, batch_size=8, attention="eager")
    assert eager.flops_per_item["shared"] == eager.flops_per_item["rows"]  # no fused attention: no prefixes
    config = ReportConfig(n=3, rank_n=3)
    later = estimate.passes(config, 1)
    f = work.flops_per_item
    expected = 3 * (f["hooked"] + (later.shared * f["shared"] + later.rows * f["rows"] + later.hooked * f["hooked"])
                    / estimate.SPEED) / work.flops_per_second
    assert estimate.estimate(config, 1, work).seconds == pytest.approx(expected)
    each = work.stage_seconds(config, 1)  # the same seconds, stage by stage
    assert set(each) == {"ablation", "effects", "rank", "layers"}
    assert 3 * f["hooked"] / work.flops_per_second + sum(each.values()) == pytest.approx(expected)
    assert each["rank"] == pytest.approx(3 * 1.0 * f["hooked"] / estimate.SPEED / work.flops_per_second)


def test_the_first_later_stage_revises_the_time_left_at_its_pace():
    """Two tasks; the sweep on the first took twice its estimate: what is left (the sweep on the second task, the
    effects, the rank profile, the layers) is told at twice its estimate, in the log, the page and results.json."""
    from lens_heads.report.stage_table import STAGES

    work = estimate.Work({"shared": 1.0, "rows": 2.0, "hooked": 3.0}, flops_per_second=0.5)
    config = ReportConfig(n=4, rank_n=2, fractions=(0.0, 0.1, 0.2), scores=("AWFT", "AHON (LN)"))
    each = work.stage_seconds(config, 2)
    said = estimate.estimate(config, 2, work)
    logged: list[str] = []
    watch = pipeline.Watch(None, None, config, {"arc_easy": None, "piqa": None}, logged.append, time.perf_counter())
    watch.expected = said
    stage = {s.kind: s for s in STAGES}
    watch.finished(pipeline.Ran("compare", "done", seconds=1.0, stage=stage["compare"]))  # not a priced stage
    assert watch.revision is None
    took = 2 * each["ablation"] / 2
    watch.finished(pipeline.Ran("ablation:arc_easy", "done", seconds=took, stage=stage["ablation"], task="arc_easy"))
    left = 2 * (each["ablation"] / 2 + each["effects"] + each["rank"] + each["layers"])
    assert watch.revision["pace"] == pytest.approx(2.0) and watch.revision["seconds_left"] == pytest.approx(left, abs=0.1)
    assert logged == [f"[report] ablation:arc_easy took 2.0x its estimate: {live.duration(left)} left at that pace"]
    watch.finished(pipeline.Ran("ablation:piqa", "done", seconds=100 * took, stage=stage["ablation"], task="piqa"))
    assert watch.revision["pace"] == pytest.approx(2.0) and len(logged) == 1  # told once
    free = pipeline.Watch(None, None, config, {"arc_easy": None}, logged.append, time.perf_counter())
    free.expected = estimate.estimate(config, 1, estimate.Work({"shared": 0.0, "rows": 0.0, "hooked": 0.0}, 1.0))
    free.finished(pipeline.Ran("ablation:arc_easy", "done", seconds=took, stage=stage["ablation"], task="arc_easy"))
    assert free.revision is None and len(logged) == 1  # a stage priced at nothing gives no pace


def test_the_estimate_names_the_choices_that_fit():
    # one FLOP an item for every kind: seconds = n x (1 + (shared + rows + hooked) / SPEED) / rate
    work = estimate.Work({"shared": 1.0, "rows": 1.0, "hooked": 1.0}, flops_per_second=1.0)
    four = ("AWFT", "AHON (LN)", "AHON", "AEQD")
    config = ReportConfig(n=2, rank_n=2, fractions=(0.0, 0.1, 0.2, 0.3), scores=four)

    def seconds(c):
        p = estimate.passes(c, 1)
        return c.n * (1 + (p.shared + p.rows + p.hooked) / estimate.SPEED)

    scale = 1.01 * estimate.LONG_RUN_SECONDS / seconds(config)  # the whole run just too long
    slow = estimate.Work(work.flops_per_item, flops_per_second=1.0 / scale)
    got = estimate.estimate(config, 1, slow)
    assert got.seconds == pytest.approx(scale * seconds(config)) and got.long
    assert "more than 10 min" in got.message() and "stop it" in got.message()
    flags = dict(got.choices)
    for flag, seconds_then in flags.items():  # each fits even where the estimate falls ERROR short
        assert seconds_then <= (1 - estimate.ERROR) * estimate.LONG_RUN_SECONDS and f"{flag} (about" in got.message()
    one = ReportConfig(n=1, rank_n=2, fractions=config.fractions, scores=four)
    assert flags["--n 1"] == pytest.approx(scale * seconds(one))
    # --n 1 inside the limit as estimated but not at the estimate's longest: not offered
    near = 0.8 * estimate.LONG_RUN_SECONDS / seconds(one)
    offered = dict(estimate.estimate(config, 1, estimate.Work(work.flops_per_item, 1.0 / near)).choices)
    assert "--n 1" not in offered and near * seconds(one) < estimate.LONG_RUN_SECONDS
    short = estimate.estimate(config, 1, estimate.Work(work.flops_per_item, flops_per_second=scale * 10))
    assert not short.long and "more than" not in short.message()


def test_the_estimate_holds_to_the_recorded_report_runs():
    """Each timed report run of the default sizes in docs/records/report_live.json kept what its scores stage
    measured (results.json's "estimate"); priced at today's SPEED, it gives the run's own seconds (from loading to
    the end) within the estimate's stated ERROR (the machine's speed moves between the scores and the later stages,
    and the stages' costs are not all FLOPs). A --quick run is left out: in so short a run, costs the FLOPs don't
    count weigh more, and the page shows how far off its estimate was."""
    import json

    from lens_heads.report.__main__ import config_from_args

    record = json.loads((Path(__file__).resolve().parents[1] / "docs/records/report_live.json").read_text())
    assert record["embedded"] and record["gpt2_medium"]  # rotary and learned positions, a small and a larger model
    runs = [run for run in record["embedded"] + record["gpt2_medium"] if "--quick" not in run["command"]]
    assert len(runs) >= 2
    for run in runs:
        config = config_from_args(run["command"].split()[3:])
        work = estimate.Work.from_dict(run["estimate"])
        got = estimate.estimate(config, len(config.tasks), work).seconds
        assert abs(got / run["run_s"] - 1) < estimate.ERROR, (run["command"], got, run["run_s"])
        # what it said after the sweep: the seconds so far and those left at the sweep's pace, within the same error
        told = run["estimate"]["revised"]
        assert told["after"] == "ablation:arc_easy" and told["seconds"] > told["seconds_left"] > 0
        assert abs(told["seconds"] / run["run_s"] - 1) < estimate.ERROR, (run["command"], told, run["run_s"])


# ---------------------------------------------------------------- in Chromium


def distinct_states(pages: list[str]) -> list[str]:
    """One page of each state of the run (which stages finished, which runs), in order."""
    seen, out = set(), []
    for page in pages:
        state = tuple(sorted(statuses(page).items()))
        if state not in seen:
            seen.add(state)
            out.append(page)
    return out


@pytest.mark.browser
def test_chromium_shows_every_page_of_the_run_without_errors(run, tmp_path):
    from lens_heads.report.browser import offline_browser, offline_page

    out, pages, _ = run
    shown_pages = [*distinct_states(pages), (out / "report.html").read_text()]
    with offline_browser() as browser:
        for i, page in enumerate(shown_pages):
            path = tmp_path / f"page{i}.html"
            path.write_text(page)
            with offline_page(path, settle_ms=1500, browser=browser) as (tab, log):
                assert log.errors == [] and log.console_errors == [] and log.outside == [], (i, log.errors,
                                                                                             log.console_errors)
                shown = {h.rsplit(" (", 1)[0]: h.rsplit(" (", 1)[1].rstrip(")")
                         for h in tab.locator("main h2").all_inner_texts() if h.endswith(("(running)", "(queued)"))}
                assert shown == statuses(page), i
                banner = tab.locator("#run-banner")
                if i < len(shown_pages) - 1:  # every page the run wrote says it is still going; the finished one not
                    assert "still going" in banner.inner_text() and "reloads itself" in banner.inner_text()
                else:
                    assert banner.count() == 0
                for state in ("running", "queued"):  # each such section says so in its words too
                    for title in [t for t, s in statuses(page).items() if s == state]:
                        text = tab.locator("main section", has=tab.locator(f"h2:text-is('{title} ({state})')"))
                        assert text.inner_text().split("\n")[-1].startswith("Running for" if state == "running"
                                                                            else "Queued:")


@pytest.mark.browser
def test_a_running_page_reloads_itself_where_it_was_scrolled_to(run, tmp_path):
    from lens_heads.report.browser import offline_page

    _, pages, _ = run
    path = tmp_path / "running.html"
    path.write_text(pages[0])
    with offline_page(path, width=1366, height=700, settle_ms=500) as (tab, log):
        tab.evaluate("() => { window.lensHeadsMark = 1; window.scrollTo(0, 600); }")
        tab.wait_for_timeout((live.RELOAD_SECONDS + 3) * 1000)
        assert tab.evaluate("() => window.lensHeadsMark") is None  # a fresh document: it reloaded
        assert tab.evaluate("() => performance.getEntriesByType('navigation')[0].type") == "reload"
        assert abs(tab.evaluate("() => window.scrollY") - 600) <= 1
        assert log.errors == [] and log.console_errors == []
