"""Greedy generation over a left-padded batch against a key/value cache: each step runs only the batch's new
tokens, which attend to the keys and values the earlier steps left in TransformerLens's cache.

Which runs take it (:func:`uncached_reason`). The cache keeps each earlier position's keys and values as the step
that ran it computed them, so it is exact only where what the hooks do at a position is fixed once that position
has run. Ablations declare it (:attr:`~lens_heads.evaluation.ablation_interface.Ablation.cache_exact`): the
unablated model, fixed-head zeroing on ``hook_z`` (static, per-input sets, random zeroing, which draws once per
prompt) and layer removal are exact; a threshold zeroing is not: it decides which heads to zero from the scores of
the whole sequence, so appending a token can change its decision at every earlier position, and it keeps the rerun
path (every step reruns the sequence, as the authors' ``use_cache=False`` generation). Plain ``(hook_name, fn)``
pairs are exact only where marked for shared prefixes (:func:`lens_heads.evaluation.prefix.mark`, as
:func:`lens_heads.ablation.hooks.zero_heads` marks its own); an unmarked pair may read the whole row. The model
must allow it too: a HookedTransformer with learned or rotary positions, none scaled by the padded length; a
TransformerBridge reruns.

Padding and positions. Rows are left-padded, so every row's last token sits in the batch's last column, and each
step appends one column. TransformerLens counts a position from the row's first real token (the cumulative sum of
the attention mask it keeps beside the cache), so GPT-2's learned positions and a Llama's rotary angles are those
the row has alone, and the distance between two tokens (a sliding window's) is unchanged; the padding's keys are
masked out of every query (a padding query attends to nothing and gets zero, TransformerLens's NaN-to-zero). A row
whose generation ended leaves the batch and the cache.

The forward is TransformerLens's own, with its eager attention: the evaluator's fused attention and fast blocks
(:mod:`lens_heads.evaluation.fused_attention`, :mod:`lens_heads.evaluation.fast_blocks`) hand any layer or block
given a key/value cache to TransformerLens's forward, so the cache works inside them too. A cached step's attention
is one query row per prompt, so the pattern eager attention materialises is small.

Hooks fire on the positions each forward runs: the whole left-padded prompt batch, then one column per step. A
per-input ablation is told each forward's rows and the mask of the positions run (``batch(mask, inputs=...)``), so
a static or random zeroing counts one row per step, as on the rerun path.
"""

from __future__ import annotations

import contextlib
from typing import Iterable

import torch

from lens_heads.evaluation.ablation_interface import Ablation
from lens_heads.evaluation.generate import Generation, advance, greedy_tokens
from lens_heads.evaluation.hook_sets import not_cache_exact
from lens_heads.models.backends import backend
from lens_heads.models.nonfinite import where_nonfinite
from lens_heads.plumbing.errors import NonFiniteError

CACHED_POSITIONS = ("standard", "rotary")  # learned and rotary positions: counted from each row's first real token


def uncached_reason(model, hooks: Iterable | None) -> str | None:
    """Why generation on ``model`` under ``hooks`` must rerun the whole sequence at every step, in words (None: it
    may run against a key/value cache; the module docstring says when)."""
    runs = backend(model)
    if not runs.caches_batches:
        return f"the {runs.name} backend keeps no key/value cache for a padded batch"
    cfg = model.cfg
    if cfg.positional_embedding_type not in CACHED_POSITIONS:
        return f"{cfg.positional_embedding_type} positions (the cache's left padding is exact for learned and rotary)"
    if cfg.use_dynamic_ntk_rope or cfg.use_logn_attn:
        return "positions scaled by the sequence's length, which left padding changes (dynamic NTK or log-n scaling)"
    inexact = not_cache_exact(hooks)
    if inexact:
        return f"{', '.join(inexact)} may decide from the whole sequence, which grows at every step"
    return None


def run_cached(model, prompts: list[list[int]], batch_aware: list[Ablation], max_new: list[int],
               stops: list[list[str]], input_ids: list[int]) -> list[Generation]:
    """One batch of prompts (token ids) generated greedily against a key/value cache, under the hooks already added
    to ``model`` (``batch_aware``: those told each forward): per prompt its ``max_new`` tokens, ``stops`` and input
    id. Each generation ends by :func:`lens_heads.evaluation.generate.advance`, as on the rerun path."""
    runs = backend(model)
    device = model.cfg.device
    eos = model.tokenizer.eos_token_id if model.tokenizer is not None else None
    pad = eos if eos is not None else 0  # never attended to: masked out of every query
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    kv = runs.new_kv_cache(model, len(prompts))
    new: list[list[int]] = [[] for _ in prompts]
    done: dict[int, Generation] = {}
    active = list(range(len(prompts)))
    while True:
        sequences = [prompts[r] + new[r] for r in active]
        inputs = [input_ids[r] for r in active]
        try:
            with contextlib.ExitStack() as stack:
                for obj in batch_aware:
                    stack.enter_context(obj.batch(mask.bool(), inputs=inputs))
                logits = runs.cached_step(model, ids, mask, kv)
        except NonFiniteError as e:  # a hook's own refusal: where the model's forward goes non-finite
            raise NonFiniteError(f"{e}; {where_nonfinite(model, sequences[0])}") from None
        for r, token in zip(active, greedy_tokens(model, logits, sequences, inputs)):
            ended = advance(model, new[r], token, eos, stops[r], max_new[r])
            if ended is not None:
                ended.cached = True
                done[r] = ended
        keep = [k for k, r in enumerate(active) if r not in done]
        if not keep:
            return [done[r] for r in range(len(prompts))]
        if len(keep) < len(active):
            runs.keep_rows(kv, torch.tensor(keep))
            active = [active[k] for k in keep]
        ids = torch.tensor([[new[r][-1]] for r in active], device=device)
        mask = torch.ones_like(ids)
