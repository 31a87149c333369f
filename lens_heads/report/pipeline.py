"""The report pipeline: load the model and data, run each stage (``stages``), render its section (``sections``) and
write the folder.

``build_report`` reads as the list of stages: model card; head scores per task; the ablation sweep per task; where
the report holds more than one sweep (several tasks, or recorded sweeps given with ``compare``), their comparison;
head effects per task (skipped under ``quick``); the attention-rank profile; whole layers on the first task (per-layer
scores and the attention of whole layers removed in each ranking's order; skipped under ``quick``); attention
patterns of the most and least active heads. Each stage names the stages it needs (``run_stage(..., needs=)``). A
stage that raises is recorded as failed (with its traceback in results.json and a note on the page) and the others
still run; a stage that needs one that failed or did not run is not run (status "not run", "needs <stage>"), never
run on a substitute; the command then exits non-zero. PNG export is a step of its own: skipped where kaleido or
Chromium is missing, failed where a figure fails to draw.
"""

from __future__ import annotations

import sys
import time
import traceback
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable, Generic, Sequence, TypeVar

import torch

from lens_heads.data.tasks import load_task
from lens_heads.experiments.compare import read_sweep
from lens_heads.models.loading import load_model, model_meta
from lens_heads.plumbing import distributed
from lens_heads.plumbing.cache import Cache
from lens_heads.plumbing.errors import InputError
from lens_heads.plumbing.io import atomic_write_json, atomic_write_text
from lens_heads.plumbing.provenance import provenance
from lens_heads.report import layer_stages, sections, stages, sweep_stages
from lens_heads.report.config import ReportConfig
from lens_heads.report.findings import findings
from lens_heads.report.render import render_page
from lens_heads.report.stage_result import StageResult
from lens_heads.viz import export

R = TypeVar("R", bound=StageResult, covariant=True)


@dataclass(frozen=True)
class Ran(Generic[R]):
    """One stage's outcome: its result where it finished, else why not; wall and CPU seconds (all threads: on a
    shared machine the wall time says little)."""

    name: str
    status: str  # "done" | "failed" | "skipped" | "not run" (a stage it needs did not finish)
    seconds: float | None = None
    cpu_seconds: float | None = None
    result: R | None = None
    reason: str = ""
    traceback: str = ""

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


def build_report(config: ReportConfig, *, model=None, log=None) -> dict:
    """Run every stage for ``config`` and write the report folder; returns the ``results.json`` content. Each stage
    names the stages whose results it takes (``needs=``)."""
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
    first = next(iter(tasks))  # the task of the stages run once: rank, layers, attention, explorer

    scores = {t: run_stage(f"scores:{t}", log, partial(stages.score_stage, model, task, config, cache, key))
              for t, task in tasks.items()}
    ablations = {t: run_stage(f"ablation:{t}", log, lambda s: sweep_stages.ablation_stage(
        model, task, s.scores, config, cache, key), needs=[scores[t]]) for t, task in tasks.items()}
    compare = [run_stage("compare", log, lambda *done: sweep_stages.compare_stage(
        [a.sweep for a in done] + [read_sweep(path) for path in config.compare]), needs=list(ablations.values()))
               ] if len(tasks) + len(config.compare) > 1 else []
    effects = {t: Ran(f"effects:{t}", "skipped", reason="--quick") if config.quick else run_stage(
        f"effects:{t}", log, lambda s: stages.effects_stage(model, task, s.scores, config, cache, key),
        needs=[scores[t]]) for t, task in tasks.items()}
    rank = run_stage("rank", log, partial(layer_stages.rank_stage, model, tasks[first], config, cache, key))
    layers = Ran("layers", "skipped", reason="--quick") if config.quick else run_stage("layers", log, lambda s: (
        layer_stages.layers_stage(model, tasks[first], s.scores, config, cache, key)), needs=[scores[first]])
    attention = run_stage("attention", log, lambda s: stages.attention_stage(model, s.scores, config),
                          needs=[scores[first]])
    # the explorer adds the head effects and the rank profile where those stages finished (they are not needed)
    explorer = run_stage("explorer", log, lambda s: stages.explorer_stage(
        model, s.scores, effects[first].result if effects[first].status == "done" else None,
        rank.result.numbers if rank.status == "done" and rank.result is not None else None, config),
        needs=[scores[first]])

    ran += [*scores.values(), *ablations.values(), *compare, *effects.values(), rank, layers, attention, explorer]
    card = stages.model_card(meta, config)
    results = describe(config, meta, tasks, ran)
    files, png = write_outputs(out_dir, config, card, ran, results, log) if distributed.is_main() else ([], None)
    total = {"status": "done", "seconds": round(time.perf_counter() - started, 1),
             "cpu_seconds": round(time.process_time() - cpu_started, 1)}
    results["stages"] = {**{r.name: r.entry() for r in ran}, **({"png": png} if png else {}), "total": total}
    if distributed.is_main():
        atomic_write_json(out_dir / "results.json", {**results, "files": files})
    log(f"[report] done in {time.perf_counter() - started:.0f} s: {out_dir / 'report.html'}")
    return {**results, "files": files}


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
    """results.json without its stage table: what was run, on what, and every finished stage's numbers."""
    made = provenance()
    results = {
        "report_format": 1, "created": made["recorded_at"], "settings": config.to_dict(), "versions": made["versions"],
        "machine": made["machine"], "commit": made["commit"], "dirty": made["dirty"],
        "model": meta, "weight_basis": meta.get("weight_basis", "unknown"),
        "data": {name: task.meta() for name, task in tasks.items()}}
    for r in ran:
        kind, _, task = r.name.partition(":")
        if kind == "effects" and r.status == "skipped":
            results.setdefault("effects", {})[task] = {"status": "skipped", "reason": r.reason}
        elif kind == "layers" and r.status == "skipped":
            results["layers"] = {"status": "skipped", "reason": r.reason}
        elif r.status == "done" and r.result is not None:
            if task:
                results.setdefault(kind, {})[task] = r.result.numbers
            else:
                results[kind] = r.result.numbers
    return results


