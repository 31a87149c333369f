"""The two numbers per query row that the pattern scores read (AWFT: the weight on the first token; AEQD: the
entropy), without ever holding a layer's whole ``[batch, head, query, key]`` pattern.

Where a layer runs fused on the CPU, :func:`fused_row_statistics` takes both from one more fused attention over the
layer's keys, with its log-sum-exp: no row of the pattern at all. Elsewhere the pattern is read a chunk of query rows
at a time, from one of two sources:

- a pattern a hook captured (``hook_pattern``), sliced into rows: what a layer that runs eagerly gives anyway;
- the layer's queries and keys (``hook_rot_q``/``hook_rot_k`` with rotary positions, else ``hook_q``/``hook_k``),
  from which each chunk of rows is computed as TransformerLens's eager attention computes it: ``q . k / attn_scale``,
  keys after the query, keys out of a local layer's sliding window and padding keys masked, softmax, and a row with
  no allowed key all zero (a windowed layer's chunk reads only the keys its rows' windows reach). Hooking these
  instead of ``hook_pattern`` leaves the layer on fused attention
  (:mod:`lens_heads.evaluation.fused_attention`), so a forward's memory grows linearly with the prompt: per layer
  ``batch x head x query_chunk x key`` floats for the rows, instead of ``batch x head x query x key``.

:func:`pattern_source` says, per layer, which hooks a scoring pass or a per-input zeroing captures;
:func:`rows_from` builds the source from what they captured.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from lens_heads.evaluation.fused_attention import eager_reason
from lens_heads.models import tl_internals as tl
from lens_heads.models.backends import backend
from lens_heads.models.loading import expand_kv
from lens_heads.plumbing.errors import InputError

DEFAULT_QUERY_CHUNK = 256  # rows per step: 8 inputs x 9 heads x 256 rows x 8,192 keys is 0.6 GB of float32


@dataclass(frozen=True)
class QueryKeys:
    """One layer's queries and keys as its attention reads them (after rotary and q/k norms), key/value heads
    already expanded to query heads; ``real``: the keys that are real tokens."""

    q: Float[Tensor, "batch q head d_head"]
    k: Float[Tensor, "batch k head d_head"]
    real: Bool[Tensor, "batch k"]
    attn_scale: float  # the scores are q . k / attn_scale, as eagerly
    causal: bool
    window: int | None = None  # a causal local layer's sliding window: query i reads keys i - window + 1 .. i

    def first_key(self, start: int) -> int:
        """The first key any query from ``start`` on may read: 0, or the start of row ``start``'s window."""
        return max(0, start - self.window + 1) if self.window is not None and self.causal else 0


@dataclass(frozen=True)
class RowStatistics:
    """Per query row of one layer: the weight on the first token and the entropy (nats) of the row."""

    first_weight: Float[Tensor, "batch head q"]
    entropy: Float[Tensor, "batch head q"]


def check_query_chunk(query_chunk) -> int:
    """``query_chunk`` if it is a positive whole number, else an InputError saying so."""
    if isinstance(query_chunk, bool) or not isinstance(query_chunk, int) or query_chunk < 1:
        raise InputError(f"query_chunk must be a positive whole number of query rows (e.g. {DEFAULT_QUERY_CHUNK}), "
                         f"got {query_chunk!r}")
    return query_chunk


MASKED = -1e30  # a masked score: its probability is exactly 0, and (unlike -inf) 0 x its log-probability is 0


def score_rows(source: QueryKeys, start: int, stop: int, keys: int) -> Float[Tensor, "batch head rows keys"]:
    """The attention scores of rows ``start:stop`` over keys ``lo:keys`` (float32; ``lo`` is
    ``source.first_key(start)``: 0 but in a sliding window), as the eager attention computes them before its
    softmax, masked keys at :data:`MASKED`. A row with no allowed key (before a left-padded row's first token: a
    padding query, which no score reads) is all masked."""
    lo = source.first_key(start)
    # q / attn_scale before the product: one pass over the chunk's queries, not over its [rows, keys] scores
    q, k = source.q[:, start:stop].float() / source.attn_scale, source.k[:, lo:keys].float()
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k)
    if not bool(source.real.all()):
        scores.masked_fill_(~source.real[:, None, None, lo:keys].to(scores.device), MASKED)
    if source.causal and keys > start:
        # keys before the chunk's first row are earlier than every row of it: only keys start:keys need the mask
        query = torch.arange(start, stop, device=scores.device)
        later = torch.arange(start, keys, device=scores.device)[None, :] > query[:, None]
        scores[..., start - lo:keys - lo].masked_fill_(later, MASKED)
    if source.window is not None and source.causal and stop > source.window:
        # keys a window or more before a row are out of its reach (TransformerLens's local mask)
        query = torch.arange(start, stop, device=scores.device)
        gone = torch.arange(lo, keys, device=scores.device)[None, :] <= query[:, None] - source.window
        scores.masked_fill_(gone, MASKED)
    return scores


