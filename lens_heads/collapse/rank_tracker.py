"""A training callback that measures the attention rank of every layer as a model trains."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from jaxtyping import Int
from torch import Tensor

from lens_heads.collapse.rank import attention_rank
from lens_heads.plumbing.errors import InputError

if TYPE_CHECKING:  # HookedTransformer is TransformerLens 3.9 only
    from transformer_lens import HookedTransformer


@dataclass
class RankTracker:
    """Callback: the attention rank of every layer on fixed ``tokens`` every ``every`` steps (and at step 0)."""

    tokens: Int[Tensor, "n pos"]
    every: int = 100
    average: bool = True  # the paper's: rank of the input-averaged matrix

    def __post_init__(self):
        if self.every < 1:
            raise InputError(f"RankTracker(every={self.every}): track every 1 or more steps")

    def __call__(self, model: HookedTransformer, step: int) -> dict | None:
        if step % self.every:
            return None

        was_training = model.training
        profile = attention_rank(model, self.tokens, average=self.average, progress=False)
        model.train(was_training)
        return {"max_rank": profile.max_rank.tolist(), "mean_rank": profile.mean_rank.tolist(),
                "mass_columns": profile.mass_columns.tolist()}
