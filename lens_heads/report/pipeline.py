"""The report pipeline: load the model and data, run the stages of the stage table (``stage_table.STAGES``: what
each computes, needs and shows, when it is skipped, per task or once; docs/report.md shows it), render each one's
section after the findings and the model card, and write the folder.

A stage that raises is recorded as failed (with its traceback in results.json and a note on the page) and the others
still run; a stage that needs one that failed or did not run is not run (status "not run", "needs <stage>"), never
run on a substitute; the command then exits non-zero. PNG export is a step of its own: skipped where kaleido or
Chromium is missing, failed where a figure fails to draw.
"""

from __future__ import annotations

import sys
import time
import traceback
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Generic, Sequence, TypeVar

import torch

from lens_heads.data.rows import DEFAULT_PROTOCOL, build_rows
from lens_heads.data.tasks import load_task
from lens_heads.models.loading import load_model, model_meta
from lens_heads.plumbing import distributed
from lens_heads.plumbing.cache import Cache
from lens_heads.plumbing.errors import InputError
from lens_heads.plumbing.io import atomic_write_json, atomic_write_text, slug
from lens_heads.plumbing.provenance import provenance
from lens_heads.report import sections, stages
from lens_heads.report.config import ReportConfig
from lens_heads.report.estimate import Estimate, estimate, measured, revised
from lens_heads.report.findings import findings
from lens_heads.report.live import LivePage, Planned, duration
from lens_heads.report.render import render_page
from lens_heads.report.stage_result import StageResult
from lens_heads.report.stage_table import STAGES, Inputs, Need, Skip, Stage
from lens_heads.viz import export

R = TypeVar("R", bound=StageResult, covariant=True)


@dataclass(frozen=True)
class Ran(Generic[R]):
    """One stage's outcome: its result where it finished, else why not; wall and CPU seconds (all threads: on a
    shared machine the wall time says little)."""

    name: str  # its key in results.json's stages and the Run table: "kind:task" per task
    status: str  # "done" | "failed" | "skipped" | "not run" (a stage it needs did not finish)
    seconds: float | None = None
    cpu_seconds: float | None = None
    result: R | None = None
    reason: str = ""
    traceback: str = ""
    stage: Stage | None = None  # its entry of the stage table (None for the model's loading)
    task: str | None = None  # its task, for a stage run per task
    skip: Skip | None = None  # why it was skipped

    def entry(self) -> dict:
        entry = {"status": self.status, "seconds": self.seconds, "cpu_seconds": self.cpu_seconds}
        if self.reason:
            entry["reason"] = self.reason
        if self.traceback:
            entry["traceback"] = self.traceback
        return entry


def run_stage(name: str, log, compute: Callable[..., R], needs: Sequence[Ran] = ()) -> Ran[R]:
    """Run one stage on the results of the stages it ``needs`` (``compute(*their results)``); a stage's error must
    not lose the other stages' work, so it is recorded, not raised. Where a stage it needs failed or did not run, it
    is not run either ("not run", naming that stage): never run on a substitute."""
    missing = [r.name for r in needs if r.status != "done" or r.result is None]
    if missing:
        reason = f"needs {', '.join(missing)}"
        log(f"[report] stage {name} not run: {reason}")
        return Ran(name, "not run", reason=reason)
    log(f"[report] stage {name} ...")
    t0, c0 = time.perf_counter(), time.process_time()

    def seconds() -> dict[str, Any]:
        return dict(seconds=round(time.perf_counter() - t0, 2), cpu_seconds=round(time.process_time() - c0, 2))

    try:
        return Ran(name, "done", result=compute(*[r.result for r in needs]), **seconds())
    except (KeyboardInterrupt, MemoryError):
        raise
    except Exception as e:
        log(f"[report] stage {name} FAILED: {type(e).__name__}: {e}")
        return Ran(name, "failed", reason=f"{type(e).__name__}: {e}", traceback=traceback.format_exc(), **seconds())