def page_sections(card: StageResult, ran: list[Ran], config: ReportConfig, weight_basis: str) -> list:
    """The page, section by section, in the order the stages ran."""
    render: dict[str, Callable[[Any], sections.Section]] = {
        "scores": partial(sections.scores, weight_basis=weight_basis), "ablation": sections.ablation,
        "compare": sections.compare, "effects": sections.effects, "rank": sections.rank,
        "attention": sections.attention, "explorer": sections.explorer, "layers": sections.layers}
    done = {r.name: r.result for r in ran if r.status == "done"}
    of = lambda kind: [v for k, v in done.items() if k.partition(":")[0] == kind]  # noqa: E731
    out = [findings(of("scores"), of("ablation"), done.get("rank")), sections.model_card(card, config)]
    for r in ran:
        kind, _, task = r.name.partition(":")
        if kind not in render:
            continue
        if r.status == "done":
            out.append(render[kind](r.result))
        elif kind == "effects" and r.reason == "--quick":
            out.append(sections.effects_skipped(task))
        elif kind == "layers" and r.reason == "--quick":
            out.append(sections.layers_skipped())
        else:
            out.append(sections.not_done(r.name, r.status, r.reason))
    return out


def write_outputs(out_dir: Path, config: ReportConfig, card, ran: list[Ran], results: dict, log
                  ) -> tuple[list[str], dict | None]:
    """CSV tables, PNG figures and report.html; returns the files written and the PNG step's stage entry."""
    done = [card] + [r.result for r in ran if r.result is not None]
    files = []
    for result in done:
        for name, df in result.tables.items():
            atomic_write_text(out_dir / f"{name}.csv", df.to_csv(index=False))
            files.append(f"{name}.csv")
    figures = {name: fig for result in done for name, fig in result.figures.items()}
    png, pngs = write_pngs(out_dir, figures, log) if config.png and figures else (None, [])
    files += pngs
    meta = results["model"]
    subtitle = (f"{meta.get('name')} — {meta.get('n_layers')} layers x {meta.get('n_heads')} heads — "
                f"{results['weight_basis']} — seed {config.seed} — lens_heads "
                f"{results['versions'].get('lens_heads')} — {results['created']}")
    stage_table = {**{r.name: r.entry() for r in ran}, **({"png": png} if png else {})}
    body = page_sections(card, ran, config, results["weight_basis"]) + [sections.run(stage_table, results["versions"])]
    atomic_write_text(out_dir / "report.html", render_page(f"lens_heads report: {meta.get('name')}", subtitle, body))
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
                    write(fig, out_dir / f"{name}.png")
                    written.append(f"{name}.png")
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
