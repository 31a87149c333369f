"""Turn what a user passes (strings, a task, tokens) into one right-padded token batch and its padding mask.

Shared by scoring, rank and evaluation, so every pass reads the same tokens for the same input.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator, Sequence, Union

import torch
from jaxtyping import Bool, Int
from torch import Tensor

from lens_heads.data.items import Task
from lens_heads.data.rows import DEFAULT_PROTOCOL, build_rows
from lens_heads.plumbing.errors import InputError

if TYPE_CHECKING:  # HookedTransformer is TransformerLens 3.9 only
    from transformer_lens import HookedTransformer

Inputs = Union[str, Sequence[str], Task, Tensor, Sequence[Tensor], Sequence[Sequence[int]]]


def tokenize_inputs(
    model: HookedTransformer, inputs: Inputs, max_len: int | None = None, *, protocol: str = DEFAULT_PROTOCOL,
    apply_chat_template: bool | str = False,
) -> tuple[Int[Tensor, "batch pos"], Bool[Tensor, "batch pos"]]:
    """Right-padded ``tokens`` and ``mask`` (True at real tokens) for ``inputs``.

    ``inputs`` is a string, a list of strings, a :class:`~lens_heads.data.items.Task` (the forward rows its evaluation
    runs under ``protocol`` and ``apply_chat_template``, see :mod:`lens_heads.data.rows`), a ``[batch, pos]`` token
    tensor (taken as is: every position counts), or a list of 1-D token sequences of different lengths. Strings
    are tokenised by the model's tokenizer with the BOS token prepended when the model expects one
    (``model.cfg.default_prepend_bos``), exactly as ``model.to_tokens`` does for a single string.

    ``max_len`` truncates longer sequences to their first ``max_len`` tokens (the start holds the BOS, which the
    first-token scores read). A sequence longer than the model's context ``n_ctx`` is an error.
    """
    if max_len is not None and max_len < 1:
        raise InputError(f"max_len must be a positive number of tokens, got {max_len}")
    sequences = _sequences(model, inputs, protocol, apply_chat_template)
    if not sequences:
        raise InputError("no inputs to tokenize: pass at least one string, item or token sequence")
    if max_len is not None:
        sequences = [s[:max_len] for s in sequences]
    check_token_ids(model, sequences)
    for i, s in enumerate(sequences):
        if len(s) == 0:
            raise InputError(f"input {i} has no tokens: pass non-empty text (or set prepend_bos on the model)")
        if len(s) > model.cfg.n_ctx:
            raise InputError(f"input {i} has {len(s)} tokens, more than the model's context of {model.cfg.n_ctx}: "
                             "shorten it (fewer shots, shorter text) or pass max_len to truncate")
    return right_pad(sequences, pad_id(model))


def right_pad(sequences: Sequence[Sequence[int] | Tensor], pad: int
              ) -> tuple[Int[Tensor, "batch pos"], Bool[Tensor, "batch pos"]]:
    """Sequences right-padded with ``pad`` into one ``[batch, pos]`` tensor, and the mask of their real tokens."""
    width = max(len(s) for s in sequences)
    tokens = torch.full((len(sequences), width), pad, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.bool)
    for i, s in enumerate(sequences):
        tokens[i, : len(s)] = torch.as_tensor(s, dtype=torch.long)
        mask[i, : len(s)] = True
    return tokens, mask


def longest_first(mask: Bool[Tensor, "batch pos"], batch_size: int
                  ) -> Iterator[tuple[Int[Tensor, " rows"], slice]]:
    """Batches of the rows of ``mask`` longest first (rows of alike length together, so little padding is run),
    each with the columns it needs: those real in some row of the batch (padding on either side cut)."""
    order = torch.argsort(mask.sum(1), descending=True, stable=True)
    for start in range(0, len(order), batch_size):
        rows = order[start: start + batch_size]
        used = mask[rows].any(0).nonzero()[:, 0]
        yield rows, slice(int(used[0]), int(used[-1]) + 1)


def check_token_ids(model: HookedTransformer, sequences: Sequence[Sequence[int] | Tensor],
                    labels: Sequence[str] | None = None) -> None:
    """Refuse token ids outside the model's vocabulary ``[0, d_vocab)``, naming the inputs and the ids (an embedding
    lookup would fail deep inside the forward, or a wrong tokenizer would read garbage)."""
    vocab = model.cfg.d_vocab
    bad = []
    for i, seq in enumerate(sequences):
        ids = torch.as_tensor(seq, dtype=torch.long).reshape(-1)
        outside = ids[(ids < 0) | (ids >= vocab)]
        if outside.numel():
            name = labels[i] if labels is not None else f"input {i}"
            bad.append(f"{name}: {', '.join(str(t) for t in outside.unique().tolist()[:5])}")
    if bad:
        more = f" (and {len(bad) - 5} more inputs)" if len(bad) > 5 else ""
        raise InputError(f"token ids outside the model's vocabulary of {vocab} (0 to {vocab - 1}): "
                         f"{'; '.join(bad[:5])}{more}. Use the model's own tokenizer (model.to_tokens) or ids below "
                         f"{vocab}")


def _sequences(model: HookedTransformer, inputs: Inputs, protocol: str, apply_chat_template: bool | str) -> list[Tensor]:
    if isinstance(inputs, Tensor):
        if inputs.dtype.is_floating_point or inputs.dtype == torch.bool:
            raise InputError(f"token tensors must hold integer ids, got dtype {inputs.dtype}")
        if inputs.ndim == 1:
            inputs = inputs[None]
        if inputs.ndim != 2:
            raise InputError(f"a token tensor must be [batch, pos], got shape {tuple(inputs.shape)}")
        return [row.long().cpu() for row in inputs]
    if isinstance(inputs, str):
        inputs = [inputs]
    elif isinstance(inputs, Task):
        rows = build_rows(model, inputs, protocol=protocol, apply_chat_template=apply_chat_template)
        return [torch.tensor(row.tokens, dtype=torch.long) for row in rows]
    given = list(inputs)
    if not given:
        return []
    texts = [x for x in given if isinstance(x, str)]
    if len(texts) == len(given):
        check_texts(texts)
        if model.tokenizer is None:
            raise InputError("this model has no tokenizer: pass token ids (a tensor or lists of ints) instead of text")
        return [model.to_tokens(x, prepend_bos=model.cfg.default_prepend_bos, truncate=False)[0].cpu()
                for x in texts]
    if all(isinstance(x, Tensor) or (isinstance(x, (list, tuple)) and all(isinstance(t, int) for t in x))
           for x in given):
        seqs = [torch.as_tensor(x, dtype=torch.long).reshape(-1).cpu() for x in given]
        return seqs
    raise InputError("inputs must be a string, a list of strings, a Task, a [batch, pos] token tensor, or a list "
                    f"of token sequences; got {type(given).__name__} of {sorted({type(x).__name__ for x in given})}")


def check_texts(texts: Sequence[str]) -> None:
    """Refuse empty or whitespace-only texts, naming each input by its index: with the BOS prepended such a
    text still makes a one-token row, and its scores would describe the BOS alone, not the text."""
    empty = [i for i, text in enumerate(texts) if not text.strip()]
    if empty:
        more = f" (and {len(empty) - 5} more)" if len(empty) > 5 else ""
        raise InputError(f"input {', '.join(map(str, empty[:5]))}{more} of {len(texts)} "
                         f"{'is' if len(empty) == 1 else 'are'} empty text: drop {'it' if len(empty) == 1 else 'them'} "
                         "or give the text to read")


def pad_id(model: HookedTransformer) -> int:
    """The id that fills padding: the tokenizer's pad or end-of-text token, else 0 (padded positions are masked and
    never read, so any id gives the same numbers)."""
    tok = model.tokenizer
    if tok is not None:
        for candidate in (tok.pad_token_id, tok.eos_token_id):
            if candidate is not None:
                return int(candidate)
    return 0
