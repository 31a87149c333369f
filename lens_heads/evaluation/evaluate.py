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

The result types, their metrics and intervals: :mod:`lens_heads.evaluation.results`.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import time
from dataclasses import dataclass, replace
from typing import Any, Iterable, Sequence

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from lens_heads.data.chat import resolve_chat_template
from lens_heads.data.inputs import check_token_ids, pad_id
from lens_heads.data.rows import DEFAULT_PROTOCOL, Row, build_rows, check_protocol
from lens_heads.evaluation.batching import AUTO, check_batch_size, first_size, halving
from lens_heads.evaluation.fused_attention import AttentionCalls, eager_reason, fused_attention, reads_pattern
from lens_heads.evaluation.hook_sets import HookSet, hook_objects, hook_set
from lens_heads.evaluation.logprobs import _read_logprobs, _row_records, batches, pad_rows
from lens_heads.evaluation.packed_weights import packed_weights
from lens_heads.evaluation.prefix import (
    ROWS_PER_PREFIX,
    Extension,
    Group,
    PrefixState,
    chunk_groups,
    merge_kv,
    narrowest,
    plan_groups,
    token_batches,
)
from lens_heads.evaluation.results import EvalResult, check_primary
from lens_heads.models import backends
from lens_heads.models.loading import model_meta
from lens_heads.plumbing import distributed
from lens_heads.plumbing.errors import InputError

ACC_NORM = "per_char: log-likelihood / characters of the choice, without the continuation's leading space (lm-eval's)"
ATTENTION = ("fused", "eager")


# ---------------------------------------------------------------- the evaluator


@torch.no_grad()
def evaluate(model, task, *, hooks: Iterable = (), batch_size: int | str = 8, progress: bool = True,
             primary: str = "sum", protocol: str = DEFAULT_PROTOCOL, apply_chat_template: bool | str = False,
             attention: str = "fused", first_input: int = 0) -> EvalResult:
    """Evaluate ``model`` on ``task`` (a :class:`lens_heads.data.tasks.Task`) by log-likelihood.

    ``hooks``: TransformerLens ``(hook_name, fn)`` pairs and/or objects with a ``.hooks`` list (such as
    :class:`lens_heads.ablation.hooks.HeadAblation`); objects with a ``batch(attention_mask, inputs=)`` context manager are
    told each batch's padding mask and which item each row belongs to, numbered from ``first_input`` (the index of
    ``task``'s first item when it is a block of a larger task, so a random ablation draws what it draws on the
    whole). ``primary``: the scoring behind ``.accuracy``
    (``"sum"``, ``"per_token"`` or ``"per_char"``). ``protocol`` (``"lm-eval"`` or ``"tl"``) and
    ``apply_chat_template`` choose the forward rows (:mod:`lens_heads.data.rows`). ``batch_size="auto"``: the largest
    that fits (:mod:`lens_heads.evaluation.batching`). Under torchrun each rank evaluates a block of the items and every rank
    returns all the records (:mod:`lens_heads.plumbing.distributed`).
    ``attention="fused"`` runs fused SDPA attention in every layer whose pattern no hook reads
    (:mod:`lens_heads.evaluation.fused_attention`; same log-likelihoods to float rounding); ``"eager"`` materialises every
    pattern. Rows that begin alike compute their common beginning once (:mod:`lens_heads.evaluation.prefix`) wherever the hooks
    allow it: unhooked, static zeroing, mean ablation, ``zero_heads`` and random zeroing drawn per item; the
    per-input threshold zeroing decides from the whole row and keeps the row-by-row path, as do random zeroing drawn
    per row (told each row's key: its first choice), unknown hooks and ``attention="eager"``.
    """
    return evaluate_each(model, task, [hooks], batch_size=batch_size, progress=progress, primary=primary,
                         protocol=protocol, apply_chat_template=apply_chat_template, attention=attention,
                         first_input=first_input)[0]


