"""Log-likelihoods read off the forward rows: the rows in right-padded batches, each continuation's summed
log-probability at the positions it is read, and each item's record.

Rows are sorted by length, right-padded into batches of at most ``batch_size`` rows (a new batch starts where a row
is shorter than 3/4 of the batch's longest, which bounds the padding) and run with their attention mask.
"""

from __future__ import annotations

from typing import Iterable

import torch
from jaxtyping import Float, Float64
from torch import Tensor

from lens_heads.data.inputs import right_pad
from lens_heads.data.rows import Row
from lens_heads.evaluation.results import ItemRecord
from lens_heads.models import backends


def pad_rows(batch: list[Row], pad: int) -> tuple[Tensor, Tensor]:
    """Right-padded ``[row, pos]`` tokens of a batch of rows and the mask of their real positions."""
    return right_pad([r.tokens for r in batch], pad)


def batches(rows: list[Row], batch_size: int, min_fill: float = 0.75) -> Iterable[list[Row]]:
    """Consecutive rows (sorted longest first) in batches of at most ``batch_size``; a row shorter than ``min_fill``
    of the batch's longest starts a new batch, so padding never costs more than a quarter of a batch's tokens."""
    batch: list[Row] = []
    for row in rows:
        if batch and (len(batch) == batch_size or len(row.tokens) < min_fill * len(batch[0].tokens)):
            yield batch
            batch = []
        batch.append(row)
    if batch:
        yield batch


def record_logprobs(model, resid: Tensor, batch: list[Row], out: list[list[float]],
                    greedy: list[list[bool]]) -> None:
    """Write each (item, choice)'s log-likelihood the batch reads into ``out[item][choice]``, and whether its
    continuation is the greedy one into ``greedy[item][choice]``."""
    hits: dict[tuple[int, int], bool] = {}
    values, owners = read_logprobs(model, resid, batch, greedy=hits)
    for (item, choice), value in zip(owners, values.detach().cpu().tolist()):
        out[item][choice] = value
        greedy[item][choice] = hits[(item, choice)]


def read_logprobs(model, resid: Tensor, batch: list[Row], greedy: dict | None = None
                  ) -> tuple[Float64[Tensor, "read"], list[tuple[int, int]]]:
    """The summed log-likelihood of every (item, choice) the batch's rows read, differentiable in ``resid``;
    ``greedy``, when given, receives for each (item, choice) whether every continuation token is the argmax.

    Final norm, unembedding and log_softmax only at the positions read: most positions are context, and the
    unembedding is a fifth of a small model's forward FLOPs. (The final norm acts on each position alone, so this
    equals reading the full logits; hooks on ``ln_final``/``unembed`` see only the read positions, as [1, n, d].)
    The log_softmax runs in float32 or the model's wider dtype (float64 models keep their precision)."""
    where, targets, owners = [], [], []
    for b, row in enumerate(batch):
        for choice, first, ids in row.reads:
            for k, token in enumerate(ids):
                where.append((b, first + k))
                targets.append(token)
                owners.append((row.item, choice))
    index = torch.tensor(where, device=resid.device)
    logits = final_logits(model, resid[index[:, 0], index[:, 1]][None])[0]
    picked = torch.log_softmax(logits, dim=-1, dtype=torch.promote_types(logits.dtype, torch.float32))
    target_ids = torch.tensor(targets, device=resid.device)
    values = picked.gather(1, target_ids[:, None])[:, 0].double()
    if greedy is not None:
        for owner, hit in zip(owners, (logits.argmax(dim=-1) == target_ids).cpu().tolist()):
            greedy[owner] = greedy.get(owner, True) and bool(hit)
    slot = {owner: i for i, owner in enumerate(dict.fromkeys(owners))}
    keys = list(slot)
    where_key = torch.tensor([slot[o] for o in owners], device=resid.device)
    return torch.zeros(len(keys), dtype=values.dtype, device=values.device).index_add(0, where_key, values), keys


def final_logits(model, resid: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_vocab"]:
    """The residual stream after the last block to logits: the same steps as the model's own forward (final
    norm, unembedding, soft-cap), for callers that stop at the last layer to unembed only the positions they read."""
    return backends.final_logits(model, resid)


def item_records(items, rows: list[Row], logprobs, greedy) -> list[ItemRecord]:
    """Each item's record from its choices' log-likelihoods and greedy flags, with the token, character and
    byte counts of its continuations."""
    n_tokens = continuation_tokens(items, rows)
    return [ItemRecord(id=it.id, gold=int(it.gold), logprobs=lp, n_tokens=nt, subject=it.subject,
                       n_chars=[choice_chars(x) for x in it.continuations], greedy=gr,
                       n_bytes=[len(x.encode("utf-8")) for x in it.continuations])
            for it, lp, nt, gr in zip(items, logprobs, n_tokens, greedy)]


def continuation_tokens(items, rows: list[Row]) -> list[list[int]]:
    """How many tokens each (item, choice)'s continuation has, as its rows read them."""
    n_tokens = [[0] * len(it.continuations) for it in items]
    for row in rows:
        for choice, _, ids in row.reads:
            n_tokens[row.item][choice] = len(ids)
    return n_tokens


def choice_chars(continuation: str) -> int:
    """The length lm-eval's ``acc_norm`` divides by: the choice's characters, which the continuation carries after
    the target delimiter (one leading space). WinoGrande's choices are its option-filled contexts in lm-eval, which
    reports only ``acc`` for it; here its two continuations are one text, so per_char there equals sum."""
    return len(continuation[1:] if continuation.startswith(" ") else continuation)
