"""The report's stages as data: one entry per stage says what it computes (a function of ``stages``,
``sweep_stages`` or ``layer_stages``), which stages' results it takes, which page section shows it, when it is
skipped and why, and whether it runs per task or once (on the first task). ``pipeline`` runs ``STAGES`` in order;
adding a stage is one entry here.

A stage's compute is called as ``compute(inputs, task, *needed, *used)`` on its task's data: the results of the
stages it ``needs`` and of those it ``uses`` (``None`` where they did not finish), each a list where it covers every
task. Its section is called as ``section(result, weight_basis)``; a skipped stage's note as ``skipped_section(task)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable

from lens_heads.plumbing.cache import Cache
from lens_heads.report import layer_stages, sections, stages, sweep_stages
from lens_heads.report.config import ReportConfig
from lens_heads.report.render import Section
from lens_heads.report.stage_result import StageResult
from lens_heads.sweep.compare import read_sweep_record


class Skip(Enum):
    """Why a stage is left out although it could run, as a value; its ``value`` is the reason results.json and the
    Run table show."""

    QUICK = "--quick"


@dataclass(frozen=True)
class Inputs:
    """What every stage computes from: the model, the report's settings, the cache and the key of its entries."""

    model: Any
    settings: ReportConfig
    cache: Cache
    key: dict


@dataclass(frozen=True)
class Need:
    """A stage whose result another takes: of the same task (the first task for a stage run once), or of every
    task (a list, in the tasks' order)."""

    kind: str
    every_task: bool = False


def _never(settings: ReportConfig) -> Skip | None:
    return None


def _always(settings: ReportConfig, n_tasks: int) -> bool:
    return True


def _quick(settings: ReportConfig) -> Skip | None:
    return Skip.QUICK if settings.quick else None


@dataclass(frozen=True)
class Stage:
    """One stage of the report (see the module's docstring for how its functions are called)."""

    kind: str  # its key in results.json; per task, the Run table names it "kind:task"
    title: str  # its heading on the page where it did not finish ("... on <task>" per task)
    compute: Callable[..., StageResult]
    section: Callable[[Any, str], Section]
    per_task: bool = False
    needs: tuple[Need, ...] = ()  # not run where one of these did not finish
    uses: tuple[Need, ...] = ()  # taken where finished, else None
    skip: Callable[[ReportConfig], Skip | None] = _never
    skipped_section: Callable[[str | None], Section] | None = None  # the page's note where skipped (by task)
    present: Callable[[ReportConfig, int], bool] = _always  # whether the report has it (settings, number of tasks)


def _compare(inputs: Inputs, task, ablations: list) -> StageResult:
    return sweep_stages.compare_stage([a.sweep for a in ablations] + [read_sweep_record(p) for p in inputs.settings.compare])


def _explorer(inputs: Inputs, task, scores, effects, rank) -> StageResult:
    return stages.explorer_stage(inputs.model, scores.scores, effects, rank.numbers if rank is not None else None,
                                 inputs.settings)


# The functions are looked up when a stage runs (not bound here), so a test can replace one in its module.
STAGES: tuple[Stage, ...] = (
    Stage("scores", "Head scores", per_task=True,
          compute=lambda i, task: stages.score_stage(i.model, task, i.settings, i.cache, i.key),
          section=lambda r, basis: sections.scores(r, weight_basis=basis)),
    Stage("ablation", "Ablation sweep", per_task=True, needs=(Need("scores"),),
          compute=lambda i, task, s: sweep_stages.ablation_stage(i.model, task, s.scores, i.settings, i.cache, i.key),
          section=lambda r, basis: sections.ablation(r)),
    Stage("compare", "Comparison of sweeps", needs=(Need("ablation", every_task=True),), compute=_compare,
          section=lambda r, basis: sections.compare(r),
          present=lambda settings, n_tasks: n_tasks + len(settings.compare) > 1),  # more than one sweep
    Stage("effects", "Head effects", per_task=True, needs=(Need("scores"),), skip=_quick,
          compute=lambda i, task, s: stages.effects_stage(i.model, task, s.scores, i.settings, i.cache, i.key),
          section=lambda r, basis: sections.effects(r), skipped_section=lambda task: sections.effects_skipped(str(task))),
    Stage("rank", "Attention rank",
          compute=lambda i, task: layer_stages.rank_stage(i.model, task, i.settings, i.cache, i.key),
          section=lambda r, basis: sections.rank(r)),
    Stage("layers", "Whole layers", needs=(Need("scores"),), skip=_quick,
          compute=lambda i, task, s: layer_stages.layers_stage(i.model, task, s.scores, i.settings, i.cache, i.key),
          section=lambda r, basis: sections.layers(r), skipped_section=lambda task: sections.layers_skipped()),
    Stage("attention", "Attention patterns", needs=(Need("scores"),),
          compute=lambda i, task, s: stages.attention_stage(i.model, s.scores, i.settings),
          section=lambda r, basis: sections.attention(r)),
    # the explorer adds the head effects and the rank profile where those stages finished (it does not need them)
    Stage("explorer", "Head explorer", needs=(Need("scores"),), uses=(Need("effects"), Need("rank")),
          compute=_explorer, section=lambda r, basis: sections.explorer(r)),
)