def build_report(config: ReportConfig, *, model=None, log=None, live: bool = True, command: str | None = None) -> dict:
    """Run every stage of the stage table (``stage_table.STAGES``) for ``config`` and write the report folder;
    returns the ``results.json`` content.

    ``live``: report.html is written when the first stage finishes and rewritten as the run goes (:mod:`live`); the
    finished page replaces it at the end. ``command``: the command line that resumes the run, for the page a stopped
    run leaves."""
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True) if distributed.is_main() else None)
    out_dir = Path(config.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cache, started, cpu_started = Cache(out_dir / "cache"), time.perf_counter(), time.process_time()
    torch.manual_seed(config.seed)

    tasks = load_tasks(config)  # first: a malformed task file is refused before the model loads
    log(f"[report] loading {config.model} ...")
    t0 = time.perf_counter()
    model = model if model is not None else load_model(config.model, device=config.device, dtype=config.dtype,
                                                           backend=config.backend)
    meta = model_meta(model)
    ran: list[Ran[StageResult]] = [Ran("load_model", "done", seconds=round(time.perf_counter() - t0, 2))]
    key = {"model": meta.get("source", meta.get("name")), "name": config.model, "dtype": str(config.dtype),
           "basis": meta.get("weight_basis"), "seed": config.seed}
    card = stages.model_card(meta, config)
    page = live_page(out_dir, config, meta, tasks, card, ran[0], command) if live and distributed.is_main() else None
    watch = Watch(page, model, config, tasks, log, started)
    try:
        ran += run_stages(STAGES, Inputs(model, config, cache, key), tasks, log, watch=watch)
        if page is not None:
            page.close()  # nothing of the running pages may land after the finished one
        results = describe(config, meta, tasks, ran)
        files, png = write_outputs(out_dir, config, card, ran, results, log) if distributed.is_main() else ([], None)
    except BaseException as e:  # a signal (Stopped), Ctrl-C, or an error outside the stages
        if page is not None:
            page.stopped(stop_reason(e))
        raise
    total = {"status": "done", "seconds": round(time.perf_counter() - started, 1),
             "cpu_seconds": round(time.process_time() - cpu_started, 1)}
    results["stages"] = {**{r.name: r.entry() for r in ran}, **({"png": png} if png else {}), "total": total}
    if watch.expected is not None:  # what the run said it would take, beside what it took
        results["estimate"] = {**watch.expected.to_dict(), **({"revised": watch.revision} if watch.revision else {})}
    if distributed.is_main():
        atomic_write_json(out_dir / "results.json", {**results, "files": files})
    log(f"[report] done in {time.perf_counter() - started:.0f} s: {out_dir / 'report.html'}")
    return {**results, "files": files}


def stop_reason(e: BaseException) -> str:
    """How a run ended early, in the words of the page it leaves."""
    if getattr(e, "signal", None):
        return f"{e.signal}, exit {e.code}"  # type: ignore[attr-defined]
    if isinstance(e, KeyboardInterrupt):
        return "interrupted"
    return f"{type(e).__name__}: {e}".splitlines()[0]


def live_page(out_dir: Path, config: ReportConfig, meta: dict, tasks: dict, card: StageResult, loaded: Ran,
              command: str | None) -> LivePage:
    """The page written while the run goes (:class:`lens_heads.report.live.LivePage`)."""
    made = provenance()
    basis = meta.get("weight_basis", "unknown")
    title, subtitle = page_title(meta, config, basis, made["versions"], made["recorded_at"])
    plan = []
    for stage, task in planned(STAGES, config, tasks):
        skip = stage.skip(config)
        plan.append(Planned(stage_name(stage, task), stage.title + (f" on {task}" if task else ""),
                            f"{stage.kind}-{task}" if task else stage.kind,
                            skipped=stage.skipped_section(task) if skip and stage.skipped_section else None,
                            skip_reason=skip.value if skip else ""))
    again = (f"Run the same command again to resume ({command})" if command else
             "Run the same report again (same settings and output folder) to resume")
    resume = f"{again}: the finished stages and sweep units are cached in {out_dir / 'cache'} and are reused."
    return LivePage(out_dir / "report.html", title, subtitle, plan,
                    head=lambda done: head_sections(card, done, config),
                    section=lambda r: stage_section(r, basis),
                    run_table=lambda entries: sections.run({loaded.name: loaded.entry(), **entries},
                                                           made["versions"]),
                    resume=resume)


class Watch:
    """What the pipeline does around each stage: the live page's writes, after the first stage the run's expected
    time, a warning where it is long (:mod:`lens_heads.report.estimate`), and after the first later stage the time
    left at the pace it ran."""

    def __init__(self, page: LivePage | None, model, config: ReportConfig, tasks: dict, log, started: float):
        self.page, self.model, self.config, self.tasks, self.log = page, model, config, tasks, log
        self.run_started = started  # the run's time.perf_counter() at its start
        self.expected: Estimate | None = None
        self.revision: dict | None = None  # the time left, told once the first later stage has run
        self.done: set[str] = set()  # the stage kinds finished on every task

    def started(self, name: str) -> None:
        if self.page is not None:
            self.page.started(name)

    def finished(self, r: Ran) -> None:
        kind = r.stage.kind if r.stage is not None else None
        if self.expected is None and kind == "scores" and r.status == "done":
            self.expected = self.estimate(r)
        elif self.revision is None and r.status == "done" and r.seconds and self.priced(kind):
            self.revise(r)
        if kind is not None and (r.task is None or r.task == list(self.tasks)[-1]):
            self.done.add(kind)
        if self.page is not None:
            self.page.finished(r)

    def priced(self, kind: str | None) -> bool:
        """Whether the run's estimate priced the stage ``kind`` at more than nothing (a pace needs a price)."""
        return self.expected is not None and kind is not None and \
            self.expected.work.stage_seconds(self.config, len(self.tasks)).get(kind, 0.0) > 0

    def revise(self, r: Ran) -> None:
        """The time left at the pace the first later stage ran (the forwards' speed against the scoring pass's
        differs by model and machine: this stage measured it)."""
        assert self.expected is not None and r.stage is not None and r.seconds
        pace, left = revised(self.expected.work, self.config, len(self.tasks), r.stage.kind, r.seconds, self.done)
        elapsed = time.perf_counter() - self.run_started
        self.revision = {"after": r.name, "pace": round(pace, 3), "seconds_left": round(left, 1),
                         "seconds": round(elapsed + left, 1)}
        self.log(f"[report] {r.name} took {pace:.1f}x its estimate: {duration(left)} left at that pace")
        if self.page is not None:
            self.page.note = (f"Expected to finish around {clock_after(left)} ({duration(left)} left at the pace "
                              f"{r.name} ran, {pace:.1f}x its estimate).")

    def estimate(self, r: Ran) -> Estimate | None:
        """The run's expected time from the scores stage that just ran (none where its scores came from the cache)."""
        result = r.result
        if not isinstance(result, stages.ScoresResult) or result.reused or not r.seconds:
            return None
        try:
            rows = build_rows(self.model, list(result.task), protocol=result.scores.meta.get("data", {}).get(
                "protocol", DEFAULT_PROTOCOL))
        except Exception:  # the estimate is advice: a task whose rows can't be laid out here gets none
            return None
        work = measured(self.model, rows, len(result.task), r.seconds, self.config.batch_size,
                        self.config.evaluation.attention, time.perf_counter() - self.run_started - r.seconds)
        expected = estimate(self.config, len(self.tasks), work)
        self.log(f"[report] {'warning: ' if expected.long else ''}{expected.message()}")
        if self.page is not None:
            left = expected.seconds - (time.perf_counter() - self.run_started)
            self.page.note = f"Expected to finish around {clock_after(left)}: {expected.message()}"
        return expected


def clock_after(seconds: float) -> str:
    """The local time (HH:MM) ``seconds`` from now: when the page says a run is expected to finish."""
    return time.strftime("%H:%M", time.localtime(time.time() + seconds))


def stage_name(stage: Stage, task: str | None) -> str:
    """A stage's key in results.json's stages and the Run table: ``kind:task`` per task."""
    return f"{stage.kind}:{task}" if task else stage.kind


def planned(table: Sequence[Stage], settings: ReportConfig, tasks: dict) -> list[tuple[Stage, str | None]]:
    """The stages the report has, in the table's order, each with its task (None for a stage run once)."""
    return [(stage, task) for stage in table if stage.present(settings, len(tasks))
            for task in (list(tasks) if stage.per_task else [None])]


def run_stages(table: Sequence[Stage], inputs: Inputs, tasks: dict, log, watch: "Watch | None" = None) -> list[Ran]:
    """Every stage of ``table`` the report has, in the table's order: a per-task stage on each task, the others
    once on the first task. A stage is skipped where its ``skip`` says so, and not run where a stage it needs did
    not finish. ``watch`` is told as each stage starts and finishes."""
    first = next(iter(tasks))
    by_kind = {stage.kind: stage for stage in table}
    ran: dict[tuple[str, str | None], Ran] = {}

    def of(need: Need, task: str) -> list[Ran]:
        """The runs of the stage ``need`` names ("not run" where the report has none, or not yet)."""
        per_task = need.kind in by_kind and by_kind[need.kind].per_task
        on = [t if per_task else None for t in (list(tasks) if need.every_task else [task])]
        return [ran.get((need.kind, t)) or Ran(f"{need.kind}:{t}" if t else need.kind, "not run") for t in on]

    for stage, task in planned(table, inputs.settings, tasks):
        own = task or first
        needs, uses = [of(need, own) for need in stage.needs], [of(need, own) for need in stage.uses]
        if watch is not None:
            watch.started(stage_name(stage, task))
        ran[stage.kind, task] = run_one(stage, task, inputs, tasks[own], needs, uses, log)
        if watch is not None:
            watch.finished(ran[stage.kind, task])
    return list(ran.values())


def run_one(stage: Stage, task: str | None, inputs: Inputs, data, needs: list[list[Ran]], uses: list[list[Ran]],
            log) -> Ran:
    """One stage on one task's data (``task`` None for a stage run once): skipped, not run or its outcome."""
    name = stage_name(stage, task)
    skip = stage.skip(inputs.settings)
    if skip is not None:
        return Ran(name, "skipped", reason=skip.value, stage=stage, task=task, skip=skip)
    every = [need.every_task for need in stage.needs]
    finished = [[r.result if r.status == "done" else None for r in group] for group in uses]
    used = [group if need.every_task else group[0] for need, group in zip(stage.uses, finished)]

    def compute(*results):
        it = iter(results)
        taken = [[next(it) for _ in group] if whole else next(it) for whole, group in zip(every, needs)]
        return stage.compute(inputs, data, *taken, *used)

    outcome = run_stage(name, log, compute, needs=[r for group in needs for r in group])
    return replace(outcome, stage=stage, task=task)


def load_tasks(config: ReportConfig) -> dict:
    """The benchmarks of ``config.tasks``, then the items of ``config.task_file`` (named after the file)."""
    tasks = {name: load_task(name, n=config.n, seed=config.seed) for name in config.tasks}
    if config.task_file:
        own = load_task(config.task_file, format=config.task_format, n=config.n, seed=config.seed)
        if own.name in tasks:
            raise InputError(f"the task file's name {own.name!r} is also a benchmark of --tasks: rename the file")
        tasks[own.name] = own
    return tasks


def describe(config: ReportConfig, meta: dict, tasks: dict, ran: list[Ran]) -> dict:
    """results.json without its stage table: what was run, on what, and every finished stage's numbers (a skipped
    stage's status and reason in their place)."""
    made = provenance()
    results = {
        "report_format": 1, "created": made["recorded_at"], "settings": config.to_dict(), "versions": made["versions"],
        "machine": made["machine"], "commit": made["commit"], "dirty": made["dirty"],
        "model": meta, "weight_basis": meta.get("weight_basis", "unknown"),
        "data": {name: task.meta() for name, task in tasks.items()}}
    for r in ran:
        if r.stage is None:
            continue
        if r.skip is not None:
            numbers = {"status": "skipped", "reason": r.skip.value}
        elif r.status == "done" and r.result is not None:
            numbers = r.result.numbers
        else:
            continue
        if r.task:
            results.setdefault(r.stage.kind, {})[r.task] = numbers
        else:
            results[r.stage.kind] = numbers
    return results


def page_sections(card: StageResult, ran: list[Ran], config: ReportConfig, weight_basis: str) -> list:
    """The page, section by section, in the order the stages ran."""
    out = head_sections(card, ran, config)
    return out + [section for section in (stage_section(r, weight_basis) for r in ran) if section is not None]


def head_sections(card: StageResult, ran: list[Ran], config: ReportConfig) -> list:
    """The findings box (from the stages that finished) and the model card."""
    done = [r for r in ran if r.stage is not None and r.status == "done"]
    of = lambda kind: [r.result for r in done if r.stage is not None and r.stage.kind == kind]  # noqa: E731
    rank = of("rank")
    return [findings(of("scores"), of("ablation"), rank[0] if rank else None), sections.model_card(card, config)]


def stage_section(r: Ran, weight_basis: str):
    """A stage's section: its result, the note of a skipped stage, or why it did not finish."""
    if r.stage is None:
        return None
    if r.status == "done":
        return r.stage.section(r.result, weight_basis)
    if r.skip is not None and r.stage.skipped_section is not None:
        return r.stage.skipped_section(r.task)
    title = r.stage.title + (f" on {r.task}" if r.task else "")
    return sections.not_done(title, r.status, r.reason)


def file_name(name: str) -> str:
    """A table's or figure's file name in the report folder: a task given as a path (``lm_eval:tasks/x.yaml``) is
    one name, not folders (``ablation_lm_eval_tasks_x.yaml``)."""
    return slug(name, keep="-_.")


def page_title(meta: dict, config: ReportConfig, weight_basis: str, versions: dict, created: str) -> tuple[str, str]:
    """The page's title and the line under it (model, shape, weight basis, seed, version, when)."""
    subtitle = (f"{meta.get('name')} — {meta.get('n_layers')} layers x {meta.get('n_heads')} heads — "
                f"{weight_basis} — seed {config.seed} — lens_heads {versions.get('lens_heads')} — {created}")
    return f"lens_heads report: {meta.get('name')}", subtitle


def write_outputs(out_dir: Path, config: ReportConfig, card, ran: list[Ran], results: dict, log
                  ) -> tuple[list[str], dict | None]:
    """CSV tables, PNG figures and report.html; returns the files written and the PNG step's stage entry."""
    done = [card] + [r.result for r in ran if r.result is not None]
    files = []
    for result in done:
        for name, df in result.tables.items():
            atomic_write_text(out_dir / f"{file_name(name)}.csv", df.to_csv(index=False))
            files.append(f"{file_name(name)}.csv")
    figures = {name: fig for result in done for name, fig in result.figures.items()}
    png, pngs = write_pngs(out_dir, figures, log) if config.png and figures else (None, [])
    files += pngs
    title, subtitle = page_title(results["model"], config, results["weight_basis"], results["versions"],
                                 results["created"])
    stage_table = {**{r.name: r.entry() for r in ran}, **({"png": png} if png else {})}
    body = page_sections(card, ran, config, results["weight_basis"]) + [sections.run(stage_table, results["versions"])]
    atomic_write_text(out_dir / "report.html", render_page(title, subtitle, body))
    return files + ["report.html", "results.json"], png


def write_pngs(out_dir: Path, figures: dict, log) -> tuple[dict, list[str]]:
    """Every figure as PNG: the PNG step's stage entry and the files written. Where kaleido or Chromium is missing
    the step is skipped, saying what to install (the numbers, CSVs and report.html do not need the PNGs); a figure
    that fails to draw fails the step, naming the figure, and the others are still written."""
    t0 = time.perf_counter()
    written, failed, tracebacks = [], [], []
    try:
        with export.png_writer() as write:
            for name, fig in figures.items():
                try:
                    write(fig, out_dir / f"{file_name(name)}.png")
                    written.append(f"{file_name(name)}.png")
                except (export.PngUnavailable, KeyboardInterrupt, MemoryError):
                    raise
                except Exception as e:
                    failed.append(f"{name}: {type(e).__name__}: {e}".splitlines()[0])
                    tracebacks.append(f"{name}\n{traceback.format_exc()}")
    except export.PngUnavailable as e:
        log(f"[report] PNG figures skipped: {e}")
        return {"status": "skipped", "reason": str(e)}, []
    # Chromium draws in its own process: this process's CPU time would leave it out
    timing = {"seconds": round(time.perf_counter() - t0, 2), "cpu_seconds": None}
    if failed:
        log(f"[report] stage png FAILED: {len(failed)} of {len(figures)} figures not drawn: {'; '.join(failed)}")
        return {"status": "failed", **timing, "reason": f"{len(failed)} of {len(figures)} figures not drawn: "
                f"{'; '.join(failed)}", "traceback": "\n".join(tracebacks)}, written
    return {"status": "done", **timing}, written
