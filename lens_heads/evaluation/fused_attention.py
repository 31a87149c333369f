"""Fused attention for forwards whose hooks never read the attention pattern.

TransformerLens's attention materialises the ``[batch, head, query, key]`` scores and pattern so that
``hook_attn_scores`` and ``hook_pattern`` can see them. An evaluation whose hooks read only ``hook_z`` (random and
static zeroings, threshold zeroings on value/output scores, the unablated baseline) pays for that tensor without
reading it. Inside ``with fused_attention(model):`` each attention layer runs
``torch.nn.functional.scaled_dot_product_attention`` (causal + padding mask) instead, and still fires every hook
point it fires eagerly except the two that hold the pattern: ``hook_q``, ``hook_k``, ``hook_v`` (K/V with their
grouped-query heads, as eagerly), ``hook_rot_q``/``hook_rot_k`` (rotary), and ``hook_z``, which a hook may replace
before ``W_O`` exactly as eagerly. Block-level hooks (``hook_attn_out``, residual hooks) are outside the attention
and unaffected. Where a block hands the layer one tensor as its query, key and value input (a fast block,
:mod:`lens_heads.evaluation.fast_blocks`), the queries, keys and values come from one product with the weights laid out
once; grouped-query key/value heads reach SDPA uncopied (its ``enable_gqa``).

A layer runs eagerly, per forward, whenever anything is hooked on its ``hook_attn_scores`` or ``hook_pattern``
(forward or backward hooks, so ``run_with_cache`` and the scoring pass see the usual pattern), and always where the
layer uses a feature the fused path does not express: soft-capped scores, attention sinks, ALiBi or relative
position biases, per-head results (``use_attn_result``), Q/K/V clipping, OLMo-style full-vector QK norms, log-n
query scaling, 4-bit weights, a key/value cache, or an additive mask. A local (sliding-window) layer runs fused by
chunks of queries, each attending to its own window of keys only (:func:`windowed_z`), so its memory is
``chunk x (chunk + window)`` scores per head rather than ``query x key``.

Given a :class:`lens_heads.evaluation.prefix.PrefixState`, the fused layers also record each forward's keys/values (post-rotary)
or attend to recorded prefixes as well as to the forward's own positions (the evaluator's shared prefixes,
:mod:`lens_heads.evaluation.prefix`); a layer that would run eagerly then is an error, as the eager attention knows no prefix.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Any, Iterator

import einops
import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from lens_heads.evaluation import rotary
from lens_heads.evaluation.blocked_linear import linear
from lens_heads.evaluation.packed_weights import Packed, layout, nonzero_bias
from lens_heads.evaluation.prefix import QKV, Extension, PrefixState, prefixed_z, suffix_positions
from lens_heads.models import tl_internals as tl
from lens_heads.models.backends import backend
from lens_heads.models.capture import any_hooked

FUSABLE_POSITIONS = ("standard", "rotary", "shortformer")
FULL_VECTOR_QK_NORM = ("OlmoeForCausalLM", "Olmo2ForCausalLM", "Olmo3ForCausalLM")


@dataclass
class AttentionCalls:
    """How many attention-layer calls ran fused and how many eagerly inside one :func:`fused_attention` block."""

    fused: int = 0
    eager: int = 0

    def describe(self) -> str:
        total = self.fused + self.eager
        return f"fused SDPA in {self.fused} of {total} attention-layer calls (eager where a hook reads the pattern)"


def eager_reason(attn) -> str | None:
    """Why this attention layer can never run fused (None: it can, while no hook reads its pattern)."""
    cfg = attn.cfg
    checks = [
        (type(attn) not in tl.ATTENTION_CLASSES, f"{type(attn).__name__} is not a standard attention"),
        (cfg.load_in_4bit, "4-bit weights"),
        (cfg.use_attn_result, "use_attn_result (hook_result needs per-head outputs)"),
        (cfg.positional_embedding_type not in FUSABLE_POSITIONS, f"{cfg.positional_embedding_type} positions"),
        (tl.softcap_enabled(cfg.attn_scores_soft_cap), "soft-capped attention scores"),
        (cfg.use_attention_sinks, "attention sinks"),
        (cfg.clip_qkv is not None, "Q/K/V clipping"),
        (cfg.original_architecture in FULL_VECTOR_QK_NORM, "full-vector QK norm"),
        (cfg.use_logn_attn, "log-n query scaling"),
    ]
    return next((why for failed, why in checks if failed), None)


def reads_pattern(attn) -> bool:
    """Whether any forward or backward hook is attached to the layer's ``hook_attn_scores`` or ``hook_pattern``
    (:func:`lens_heads.models.capture.any_hooked`)."""
    return any_hooked((attn.hook_attn_scores, attn.hook_pattern))


@contextlib.contextmanager
def fused_attention(model, calls: AttentionCalls | None = None,
                    prefix: PrefixState | None = None) -> Iterator[AttentionCalls]:
    """Run every fusable attention layer of ``model`` with fused SDPA for the duration of the block (see the module
    docstring); yields the :class:`AttentionCalls` counts (``calls``, if given, is counted into). ``prefix``: the
    state through which the caller has the layers record or extend shared prefixes (it replaces an enclosing
    block's fused forward for the duration). The layers' own forwards are restored on exit. Nothing is swapped on a
    backend whose attention lens_heads doesn't fuse (a TransformerBridge runs its own)."""
    calls = calls if calls is not None else AttentionCalls()
    tables = rotary.RotaryTables()  # shared by the block's layers: gathered once per forward
    swapped: list = []
    blocks = model.blocks if backend(model).fuses_attention else []
    if len(blocks):
        tl.require(tl.FUSED_ATTENTION)
    for block in blocks:
        attn = block.attn
        # an enclosing block may have swapped it already: kept, unless this block brings a prefix state
        if eager_reason(attn) is None and ("forward" not in vars(attn) or prefix is not None):
            swapped.append((attn, vars(attn).get("forward")))
            attn.forward = functools.partial(_forward, _Layer(attn, calls, prefix, _packed_qkv(attn),
                                                              _packed_output(attn), tables))
    try:
        yield calls
    finally:
        for attn, before in swapped:
            del attn.forward
            if before is not None:
                attn.forward = before


def _packed_qkv(attn) -> Packed | None:
    """The layer's query, key and value weights each as ``[(head d_head), d_model]`` and their biases (None where all
    zero, left out), laid out once per block of forwards; None where the layer's inputs are per head or its queries
    and keys are normalised (those take TransformerLens's own products). Three products rather than one stacked
    ``[(head + 2 kv_head) d_head, d_model]`` product: on the CPU measured (a side-by-side timing of the products alone) the
    stacked one was the slower, and its slices reach the elementwise ops strided."""
    cfg = attn.cfg
    if cfg.use_split_qkv_input or cfg.use_attn_in or cfg.use_qk_norm:
        return None
    grouped = hasattr(attn, "_W_K") and not cfg.ungroup_grouped_query_attention
    names = ("W_Q", "_W_K", "_W_V", "b_Q", "_b_K", "_b_V") if grouped else ("W_Q", "W_K", "W_V", "b_Q", "b_K", "b_V")

    return layout(attn, "qkv", _qkv_layout, *(getattr(attn, name) for name in names))


def _qkv_layout(*weights: Tensor) -> list:
    """W_Q, W_K, W_V (then b_Q, b_K, b_V) as three products."""
    return [linear(einops.rearrange(w, "head d_model d_head -> (head d_head) d_model"),
                   nonzero_bias(b.flatten())) for w, b in zip(weights[:3], weights[3:])]


def _qkv(attn, packed: Packed | None, query_input, key_input, value_input) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`tl.qkv` (fires ``hook_q``, ``hook_k``, ``hook_v``); by the weights laid out once where the three
    inputs are one tensor (a fast block's) and the layer's weights are packed."""
    if packed is None or not (query_input is key_input is value_input) or query_input.device != attn.W_Q.device:
        return tl.qkv(attn, query_input, key_input, value_input)
    d_head = attn.cfg.d_head
    q, k, v = (product(query_input).unflatten(-1, (-1, d_head)) for product in packed.get())
    return attn.hook_q(q), attn.hook_k(k), attn.hook_v(v)


@dataclass(frozen=True)
class _Layer:
    """What a fused layer's forward reads besides its inputs: the layer, the block's counts, prefix state and
    rotary tables, and its weights laid out once."""

    attn: Any  # a TransformerLens attention layer
    calls: AttentionCalls
    prefix: PrefixState | None
    qkv: Packed | None
    output: Packed
    tables: rotary.RotaryTables


def _forward(layer: _Layer, query_input, key_input, value_input,
             past_kv_cache_entry=None, additive_attention_mask=None,
             attention_mask: Int[Tensor, "batch pos"] | None = None, position_bias=None
             ) -> Float[Tensor, "batch pos d_model"]:
    attn, calls, prefix = layer.attn, layer.calls, layer.prefix
    eager = (past_kv_cache_entry is not None or additive_attention_mask is not None or position_bias is not None
             or reads_pattern(attn))
    if eager:
        if prefix is not None and prefix.active:
            raise RuntimeError(f"layer {attn.layer_id} must run eagerly, which knows no shared prefix: run these "
                               "hooks on the row-by-row path (their prefix_scope None)")
        calls.eager += 1
        return tl.eager_attention(attn, query_input, key_input, value_input, past_kv_cache_entry=past_kv_cache_entry,
                                  additive_attention_mask=additive_attention_mask, attention_mask=attention_mask,
                                  position_bias=position_bias)
    calls.fused += 1
    extension = prefix.extend if prefix is not None else None
    q, k, v = _qkv(attn, layer.qkv, query_input, key_input, value_input)  # fires hook_q, hook_k, hook_v
    causal = tl.causal(attn)
    window = tl.window(attn) if causal else None  # TransformerLens applies the window with the causal mask only
    if window is not None and prefix is not None and prefix.active:
        raise RuntimeError(f"layer {attn.layer_id} attends within a sliding window, which shared prefixes don't "
                           "apply: run these rows on the row-by-row path (their prefix_scope None)")
    if attn.cfg.positional_embedding_type == "rotary":
        q, k = _rotary(layer, q, k, attention_mask, extension)  # fires hook_rot_q, hook_rot_k
    if prefix is not None and prefix.record is not None:
        prefix.record[attn.layer_id] = (k, v)
    scale, heads = 1.0 / attn.attn_scale, QKV(q, k, v, attention_mask)
    if window is not None:
        z = attn.hook_z(windowed_z(heads, scale=scale, window=window, query_chunk=WINDOW_QUERY_CHUNK))
    elif extension is None:
        z = attn.hook_z(sdpa_z(heads, scale=scale, causal=causal))
    else:
        z = attn.hook_z(prefixed_z(heads, extension, attn.layer_id, scale=scale))
    if z.device != attn.W_O.device:
        return F.linear(einops.rearrange(z.to(attn.W_O.dtype), "b p head d -> b p (head d)"),
                        einops.rearrange(attn.W_O, "head d_head d_model -> d_model (head d_head)").to(z.device),
                        attn.b_O.to(z.device))
    return layer.output.get()(einops.rearrange(z.to(attn.W_O.dtype), "b p head d -> b p (head d)"))


def _rotary(layer: _Layer, q, k, attention_mask, extension: Extension | None) -> tuple[Tensor, Tensor]:
    """Queries and keys rotated (:mod:`lens_heads.evaluation.rotary`; TransformerLens's own rotary where that
    module doesn't apply), at the rows' positions or after their prefixes."""
    attn, n_pos = layer.attn, q.shape[1]
    if not rotary.lean(attn) or q.device != attn.rotary_cos.device:
        if extension is None:
            return attn.hook_rot_q(tl.rotary(attn, q, attention_mask)), attn.hook_rot_k(tl.rotary(attn, k, attention_mask))
        positions = suffix_positions(extension, n_pos)
        return attn.hook_rot_q(tl.rotary_at(attn, q, positions)), attn.hook_rot_k(tl.rotary_at(attn, k, positions))
    if extension is None:
        cos, sin = layer.tables.at_mask(attn, n_pos, attention_mask)
    else:
        cos, sin = layer.tables.at_positions(attn, n_pos, extension.lengths,
                                             lambda: suffix_positions(extension, n_pos))
    return attn.hook_rot_q(rotary.rotate(q, cos, sin)), attn.hook_rot_k(rotary.rotate(k, cos, sin))


def _packed_output(attn) -> Packed:
    """The layer's ``W_O`` as ``[d_model, (head d_head)]`` and its bias (None where all zero: adding zero is exact),
    laid out once per block of forwards."""
    return layout(attn, "output", _output_layout, attn.W_O, attn.b_O)


def _output_layout(w_o: Tensor, b_o: Tensor):
    return linear(einops.rearrange(w_o, "head d_head d_model -> d_model (head d_head)"), nonzero_bias(b_o))


def sdpa_z(x: QKV, *, scale: float, causal: bool = True) -> Float[Tensor, "batch pos head d_head"]:
    """Head outputs ``z_i = sum_j softmax_j(q_i . k_j * scale) v_j`` over the allowed keys (earlier or equal
    positions when ``causal``, real tokens of ``x.attention_mask``), K/V heads shared by consecutive query heads.
    A query with no allowed key gets z = 0, as the eager pattern's NaN-to-zero gives."""
    q = x.q
    q_, k_, v_, grouped = _heads_first(q, x.k, x.v)
    if x.attention_mask is None:
        out = F.scaled_dot_product_attention(q_, k_, v_, is_causal=causal, scale=scale, enable_gqa=grouped)
        return einops.rearrange(out, "b head p d -> b p head d")
    real = x.real()
    allowed = real[:, None, None, :]  # [batch, 1, 1, key]
    if causal:
        positions = torch.arange(q.shape[1], device=q.device)
        allowed = allowed & (positions[None, :] <= positions[:, None])[None, None]
        dead = real.long().cumsum(-1) == 0  # no real key at or before the query (left padding)
    else:
        dead = ~real.any(-1, keepdim=True).expand_as(real)
    out = F.scaled_dot_product_attention(q_, k_, v_, attn_mask=allowed, scale=scale, enable_gqa=grouped)
    z = einops.rearrange(out, "b head p d -> b p head d")
    return z.masked_fill(dead[:, :, None, None], 0.0) if bool(dead.any()) else z


def _heads_first(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor, bool]:
    """Q, K, V as ``[batch, head, pos, d_head]`` for SDPA, V in Q's dtype, and whether the heads are grouped: SDPA's
    ``enable_gqa`` has query head h read KV head h // (n_heads // n_kv), as eagerly, without copying K/V per query
    head."""
    q_, k_, v_ = (einops.rearrange(x, "b p head d -> b head p d") for x in (q, k, v))
    return q_, k_, v_.to(q_.dtype), k.shape[2] != q.shape[2]


WINDOW_QUERY_CHUNK = 256  # queries per step of a windowed layer: 256 x (256 + window) scores per head


def windowed_z(x: QKV, *, scale: float, window: int,
               query_chunk: int = WINDOW_QUERY_CHUNK) -> Float[Tensor, "batch pos head d_head"]:
    """Causal :func:`sdpa_z` of a local layer: query ``i`` attends to the real keys ``j`` with
    ``i - window < j <= i``, positions counted along the padded row as TransformerLens's local mask counts them.
    ``query_chunk`` queries at a time, each chunk against its own span of keys only: memory ``batch x head x
    query_chunk x (query_chunk + window)`` scores instead of the whole ``[query, key]`` pattern. A query with no
    allowed key gets z = 0, as eagerly."""
    q = x.q
    q_, k_, v_, grouped = _heads_first(q, x.k, x.v)
    n = q.shape[1]
    real = x.real()
    out = torch.empty_like(q_)
    for start in range(0, n, query_chunk):
        stop = min(n, start + query_chunk)
        lo = max(0, start - window + 1)
        query = torch.arange(start, stop, device=q.device)[:, None]
        key = torch.arange(lo, stop, device=q.device)[None, :]
        allowed = ((key > query - window) & (key <= query))[None, None] & real[:, None, None, lo:stop]  # [batch, 1, chunk, keys]
        chunk = F.scaled_dot_product_attention(q_[:, :, start:stop], k_[:, :, lo:stop], v_[:, :, lo:stop],
                                               attn_mask=allowed, scale=scale, enable_gqa=grouped)
        # a row with no allowed key: SDPA's value there is not the eager zero
        out[:, :, start:stop] = chunk.masked_fill(~allowed.any(-1, keepdim=True), 0.0)
    return einops.rearrange(out, "b head p d -> b p head d")
