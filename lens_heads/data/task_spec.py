"""What makes a benchmark (:class:`TaskSpec`), and the rendering most benchmarks use: a document's (context,
continuation) pairs after solved examples drawn from its own split or another one (:func:`render_same_split`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from lens_heads.data.items import Item
from lens_heads.plumbing.errors import InputError


def render_same_split(spec: TaskSpec, docs: list[dict], i: int, shots: int, seed: int,
                      examples: list[dict] | None = None) -> Item:
    """The document's ``spec.pairs``, after ``shots`` solved examples (each followed by a blank line) drawn by
    ``seed + i`` from ``examples`` (another split's documents), else from the other documents of the same split."""
    assert spec.pairs is not None  # every spec rendered by render_same_split has pairs
    contexts, continuations, gold, item_id = spec.pairs(docs[i])
    fewshot: tuple[tuple[str, str], ...] = ()
    if shots:
        pool = docs if examples is None else examples
        order = np.random.default_rng(seed + i).permutation(len(pool)).tolist()
        fewshot = tuple(_solved(spec, pool[j]) for j in order if examples is not None or j != i)[:shots]
    prefix = "".join(f"{question} {answer}\n\n" for question, answer in fewshot)
    return Item(id=f"{spec.name}/{item_id if item_id is not None else i}", contexts=tuple(prefix + c for c in contexts),
                continuations=continuations, gold=gold, fewshot=fewshot)


def _solved(spec: TaskSpec, doc: dict) -> tuple[str, str]:
    """A solved example as (question, answer): the gold choice's context, and its continuation after lm-eval's
    target delimiter (one space); the plain text is question + " " + answer."""
    assert spec.pairs is not None  # only called from render_same_split
    contexts, continuations, gold, _ = spec.pairs(doc)
    if not continuations[gold].startswith(" "):
        raise InputError(f"{spec.name}: a continuation must start with lm-eval's target delimiter, a space")
    return contexts[gold], continuations[gold][1:]


@dataclass(frozen=True)
class TaskSpec:
    """Everything that makes a benchmark: where its documents are, how one is rendered, and its defaults."""

    name: str
    source: str  # the data set the files hold, named in every result's meta
    files: str  # the folder under the asset root (``{split}`` filled in, where the split is a folder)
    read: Callable[["TaskSpec", str], list[dict]]  # (spec, split) -> the split's documents, in dataset order
    split: str  # the evaluation split read by default
    shots: int  # few-shot examples by default
    format: str  # "letter" | "cloze" | "partial" (the option is in the context) | "greedy" (one continuation)
    render: Callable[..., Item] = render_same_split  # (spec, docs, i, shots, seed) -> the rendered item i
    pairs: Callable[[dict], tuple] | None = None  # doc -> (contexts, continuations, gold, id) for render_same_split
    fewshot_split: str | None = None  # the examples' split by default (None: the evaluated split)
    train_examples: Callable[[], list[dict]] | None = None  # the train examples the data ship, where not a split
    inactive_heads: bool = False  # one of the inactive-heads paper's multiple-choice benchmarks
    inheritune_scoring: str | None = None  # the Inheritune paper's zero-shot metric, where it reports the task