@torch.no_grad()
def evaluate_each(model, task, hook_sets: Sequence, *, batch_size: int | str = 8, progress: bool = True,
                  primary: str = "sum", protocol: str = DEFAULT_PROTOCOL, apply_chat_template: bool | str = False,
                  attention: str = "fused", first_input: int = 0, _shared_prefixes: bool = True) -> list[EvalResult]:
    """:func:`evaluate` under each of ``hook_sets`` (each what ``evaluate`` takes as ``hooks``), one result per set.

    The sets share the forward below the layers they hook: per batch the unhooked trunk runs once, and each set
    runs only the blocks from the first one it hooks (read from its hook names, ``blocks.{layer}.``...). Removing
    one head at a time (:func:`lens_heads.head_effects`) thus costs about half of one full evaluation per head.
    Each result equals ``evaluate`` under that set alone (the same operations on the same batches). Shared prefixes
    (module docstring) are computed once where every set allows it (``_shared_prefixes=False``: never, the
    row-by-row reference the tests compare with). On a backend whose forward can't start at a block (a
    TransformerBridge runs the blocks before it) each set runs whole (no shared trunk: one full evaluation per set),
    and on one whose attention lens_heads doesn't fuse (the bridge's is its own) rows run one by one (no shared
    prefixes)."""
    settings: dict[str, Any] = dict(batch_size=batch_size, progress=progress, primary=primary, protocol=protocol,
                                    apply_chat_template=apply_chat_template, attention=attention,
                                    first_input=first_input, _shared_prefixes=_shared_prefixes)
    if isinstance(task, (str, bytes)):  # a name or a path is not a task (its characters would be the items)
        raise InputError(f"evaluate takes a Task, got {task!r}: load it first, lens_heads.load_task({task!r})")
    if distributed.sharding():
        return _evaluate_shards(model, task, hook_sets, settings)
    if batch_size == AUTO:
        start = first_size(model.cfg.device, sum(len(it.continuations) for it in task))
        described = [obj for hooks in hook_sets for obj in hook_objects(hooks)]
        return halving(lambda size: evaluate_each(model, task, hook_sets, **{**settings, "batch_size": size}), start,
                       described)
    check_batch_size(batch_size)
    assert isinstance(batch_size, int)  # "auto" has returned above, and check_batch_size refuses the rest
    check_primary(primary)
    if attention not in ATTENTION:
        raise InputError(f"attention must be one of {ATTENTION}, got {attention!r}")
    items = list(task)
    if not items:
        raise InputError("the task has no items")
    sets = [hook_set(model, hooks) for hooks in hook_sets]
    check_protocol(protocol)
    chat = resolve_chat_template(model, apply_chat_template)
    rows = build_rows(model, items, protocol=protocol, apply_chat_template=chat)
    check_token_ids(model, [r.tokens + [t for _, _, ids in r.reads for t in ids] for r in rows],
                    [f"item {items[r.item].id}" for r in rows])
    start_time = time.perf_counter()
    attention_calls = AttentionCalls()
    bar = tqdm(total=len(items), desc=f"{getattr(task, 'name', 'task')} items", unit="item", disable=not progress,
               leave=False)
    scope = _prefix_scope(model, sets, attention) if _shared_prefixes else None
    groups = plan_groups(rows, scope, ROWS_PER_PREFIX * batch_size) if scope else []
    state = PrefixState() if any(g.prefix for g in groups) else None
    with _attention(model, attention, attention_calls, state):
        outputs, stats = (_run_rows(model, items, rows, batch_size, sets, first_input, bar) if state is None else
                          _run_prefixed(model, items, groups, batch_size, sets, first_input, bar, state))
    bar.close()
    meta = dict(model=model_meta(model), task=task.meta() if hasattr(task, "meta") else {}, batch_size=batch_size,
                protocol=protocol, apply_chat_template=apply_chat_template, chat_template=chat, acc_norm=ACC_NORM,
                rows=len(rows), wall_s=time.perf_counter() - start_time, ci_method="wilson 95%",
                attention=_attention_ran(model, attention, attention_calls),
                shared_prefix=scope if state is not None else None, row_tokens=sum(len(r.tokens) for r in rows),
                **stats)
    if len(sets) > 1:
        meta["shared_by"] = len(sets)  # wall_s and the forward counts are the shared run's
    return [EvalResult(task=getattr(task, "name", "task"), format=getattr(task, "format", "?"),
                       items=_row_records(items, rows, logprobs, greedy),
                       chance=float(getattr(task, "chance", float("nan"))), primary=primary,
                       meta=dict(meta, hooks=[getattr(obj, "description", None) or repr(obj)
                                              for obj in hook_objects(hooks)]))
            for hooks, (logprobs, greedy) in zip(hook_sets, outputs)]


