"""Solved items as training data: each example is one item laid out as its evaluation lays it out
(:mod:`lens_heads.data.rows`: the item's context, then its gold answer), the instruction/answer format of supervised
fine-tuning with the task's own prompt as the instruction. `ExampleData` is a set of them as the training loop's
data (`lens_heads.training.loop.TrainData`): batches drawn without replacement from a generator seeded by (seed,
step, micro-batch), the answer loss (`lens_heads.training.objectives.AnswerLoss`) and the held-out loss."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from lens_heads.data.rows import DEFAULT_PROTOCOL, item_rows
from lens_heads.plumbing.errors import InputError
from lens_heads.training.config import TrainConfig
from lens_heads.training.objectives import AnswerLoss, answer_loss


@dataclass(frozen=True)
class Example:
    """One solved item: the forward row's ``tokens``; positions ``first .. first + len(answer) - 1`` predict
    ``answer`` (the gold continuation's tokens)."""

    tokens: tuple[int, ...]
    first: int
    answer: tuple[int, ...]

    def __post_init__(self):
        if not self.answer or len(self.tokens) != self.first + len(self.answer) \
                or tuple(self.tokens[self.first + 1:]) != tuple(self.answer[:-1]):
            raise InputError(f"Example: the tokens after position {self.first} must be the answer but its last token "
                             f"(got {len(self.tokens)} tokens, answer {list(self.answer)})")


def examples(model, task, *, protocol: str = DEFAULT_PROTOCOL) -> list[Example]:
    """The gold answer of every item of ``task`` as a training example, laid out as ``model`` (a loaded
    ``HookedTransformer``: its tokenizer and its family's BOS rule) evaluates it under ``protocol``."""
    out = []
    for i, item in enumerate(task):
        for row in item_rows(model, i, item, protocol):
            for choice, first, ids in row.reads:
                if choice == int(item.gold):
                    out.append(Example(tuple(row.tokens[:first + len(ids)]), first, tuple(ids)))
    if not out:
        raise InputError("the task gave no training examples: give a task with items")
    return out


def example_batch(n_examples: int, step: int, micro: int, cfg: TrainConfig) -> list[int]:
    """The examples of (step, micro-batch): drawn without replacement from a generator seeded by (seed, step, micro).
    (numpy's seed sequence pads with zeros, so micro-batch 0 draws what a (seed, step) generator draws.)"""
    rng = np.random.default_rng([cfg.seed, step, micro])
    return rng.choice(n_examples, size=min(cfg.batch_size, n_examples), replace=False).tolist()


@torch.no_grad()
def held_out_loss(model, held_out: Sequence[Example], pad_id: int, batch_size: int) -> float:
    """The answer-token loss over ``held_out``, every answer token weighing the same."""
    total, n = 0.0, 0
    for start in range(0, len(held_out), batch_size):
        batch = held_out[start:start + batch_size]
        tokens = sum(len(e.answer) for e in batch)
        total += float(answer_loss(model, batch, pad_id)) * tokens
        n += tokens
    return total / max(n, 1)


@dataclass(frozen=True)
class ExampleData:
    """``train`` examples to learn and ``held_out`` ones the validation loss is measured on (in eval mode, in
    batches of ``batch_size``), for a Hugging Face causal LM whose rows are padded with ``pad_id``."""

    train: Sequence[Example]
    held_out: Sequence[Example]
    pad_id: int
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        if not self.train or not self.held_out:
            raise InputError("training on examples needs training examples and held-out examples")

    @property
    def objective(self) -> AnswerLoss:
        return AnswerLoss(self.pad_id)

    def check(self, model, cfg: TrainConfig) -> None:
        """Nothing to check against the model: an example is as long as its item."""

    def batch(self, step: int, micro: int, cfg: TrainConfig, device) -> list[Example]:
        return [self.train[i] for i in example_batch(len(self.train), step, micro, cfg)]

    def tokens(self, batch: Sequence[Example]) -> int:
        return sum(len(e.tokens) for e in batch)

    def validation_loss(self, model, cfg: TrainConfig) -> float:
        was_training = model.training
        model.eval()
        loss = held_out_loss(model, self.held_out, self.pad_id, cfg.batch_size)
        model.train(was_training)
        return loss
