"""The inactive-heads sweep: how much accuracy each head score loses as it zeroes more heads, against random zeroing.

For each score and target fraction p (the paper's protocol, as its authors' code runs it):

1. **Thresholds** from the *unablated* pooled CDF of the score over exactly the forward rows the evaluation runs
   (``calibration="rows"``: for cloze tasks one row per choice, context + continuation), read by
   :func:`lens_heads.heads.distributions.thresholds`; ``calibration="prompts"`` or given inputs stay available.
2. **Per-input threshold zeroing** (:func:`lens_heads.ablation.hooks.threshold_zeroing`) during a full evaluation of the
   task; the x axis is the *realised* share of heads zeroed (it can still miss p: later layers are scored on the
   ablated stream, and ties in a score make the CDF step).
3. **Random baseline**: each (row, layer, head) zeroed with probability p (one draw per question, shared by its
   choices). p = 0 is the unablated baseline, evaluated once and shared by all curves.
4. Optionally the **static pruning view**: rank heads by their mean score over the calibration inputs and zero the
   most inactive ``round(p x layers x heads)`` heads for every input, as removing them for good would.

The plan (:class:`lens_heads.sweep.plan.SweepPlan`) lists ablation specs
(:mod:`lens_heads.ablation.specs`), one per unit. Rows and tokens follow a
named protocol (:mod:`lens_heads.data.rows`: ``"lm-eval"`` by default, ``"tl"``), recorded in the result. Each finished
unit is written at once to ``out_dir``, keyed by the run's fingerprint and its spec (:mod:`lens_heads.plumbing.cache`); a
rerun with the same model, data, protocol, seed and calibration skips the finished units. Headline numbers (from
:mod:`lens_heads.stats.curves`): "% of heads zeroable within 1 point" (the authors' rule or the censored one) and the
normalised AUC, both on the realised-% axis, and the paper's Table 2 (:func:`lens_heads.sweep.table2.table2`).
"""

from __future__ import annotations

import time
from typing import Sequence

from tqdm.auto import tqdm

from lens_heads.ablation.hooks import HeadAblation
from lens_heads.ablation.specs import (
    AblationSpec,
    RandomAblation,
    ThresholdAblation,
)
from lens_heads.ablation.stacked import stack_ablations
from lens_heads.data.chat import resolve_chat_template
from lens_heads.evaluation.batching import settled_sizes
from lens_heads.evaluation.eval_settings import EvalSettings, eval_settings
from lens_heads.evaluation.evaluate import evaluate, evaluate_each
from lens_heads.evaluation.packed_weights import shared_layouts
from lens_heads.evaluation.results import EvalResult
from lens_heads.heads.scores import SCORE_NAMES
from lens_heads.heads.thresholds_file import Thresholds
from lens_heads.plumbing import distributed
from lens_heads.plumbing.cache import canonical
from lens_heads.plumbing.errors import InputError
from lens_heads.plumbing.signals import stops_cleanly
from lens_heads.plumbing.values import keywords
from lens_heads.sweep.calibration import CALIBRATIONS, Calibration, calibration_id
from lens_heads.sweep.plan import SweepPlan, sweep_plan
from lens_heads.sweep.result import SweepResult, UnitResult, calibration_key
from lens_heads.sweep.unit_store import UnitStore, run_fingerprint

DEFAULT_STACK = 4  # units per forward where they stack (run_units_stacked)