def _attention_ran(model, attention: str, calls: AttentionCalls) -> str:
    """What attention the forwards ran: on HookedTransformer the fused and eager layer calls (``"eager"`` where
    asked for); on a TransformerBridge, which keeps its own attention, that attention."""
    own = backends.backend(model).own_attention(model)
    if own is not None:
        return own
    return calls.describe() if attention == "fused" else "eager"


def _prefix_scope(model, sets: list[HookSet], attention: str) -> str | None:
    """The prefix sharing the evaluation may use (None: the row-by-row path): every hook set must allow it, and
    every attention layer must run fused with rotary (or no) positions, causally, with no hook left on the model."""
    if not backends.backend(model).fuses_attention:  # the prefixes' keys/values live in the fused layers
        return None
    cfg = model.cfg
    fusable = attention == "fused" and cfg.positional_embedding_type == "rotary" and not cfg.use_dynamic_ntk_rope \
        and cfg.attention_dir == "causal" \
        and all(eager_reason(b.attn) is None and not reads_pattern(b.attn) for b in model.blocks)
    bare = not any(p._forward_hooks or p._forward_pre_hooks for p in model.hook_dict.values())
    return narrowest([s.prefix_scope for s in sets]) if fusable and bare else None


def _run_rows(model, items, rows: list[Row], batch_size: int, sets: list[HookSet], first_input: int, bar
              ) -> tuple[list[tuple[list[list[float]], list[list[bool]]]], dict]:
    """Forward every row (longest first, in batches) under each hook set and read each (item, choice)'s
    log-likelihood and whether its continuation is the greedy one; ``bar`` advances as each item's last row is
    read. Per batch, the unhooked trunk is run once, as far as the sets share it."""
    outputs = _blank_outputs(items, len(sets))
    rows_left = np.bincount([r.item for r in rows], minlength=len(items))
    device, pad, L = model.cfg.device, pad_id(model), model.cfg.n_layers
    order = _set_order(sets)
    stats = dict(forward_passes=0, forward_tokens=0, padded_tokens=0)
    for batch in batches(sorted(rows, key=lambda r: -len(r.tokens)), batch_size):
        tokens, mask = (t.to(device) for t in pad_rows(batch, pad))
        mask = mask.long()
        trunk, trunk_layer = tokens, None  # the unhooked residual stream before block trunk_layer (None: the tokens)
        for i in order:
            hook_set = sets[i]
            if hook_set.first_layer is not None:
                trunk = _advance(model, trunk, mask, trunk_layer, hook_set.first_layer)
                trunk_layer = hook_set.first_layer
            with _hooked(model, hook_set, mask, [first_input + row.item for row in batch], _row_keys(batch)):
                start = hook_set.first_layer
                resid = backends.run_to_resid(model, tokens if start is None else trunk, mask, start=start, stop=L)
                _read_logprobs(model, resid, batch, *outputs[i])
        stats["forward_passes"] += 1
        stats["forward_tokens"] += int(mask.sum())
        stats["padded_tokens"] += int(mask.numel())
        for row in batch:
            rows_left[row.item] -= 1
        bar.update(sum(int(rows_left[row.item] == 0) for row in {r.item: r for r in batch}.values()))
    return outputs, stats


@dataclass
class _Pass:
    """One forward batch of the shared-prefix path: its rows, padded tokens and mask, the prefixes its rows continue
    (None: a batch of prefixes, or rows that continue none), and the unhooked trunk's residual stream so far."""

    rows: list[Row]
    tokens: Tensor
    mask: Tensor
    inputs: list[int]
    extension: Extension | None = None
    trunk: Tensor | None = None

    def start(self) -> Tensor:
        return self.tokens if self.trunk is None else self.trunk


def _run_prefixed(model, items, groups: list[Group], batch_size: int, sets: list[HookSet], first_input: int, bar,
                  state: PrefixState) -> tuple[list[tuple[list[list[float]], list[list[bool]]]], dict]:
    """:func:`_run_rows` for rows grouped by shared prefix: per chunk of groups, each prefix runs once (under each
    hook set, from the shared trunk) and the rows' suffixes against it; the same outputs and stats. A forward holds
    at most the padded tokens of ``batch_size`` of the longest rows (the row path's largest batch)."""
    outputs = _blank_outputs(items, len(sets))
    rows_left = np.bincount([r.item for g in groups for r in g.rows], minlength=len(items))
    stats = dict(forward_passes=0, forward_tokens=0, padded_tokens=0)
    budget = batch_size * max(len(g.prefix) + len(r.tokens) for g in groups for r in g.rows)
    for chunk in chunk_groups(groups, budget):
        prefixes, suffixes = _chunk_passes(model, chunk, budget, first_input)
        _run_chunk(model, prefixes, suffixes, sets, outputs, state)
        for p in prefixes + suffixes:
            stats["forward_passes"] += 1
            stats["forward_tokens"] += int(p.mask.sum())
            stats["padded_tokens"] += int(p.mask.numel())
        np.subtract.at(rows_left, [r.item for g in chunk for r in g.rows], 1)
        bar.update(sum(int(rows_left[item] == 0) for item in {r.item for g in chunk for r in g.rows}))
    return outputs, stats


