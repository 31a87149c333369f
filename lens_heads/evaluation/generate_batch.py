"""Greedy generation of many prompts at once: :func:`generate_batch`, what lm-eval's ``generate_until`` runs.

The prompts of a batch are right-padded into one forward per step, every row's sequence (prompt + its tokens so far)
rerun with the hooks active, as :func:`lens_heads.evaluation.generate.generate` does with ``cache=False`` for one
prompt: a per-input zeroing (:func:`lens_heads.threshold_zeroing`) decides at each step on the scores of the row's
whole current sequence, its padding masked out, and a random zeroing draws once per prompt (its ``input_id``). So each
text is the one :func:`~lens_heads.evaluation.generate.generate` gives for that prompt alone (to float rounding of
a batched forward, which can turn an argmax whose top two logits tie to 1e-6). Under causal attention a row's real
positions never see the padding to their right. A key/value cache would run only the new token per step, and a
per-input zeroing then decides on that one position: the authors' ablation recomputes it over the sequence.
"""

from __future__ import annotations

import contextlib
from typing import Iterable, Sequence

import torch
from tqdm.auto import tqdm

from lens_heads.evaluation.generate import Generation, _decode
from lens_heads.evaluation.hook_sets import collect_hooks, stacked_copies
from lens_heads.models.backends import backend
from lens_heads.models.nonfinite import where_nonfinite
from lens_heads.plumbing.errors import InputError, NonFiniteError


@torch.no_grad()
def generate_batch(model, prompts: Sequence[Sequence[int]], *, hooks: Iterable | None = None,
                   max_new_tokens: Sequence[int], stops: Sequence[Sequence[str]], input_ids: Sequence[int] | None = None,
                   batch_size: int = 8, progress: bool = False) -> list[Generation]:
    """Greedy continuations of token-id ``prompts``, ``batch_size`` at a time (module docstring); per prompt its
    ``max_new_tokens``, its ``stops`` (the text is cut before the first) and its ``input_id`` (default: its index)."""
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
    out: list[Generation | None] = [None] * n
    bar = tqdm(total=n, desc="generating", unit="prompt", disable=not progress)
    with model.hooks(fwd_hooks=pairs):
        for start in range(0, n, batch_size):
            rows = list(range(start, min(start + batch_size, n)))
            for r, generation in zip(rows, _run(model, [list(prompts[r]) for r in rows], batch_aware,
                                                [max_new_tokens[r] for r in rows], [list(stops[r]) for r in rows],
                                                [input_ids[r] for r in rows])):
                out[r] = generation
            bar.update(len(rows))
    bar.close()
    return [g for g in out if g is not None]


def _run(model, prompts: list[list[int]], batch_aware: list, max_new: list[int], stops: list[list[str]],
         input_ids: list[int]) -> list[Generation]:
    """One batch: a step runs every unfinished row, right-padded, and appends each row's argmax."""
    eos = model.tokenizer.eos_token_id if model.tokenizer is not None else None
    pad = eos if eos is not None else 0
    runs = backend(model)
    new: list[list[int]] = [[] for _ in prompts]
    done: dict[int, Generation] = {}
    while len(done) < len(prompts):
        active = [r for r in range(len(prompts)) if r not in done]
        sequences = [prompts[r] + new[r] for r in active]
        width = max(len(s) for s in sequences)
        ids = torch.tensor([s + [pad] * (width - len(s)) for s in sequences], device=model.cfg.device)
        mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in sequences], device=model.cfg.device)
        try:
            with contextlib.ExitStack() as stack:
                for obj in batch_aware:
                    stack.enter_context(obj.batch(mask.bool(), inputs=[input_ids[r] for r in active]))
                resid = runs.run_to_resid(model, ids, mask, stop=model.cfg.n_layers)
        except NonFiniteError as e:  # a hook's own refusal: where the model's forward goes non-finite
            raise NonFiniteError(f"{e}; {where_nonfinite(model, sequences[0])}") from None
        last = mask.sum(1) - 1
        logits = runs.final_logits(model, resid[torch.arange(len(active)), last][:, None])[:, 0]
        for k, r in enumerate(active):
            if not bool(torch.isfinite(logits[k]).all()):
                raise NonFiniteError(f"generation of prompt {input_ids[r]} stopped: the logits after "
                                     f"{len(sequences[k])} tokens are NaN or infinite, so no next token can be "
                                     f"chosen; {where_nonfinite(model, sequences[k])}")
            token = int(logits[k].argmax())
            if token == eos:
                done[r] = Generation(new[r], _decode(model, new[r]), "eos")
                continue
            new[r].append(token)
            text = _decode(model, new[r])
            hits = [(text.index(s), s) for s in stops[r] if s in text]
            if hits:
                at, which = min(hits)
                done[r] = Generation(new[r], text[:at], which)
            elif len(new[r]) == max_new[r]:
                done[r] = Generation(new[r], text, "max_new_tokens")
    return [done[r] for r in range(len(prompts))]
