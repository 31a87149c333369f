"""Multiple-choice evaluation by log-likelihood, batched, with any TransformerLens hooks in the forward pass.

Each item's choice ``i`` is scored as log P(continuations[i] | contexts[i]) summed over the continuation's tokens.
The forward rows (which tokens run, where each continuation is read) come from :mod:`lens_heads.data.rows` under a
named protocol (``"lm-eval"`` by default, as the paper's authors ran it; ``"tl"``): one row per question when
all choices share the context and every continuation is one token (MMLU's " A".." D"), otherwise one row per
choice (cloze tasks; WinoGrande's partial scoring, whose contexts differ per choice).

Shared prefixes (:mod:`lens_heads.evaluation.prefix`): where every hook acts on a position regardless of the rest of its row (no
hooks, static zeroing, mean ablation, :func:`lens_heads.ablation.hooks.zero_heads`; random zeroing within an item), rows
that begin alike (an item's choices after its context; the MMLU questions of a subject after its five shots) run
that beginning once and their remaining tokens against its keys and values: the same log-likelihoods (to float
rounding) from fewer forward tokens. Per-input threshold zeroing decides from the whole row, random zeroing drawn per
row gives each row its own heads, and unknown hooks may do either, so they keep the row-by-row path. ``meta["shared_prefix"]`` says which was taken, ``meta["row_tokens"]`` how many
tokens the row-by-row path runs (``forward_tokens``: how many were run).

The forward passes: :mod:`lens_heads.evaluation.passes`; the log-likelihoods read off them:
:mod:`lens_heads.evaluation.logprobs`; the result types, their metrics and intervals:
:mod:`lens_heads.evaluation.results`.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import replace
from typing import Iterable, Sequence

import torch
from tqdm.auto import tqdm

from lens_heads.data.chat import resolve_chat_template
from lens_heads.data.inputs import check_token_ids
from lens_heads.data.rows import Row, build_rows
from lens_heads.evaluation.ablation_interface import describe
from lens_heads.evaluation.batching import AUTO, first_size, halving, is_out_of_memory
from lens_heads.evaluation.eval_settings import EvalRun, EvalSettings, eval_settings
from lens_heads.evaluation.failed_items import check_nonfinite, settle
from lens_heads.evaluation.fused_attention import AttentionCalls
from lens_heads.evaluation.hook_sets import hook_objects, hook_set, stacked_copies
from lens_heads.evaluation.logprobs import item_records
from lens_heads.evaluation.passes import Outputs, Work, attention_ran, run_passes
from lens_heads.evaluation.results import EvalResult
from lens_heads.models.loading import model_meta
from lens_heads.models.nonfinite import where_nonfinite
from lens_heads.plumbing import distributed
from lens_heads.plumbing.errors import InputError
from lens_heads.plumbing.values import keywords

ACC_NORM = "per_char: log-likelihood / characters of the choice, without the continuation's leading space (lm-eval's)"


# ---------------------------------------------------------------- the evaluator


@keywords(EvalSettings)  # the signature names the settings' fields taken as keywords
@torch.no_grad()
def evaluate(model, task, *, hooks: Iterable | None = None, settings: EvalSettings | None = None,
             progress: bool = True, first_input: int = 0, nonfinite: str = "raise", **options) -> EvalResult:
    """Evaluate ``model`` on ``task`` (a :class:`lens_heads.data.tasks.Task`) by log-likelihood.

    ``hooks``: TransformerLens ``(hook_name, fn)`` pairs and/or objects with a ``.hooks`` list (such as
    :class:`lens_heads.ablation.hooks.HeadAblation`), or None for none; objects with a
    ``batch(attention_mask, inputs=)`` context manager are told each batch's padding mask and which item each row
    belongs to, numbered from ``first_input`` (the index of ``task``'s first item when it is a block of a larger
    task, so a random ablation draws what it draws on the whole).

    ``settings`` (:class:`lens_heads.evaluation.eval_settings.EvalSettings`), or its fields as keywords
    (``options``, laid over ``settings``): ``batch_size`` (rows per forward, or ``"auto"``: the largest that fits,
    :mod:`lens_heads.evaluation.batching`); ``primary``: the scoring behind ``.accuracy`` (``"sum"``,
    ``"per_token"`` or ``"per_char"``); ``protocol`` (``"lm-eval"`` or ``"tl"``) and ``apply_chat_template`` choose
    the forward rows (:mod:`lens_heads.data.rows`); ``attention="fused"`` runs fused SDPA attention in every layer
    whose pattern no hook reads (:mod:`lens_heads.evaluation.fused_attention`; same log-likelihoods to float
    rounding), ``"eager"`` materialises every pattern. The result's ``meta["settings"]`` records them whole.

    Under torchrun each rank evaluates a block of the items and every rank returns all the records
    (:mod:`lens_heads.plumbing.distributed`). Rows that begin alike compute their common beginning once
    (:mod:`lens_heads.evaluation.prefix`) wherever the hooks allow it: unhooked, static zeroing, mean ablation,
    ``zero_heads`` and random zeroing drawn per item; the per-input threshold zeroing decides from the whole row and
    keeps the row-by-row path, as do random zeroing drawn per row (told each row's key: its first choice), unknown
    hooks and ``attention="eager"``.

    An item whose log-likelihood is NaN or infinite (a NaN weight, a diverged fine-tune, a float16 overflow) is never
    scored: ``nonfinite="raise"`` raises a :class:`lens_heads.plumbing.errors.NonFiniteError` naming the items and the
    first hook point whose output went non-finite; ``"exclude"`` leaves them out of every metric, their ids in
    ``meta["failed_items"]`` and their count in ``meta["n_failed"]`` (:mod:`lens_heads.evaluation.failed_items`).
    Log-softmax runs in float32 (or the model's wider dtype) whatever the model's dtype.
    """
    return evaluate_each(model, task, [hooks], settings=settings, progress=progress, first_input=first_input,
                         nonfinite=nonfinite, **options)[0]


@keywords(EvalSettings)  # the signature names the settings' fields taken as keywords
@torch.no_grad()
def evaluate_each(model, task, hook_sets: Sequence, *, settings: EvalSettings | None = None, progress: bool = True,
                  first_input: int = 0, nonfinite: str = "raise", _shared_prefixes: bool = True,
                  _settle: bool = True, **options) -> list[EvalResult]:
    """:func:`evaluate` under each of ``hook_sets`` (each what ``evaluate`` takes as ``hooks``), one result per set;
    ``settings``, ``options`` and ``nonfinite`` (per set) as for ``evaluate``.

    The sets share the forward below the layers they hook: per batch the unhooked trunk runs once, and each set
    runs only the blocks from the first one it hooks (read from its hook names, ``blocks.{layer}.``...). Removing
    one head at a time (:func:`lens_heads.head_effects`) thus costs about half of one full evaluation per head.
    Each result equals ``evaluate`` under that set alone (the same operations on the same batches). Shared prefixes
    (module docstring) are computed once where every set allows it (``_shared_prefixes=False``: never, the
    row-by-row reference the tests compare with). On a backend whose forward can't start at a block (a
    TransformerBridge runs the blocks before it) each set runs whole (no shared trunk: one full evaluation per set),
    and on one whose attention lens_heads doesn't fuse (the bridge's is its own) rows run one by one (no shared
    prefixes).

    A stacked set (:func:`lens_heads.ablation.stacked.stack_ablations`: ``k`` head ablations, None for the baseline)
    runs ``k`` copies of each batch in one forward, row by row, ``batch_size`` rows per unit (``"auto"``: sized by
    memory, halving the rows per unit), and gives one result per unit, each the records its unit alone gives (to the
    float rounding of the wider matmuls); ``meta["stacked_units"]`` says how many shared the forwards."""
    if isinstance(task, (str, bytes)):  # a name or a path is not a task (its characters would be the items)
        raise InputError(f"evaluate takes a Task, got {task!r}: load it first, lens_heads.load_task({task!r})")
    check_nonfinite(nonfinite)
    run = EvalRun(eval_settings(settings, options), progress, first_input, _shared_prefixes, nonfinite, _settle)
    if distributed.sharding():
        return _evaluate_shards(model, task, hook_sets, run)
    copies = max((stacked_copies(hooks) for hooks in hook_sets), default=1)
    try:
        if run.settings.batch_size == AUTO:
            return _evaluate_auto(model, task, hook_sets, run)
        return _evaluate(model, task, hook_sets, run)
    except Exception as e:
        if copies == 1 or not is_out_of_memory(e):
            raise
        raise InputError(f"a stacked forward of {copies} units does not fit in memory even at "
                         f"{1 if run.settings.batch_size == AUTO else run.settings.batch_size} row(s) per unit: stack "
                         f"fewer units per forward (e.g. stack={max(1, copies // 2)})"
                         + ("" if run.settings.batch_size == AUTO else " or give batch_size='auto'")) from e


def _evaluate(model, task, hook_sets: Sequence, run: EvalRun) -> list[EvalResult]:
    """``evaluate_each`` at a whole-number batch size, in this process."""
    s = run.settings
    assert isinstance(s.batch_size, int)  # "auto" is resolved by the caller
    items = list(task)
    if not items:
        raise InputError("the task has no items")
    sets = [hook_set(model, hooks) for hooks in hook_sets]  # bad hooks are refused before the rows are built
    chat = resolve_chat_template(model, s.apply_chat_template)
    work = Work(items, _checked_rows(model, items, s.protocol, chat), sets)
    start_time = time.perf_counter()
    attention_calls = AttentionCalls()
    bar = tqdm(total=len(items), desc=f"{getattr(task, 'name', 'task')} items", unit="item",
               disable=not run.progress, leave=False)
    outputs, stats, shared_prefix = run_passes(model, work, run, bar, attention_calls)
    bar.close()
    meta = dict(model=model_meta(model), task=task.meta() if hasattr(task, "meta") else {}, settings=s.to_dict(),
                batch_size=s.batch_size, protocol=s.protocol, apply_chat_template=s.apply_chat_template,
                chat_template=chat, acc_norm=ACC_NORM, rows=len(work.rows), wall_s=time.perf_counter() - start_time,
                ci_method="wilson 95%", attention=attention_ran(model, s.attention, attention_calls),
                shared_prefix=shared_prefix, row_tokens=sum(len(r.tokens) for r in work.rows), **stats)
    if len(work.sets) > 1:
        meta["shared_by"] = len(work.sets)  # wall_s and the forward counts are the shared run's
    if any(hs.copies > 1 for hs in work.sets):
        meta["stacked_units"] = max(hs.copies for hs in work.sets)  # wall_s and the forward counts: all units
    results = _results(task, work, outputs, s.primary, meta)
    return _settled(model, items, results, run) if run.settle else results


def _settled(model, items, results: list[EvalResult], run: EvalRun) -> list[EvalResult]:
    """The results with their non-finite items refused or excluded; an error names where the first one's forward
    went non-finite (its first row run alone, unhooked)."""
    by_id = {item.id: item for item in items}
    chat = resolve_chat_template(model, run.settings.apply_chat_template)

    def where(item_id: str) -> str:
        row = build_rows(model, [by_id[item_id]], protocol=run.settings.protocol, apply_chat_template=chat)[0]
        return where_nonfinite(model, row.tokens)

    return settle(results, run.nonfinite, where)


def _evaluate_auto(model, task, hook_sets: Sequence, run: EvalRun) -> list[EvalResult]:
    """``batch_size="auto"``: ``evaluate_each`` at the device's start size, halved after each out-of-memory error."""
    # a stacked run settles its own size (rows per unit): it must not shrink the unstacked units' batches
    what = "evaluate" if all(stacked_copies(hooks) == 1 for hooks in hook_sets) else "stacked"
    start = first_size(model.cfg.device, sum(len(it.continuations) for it in task), what)
    described = [obj for hooks in hook_sets for obj in hook_objects(hooks)]
    return halving(lambda size: _evaluate(model, task, hook_sets, run.again(settings=run.settings.replace(
        batch_size=size))), start, described, what)


