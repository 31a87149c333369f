"""Useful FLOPs of the evaluator's forwards, counted from a model's config (what the report's time estimate and the
benchmarks read rates against).

A multiply-add is 2 FLOPs; real tokens only (padding is waste):

    per token, trunk:  2 * n_layers * (d_model*H*d_head + 2*d_model*KV*d_head + H*d_head*d_model
                                       + (3 if gated else 2) * d_model*d_mlp)
    per row of L tokens, attention (causal QK^T and AV):  n_layers * 2 * H * d_head * L * (L + 1)
    per position whose logits are computed:  2 * d_model * d_vocab

(H query heads, KV key/value heads; norms, softmax, rotary and the head scores are left out: a few percent.)
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from lens_heads.data.rows import Row
from lens_heads.evaluation.prefix import group_rows, plan_groups


def trunk_flops_per_token(cfg) -> float:
    """2 x the weights each token's trunk forward multiplies by (attention projections and MLP, all layers); K and V
    have ``n_key_value_heads`` heads where the config has them (grouped-query attention), a gated MLP three matrices."""
    kv = getattr(cfg, "n_key_value_heads", None) or cfg.n_heads
    attn = 2 * cfg.d_model * cfg.n_heads * cfg.d_head + 2 * cfg.d_model * kv * cfg.d_head
    mlp = (3 if getattr(cfg, "gated_mlp", False) else 2) * cfg.d_model * cfg.d_mlp
    return 2.0 * cfg.n_layers * (attn + mlp)


def forward_flops(cfg, lengths: Sequence[int], logit_positions: int) -> float:
    """Useful FLOPs of forwards over rows of ``lengths`` real tokens with logits at ``logit_positions`` positions."""
    n = np.asarray(lengths, dtype=float)
    attention = cfg.n_layers * 2 * cfg.n_heads * cfg.d_head * float((n * (n + 1)).sum())
    return trunk_flops_per_token(cfg) * float(n.sum()) + attention + 2.0 * cfg.d_model * cfg.d_vocab * logit_positions


def path_flops(model, rows: Sequence[Row], batch_size: int | None = None) -> float:
    """Useful FLOPs of the evaluator over ``rows``, logits at every token it reads (as it computes them: MMLU's four
    letters read one position four times): whole rows, or, given the ``batch_size`` of the shared-prefix path, each
    distinct prefix of its groups (:func:`lens_heads.evaluation.prefix.plan_groups`) once and every suffix against its
    prefix (a suffix of s tokens after p attends to p + its own earlier tokens)."""
    cfg = model.cfg
    reads = sum(len(ids) for row in rows for _, _, ids in row.reads)
    if batch_size is None:
        return forward_flops(cfg, [len(r.tokens) for r in rows], reads)
    groups = plan_groups(rows, "any", group_rows(batch_size))
    flops = forward_flops(cfg, [len(p) for p in {tuple(g.prefix) for g in groups if g.prefix}], reads)
    for g in groups:
        for r in g.rows:
            s, p = len(r.tokens), len(g.prefix)
            flops += trunk_flops_per_token(cfg) * s + cfg.n_layers * 2 * cfg.n_heads * cfg.d_head * (
                2 * s * p + s * (s + 1))
    return flops


def whole_logits_flops(model, rows: Sequence[Row]) -> float:
    """Useful FLOPs of a forward over every row whole with logits at every position (lm-eval's ``hf`` model, and the
    scoring pass)."""
    lengths = [len(r.tokens) for r in rows]
    return forward_flops(model.cfg, lengths, sum(lengths))
