"""How a task's items become forward rows: which tokens are run, and where each answer's log-probs are read.

Two protocols, named in every result that depends on them:

- ``"lm-eval"`` (the default; lm-evaluation-harness 0.4.5's ``HFLM``, which the paper's authors ran): a
  context's trailing whitespace moves to the continuation; ``whole = encode(context + continuation)``,
  ``ctx = encode(context)``, continuation tokens ``whole[len(ctx):]``; the row is ``(ctx + continuation)[:-1]``,
  so the last continuation token is never input and its log-prob is read at the position before it. No BOS is
  added unless the model family needs one (lm-eval forces it for Gemma). Choices that share a context and have
  one-token continuations (MMLU's " A".." D") share one row, the context itself, as lm-eval's grouping does.
- ``"tl"``: TransformerLens's convention: BOS prepended when ``model.cfg.default_prepend_bos``; context and
  continuation encoded separately; the whole continuation is input. One row per question for the letter format.

``apply_chat_template`` renders each context through the tokenizer's chat template as lm-eval does
(:mod:`lens_heads.data.chat`: ``True`` with the few-shot examples as turns, as the authors ran instruct models;
``"single_turn"``; ``"auto"``: by the model's name, as the authors' script decides); the template then supplies the
special tokens. The head scores read the same rows, so "first token" and "last token" follow from the protocol.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable

from transformers import PreTrainedTokenizerBase

from lens_heads.data.chat import chat_context, resolve_chat_template
from lens_heads.plumbing.errors import InputError

PROTOCOLS = ("lm-eval", "tl")
DEFAULT_PROTOCOL = "lm-eval"


@dataclass
class Row:
    """One forward row: ``tokens``; for each choice it scores, the positions whose logits predict its tokens."""

    item: int
    tokens: list[int]
    reads: list[tuple[int, int, list[int]]]  # (choice, first logit position, continuation token ids)


def check_protocol(protocol: str) -> str:
    if protocol not in PROTOCOLS:
        raise InputError(f"unknown protocol {protocol!r}: choose 'lm-eval' (lm-evaluation-harness rows, the paper's) "
                         "or 'tl' (TransformerLens: BOS prepended, whole continuation input)")
    return protocol


def encode(model, text: str) -> list[int]:
    """Token ids of ``text`` without special tokens (any BOS is added by the row layout)."""
    return encode_each(model, [text])[0]


def encode_each(model, texts: list[str]) -> list[list[int]]:
    """:func:`encode` of each text, the distinct ones in one tokenizer call (an item's choices repeat its context)."""
    if model.tokenizer is None:
        raise InputError("this model has no tokenizer: evaluating text tasks needs one (tiny_model(tokenizer=...))")
    distinct = list(dict.fromkeys(texts))
    if isinstance(model.tokenizer, PreTrainedTokenizerBase):
        encoded = model.tokenizer(distinct, add_special_tokens=False)["input_ids"]
    else:  # a tokenizer of one's own is called as TransformerLens calls it, one text at a time
        encoded = [model.tokenizer(text, add_special_tokens=False)["input_ids"] for text in distinct]
    ids = dict(zip(distinct, encoded))
    return [list(ids[text]) for text in texts]


def lm_eval_bos(model) -> list[int]:
    """The BOS lm-eval adds for this model under the ``"lm-eval"`` protocol: only for Gemma models."""
    family = f"{getattr(model.cfg, 'original_architecture', '')} {model.cfg.model_name}".lower()
    bos = model.tokenizer.bos_token_id if model.tokenizer is not None else None
    return [bos] if "gemma" in family and bos is not None else []


def build_rows(model, items: Iterable, *, protocol: str = DEFAULT_PROTOCOL,
               apply_chat_template: bool | str = False) -> list[Row]:
    """Lay the items out as forward rows under ``protocol`` (see the module docstring); rows longer than the
    model's context are an error that says what to do."""
    check_protocol(protocol)
    rows = [row for index, item in enumerate(items)
            for row in item_rows(model, index, item, protocol, apply_chat_template)]
    too_long = [r for r in rows if len(r.tokens) > model.cfg.n_ctx]
    if too_long:
        raise InputError(f"{len(too_long)} rows are longer than the model's context of {model.cfg.n_ctx} tokens "
                         f"(longest {max(len(r.tokens) for r in too_long)}): use fewer shots, a longer-context model, "
                         "or lens_heads.data.rows.within_context(model, task) to drop those items")
    return rows


def within_context(model, task, *, protocol: str = DEFAULT_PROTOCOL, apply_chat_template: bool | str = False):
    """``task`` without the items that need a forward row longer than the model's context, and how many were
    dropped (for toy models whose ``n_ctx`` is shorter than a few prompts; say the count beside the result)."""
    check_protocol(protocol)
    kept = [item for item in task if all(len(r.tokens) <= model.cfg.n_ctx
                                         for r in item_rows(model, 0, item, protocol, apply_chat_template))]
    return replace(task, items=kept), len(task) - len(kept)


def item_rows(model, index: int, item, protocol: str, apply_chat_template: bool | str = False) -> list[Row]:
    """The rows of one item (``index`` is the item's position, kept in each row)."""
    encoded = _encode(model, item, len(item.contexts), protocol, apply_chat_template)
    if any(not x for _, x in encoded):
        raise InputError(f"item {item.id}: a continuation encodes to no tokens")
    if any(not c for c, _ in encoded):
        raise InputError(f"item {item.id}: empty context and no BOS token to condition on")
    if len({tuple(c) for c, _ in encoded}) == 1 and all(len(x) == 1 for _, x in encoded):  # MMLU letters
        ctx = encoded[0][0]
        return [Row(index, ctx, [(choice, len(ctx) - 1, x) for choice, (_, x) in enumerate(encoded)])]
    rows = []
    for choice, (ctx, x) in enumerate(encoded):
        tokens = ctx + x
        rows.append(Row(index, tokens[:-1] if protocol == "lm-eval" else tokens, [(choice, len(ctx) - 1, x)]))
    return rows


def _encode_lm_eval(model, pairs: list[tuple[str, str]]) -> list[tuple[list[int], list[int]]]:
    bos = lm_eval_bos(model)
    # an empty context is conditioned on lm-eval's prefix token, its continuation encoded alone
    texts = [t for c, x in pairs for t in ((c + x, c) if c else (x, ""))]
    encoded = iter(encode_each(model, texts))
    out = []
    for context, _ in pairs:
        whole, ctx = next(encoded), next(encoded)
        if context == "":
            prefix = model.tokenizer.bos_token_id if model.tokenizer.bos_token_id is not None \
                else model.tokenizer.eos_token_id
            out.append(([prefix], whole))
            continue
        out.append((bos + ctx, whole[len(ctx):]))
    return out


def _encode_tl(model, pairs: list[tuple[str, str]]) -> list[tuple[list[int], list[int]]]:
    bos_id = model.tokenizer.bos_token_id
    bos = [bos_id] if model.cfg.default_prepend_bos and bos_id is not None else []
    encoded = iter(encode_each(model, [t for pair in pairs for t in pair]))
    return [(bos + next(encoded), next(encoded)) for _ in pairs]


def _split_whitespace(context: str, continuation: str) -> tuple[str, str]:
    stripped = context.rstrip()
    return stripped, context[len(stripped):] + continuation


def context_tokens(model, item, protocol: str = DEFAULT_PROTOCOL, apply_chat_template: bool | str = False
                   ) -> list[int]:
    """The tokens of an item's (first) context alone, as its rows begin under ``protocol``: what a calibration on
    prompts reads instead of the evaluated rows."""
    check_protocol(protocol)
    return _encode(model, item, 1, protocol, apply_chat_template)[0][0]


def request_pairs(model, item, apply_chat_template: bool | str = False) -> list[tuple[str, str]]:
    """The (context, continuation) text of each of the item's choices as lm-eval's ``loglikelihood`` requests carry
    them: the context rendered through the chat template where ``apply_chat_template`` asks for it."""
    setting = resolve_chat_template(model, apply_chat_template)
    pairs = list(zip(item.contexts, item.continuations))
    if setting is False:
        return pairs
    return [(chat_context(model.tokenizer, item, context, setting), continuation) for context, continuation in pairs]


def _encode(model, item, n_choices: int, protocol: str, apply_chat_template: bool | str
            ) -> list[tuple[list[int], list[int]]]:
    """(context tokens, continuation tokens) of the item's first ``n_choices`` choices under ``protocol`` (an item
given as tokens: its own, under either protocol)."""
    if item.tokens:
        return [(list(c), list(x)) for c, x in item.tokens[:n_choices]]
    pairs = [_split_whitespace(c, x) for c, x in request_pairs(model, item, apply_chat_template)[:n_choices]]
    return _encode_lm_eval(model, pairs) if protocol == "lm-eval" else _encode_tl(model, pairs)