@keywords(SweepPlan, EvalSettings)  # the signature names the settings' fields taken as keywords
@distributed.local()  # each unit is evaluated whole by the worker that owns it
@stops_cleanly("sweep")  # SIGTERM/SIGINT: finished units stay in out_dir
def run_sweep(model, task, *, plan: SweepPlan | None = None, calibration="rows", out_dir=None,
              thresholds: Thresholds | None = None, settings: EvalSettings | None = None, progress: bool = True,
              stack: int = DEFAULT_STACK, **options) -> SweepResult | None:
    """Evaluate ``task`` with heads zeroed per input by each score at each target fraction, plus the random
    baseline (``random_baseline``), the static pruning view for ``static_scores`` and any further ablation
    ``specs`` (e.g. :class:`lens_heads.ablation.specs.LayerRemoval`: ``result.curves("layers")``), each a unit.

    ``plan`` (:class:`lens_heads.sweep.plan.SweepPlan`, or its fields as keywords laid over it:
    ``scores``, ``fractions``, ``seed``, ``random_baseline``, ``static_scores``, ``specs``, ``random``): the units;
    ``meta["plan"]`` records it whole.

    ``settings`` (:class:`lens_heads.evaluation.eval_settings.EvalSettings`, or its fields as keywords laid over it:
    ``batch_size``, ``primary``, ``protocol``, ``apply_chat_template``, ``attention``): every unit's evaluation and
    the calibration's scoring pass run under it, and ``meta["settings"]`` records it whole.
    ``calibration``: where thresholds and static rankings come from: ``"rows"`` (the authors' protocol: an
    unablated scoring pass over exactly the forward rows the evaluation runs), ``"prompts"`` (each item's context
    alone, as its rows begin), a :class:`lens_heads.heads.scoring.HeadScores` already computed, or any inputs
    ``score_heads`` accepts. The settings' ``protocol``/``apply_chat_template``: the evaluation's rows
    (:mod:`lens_heads.data.rows`; the meta records the chat setting given and what it resolved to,
    ``chat_template``, and the task's split).
    ``out_dir``: where each finished unit is written (and found again on a rerun). The plan's ``seed``: the random
    baseline's. Its ``random``: how the random baseline draws, once per item (``"per_item"``: all choices of a
    question lose the same heads, and their shared prefix runs once) or once per forward row (``"per_row"``, the
    authors' baseline; kept in the run's fingerprint and each unit's key, so a folder never mixes the two).
    ``thresholds``: zero at given thresholds instead of calibrating them
    (:func:`lens_heads.heads.thresholds_file.load_thresholds`, the authors' released file): refused for another
    model; ``scores`` default to the file's, and every target fraction must be one the file has.
    ``stack``: units per forward (:func:`run_units_stacked`: the units that run row by row alone, the threshold
    and per-row random ones, stacked ``stack`` at a time in one batch, each unit's records what it gives alone, each
    still stored as it finishes; 1: one unit at a time). ``meta["stack"]`` records it.
    ``scores`` may name the extras (``lens_heads.heads.scores.EXTRA_NAMES``: LTHON (HN), the full-head-output
    scores).

    Several workers (:mod:`lens_heads.plumbing.distributed`) share the units: torchrun ranks gather them all, so every rank
    returns the whole result (only rank 0 should write it); the tasks of a job array each run their share into the
    shared ``out_dir`` and return None unless every unit is finished there, and a plain run afterwards merges them.
    """
    plan = sweep_plan(plan, options)
    if thresholds is not None:
        thresholds.check_model(model)
        plan = plan.with_scores(thresholds.scores)
    plan = plan.with_scores(SCORE_NAMES)
    evaluation = eval_settings(settings, options)
    scores, fractions, static_scores, seed, random = (list(plan.scores or ()), list(plan.fractions),
                                                      list(plan.static_scores), plan.seed, plan.random)
    _check_calibration(calibration)
    if isinstance(stack, bool) or not isinstance(stack, int) or stack < 1:
        raise InputError(f"stack must be a whole number of units per forward >= 1 (1: one unit at a time), "
                         f"got {stack!r}")
    chat = resolve_chat_template(model, evaluation.apply_chat_template)
    run = evaluation.replace(apply_chat_template=chat)  # the rows as they run: the chat setting resolved
    if thresholds is not None:
        for s, p in [(s, p) for s in scores for p in fractions]:
            thresholds.threshold(s, p)  # refuses a score or a target share the file lacks, before any work
    fingerprint = _fingerprint(model, task, seed, run, calibration, thresholds, random)
    distributed.check_agree(fingerprint, "sweep fingerprint (model, data, seed, scoring, calibration)")
    units_plan = plan.units()
    store = UnitStore(out_dir, fingerprint)
    progress = progress and distributed.is_main()
    extras = [s for s in dict.fromkeys(list(scores) + list(static_scores)) if s not in SCORE_NAMES]
    calib = Calibration(model, task, calibration, store, run, progress, extras, thresholds)
    workers = distributed.unit_workers()
    units, n_run = _run_units(model, task, units_plan, store, calib, set(workers.share(len(units_plan))), run,
                              progress, desc=f"sweep {getattr(task, 'name', '')} units", stack=stack)
    if len(units) < len(units_plan):
        return None
    unablated = {calibration_key(s.score, s.fraction): calib.unablated_share(s.score, s.fraction)
                 for s in units_plan if isinstance(s, ThresholdAblation)}
    meta = dict(fingerprint=fingerprint, fractions=fractions, scores=scores, static_scores=static_scores,
                random_baseline=plan.random_baseline, random_draw=random, seed=seed, plan=plan.to_dict(),
                settings=evaluation.to_dict(),
                batch_size=evaluation.batch_size,
                out_dir=store.describe(), calibration=calib.describe(), unablated_shares=unablated,
                units_reused=len(units_plan) - n_run,
                thresholds=None if thresholds is None else thresholds.describe(),
                units_run=n_run, stack=stack, workers=workers.to_dict(),
                specs=[spec.to_dict() for spec in plan.specs],
                protocol=evaluation.protocol, apply_chat_template=evaluation.apply_chat_template, chat_template=chat,
                split=getattr(task, "split", None), fewshot_split=getattr(task, "fewshot_split", None))
    return SweepResult(baseline=units[0].result, units=[units[i] for i in range(len(units_plan))], meta=meta)


