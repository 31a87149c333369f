"""Greedy generation of many prompts at once: :func:`generate_batch`, what lm-eval's ``generate_until`` runs.

Each text is the one :func:`lens_heads.evaluation.generate.generate` gives for that prompt alone, under the same
hooks (to float rounding of a batched forward, which can turn an argmax whose top two logits tie to 1e-6), by one
of two paths, chosen from the model and from what the hooks declare
(:func:`lens_heads.evaluation.cached_generation.uncached_reason`):

- **cached** (the unablated model, fixed-head zeroing, layer removal): the prompts are left-padded into one forward,
  then every step runs only the new tokens against a key/value cache
  (:mod:`lens_heads.evaluation.cached_generation`);
- **rerun** (a threshold zeroing, unmarked hook pairs, ``cache=False``): every step reruns each unfinished row's
  whole sequence (prompt + its tokens so far), right-padded, with the hooks active, as ``generate(cache=False)``
  does for one prompt: a per-input zeroing decides at each step on the scores of the row's whole current
  sequence, its padding masked out. Under causal attention a row's real positions never see the padding to their
  right.

On both, a random zeroing draws once per prompt (its ``input_id``), and each forward counts one row per unfinished
prompt. Each :class:`~lens_heads.evaluation.generate.Generation` says which path made it (``cached``).
"""

from __future__ import annotations

import contextlib
from typing import Iterable, Sequence

import torch
from tqdm.auto import tqdm

from lens_heads.evaluation.cached_generation import run_cached, uncached_reason
from lens_heads.evaluation.generate import Generation, advance, greedy_tokens
from lens_heads.evaluation.hook_sets import collect_hooks, stacked_copies
from lens_heads.models.backends import backend
from lens_heads.models.nonfinite import where_nonfinite
from lens_heads.plumbing.errors import InputError, NonFiniteError


@torch.no_grad()
def generate_batch(model, prompts: Sequence[Sequence[int]], *, hooks: Iterable | None = None,
                   max_new_tokens: Sequence[int], stops: Sequence[Sequence[str]], input_ids: Sequence[int] | None = None,
                   batch_size: int = 8, cache: bool = True, progress: bool = False) -> list[Generation]:
    """Greedy continuations of token-id ``prompts``, ``batch_size`` at a time (module docstring); per prompt its
    ``max_new_tokens``, its ``stops`` (the text is cut before the first) and its ``input_id`` (default: its index).
    ``cache``: run against a key/value cache where that is exact (the module docstring's cached path); False: rerun
    the sequence at every step whatever the hooks."""
    n = len(prompts)
    input_ids = list(range(n)) if input_ids is None else list(input_ids)
    if not len(max_new_tokens) == len(stops) == len(input_ids) == n:
        raise InputError("generate_batch: give one max_new_tokens, one list of stops and one input id per prompt")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InputError(f"generate_batch: batch_size must be a whole number >= 1, got {batch_size!r}")
    bad = [i for i, (p, m) in enumerate(zip(prompts, max_new_tokens)) if not p or m < 1 or len(p) + m > model.cfg.n_ctx]
    if bad:
        raise InputError(f"generate_batch: prompt {bad[0]} is empty, asks for no token, or with its max_new_tokens "
                         f"exceeds the model's context of {model.cfg.n_ctx}")
    if stacked_copies(hooks) > 1:
        raise InputError("generate_batch runs one hook set, not a stacked batch of units")
    pairs, batch_aware = collect_hooks(hooks, model)
    run = run_cached if cache and uncached_reason(model, hooks) is None else _run
    out: list[Generation | None] = [None] * n
    bar = tqdm(total=n, desc="generating", unit="prompt", disable=not progress)
    with model.hooks(fwd_hooks=pairs):
        for start in range(0, n, batch_size):
            rows = list(range(start, min(start + batch_size, n)))
            for r, generation in zip(rows, run(model, [list(prompts[r]) for r in rows], batch_aware,
                                               [max_new_tokens[r] for r in rows], [list(stops[r]) for r in rows],
                                               [input_ids[r] for r in rows])):
                out[r] = generation
            bar.update(len(rows))
    bar.close()
    return [g for g in out if g is not None]


def _run(model, prompts: list[list[int]], batch_aware: list, max_new: list[int], stops: list[list[str]],
         input_ids: list[int]) -> list[Generation]:
    """One batch on the rerun path: a step runs every unfinished row's whole sequence, right-padded, and appends
    each row's argmax."""
    eos = model.tokenizer.eos_token_id if model.tokenizer is not None else None
    pad = eos if eos is not None else 0
    runs = backend(model)
    new: list[list[int]] = [[] for _ in prompts]
    done: dict[int, Generation] = {}
    while len(done) < len(prompts):
        active = [r for r in range(len(prompts)) if r not in done]
        sequences = [prompts[r] + new[r] for r in active]
        inputs = [input_ids[r] for r in active]
        width = max(len(s) for s in sequences)
        ids = torch.tensor([s + [pad] * (width - len(s)) for s in sequences], device=model.cfg.device)
        mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in sequences], device=model.cfg.device)
        try:
            with contextlib.ExitStack() as stack:
                for obj in batch_aware:
                    stack.enter_context(obj.batch(mask.bool(), inputs=inputs))
                resid = runs.run_to_resid(model, ids, mask, stop=model.cfg.n_layers)
        except NonFiniteError as e:  # a hook's own refusal: where the model's forward goes non-finite
            raise NonFiniteError(f"{e}; {where_nonfinite(model, sequences[0])}") from None
        last = mask.sum(1) - 1
        logits = runs.final_logits(model, resid[torch.arange(len(active)), last][:, None])[:, 0]
        for r, token in zip(active, greedy_tokens(model, logits, sequences, inputs)):
            ended = advance(model, new[r], token, eos, stops[r], max_new[r])
            if ended is not None:
                done[r] = ended
    return [done[r] for r in range(len(prompts))]
