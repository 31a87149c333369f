"""The evaluator's forward passes: every row under each hook set, its log-likelihoods read after each batch.

:func:`run_passes` takes one of two paths: row by row (:func:`_run_rows`, the rows in batches of
:func:`lens_heads.evaluation.logprobs.batches`) or over shared prefixes (:func:`_run_prefixed`,
:mod:`lens_heads.evaluation.prefix`), where the hooks and the attention allow it (:func:`_prefix_scope`). Both run
the unhooked trunk once per batch as far as the hook sets share it: each set runs from the first block it hooks.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import Tensor

from lens_heads.data.inputs import pad_id
from lens_heads.data.rows import Row
from lens_heads.evaluation.eval_settings import EvalRun
from lens_heads.evaluation.fast_blocks import fast_blocks
from lens_heads.evaluation.fused_attention import AttentionCalls, eager_reason, fused_attention, reads_pattern
from lens_heads.evaluation.hook_sets import HookSet
from lens_heads.evaluation.logprobs import batches, pad_rows, record_logprobs
from lens_heads.evaluation.packed_weights import packed_weights
from lens_heads.evaluation.prefix import (
    LEARNED_POSITIONS,
    Extension,
    Group,
    PrefixState,
    chunk_groups,
    group_rows,
    learned_positions,
    merge_kv,
    narrowest,
    plan_groups,
    token_batches,
)
from lens_heads.models import backends
from lens_heads.models import tl_internals as tl
from lens_heads.models.capture import any_hooked

Outputs = list[tuple[list[list[float]], list[list[bool]]]]  # per hook set: log-likelihoods, greedy flags


@dataclass(frozen=True)
class Work:
    """What one evaluation runs: its items, their forward rows (:mod:`lens_heads.data.rows`) and its hook sets."""

    items: list
    rows: list[Row]
    sets: list[HookSet]


def run_passes(model, work: Work, run: EvalRun, bar, calls: AttentionCalls) -> tuple[Outputs, dict, str | None]:
    """Every row under each hook set, ``run.settings.batch_size`` rows per forward, over shared prefixes where the
    hooks and the attention allow it (``run.shared_prefixes=False``: never), row by row otherwise: the outputs and
    forward counts of :func:`_run_rows` and the prefix sharing taken (None: the row-by-row path). A stacked set
    (``copies`` > 1) gives one output per copy, in order. ``calls`` counts the fused and eager attention calls."""
    attention, batch_size = run.settings.attention, run.settings.batch_size
    assert isinstance(batch_size, int)  # "auto" is resolved by the caller
    stacked = any(s.copies > 1 for s in work.sets)  # a stacked forward runs its copies row by row
    scope = _prefix_scope(model, work.sets, attention) if run.shared_prefixes and not stacked else None
    groups = plan_groups(work.rows, scope, group_rows(batch_size)) if scope else []
    state = PrefixState() if any(g.prefix for g in groups) else None
    with evaluator_forward(model, attention, calls, state):
        outputs, stats = (_run_rows(model, work, run, bar) if state is None else
                          _run_prefixed(model, work, _Prefixes(groups, state, scope), run, bar))
    return outputs, stats, scope if state is not None else None


def _prefix_scope(model, sets: list[HookSet], attention: str) -> str | None:
    """The prefix sharing the evaluation may use (None: the row-by-row path): the model must allow it
    (:func:`shares_prefixes`) and so must every hook set."""
    return narrowest([s.prefix_scope for s in sets]) if shares_prefixes(model, attention) else None


def shares_prefixes(model, attention: str = "fused") -> bool:
    """Whether an evaluation of ``model`` whose hooks allow it runs shared prefixes: every attention layer must run
    fused (``attention`` ``"fused"``) with rotary or learned positions
    (:func:`lens_heads.evaluation.prefix.learned_positions`), causally, without a sliding window (the prefixes'
    attention knows none), with no hook left on the model."""
    if not backends.backend(model).fuses_attention:  # the prefixes' keys/values live in the fused layers
        return False
    cfg = model.cfg
    fusable = attention == "fused" and cfg.positional_embedding_type in ("rotary", *LEARNED_POSITIONS) \
        and not cfg.use_dynamic_ntk_rope \
        and cfg.attention_dir == "causal" \
        and all(eager_reason(b.attn) is None and not reads_pattern(b.attn) and tl.window(b.attn) is None
                for b in model.blocks)
    return fusable and not any_hooked(model.hook_dict.values())


@contextlib.contextmanager
def evaluator_forward(model, attention: str = "fused", calls: AttentionCalls | None = None,
                      prefix: PrefixState | None = None):
    """The evaluator's forward for the block: weights laid out once (:mod:`lens_heads.evaluation.packed_weights`: the
    same outputs) and, unless ``attention`` is ``"eager"``, the fused-attention block (counting into ``calls``;
    ``prefix``: the shared prefixes' state) inside blocks that normalise once (:mod:`lens_heads.evaluation.fast_blocks`).
    A hook on a pattern or a norm makes its layer or block run eagerly, so every hook sees its values."""
    if attention == "eager":
        with packed_weights(model):
            yield
        return
    with packed_weights(model), fused_attention(model, calls, prefix), fast_blocks(model), \
            contextlib.nullcontext() if prefix is None else learned_positions(model, prefix):
        yield


def attention_ran(model, attention: str, calls: AttentionCalls) -> str:
    """What attention the forwards ran: on HookedTransformer the fused and eager layer calls (``"eager"`` where
    asked for); on a TransformerBridge, which keeps its own attention, that attention."""
    own = backends.backend(model).own_attention(model)
    if own is not None:
        return own
    return calls.describe() if attention == "fused" else "eager"


def _run_rows(model, work: Work, run: EvalRun, bar) -> tuple[Outputs, dict]:
    """Forward every row (longest first, in batches) under each hook set and read each (item, choice)'s
    log-likelihood and whether its continuation is the greedy one; ``bar`` advances as each item's last row is
    read. Per batch, the unhooked trunk is run once, as far as the sets share it. A stacked set runs ``copies``
    copies of the batch in one forward, unit after unit, each read into its own output."""
    items, rows, sets, first_input = work.items, work.rows, work.sets, run.first_input
    batch_size = run.settings.batch_size
    assert isinstance(batch_size, int)
    outputs = _blank_outputs(items, sum(s.copies for s in sets))
    offsets = np.cumsum([0] + [s.copies for s in sets]).tolist()
    widest = max((s.copies for s in sets), default=1)  # the forward counts are the widest set's
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
            c = hook_set.copies
            start = hook_set.first_layer
            stacked_mask = _stacked(mask, c)
            with _hooked(model, hook_set, _Told(stacked_mask, [first_input + row.item for row in batch] * c,
                                                 _row_keys(batch) * c)):
                resid = backends.run_to_resid(model, _stacked(tokens if start is None else trunk, c), stacked_mask,
                                              start=start, stop=L)
                for copy, part in enumerate(resid.chunk(c) if c > 1 else [resid]):
                    record_logprobs(model, part, batch, *outputs[offsets[i] + copy])
        stats["forward_passes"] += 1
        stats["forward_tokens"] += int(mask.sum()) * widest
        stats["padded_tokens"] += int(mask.numel()) * widest
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


@dataclass(frozen=True)
class _Prefixes:
    """The rows grouped by shared prefix (:func:`lens_heads.evaluation.prefix.plan_groups`) and the prefixes'
    keys/values as the fused layers record and extend them."""

    groups: list[Group]
    state: PrefixState
    scope: str | None  # "item" or "any" (:func:`lens_heads.evaluation.prefix.plan_groups`)


def _run_prefixed(model, work: Work, prefixes: _Prefixes, run: EvalRun, bar) -> tuple[Outputs, dict]:
    """:func:`_run_rows` for rows grouped by shared prefix: per chunk of groups, each prefix runs once (under each
    hook set, from the shared trunk) and the rows' suffixes against it; the same outputs and stats. A forward holds
    at most the padded tokens of ``batch_size`` of the longest rows (the row path's largest batch)."""
    groups, batch_size = prefixes.groups, run.settings.batch_size
    assert isinstance(batch_size, int)
    outputs = _blank_outputs(work.items, len(work.sets))
    rows_left = np.bincount([r.item for g in groups for r in g.rows], minlength=len(work.items))
    stats = dict(forward_passes=0, forward_tokens=0, padded_tokens=0)
    budget = batch_size * max(len(g.prefix) + len(r.tokens) for g in groups for r in g.rows)
    for chunk in chunk_groups(groups, budget):
        passes = _chunk_passes(model, chunk, budget, run.first_input, prefixes.scope)
        _run_chunk(model, passes, work.sets, outputs, prefixes.state)
        for p in passes.prefixes + passes.suffixes:
            stats["forward_passes"] += 1
            stats["forward_tokens"] += int(p.mask.sum())
            stats["padded_tokens"] += int(p.mask.numel())
        np.subtract.at(rows_left, [r.item for g in chunk for r in g.rows], 1)
        bar.update(sum(int(rows_left[item] == 0) for item in {r.item for g in chunk for r in g.rows}))
    return outputs, stats


@dataclass(frozen=True)
class _Chunk:
    """A chunk's forward batches: its prefixes' (none where no group shares one) and its suffix rows'."""

    prefixes: list[_Pass]
    suffixes: list[_Pass]


def _chunk_passes(model, chunk: list[Group], budget: int, first_input: int, scope: str | None) -> _Chunk:
    """The batches of a chunk's prefixes (none where no group shares one) and of its suffix rows, each suffix row
    told which prefix it continues (numbered across the prefix batches; the empty prefix: index 0, length 0).
    Groups with the same prefix (a large group's parts: a subject's questions) run it once; under ``scope``
    ``"item"`` only within an item, whose hooks may act differently from another's."""
    device, pad = model.cfg.device, pad_id(model)

    def make(rows: list[Row], extension=None) -> _Pass:
        tokens, mask = (t.to(device) for t in pad_rows(rows, pad))
        return _Pass(rows, tokens, mask.long(), [first_input + r.item for r in rows], extension)

    shared: dict[tuple, list[Group]] = {}  # one forward per distinct prefix: a group split by size shares its own
    for g in chunk:
        if g.prefix:
            shared.setdefault((g.rows[0].item if scope == "item" else None, *g.prefix), []).append(g)
    keys = list(shared)
    heads = [Row(gs[0].rows[0].item, gs[0].prefix, [(0, k, [])]) for k, gs in enumerate(shared.values())]
    prefixes = [make(batch) for batch in token_batches(heads, budget)]  # reads: the prefix's key
    order = [shared[keys[row.reads[0][1]]] for p in prefixes for row in p.rows]
    where = {id(row): (i, len(gs[0].prefix)) for i, gs in enumerate(order) for g in gs for row in g.rows}
    suffixes = []
    for batch in token_batches(sorted([r for g in chunk for r in g.rows], key=lambda r: -len(r.tokens)), budget):
        index, lengths = zip(*[where.get(id(row), (0, 0)) for row in batch])
        extension = Extension({}, torch.tensor(index, device=device), torch.tensor(lengths, device=device)) \
            if prefixes else None
        suffixes.append(make(batch, extension))
    return _Chunk(prefixes, suffixes)


def _run_chunk(model, chunk: _Chunk, sets: list[HookSet], outputs: Outputs, state: PrefixState) -> None:
    """Each hook set on one chunk: the unhooked trunk advanced to the set's first hooked block (prefixes first,
    their keys/values kept), then the prefixes from there under the set's hooks (keys/values recorded, nothing
    counted), then every suffix batch against them, read into ``outputs``."""
    L, prefixes, suffixes = model.cfg.n_layers, chunk.prefixes, chunk.suffixes
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
            with _hooked(model, hook_set, _told(p), count=False), state.recording(part):
                backends.run_to_resid(model, p.start(), p.mask, start=first, stop=L)
        kv = merge_kv(parts) if prefixes else {}
        for p in suffixes:
            with _hooked(model, hook_set, _told(p)), state.extending(_with_kv(p, kv)):
                resid = backends.run_to_resid(model, p.start(), p.mask, start=first, stop=L)
            record_logprobs(model, resid, p.rows, *outputs[i])


def _stacked(x: Tensor, copies: int) -> Tensor:
    """``copies`` copies of a batch's rows, one after the other (a stacked set's units each take one)."""
    return x if copies == 1 else x.repeat(copies, *([1] * (x.dim() - 1)))


def _with_kv(p: _Pass, kv: dict) -> Extension | None:
    return None if p.extension is None else replace(p.extension, kv=kv)


def _blank_outputs(items, n_sets: int) -> list[tuple[list[list[float]], list[list[bool]]]]:
    """Per hook set: NaN log-likelihoods and False greedy flags for every (item, choice), to be filled in."""
    return [([[math.nan] * len(it.continuations) for it in items], [[False] * len(it.continuations) for it in items])
            for _ in range(n_sets)]


def _set_order(sets: list[HookSet]) -> list[int]:
    """The sets in the order the shared trunk reaches them (from the tokens first, then by first hooked block)."""
    return sorted(range(len(sets)), key=lambda i: -1 if (first := sets[i].first_layer) is None else first)


@dataclass(frozen=True)
class _Told:
    """What a forward's batch-aware ablations are told: its mask, each row's input id and its key within its item."""

    mask: Tensor
    inputs: list[int]
    rows: list[int]


def _told(p: _Pass) -> _Told:
    return _Told(p.mask, p.inputs, _row_keys(p.rows))


@contextlib.contextmanager
def _hooked(model, hook_set: HookSet, told: _Told, count: bool = True):
    """The set's hooks on the model, its batch-aware ablations told the batch's mask and input ids (and, those that
    draw per row, ``reads_rows``, each row's key within its item; ``count=False``: a shared prefix, not counted by
    the ablations)."""
    with contextlib.ExitStack() as stack:
        for obj in hook_set.batch_aware:
            rows = told.rows if obj.reads_rows else None
            stack.enter_context(obj.batch(told.mask, inputs=told.inputs, rows=rows, count=count))
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