@keywords(EvalSettings)  # the signature names the settings' fields taken as keywords
def run_unit(model, task, spec: AblationSpec, *, means=None, settings: EvalSettings | None = None,
             progress: bool = True, **options) -> UnitResult:
    """Evaluate ``task`` under one resolved ablation ``spec`` (``means``: what an ``ablation="mean"`` spec substitutes,
    from :func:`lens_heads.ablation.hooks.mean_z`; ``settings``, ``progress`` and ``options``:
    :func:`lens_heads.evaluation.evaluate`'s)."""
    ablation = spec.build(model, means=means)
    start = time.perf_counter()
    result = evaluate(model, task, hooks=[ablation] if ablation else [], settings=settings, progress=progress,
                      **options)
    return unit_result(spec, ablation, result, time.perf_counter() - start)


@keywords(EvalSettings)  # the signature names the settings' fields taken as keywords
def run_units_stacked(model, task, specs: Sequence[AblationSpec], *, means=None, settings: EvalSettings | None = None,
                      progress: bool = True, **options) -> list[UnitResult]:
    """:func:`run_unit` for each of the resolved ``specs``, all in the same forwards
    (:func:`lens_heads.ablation.stacked.stack_ablations`: each batch's rows once per spec, ``batch_size`` rows per
    spec); each unit's records and counts are what it gives alone, its ``wall_s`` its share of the stacked run's.
    Only head ablations stack (:func:`stacks`): a layer removal runs with :func:`run_unit`."""
    built: list[HeadAblation | None] = []
    for spec in specs:
        ablation = spec.build(model, means=means)
        if ablation is not None and not isinstance(ablation, HeadAblation):
            raise InputError(f"{spec} does not stack (it is not a head ablation): run it with run_unit")
        built.append(ablation)
    start = time.perf_counter()
    results = evaluate_each(model, task, [stack_ablations(built)], settings=settings, progress=progress, **options)
    wall = (time.perf_counter() - start) / len(specs)
    return [unit_result(spec, ablation, result, wall) for spec, ablation, result in zip(specs, built, results)]


def stacks(spec: AblationSpec) -> bool:
    """Whether a sweep stacks ``spec``'s unit: the head ablations that run row by row alone (the threshold zeroing
    and the per-row random draw). The others alone share their rows' prefixes, which a stacked forward gives up (a
    layer removal cannot stack at all)."""
    return isinstance(spec, ThresholdAblation) or (isinstance(spec, RandomAblation) and spec.draw == "per_row")


def unit_result(spec: AblationSpec, ablation, result: EvalResult, wall_s: float = float("nan")) -> UnitResult:
    """The unit of ``spec`` evaluated with its built ``ablation`` (None for the baseline) into ``result``."""
    return UnitResult(spec=canonical(spec.to_dict()), realised_fraction=ablation.share_zeroed() if ablation else 0.0,
                      result=result,
                      head_share=ablation.zeroed().float().mean(0).tolist() if ablation else None,
                      wall_s=wall_s, item_zeroed=_item_zeroed(ablation, result))


