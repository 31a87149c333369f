"""Shared prefixes computed once: rows that begin with the same tokens run that beginning in one forward, and their
continuations attend to its keys and values.

Causal attention makes a position's activations depend on the tokens at and before it only, so the rows of one
cloze item (its choices: the context repeated, then a different continuation) and the MMLU questions of one subject
(the same description and five shots, then the question) compute their common beginning identically. The evaluator
(:func:`lens_heads.evaluation.evaluate.evaluate_each`) groups such rows (:func:`plan_groups`), runs each group's *prefix* once
while every fused attention layer records its keys and values (post-rotary, with the grouped-query KV heads), then
runs the rows' remaining tokens (the *suffix*: at least every position whose logits are read) with each layer
attending to its row's prefix keys/values and to the suffix's own, the suffix's positions continuing the prefix's:
rotary ones in the fused layers (:func:`prefixed_z`, :func:`lens_heads.models.tl_internals.rotary_at`), learned ones
(GPT-2's) in the position embedding (:func:`learned_positions`). Hooks run in both passes: a hook on
``hook_z`` sees the prefix positions in the prefix pass and the suffix positions in the suffix pass, each with the
values the whole row has there, so ablations that zero a head everywhere act on the prefix's keys/values as on the
whole row.

This is exact only for hooks whose action at a position does not depend on the rest of the row. Hook objects say so
with a ``prefix_scope`` attribute (hook pairs: on the function): ``"any"`` (the same action on every row: no hooks,
static zeroing, mean ablation, :func:`lens_heads.ablation.hooks.zero_heads`), ``"item"`` (the same action on the rows of
one item: random zeroing, drawn per item), or None (decides from the whole row, e.g. the per-input threshold
zeroing; acts differently on each row, e.g. random zeroing drawn per row; unknown user hooks): then the evaluator
keeps the row-by-row path.

Each row continues one prefix: an item's context across its choices, or a subject's description and shots across
its questions (MMLU). Where both levels exist (a few-shot cloze task), the grouping keeps whichever its greedy rule
finds saves more tokens; it does not nest them. Prefixes and suffixes run in batches cut to the fewest padded
tokens (:func:`token_batches`): on a CPU a forward costs its padded tokens, and suffixes are many and short.

Exactness: the shared path computes the whole row's sums in other groupings (a prefix forward, then a suffix forward
against its keys/values). In float64 it equals TransformerLens's eager attention run row by row to 1e-10, for every
ablation kind above (``tests/test_prefix.py``). In float32 the matmuls of a prefix, a suffix and a whole row differ
in shape, and so in rounding: on the embedded model the summed log-likelihoods differ by the order of the row
path's own change between batch sizes and of lm-eval's difference from it (``benchmarks/bench_prefix.py`` records
the largest difference per task in ``docs/records/benchmarks.md``).
A 1e-5 agreement holds in float64; in float32 it holds to the float32 rounding of the forward, not to 1e-5.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import einops
import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor

from lens_heads.data.rows import Row

SCOPES = ("item", "any")  # narrowest first
MIN_PREFIX = 4  # tokens: a shorter common beginning is not worth a second forward
ROWS_PER_PREFIX = 4  # a group holds at most this many batches of rows; a chunk this many forward budgets
FORWARD_COST = 16  # tokens: what the batching charges a forward beside its padded tokens. On a CPU a forward costs
# about its padded tokens whatever its shape, so padding, not the number of forwards, is what a batching of short
# rows must avoid; a small charge keeps it from cutting every row into a forward of its own
MAX_BATCH_ROWS = 1024  # rows in a prefix or suffix batch: bounds the batching's search at this many steps a row


# ---------------------------------------------------------------- which hooks allow it


def hook_scope(hooks: Sequence) -> str | None:
    """The widest prefix sharing that every hook object or ``(name, fn)`` pair in ``hooks`` allows (None: none)."""
    scopes = [getattr(obj[1], "prefix_scope", None) if isinstance(obj, tuple) else obj.prefix_scope for obj in hooks]
    return narrowest(scopes)


def narrowest(scopes: Sequence[str | None]) -> str | None:
    """The sharing every one of ``scopes`` allows: None if any is None, else the narrowest ("any" when empty)."""
    if any(scope not in SCOPES for scope in scopes):
        return None
    return min(scopes, key=SCOPES.index, default="any")


def mark(fn, scope: str | None):
    """``fn`` with its ``prefix_scope`` set (for hook functions whose action does not depend on the row)."""
    fn.prefix_scope = scope
    return fn


# ---------------------------------------------------------------- grouping the rows


@dataclass
class Group:
    """Rows that share ``prefix``; ``rows`` are their suffixes (tokens after the prefix, read positions shifted)."""

    prefix: list[int]
    rows: list[Row] = field(default_factory=list)


def group_rows(batch_size: int) -> int:
    """The most rows one group holds where forwards take ``batch_size`` rows: ``ROWS_PER_PREFIX`` batches."""
    return ROWS_PER_PREFIX * batch_size


def plan_groups(rows: Sequence[Row], scope: str, max_rows: int) -> list[Group]:
    """Group ``rows`` by their common beginning: sorted by (item when ``scope`` is ``"item"``, tokens), a row joins
    the group before it while the tokens that saves do not shrink; a prefix always ends before the group's first
    read position, so every read lies in a suffix. Rows that share nothing form groups with an empty prefix.
    Groups larger than ``max_rows`` are split into parts with the group's prefix (the parts that one chunk holds
    run it once)."""
    key = (lambda r: r.item) if scope == "item" else (lambda r: 0)
    groups: list[tuple[int, list[Row]]] = []
    for row in sorted(rows, key=lambda r: (key(r), r.tokens)):
        if groups:
            length, members = groups[-1]
            joined = min(length, _read_limit(row), common_length(members[0].tokens, row.tokens))
            if key(row) == key(members[0]) and joined >= MIN_PREFIX and len(members) * joined >= (
                    len(members) - 1) * length:
                groups[-1] = (joined, members + [row])
                continue
        groups.append((_read_limit(row), [row]))
    return [_group(members[i:i + max_rows], length if len(members) > 1 else 0)
            for length, members in groups for i in range(0, len(members), max_rows)]


def _read_limit(row: Row) -> int:
    return min(first for _, first, _ in row.reads)


def common_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many tokens ``a`` and ``b`` begin with alike."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _group(members: list[Row], length: int) -> Group:
    suffixes = [Row(r.item, r.tokens[length:], [(c, first - length, ids) for c, first, ids in r.reads])
                for r in members]
    return Group(members[0].tokens[:length], suffixes)


def chunk_groups(groups: list[Group], budget: int) -> Iterator[list[Group]]:
    """Groups, longest prefix first, in chunks whose prefix tokens and suffix tokens each stay within
    ``ROWS_PER_PREFIX * budget`` (a chunk's prefix keys/values are held while its suffixes run)."""
    chunk: list[Group] = []
    for group in sorted(groups, key=lambda g: -len(g.prefix)):
        if chunk and (sum(len(g.prefix) for g in chunk) + len(group.prefix) > ROWS_PER_PREFIX * budget
                      or sum(len(r.tokens) for g in chunk + [group] for r in g.rows) > ROWS_PER_PREFIX * budget):
            yield chunk
            chunk = []
        chunk.append(group)
    if chunk:
        yield chunk


def token_batches(rows: Sequence[Row], budget: int) -> list[list[Row]]:
    """Rows (sorted longest first) cut into consecutive forward batches of at most ``budget`` padded tokens (a row
    longer than ``budget`` alone) of at most ``MAX_BATCH_ROWS`` rows, the cut with the fewest padded tokens plus
    ``FORWARD_COST`` per forward.

    Dynamic programming over the cut points: ``cost[i]``, the cheapest batching of the first ``i`` rows, is the
    cheapest ``cost[j]`` plus the batch ``rows[j:i]`` (``i - j`` rows padded to ``rows[j]``'s length). Prefixes and
    suffixes are many and short (ARC-Easy's suffixes: 1 to 67 tokens), so a fixed fill bound either pads a batch
    by up to half or runs many small forwards; the cut pads little (``bench_prefix.py`` prints the padded
    tokens beside the forward tokens)."""
    lengths = [len(r.tokens) for r in rows]
    cost, cut = [0.0] + [math.inf] * len(rows), [0] * (len(rows) + 1)
    for i in range(1, len(rows) + 1):
        for j in range(i - 1, -1, -1):  # rows[j:i] grows in rows and in its longest row as j falls
            if i - j > 1 and ((i - j) * lengths[j] > budget or i - j > MAX_BATCH_ROWS):
                break
            c = cost[j] + (i - j) * lengths[j] + FORWARD_COST
            if c < cost[i]:
                cost[i], cut[i] = c, j
    ends = [len(rows)]
    while ends[-1]:
        ends.append(cut[ends[-1]])
    return [list(rows[j:i]) for j, i in zip(ends[:0:-1], ends[-2::-1])]


def merge_kv(parts: Sequence[dict]) -> dict[int, tuple[Tensor, Tensor]]:
    """Per layer, the keys/values recorded by several prefix batches as one ``[prefix, pos, kv_head, d_head]``
    pair, each batch's positions right-padded with zeros to the longest (the padding is never attended to)."""
    if len(parts) == 1:
        return dict(parts[0])
    out = {}
    for layer in parts[0]:
        n_pos = max(part[layer][0].shape[1] for part in parts)
        keys, values = (torch.cat([F.pad(part[layer][j], (0, 0, 0, 0, 0, n_pos - part[layer][j].shape[1]))
                                   for part in parts]) for j in (0, 1))
        out[layer] = (keys, values)
    return out


# ---------------------------------------------------------------- what the attention layers do


@dataclass
class Extension:
    """A suffix batch's prefixes: each row continues prefix ``index[row]`` (``lengths[row]`` real tokens) whose
    keys/values per layer are ``kv[layer]`` (``[prefix, pos, kv_head, d_head]`` each); ``longest``: the batch's
    longest prefix (keys past it are padding for every row, left out)."""

    kv: dict[int, tuple[Tensor, Tensor]]
    index: Int[Tensor, "batch"]
    lengths: Int[Tensor, "batch"]
    longest: int = field(init=False)

    def __post_init__(self):
        self.longest = int(self.lengths.max()) if len(self.lengths) else 0


@dataclass
class PrefixState:
    """What the fused attention layers do with keys and values in the current forward: store them per layer into
    ``record``, and/or attend to the prefixes of ``extend`` as well (neither: the ordinary forward)."""

    record: dict | None = None
    extend: Extension | None = None

    @property
    def active(self) -> bool:
        return self.record is not None or self.extend is not None

    @contextlib.contextmanager
    def recording(self, store: dict) -> Iterator[None]:
        self.record = store
        try:
            yield
        finally:
            self.record = None

    @contextlib.contextmanager
    def extending(self, extension: Extension | None) -> Iterator[None]:
        self.extend = extension
        try:
            yield
        finally:
            self.extend = None


def suffix_positions(extension: Extension, n_pos: int) -> Int[Tensor, "batch pos"]:
    """Where a suffix batch's positions sit in their whole rows: after their prefixes."""
    return extension.lengths[:, None] + torch.arange(n_pos, device=extension.lengths.device)[None]


LEARNED_POSITIONS = ("standard", "shortformer")  # TransformerLens's position embeddings looked up in W_pos


@contextlib.contextmanager
def learned_positions(model, state: PrefixState) -> Iterator[None]:
    """While ``state`` extends prefixes, ``model``'s learned position embedding (GPT-2's ``W_pos``) gives a suffix
    batch's tokens their positions in the whole rows, after their prefixes, as rotary positions continue them in the
    fused layers; padding gets a zero embedding, as TransformerLens gives it. Nothing changes for rotary models."""
    pos_embed = getattr(model, "pos_embed", None)
    if model.cfg.positional_embedding_type not in LEARNED_POSITIONS or pos_embed is None:
        yield
        return
    own, before = pos_embed.forward, vars(pos_embed).get("forward")  # an enclosing block's, restored on exit

    def forward(tokens, past_kv_pos_offset: int = 0, attention_mask=None):
        extension = state.extend
        if extension is None:
            return own(tokens, past_kv_pos_offset, attention_mask)
        real = (torch.ones_like(tokens, dtype=torch.bool) if attention_mask is None
                else attention_mask[:, past_kv_pos_offset:].bool())
        positions = suffix_positions(extension, tokens.shape[1]).to(tokens.device).masked_fill(~real, 0)
        return pos_embed.W_pos[positions].masked_fill(~real[..., None], 0.0)

    pos_embed.forward = forward
    try:
        yield
    finally:
        del pos_embed.forward
        if before is not None:
            pos_embed.forward = before


Heads = Float[Tensor, "batch pos head d_head"]
KVHeads = Float[Tensor, "batch pos kv_head d_head"]


@dataclass(frozen=True)
class QKV:
    """One attention layer call's queries, keys and values (after rotary; grouped-query K/V heads not copied per
    query head) and its padding mask (``attention_mask``, 1 for a real token; None: every position real): what the
    fused attention functions attend with (:func:`prefixed_z`, :func:`lens_heads.evaluation.fused_attention.sdpa_z`,
    :func:`lens_heads.evaluation.fused_attention.windowed_z`)."""

    q: Heads
    k: KVHeads
    v: KVHeads
    attention_mask: Int[Tensor, "batch pos"] | None = None

    def real(self) -> Bool[Tensor, "batch pos"]:
        """Which positions hold real tokens, on the queries' device."""
        if self.attention_mask is None:
            return torch.ones(self.q.shape[:2], dtype=torch.bool, device=self.q.device)
        return self.attention_mask.to(self.q.device).bool()


def prefixed_z(x: QKV, extension: Extension, layer: int, *, scale: float) -> Heads:
    """Causal head outputs of a suffix batch whose queries attend to their row's prefix keys/values (all real ones)
    and to the suffix's earlier or equal real positions: the values the whole row's forward has there.

    Grouped-query heads (query head h reads KV head h // group, as in ``sdpa_z``) attend as one query sequence per
    KV head, the group's query heads one after another along it, so the keys and values are never copied per query
    head (a suffix of a few tokens against a prefix of tens would spend more on those copies than on its products).
    """
    q, k, v = x.q, x.k, x.v
    n_pos, group = q.shape[1], q.shape[2] // k.shape[2]
    prefix_k, prefix_v = (t[:, :extension.longest][extension.index.to(t.device)] for t in extension.kv[layer])
    real = x.real()
    in_prefix: Bool[Tensor, "batch key"] = (torch.arange(extension.longest, device=q.device)[None]
                                            < extension.lengths.to(q.device)[:, None])
    causal = torch.ones(n_pos, n_pos, dtype=torch.bool, device=q.device).tril()
    allowed = torch.cat([in_prefix[:, None, :].expand(-1, n_pos, -1), causal[None] & real[:, None, :]], dim=-1)
    queries = einops.rearrange(q, "b p (kv g) d -> b kv (g p) d", g=group)
    keys, values = (einops.rearrange(torch.cat([prefix, x], dim=1), "b key kv d -> b kv key d")
                    for prefix, x in ((prefix_k, k), (prefix_v, v)))
    mask = einops.repeat(allowed, "b p key -> b 1 (g p) key", g=group)
    out = F.scaled_dot_product_attention(queries, keys, values.to(q.dtype), attn_mask=mask, scale=scale)
    return einops.rearrange(out, "b kv (g p) d -> b p (kv g) d", g=group)