def row_statistics(source: Float[Tensor, "batch head q k"] | QueryKeys, first: Tensor, *, causal: bool,
                   query_chunk: int) -> RowStatistics:
    """The weight on the key ``first[b]`` and the entropy of every query row, ``query_chunk`` rows at a time;
    ``causal`` promises no weight on later keys, so each chunk reads only the keys up to its last row."""
    if isinstance(source, QueryKeys) and fused_statistics_apply(source):
        return fused_row_statistics(source, first)
    if isinstance(source, QueryKeys):
        b, q, h = source.q.shape[:3]
        k = source.k.shape[1]
        device = source.q.device
    else:
        b, h, q, k = source.shape
        device = source.device
    first = first.to(device)
    first_weight = torch.empty((b, h, q), dtype=torch.float32, device=device)
    entropy = torch.empty((b, h, q), dtype=torch.float32, device=device)
    for start in range(0, q, query_chunk):
        stop = min(q, start + query_chunk)
        # keys up to the chunk's last row (the key axis may be longer than the query axis by a prefix), and always
        # the first token's column, which a left-padded row's first rows may precede
        keys = max(min(k, stop + k - q), int(first.max()) + 1) if causal else k
        if isinstance(source, QueryKeys):
            scores = score_rows(source, start, stop, keys)
            lo = source.first_key(start)
            # softmax and log_softmax, not exp(log_softmax): exp of the masked log-probabilities is slow on CPU
            rows = torch.softmax(scores, dim=-1)
            # -sum A ln A from the log-probabilities themselves: masked keys add 0 x (MASKED - lse) = 0
            entropy[..., start:stop] = -torch.linalg.vecdot(rows, torch.log_softmax(scores, dim=-1))
        else:
            rows, lo = source[..., start:stop, :keys].float(), 0
            # xlogy(0, 0) = 0: masked keys (A = 0) add nothing, as in -sum A ln A with 0 ln 0 = 0
            entropy[..., start:stop] = -torch.special.xlogy(rows, rows).sum(-1)
        # a first token before the chunk's keys (out of a sliding window) has weight 0 in every row of it
        column = (first - lo).clamp_min(0)[:, None, None, None].expand(*rows.shape[:3], 1)
        weight = rows.gather(-1, column)[..., 0]
        first_weight[..., start:stop] = weight.masked_fill((first < lo)[:, None, None], 0.0)
    return RowStatistics(first_weight, entropy)


# ---------------------------------------------------------------- from one fused attention's outputs

# The CPU flash attention, which returns each row's log-sum-exp beside its output: no public function does
_FLASH_WITH_LSE = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def fused_statistics_apply(source: QueryKeys) -> bool:
    """Whether :func:`fused_row_statistics` computes ``source``'s rows: on the CPU (whose flash attention returns
    the rows' log-sum-exp), with one key per query, without a sliding window (its mask would be the whole
    ``[query, key]``); elsewhere the rows are computed by chunks, a windowed layer's against its windows only."""
    return (_FLASH_WITH_LSE is not None and source.q.device.type == "cpu"
            and source.q.shape[1] == source.k.shape[1] and source.window is None)


