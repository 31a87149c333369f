"""What a loaded task is: its items, each a question rendered into (context, continuation) pairs, one per choice,
and the :class:`Task` holding a seeded sample of them (:func:`sample`), whether a benchmark or your own records."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from lens_heads.plumbing.errors import InputError


@dataclass(frozen=True)
class Item:
    """One question: ``contexts[i] + continuations[i]`` is the full text of choice ``i``."""

    id: str
    contexts: tuple[str, ...]
    continuations: tuple[str, ...]
    gold: int
    subject: str | None = None
    description: str = ""  # the task's description, where the contexts start with one (a chat template's system turn)
    target: str | None = None  # the reference answer a generation is matched against (GSM8K: the final number)
    # the few-shot examples in the context, as lm-eval's multi-turn chat puts them: (question, answer) pairs, each in
    # the plain context as question + " " + answer + "\n\n" after the description (empty where not structured: GSM8K)
    fewshot: tuple[tuple[str, str], ...] = ()
    # each choice's (context, continuation) token ids where they are given as tokens, not text (lm-eval's rolling
    # windows of a long document): the rows read them as they are; the texts above are then for people only. Left out
    # of the repr: an item reads as its texts, and thousands of ids would bury them
    tokens: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...] = field(default=(), repr=False)

    @property
    def prompt(self) -> str:
        """The text a scoring pass reads for this item (the shared context, or the first choice's)."""
        return self.contexts[0]

    @property
    def n_choices(self) -> int:
        return len(self.continuations)


@dataclass
class Task:
    """A sized, iterable collection of items with what a result must say about its data."""

    name: str
    split: str
    shots: int
    format: str  # "letter" | "cloze" | "partial" | "greedy" (see TaskSpec.format)
    items: list[Item]
    n_total: int
    seed: int
    source: str = ""
    subjects: dict[str, int] = field(default_factory=dict)
    fewshot_split: str | None = None  # where the few-shot examples come from (None: no examples)

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[Item]:
        return iter(self.items)

    def __getitem__(self, i: int) -> Item:
        return self.items[i]

    @property
    def chance(self) -> float:
        """Expected accuracy of uniform guessing over this sample's choices (0 where an item has one continuation:
        its accuracy is a greedy match, which guessing never achieves)."""
        if not self.items:
            return float("nan")
        return float(np.mean([1.0 / it.n_choices if it.n_choices > 1 else 0.0 for it in self.items]))

    def meta(self) -> dict:
        return dict(task=self.name, split=self.split, shots=self.shots, fewshot_split=self.fewshot_split,
                    format=self.format, n=len(self), n_total=self.n_total, seed=self.seed, chance=self.chance,
                    source=self.source)


def sample(total: int, n: int | None, seed: int) -> list[int]:
    """The indices of a seeded random sample of ``n`` of ``total`` items, in order (all of them where ``n`` is None
    or at least ``total``)."""
    if n is None or n >= total:
        return list(range(total))
    if n <= 0:
        raise InputError(f"n must be positive, got {n}")
    return sorted(np.random.default_rng(seed).permutation(total)[:n].tolist())