def _chunk_passes(model, chunk: list[Group], budget: int, first_input: int) -> tuple[list[_Pass], list[_Pass]]:
    """The batches of a chunk's prefixes (none where no group shares one) and of its suffix rows, each suffix row
    told which prefix it continues (numbered across the prefix batches; the empty prefix: index 0, length 0)."""
    device, pad = model.cfg.device, pad_id(model)

    def make(rows: list[Row], extension=None) -> _Pass:
        tokens, mask = (t.to(device) for t in pad_rows(rows, pad))
        return _Pass(rows, tokens, mask.long(), [first_input + r.item for r in rows], extension)

    shared = {id(g.rows[0]): g for g in chunk if g.prefix}
    heads = [Row(g.rows[0].item, g.prefix, [(0, id(g.rows[0]), [])]) for g in shared.values()]  # reads: the group
    prefixes = [make(batch) for batch in token_batches(heads, budget)]
    order = [shared[row.reads[0][1]] for p in prefixes for row in p.rows]
    where = {id(row): (i, len(g.prefix)) for i, g in enumerate(order) for row in g.rows}
    suffixes = []
    for batch in token_batches(sorted([r for g in chunk for r in g.rows], key=lambda r: -len(r.tokens)), budget):
        index, lengths = zip(*[where.get(id(row), (0, 0)) for row in batch])
        extension = Extension({}, torch.tensor(index, device=device), torch.tensor(lengths, device=device)) \
            if prefixes else None
        suffixes.append(make(batch, extension))
    return prefixes, suffixes


def _run_chunk(model, prefixes: list[_Pass], suffixes: list[_Pass], sets: list[HookSet], outputs,
               state: PrefixState) -> None:
    """Each hook set on one chunk: the unhooked trunk advanced to the set's first hooked block (prefixes first,
    their keys/values kept), then the prefixes from there under the set's hooks (keys/values recorded, nothing
    counted), then every suffix batch against them, read into ``outputs``."""
    L = model.cfg.n_layers
    trunk_parts: list[dict] = [{} for _ in prefixes]
    trunk_layer = None
    for i in _set_order(sets):
        hook_set = sets[i]
        first = hook_set.first_layer
        if first is not None:
            for p, part in zip(prefixes, trunk_parts):
                with state.recording(part):
                    p.trunk = _advance(model, p.start(), p.mask, trunk_layer, first)
            trunk_kv = merge_kv(trunk_parts) if prefixes else {}
            for p in suffixes:
                with state.extending(_with_kv(p, trunk_kv)):
                    p.trunk = _advance(model, p.start(), p.mask, trunk_layer, first)
            trunk_layer = first
        parts = [dict(part) for part in trunk_parts]  # the set's own layers are recorded over the trunk's
        for p, part in zip(prefixes, parts):
            with _hooked(model, hook_set, p.mask, p.inputs, _row_keys(p.rows), count=False), state.recording(part):
                backends.run_to_resid(model, p.start(), p.mask, start=first, stop=L)
        kv = merge_kv(parts) if prefixes else {}
        for p in suffixes:
            with _hooked(model, hook_set, p.mask, p.inputs, _row_keys(p.rows)), state.extending(_with_kv(p, kv)):
                resid = backends.run_to_resid(model, p.start(), p.mask, start=first, stop=L)
            _read_logprobs(model, resid, p.rows, *outputs[i])


def _with_kv(p: _Pass, kv: dict) -> Extension | None:
    return None if p.extension is None else replace(p.extension, kv=kv)


def _blank_outputs(items, n_sets: int) -> list[tuple[list[list[float]], list[list[bool]]]]:
    """Per hook set: NaN log-likelihoods and False greedy flags for every (item, choice), to be filled in."""
    return [([[math.nan] * len(it.continuations) for it in items], [[False] * len(it.continuations) for it in items])
            for _ in range(n_sets)]


