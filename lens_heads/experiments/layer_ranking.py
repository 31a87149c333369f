"""Per-layer scores that rank layers for removal, computed from the model on a task's inputs.

- **Block Influence** (ShortGPT, Men et al. 2024): ``BI_l = 1 - cos(x_in, x_out)`` of block ``l``, ``x_in`` the
  residual stream before it (``hook_resid_pre``) and ``x_out`` after it (``hook_resid_post``), the mean over every
  real (non-padding) token of every input. A block that changes its input little has a low BI and is removed first.
  The same measure of the attention alone (``x_out = resid_pre + attn_out``) is kept as ``attention_influence``.
- **Attention rank** (:mod:`lens_heads.collapse.rank`): per layer the max and mean over heads of the approximate
  rank (90% energy), in both of the library's aggregations: the mean over inputs of each input's rank
  (``average=False``) and the rank of the input-averaged matrix (``average=True``, every input cut to the shortest).
  Lowest first: a collapsed (lazy) layer goes first.
- **AHON** (:mod:`lens_heads.heads.scores`): the layer mean of the average head-output norm, and of AHON (LN). AHON
  (LN) divides each head's AHON by the mean over the heads of its layer on the same input, so its layer mean is 1 by
  construction (up to rounding): it cannot rank layers. What AHON (LN) says about a layer is how many of its heads
  fall on the inactive side of the pooled threshold (``ahon_ln_zero_share``, the share of the layer's (input, head)
  values below the threshold that zeroes ``zero_fraction`` of all values).

Inputs are the task's forward rows (as the evaluation runs them) for Block Influence and AHON, and the items'
prompts for the attention rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Float
from torch import Tensor
from tqdm.auto import tqdm

from lens_heads.collapse.rank import attention_rank
from lens_heads.data.inputs import longest_first, tokenize_inputs
from lens_heads.evaluation.eval_settings import EvalSettings, eval_settings
from lens_heads.evaluation.passes import evaluator_forward
from lens_heads.heads.distributions import thresholds
from lens_heads.heads.scores import inactive
from lens_heads.heads.scoring import HeadScores, score_heads
from lens_heads.models.backends import run_to_resid
from lens_heads.models.loading import model_meta
from lens_heads.models.nonfinite import where_nonfinite
from lens_heads.plumbing.errors import InputError, NonFiniteError
from lens_heads.plumbing.values import keywords

# name -> (column, lowest first?): the orders a layer ranking can be read in, the first layer removed first
ORDERS = {
    "Block Influence": ("block_influence", True),
    "attention influence": ("attention_influence", True),
    "attention rank": ("max_rank", True),
    "attention rank (averaged matrix)": ("max_rank_averaged", True),
    "AHON (LN) layer mean": ("ahon_ln_mean", True),
    "AHON layer mean": ("ahon_mean", True),
    "AHON (LN) zero share": ("ahon_ln_zero_share", False),
}
TIE_BREAK = {"max_rank": "mean_rank", "max_rank_averaged": "mean_rank_averaged"}


@dataclass
class LayerScores:
    """Per-layer scores of a model on some inputs (arrays of length ``n_layers``; the module docstring says what
    each is). ``lazy``: the layers the rank profile (per-input aggregation) flags."""

    block_influence: np.ndarray
    attention_influence: np.ndarray
    max_rank: np.ndarray
    mean_rank: np.ndarray
    max_rank_averaged: np.ndarray
    mean_rank_averaged: np.ndarray
    ahon_mean: np.ndarray
    ahon_ln_mean: np.ndarray
    ahon_ln_zero_share: np.ndarray
    lazy: np.ndarray
    meta: dict = field(default_factory=dict)

    @property
    def n_layers(self) -> int:
        return len(self.block_influence)

    def order(self, name: str) -> list[int]:
        """Every layer, the first to remove first, by the ranking ``name`` (:data:`ORDERS`); ties go to the mean
        rank over heads (for the max-rank orders), then to the lower layer."""
        if name not in ORDERS:
            raise InputError(f"unknown layer ranking {name!r}: choose one of {list(ORDERS)}")
        column, lowest_first = ORDERS[name]
        sign = 1.0 if lowest_first else -1.0
        values = sign * np.asarray(getattr(self, column), dtype=float)
        tie = sign * np.asarray(getattr(self, TIE_BREAK[column]), dtype=float) if column in TIE_BREAK else \
            np.zeros_like(values)
        return [int(i) for i in np.lexsort((np.arange(self.n_layers), tie, values))]

    def to_dataframe(self) -> pd.DataFrame:
        """One row per layer."""
        return pd.DataFrame({"layer": np.arange(self.n_layers), **{name: np.asarray(getattr(self, name)) for name in (
            "block_influence", "attention_influence", "max_rank", "mean_rank", "max_rank_averaged",
            "mean_rank_averaged", "ahon_mean", "ahon_ln_mean", "ahon_ln_zero_share", "lazy")}})

    def to_dict(self) -> dict:
        return {**{k: v.tolist() for k, v in self.to_dataframe().items() if k != "layer"}, "meta": self.meta}

    @classmethod
    def from_dict(cls, d: dict) -> "LayerScores":
        """The scores :meth:`to_dict` wrote."""
        return cls(**{k: np.asarray(v) for k, v in d.items() if k != "meta"}, meta=d.get("meta", {}))


@keywords(EvalSettings)  # the signature names the settings' fields taken as keywords
def layer_scores(model, task, *, scores: HeadScores | None = None, zero_fraction: float = 0.3,
                 settings: EvalSettings | None = None, progress: bool = True, **options) -> LayerScores:
    """Every per-layer score of ``model`` on ``task`` (module docstring): one pass over the task's forward rows for
    Block Influence, the rank profile on the items' prompts in both aggregations, and AHON from ``scores`` (the
    task's :func:`lens_heads.heads.scoring.score_heads`, computed here when not given). ``settings``
    (:class:`lens_heads.evaluation.eval_settings.EvalSettings`, or its fields as keywords laid over it): the rows'
    ``protocol`` and ``apply_chat_template`` and a whole-number ``batch_size``; ``meta["settings"]`` records it."""
    evaluation = eval_settings(settings, options)
    batch_size, protocol = evaluation.batch_size, evaluation.protocol
    if not isinstance(batch_size, int):
        raise InputError("layer_scores runs its own passes, which don't find a batch size: give batch_size a whole "
                         "number")
    if isinstance(task, (str, bytes)):
        raise InputError(f"layer_scores takes a Task, got {task!r}: load it first, lens_heads.load_task({task!r})")
    items = list(task)
    if not items:
        raise InputError("the task has no items: load it with a positive n (lens_heads.load_task(name, n=...))")
    if not 0 < zero_fraction < 1:
        raise InputError(f"zero_fraction must lie in (0, 1), got {zero_fraction}")
    tokens, mask = tokenize_inputs(model, task, **evaluation.rows())
    block, attention = block_influence(model, tokens, mask, batch_size=batch_size, progress=progress)
    prompts = [item.prompt for item in items]
    per_input = attention_rank(model, prompts, average=False, batch_size=batch_size, progress=progress)
    averaged = attention_rank(model, prompts, average=True, batch_size=batch_size, progress=progress)
    if scores is None:
        scores = score_heads(model, task, settings=evaluation, progress=progress)
    if scores.values.shape[1:3] != (model.cfg.n_layers, model.cfg.n_heads):
        raise InputError(f"scores are of a model with {tuple(scores.values.shape[1:3])} layers x heads, not this "
                         f"model's ({model.cfg.n_layers}, {model.cfg.n_heads}): score this model")
    name = "AHON (LN)"
    cut = thresholds(scores, name, [zero_fraction])[zero_fraction]
    zero_share = inactive(scores.score(name).float(), scores.direction[name], cut).float().mean((0, 2))
    meta = dict(model=model_meta(model), data=task.meta() if hasattr(task, "meta") else {}, protocol=protocol,
                settings=evaluation.to_dict(),
                n_rows=int(tokens.shape[0]), n_tokens=int(mask.sum()), zero_fraction=zero_fraction,
                ahon_ln_threshold=float(cut), rank=dict(per_input=per_input.meta, averaged=averaged.meta,
                                                        lazy_rule=per_input.lazy_rule),
                definitions=dict(block_influence="1 - cos(resid_pre, resid_post) of the block, mean over real tokens "
                                                 "of the task's forward rows (ShortGPT)",
                                 attention_influence="1 - cos(resid_pre, resid_pre + attn_out), mean over real tokens",
                                 rank=per_input.definition, rank_averaged=averaged.definition,
                                 ahon_ln_zero_share=f"share of the layer's (row, head) AHON (LN) values below the "
                                                    f"threshold that puts {zero_fraction:.0%} of all values below"))
    return LayerScores(
        block_influence=block.numpy(), attention_influence=attention.numpy(), max_rank=per_input.max_rank,
        mean_rank=per_input.mean_rank, max_rank_averaged=averaged.max_rank, mean_rank_averaged=averaged.mean_rank,
        ahon_mean=scores.mean("AHON").mean(1).double().numpy(),
        ahon_ln_mean=scores.mean(name).mean(1).double().numpy(), ahon_ln_zero_share=zero_share.double().numpy(),
        lazy=per_input.lazy, meta=meta)


@torch.no_grad()
def block_influence(model, tokens, mask: Bool[Tensor, "batch pos"], *, batch_size: int = 8,
                    progress: bool = True) -> tuple[Float[Tensor, "layer"], Float[Tensor, "layer"]]:
    """Per layer, ``1 - cos(x_in, x_out)`` of the block and of its attention alone, each the mean over the real
    tokens of ``tokens`` (hooks on ``hook_resid_pre``, ``hook_attn_out`` and ``hook_resid_post``; no cache)."""
    L = model.cfg.n_layers
    total = torch.zeros(2, L, dtype=torch.float64)
    count = 0
    state: dict = {}

    def hook(layer: int, what: str):
        def fn(x: Float[Tensor, "batch pos d_model"], hook=None):
            state[(layer, what)] = x.detach()
            if what == "resid_post":
                pre = state.pop((layer, "resid_pre"))
                mid = pre + state.pop((layer, "attn_out"))
                real = state["mask"]
                for i, out in enumerate((x.detach(), mid)):
                    influence = 1 - torch.nn.functional.cosine_similarity(pre.double(), out.double(), dim=-1)
                    total[i, layer] += influence[real].sum().cpu()
                state.pop((layer, what))

        return fn

    hooks = [(f"blocks.{layer}.hook_{what}", hook(layer, what)) for layer in range(L)
             for what in ("resid_pre", "attn_out", "resid_post")]
    bar = tqdm(total=tokens.shape[0], desc="block influence", unit="input", disable=not progress)
    # nothing reads the pattern or the norms: the evaluator's forward (fused attention, norms once, weights laid
    # out once), which fires these hooks with the eager values up to float32 rounding
    with model.hooks(fwd_hooks=hooks), evaluator_forward(model):
        for rows, used in longest_first(mask, batch_size):
            batch, real = tokens[rows, used], mask[rows, used]
            state["mask"] = real.to(model.cfg.device)
            run_to_resid(model, batch.to(model.cfg.device), real.long().to(model.cfg.device), stop=L)
            count += int(real.sum())
            bar.update(len(batch))
    bar.close()
    if not bool(torch.isfinite(total).all()):  # a NaN influence would rank a broken layer as any other
        layer = int(torch.nonzero((~torch.isfinite(total)).any(0))[0, 0])
        first = tokens[0][mask[0]].tolist()
        raise NonFiniteError(f"block influence: layer {layer}'s influence is NaN or infinite, so no layer score is "
                             f"computed; on input 0, {where_nonfinite(model, first)}")
    return (total[0] / count).float(), (total[1] / count).float()