def _item_zeroed(ablation, result: EvalResult) -> list[list[int]] | None:
    """Per item of ``result`` (inputs are numbered by item, as ``evaluate`` numbers them): [rows, triples zeroed]."""
    by_input = ablation.zeroed_by_input() if ablation is not None else {}
    if len(by_input) != result.n:
        return None
    return [list(by_input[i]) for i in range(result.n)]


def _check_calibration(calibration) -> None:
    if isinstance(calibration, str) and calibration not in CALIBRATIONS:
        raise InputError(f"unknown calibration {calibration!r}: choose 'rows' (the evaluated rows, the paper's), "
                         "'prompts', a HeadScores, or inputs to score")


@settled_sizes()  # batch_size="auto": a unit that ran out of memory settles the size the next units start at
def _run_units(model, task, plan: list[AblationSpec], store: "UnitStore", calib, mine: set[int],
               settings: EvalSettings, progress: bool, desc: str, stack: int = 1
               ) -> tuple[dict[int, UnitResult], int]:
    """Every unit of ``plan`` found in ``store`` or, where it is this worker's (``mine``), evaluated and stored
    (``stack`` of the units that stack per forward, :func:`run_units_stacked`; each saved as its forwards finish);
    then the other workers' units (gathered, or read from the shared folder). Returns them by plan index, and how
    many units all workers ran."""
    units: dict[int, UnitResult] = {}
    bar = tqdm(total=len(plan), desc=desc, unit="unit", disable=not progress)
    todo: list[tuple[int, AblationSpec]] = []
    for index, spec in enumerate(plan):
        stored = store.load(spec)
        if stored is not None:
            units[index] = stored
            bar.update()
        elif index in mine:
            todo.append((index, spec))
        else:
            bar.update()
    stacked = [(i, spec) for i, spec in todo if stack > 1 and stacks(spec)]
    groups = [[one] for one in todo if one not in stacked] + [stacked[k:k + stack]
                                                             for k in range(0, len(stacked), stack)]
    # the weights laid out once for all the units, not once per unit's evaluation (a layout costs a pass over every
    # weight); the units' numbers are the same either way
    with shared_layouts():
        for group in sorted(groups, key=lambda g: g[0][0]):  # in plan order, by each group's first unit
            specs = [spec.resolve(calib) for _, spec in group]
            bar.set_postfix_str(", ".join(f"{s.kind} {s.ranked_by or ''} {s.target_fraction:g}".replace("  ", " ")
                                          for s in specs))
            done = run_units_stacked(model, task, specs, settings=settings, progress=progress) \
                if len(group) > 1 else [run_unit(model, task, specs[0], settings=settings, progress=progress)]
            for (index, spec), unit in zip(group, done):
                units[index] = unit
                store.save(spec, unit)
            bar.update(len(group))
    n_run = len(todo)
    bar.close()
    gathered = distributed.all_gather((units, n_run))
    units = {index: unit for part, _ in gathered for index, unit in part.items()}
    if len(units) < len(plan):  # a job array task: the others may have finished meanwhile
        units.update({i: u for i, spec in enumerate(plan) if i not in units and (u := store.load(spec)) is not None})
    return units, sum(n for _, n in gathered)


def _fingerprint(model, task, seed: int, run: EvalSettings, calibration, thresholds: Thresholds | None = None,
                 random: str = "per_item") -> dict:
    """What a stored unit must match: model, data, seed, calibration, the random draw and the settings that decide
    its numbers (``run``, its chat setting resolved; not the batch size or attention, float rounding apart)."""
    calibration = calibration_id(calibration) if thresholds is None else \
        f"thresholds {thresholds.describe()} {thresholds.digest()}"
    # the per-row draw is named only where chosen, so the folders of runs made before it existed keep resuming
    drawn = {"random_draw": random} if random != "per_item" else {}
    return run_fingerprint(model, task, seed=seed, primary=run.primary, calibration=calibration,
                           protocol=run.protocol, apply_chat_template=run.apply_chat_template, **drawn)