def _set_order(sets: list[HookSet]) -> list[int]:
    """The sets in the order the shared trunk reaches them (from the tokens first, then by first hooked block)."""
    return sorted(range(len(sets)), key=lambda i: -1 if (first := sets[i].first_layer) is None else first)


@contextlib.contextmanager
def _hooked(model, hook_set: HookSet, mask: Tensor, inputs: list[int], rows: list[int], count: bool = True):
    """The set's hooks on the model, its batch-aware objects told the batch's mask and input ids (and, those that
    draw per row, ``reads_rows``, each row's key within its item: ``rows``; ``count=False``: a shared prefix, not
    counted by the objects)."""
    with contextlib.ExitStack() as stack:
        for obj in hook_set.batch_aware:
            told = dict(inputs=inputs, rows=rows) if getattr(obj, "reads_rows", False) else dict(inputs=inputs)
            stack.enter_context(obj.batch(mask, **told) if count else obj.batch(mask, **told, count=False))
        stack.enter_context(model.hooks(fwd_hooks=hook_set.pairs))
        yield


def _row_keys(rows: list[Row]) -> list[int]:
    """Each row's key among the rows of its item: the first choice it reads (an item's rows read different
    choices), so a per-row draw depends on the row, not on its batch."""
    return [row.reads[0][0] if row.reads else 0 for row in rows]


def _advance(model, resid: Tensor, mask: Tensor, start: int | None, stop: int) -> Tensor:
    """The unhooked forward from before block ``start`` (None: from the tokens in ``resid``) to before ``stop``."""
    if start == stop:
        return resid
    return backends.run_to_resid(model, resid, mask, start=start, stop=stop)


@contextlib.contextmanager
def _attention(model, attention: str, calls: AttentionCalls, prefix: PrefixState | None = None):
    """Weights laid out once (:mod:`lens_heads.evaluation.packed_weights`: the same outputs) and, unless ``attention`` is
    ``"eager"``, the fused-attention block (counting into ``calls``; ``prefix``: the shared prefixes' state)."""
    fused = contextlib.nullcontext() if attention == "eager" else fused_attention(model, calls, prefix)
    with packed_weights(model), fused:
        yield


# ---------------------------------------------------------------- under torchrun


def _evaluate_shards(model, task, hook_sets: Sequence, settings: dict) -> list[EvalResult]:
    """``evaluate_each`` on this rank's block of the items; the blocks' records gathered in order on every rank."""
    items = list(task)
    if not items:
        raise InputError("the task has no items")
    distributed.check_agree(_identity(model, items, settings), "model, items and settings of the evaluation")
    mine = distributed.block(len(items), distributed.rank(), distributed.world_size())
    local = None
    if len(mine):
        part = replace(task, items=items[mine.start:mine.stop]) if hasattr(task, "items") else items[mine.start:mine.stop]
        with distributed.local():
            shard = dict(first_input=settings["first_input"] + mine.start,
                         progress=settings["progress"] and distributed.is_main())
            local = [(r.items, r.meta) for r in evaluate_each(model, part, hook_sets, **{**settings, **shard})]
    parts = [p for p in distributed.all_gather(local) if p]
    results = []
    for k in range(len(hook_sets)):
        metas = [part[k][1] for part in parts]
        meta = dict(metas[0], task=task.meta() if hasattr(task, "meta") else {}, ranks=distributed.world_size(),
                    wall_s=max(m["wall_s"] for m in metas),
                    **{key: sum(m[key] for m in metas) for key in ("rows", "forward_passes", "forward_tokens",
                                                                   "padded_tokens", "row_tokens")})
        results.append(EvalResult(task=getattr(task, "name", "task"), format=getattr(task, "format", "?"),
                                  items=[record for part in parts for record in part[k][0]],
                                  chance=float(getattr(task, "chance", float("nan"))), primary=settings["primary"],
                                  meta=meta))
    return results


def _identity(model, items, settings: dict) -> dict:
    ids = "\n".join(item.id for item in items).encode()
    return dict(model={k: v for k, v in model_meta(model).items() if k != "source"},
                items=hashlib.sha256(ids).hexdigest()[:16], n=len(items),
                **{k: v for k, v in settings.items() if k != "progress"})
