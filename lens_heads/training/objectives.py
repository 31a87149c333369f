"""The losses the training loop (`lens_heads.training.loop.train`) minimises, as data: an objective is called on the
model and a batch of its data and says what it is (``describe()``, recorded with the run and in its key).

| objective | batch | loss |
|---|---|---|
| `NextToken` (the default on token windows) | token windows | mean next-token cross-entropy (`lm_loss`) |
| `AnswerLoss` (the default on solved items) | `lens_heads.training.example_data.Example` | the gold answer's mean token negative log-likelihood given its context (`answer_loss`) |
| `lens_heads.training.distill.Distillation` | token windows | logit or DistilBERT-style distillation from a teacher |

Also where a model runs: its device (`device_of`) and the bfloat16 autocast of ``TrainConfig.amp`` (`autocast`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.nn.functional as F
from jaxtyping import Int
from torch import Tensor

if TYPE_CHECKING:  # HookedTransformer is TransformerLens 3.9 only
    from transformer_lens import HookedTransformer

    from lens_heads.training.config import TrainConfig


class Objective(Protocol):
    """A training loss: ``objective(model, batch)`` (a scalar with its graph) and ``describe()`` (what it is)."""

    def __call__(self, model: Any, batch: Any, /) -> Tensor: ...

    def describe(self) -> dict | str: ...


def lm_loss(model: HookedTransformer, windows: Int[Tensor, "batch seq_plus_1"]) -> Tensor:
    """Mean next-token cross-entropy of ``windows[:, 1:]`` given ``windows[:, :-1]``."""
    logits = model(windows[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1).float(), windows[:, 1:].flatten())


@dataclass(frozen=True)
class NextToken:
    """The language-model loss (`lm_loss`) of a HookedTransformer on token windows."""

    def __call__(self, model: HookedTransformer, windows: Int[Tensor, "batch seq_plus_1"]) -> Tensor:
        return lm_loss(model, windows)

    def describe(self) -> str:
        return "language-model loss"


class Solved(Protocol):
    """What the answer loss reads of a solved item (:class:`lens_heads.training.example_data.Example`): its forward
    row's ``tokens``, and the ``answer`` tokens that positions ``first`` onwards predict."""

    @property
    def tokens(self) -> Sequence[int]: ...

    @property
    def first(self) -> int: ...

    @property
    def answer(self) -> Sequence[int]: ...


def answer_loss(model, batch: Sequence[Solved], pad_id: int) -> Tensor:
    """Mean negative log-likelihood of the answer tokens of ``batch`` under the Hugging Face causal LM ``model``
    (rows right-padded; logits only where an answer token is predicted: most positions are prompt)."""
    device = device_of(model)
    width = max(len(e.tokens) for e in batch)
    tokens = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    rows, cols, targets = [], [], []
    for b, e in enumerate(batch):
        tokens[b, :len(e.tokens)] = torch.tensor(e.tokens)
        mask[b, :len(e.tokens)] = 1
        for k, token in enumerate(e.answer):
            rows.append(b)
            cols.append(e.first + k)
            targets.append(token)
    hidden = model.base_model(input_ids=tokens.to(device), attention_mask=mask.to(device)).last_hidden_state
    logits = model.get_output_embeddings()(hidden[torch.tensor(rows), torch.tensor(cols)])
    return F.cross_entropy(logits.float(), torch.tensor(targets, device=device))


@dataclass(frozen=True)
class AnswerLoss:
    """The fine-tune's loss (`answer_loss`): a Hugging Face causal LM on solved items, rows padded with ``pad_id``."""

    pad_id: int

    def __call__(self, model, batch: Sequence[Solved]) -> Tensor:
        return answer_loss(model, batch, self.pad_id)

    def describe(self) -> str:
        return "mean negative log-likelihood of the gold answer's tokens given the context (nats per token)"


def device_of(model) -> torch.device:
    """Where ``model``'s weights are."""
    return next(model.parameters()).device


def autocast(model, cfg: TrainConfig):
    """bfloat16 autocast where ``cfg.amp`` asks for it and the model is on CUDA; a no-op context otherwise."""
    device_type = device_of(model).type
    return torch.autocast(device_type, dtype=torch.bfloat16, enabled=cfg.amp and device_type == "cuda")