def _checked_rows(model, items, protocol: str, chat) -> list[Row]:
    """The items' forward rows, every token id (context and continuations) checked against the vocabulary."""
    rows = build_rows(model, items, protocol=protocol, apply_chat_template=chat)
    check_token_ids(model, [r.tokens + [t for _, _, ids in r.reads for t in ids] for r in rows],
                    [f"item {items[r.item].id}" for r in rows])
    return rows


def _results(task, work: Work, outputs: Outputs, primary: str, meta: dict) -> list[EvalResult]:
    """One result per hook set (per unit of a stacked set) from its log-likelihoods and greedy flags, its meta
    naming its hooks."""
    described = [objects for hs in work.sets for objects in hs.unit_objects]
    return [EvalResult(task=getattr(task, "name", "task"), format=getattr(task, "format", "?"),
                       items=item_records(work.items, work.rows, logprobs, greedy),
                       chance=float(getattr(task, "chance", float("nan"))), primary=primary,
                       meta=dict(meta, hooks=[describe(obj) for obj in objects]))
            for objects, (logprobs, greedy) in zip(described, outputs)]


# ---------------------------------------------------------------- under torchrun


def _evaluate_shards(model, task, hook_sets: Sequence, run: EvalRun) -> list[EvalResult]:
    """``evaluate_each`` on this rank's block of the items; the blocks' records gathered in order on every rank."""
    items = list(task)
    if not items:
        raise InputError("the task has no items")
    distributed.check_agree(_identity(model, items, run), "model, items and settings of the evaluation")
    mine = distributed.block(len(items), distributed.rank(), distributed.world_size())
    local = None
    if len(mine):
        part = replace(task, items=items[mine.start:mine.stop]) if hasattr(task, "items") else items[mine.start:mine.stop]
        with distributed.local():
            shard = run.again(first_input=run.first_input + mine.start,
                              progress=run.progress and distributed.is_main())
            local = [(r.items, r.meta) for r in evaluate_each(model, part, hook_sets, settings=shard.settings,
                                                              progress=shard.progress, first_input=shard.first_input,
                                                              nonfinite=shard.nonfinite, _settle=False,
                                                              _shared_prefixes=shard.shared_prefixes)]
    parts = [p for p in distributed.all_gather(local) if p]
    results = []
    for k in range(len(parts[0])):  # one per hook set, or per unit of a stacked set
        metas = [part[k][1] for part in parts]
        meta = dict(metas[0], task=task.meta() if hasattr(task, "meta") else {}, ranks=distributed.world_size(),
                    wall_s=max(m["wall_s"] for m in metas),
                    **{key: sum(m[key] for m in metas) for key in ("rows", "forward_passes", "forward_tokens",
                                                                   "padded_tokens", "row_tokens")})
        results.append(EvalResult(task=getattr(task, "name", "task"), format=getattr(task, "format", "?"),
                                  items=[record for part in parts for record in part[k][0]],
                                  chance=float(getattr(task, "chance", float("nan"))), primary=run.settings.primary,
                                  meta=meta))
    # every rank holds every record, so every rank refuses (or excludes) the same items
    return _settled(model, items, results, run)


def _identity(model, items, run: EvalRun) -> dict:
    ids = "\n".join(item.id for item in items).encode()
    return dict(model={k: v for k, v in model_meta(model).items() if k != "source"},
                items=hashlib.sha256(ids).hexdigest()[:16], n=len(items), **run.settings.to_dict(),
                first_input=run.first_input, nonfinite=run.nonfinite, _shared_prefixes=run.shared_prefixes)