def fused_row_statistics(source: QueryKeys, first: Tensor) -> RowStatistics:
    """:class:`RowStatistics` from one fused attention over the keys themselves, never a row of the pattern.

    With scores ``s_ij = q_i . k_j / attn_scale`` and ``lse_i = log sum_j exp(s_ij)`` over the allowed keys, the
    flash attention run with the keys as values returns ``lse_i`` and ``m_i = sum_j A_ij k_j``, so that
    ``A[i, first] = exp(s_i,first - lse_i)`` and the entropy ``-sum_j A_ij ln A_ij = lse_i - q_i . m_i /
    attn_scale``. Both are float32 differences of numbers of the size of the scores (the same rounding as the
    softmax by chunks, up to a factor of about two); a row with one allowed key has weight 1 on it and entropy 0
    exactly, as the softmax gives. Memory: the layer's queries and keys, plus, only where left padding or a non-causal
    layer needs one, a ``[batch, 1, query, key]`` mask, as the padded fused forward itself holds."""
    q = source.q.float().transpose(1, 2) / source.attn_scale  # [batch, head, q, d]: scale 1 below
    k = source.k.float().transpose(1, 2)
    real = source.real.to(q.device)
    # Keys less their mean over the real positions: a row's softmax is the same (q_i . mean is constant along the
    # row), and the scores' rounding shrinks with them, keys commonly sharing a large component
    k = k - (k * real[:, None, :, None]).sum(2, keepdim=True) / real.sum(-1)[:, None, None, None]
    right_padded = bool(real[:, 0].all()) and bool((real[:, 1:] <= real[:, :-1]).all())
    if source.causal and right_padded:
        # a real query's allowed keys are all real: the padding keys come after it; padding queries are read by none
        mask, is_causal = None, True
        allowed = torch.arange(1, q.shape[2] + 1, device=q.device).expand(q.shape[0], -1)
    else:
        keep = real[:, None, None, :]
        if source.causal:
            pos = torch.arange(q.shape[2], device=q.device)
            keep = keep & (pos[None, :] <= pos[:, None])[None, None]
        mask, is_causal = torch.zeros(keep.shape, dtype=q.dtype, device=q.device).masked_fill_(~keep, MASKED), False
        allowed = real.long().cumsum(-1) if source.causal else real.sum(-1, keepdim=True).expand_as(real)
    assert _FLASH_WITH_LSE is not None, "fused_statistics_apply says where the fused attention exists"
    means, lse = _FLASH_WITH_LSE(q, k, k, 0.0, is_causal, attn_mask=mask, scale=1.0)
    first_key = k[torch.arange(k.shape[0], device=k.device), :, first.to(k.device)]  # [batch, head, d]
    first_weight = torch.exp(torch.einsum("bhqd,bhd->bhq", q, first_key) - lse)
    entropy = (lse - torch.linalg.vecdot(q, means)).clamp_min(0.0)
    single, none = (allowed == 1)[:, None, :], (allowed == 0)[:, None, :]
    # a row with no allowed key (a padding query before a left-padded row's first token) is all zero, as by chunks
    return RowStatistics(first_weight.masked_fill(single, 1.0).masked_fill(none, 0.0),
                         entropy.masked_fill(single, 0.0).masked_fill(none, 0.0))


# ---------------------------------------------------------------- which hooks a layer's rows come from


def pattern_source(model, layer: int) -> tuple[str, ...]:
    """The hooks (``get_act_name`` names) from which layer ``layer``'s pattern rows are read: its queries and keys
    where lens_heads runs the layer's attention fused (a HookedTransformer layer without soft-caps, sinks or
    other features :func:`~lens_heads.evaluation.fused_attention.eager_reason` lists), else ``hook_pattern``."""
    if not backend(model).fuses_attention:
        return ("pattern",)
    attn = model.blocks[layer].attn
    if eager_reason(attn) is not None:
        return ("pattern",)
    if attn.cfg.positional_embedding_type == "rotary":
        return ("rot_q", "rot_k")
    # without rotary, hook_q/hook_k fire before the per-head q/k norms: the layer's rows need its pattern then
    return ("pattern",) if attn.cfg.use_qk_norm else ("q", "k")


def rows_from(model, layer: int, acts: dict[str, Tensor], mask: Bool[Tensor, "batch pos"]
              ) -> Float[Tensor, "batch head q k"] | QueryKeys:
    """The source of layer ``layer``'s pattern rows from what :func:`pattern_source`'s hooks (or ``hook_pattern``)
    captured, ``acts``; ``mask`` marks the real tokens, as the forward's attention mask did."""
    if "pattern" in acts:
        return acts["pattern"]
    names = ("rot_q", "rot_k") if "rot_q" in acts else ("q", "k")
    missing = [name for name in names if name not in acts]
    if missing:
        raise RuntimeError(f"layer {layer}: hook_{'/hook_'.join(missing)} were not captured before hook_z")
    q, k = (acts[name] for name in names)
    attn = model.blocks[layer].attn
    causal = tl.causal(attn)
    return QueryKeys(q, expand_kv(k, q.shape[2]), mask.to(q.device), float(attn.attn_scale), causal,
                     tl.window(attn) if causal else None)
