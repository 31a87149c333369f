"""Attention rank collapse: the approximate rank of each head's attention matrix, layer by layer.

Approximate rank at energy e (Sanyal et al., "When Attention Collapses", arXiv 2404.08634): with singular values
s_1 >= s_2 >= ... of an attention matrix A (T x T), the smallest k with sum_{i<=k} s_i^2 / sum_i s_i^2 >= e.
A layer whose heads all have (near) rank one attends the same way from every query ("lazy layer").

Three aggregations over the N inputs (``aggregation``; every profile, table and figure names the one it shows):

- ``"matrix"`` (the default, as the authors' public demo code computes it): each head's attention matrices are
  averaged over the inputs first and the approximate rank is taken of that mean T x T matrix; a layer's "max
  rank" is the maximum over its heads (whole numbers).
- ``"rank"`` (``average=False``): the rank of each input's own matrix, averaged over the inputs per head; a layer's
  max/mean rank is the max/mean over its heads of those averages.
- ``"layer_rank"`` (the paper's figures: fractional ranks with bands): the rank of each input's own matrix; per
  input, the layer's max and mean over its heads; then the mean over the inputs, with a band of one standard
  deviation over the inputs (``max_rank_sd``, ``mean_rank_sd``).

m*: the fewest key columns holding 90% of the attention mass (column sums of the same matrices: the averaged one,
or each input's, averaged), averaged over the heads of the layer.

`attention_rank` streams: a forward hook on each ``blocks.{l}.attn.hook_pattern`` reduces the batch's patterns
to ranks (one batched ``torch.linalg.svdvals`` per layer) and drops them, so no activation cache is kept.
Padding does not change a rank: padded rows and columns are zeroed, which only adds zero singular values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from lens_heads.collapse.rank_settings import AGGREGATIONS, RankSettings
from lens_heads.data.inputs import longest_first, tokenize_inputs
from lens_heads.heads.scores import what_still_works
from lens_heads.models.backends import check_attention_hooks, get_act_name, run_to_resid
from lens_heads.models.nonfinite import refuse_nonfinite_values, where_nonfinite
from lens_heads.plumbing.errors import InputError, NonFiniteError
from lens_heads.plumbing.values import keywords, laid_over

if TYPE_CHECKING:  # HookedTransformer is TransformerLens 3.9 only
    from transformer_lens import HookedTransformer


# Cumulative energies are compared with this slack so that exact ties (identity: k/T == e) count as reached.
_ENERGY_TOL = 1e-6


def approx_rank(A: Float[Tensor, "... q k"], energy: float = 0.9) -> Int[Tensor, "..."]:
    """Smallest k with (s_1^2 + ... + s_k^2) / sum_i s_i^2 >= ``energy`` for each matrix of ``A`` (batched SVD).

    A zero matrix has rank 0.
    """
    if not 0 < energy <= 1:
        raise InputError(f"energy must be in (0, 1], got {energy}")
    # a NaN matrix has a NaN energy, which the rule below would read as rank 0 (a "lazy" head)
    refuse_nonfinite_values(A, "approx_rank", "a NaN attention pattern has no rank")
    # float32 SVD (half the cost of float64); energies are summed in float64
    s2 = torch.linalg.svdvals(A if A.dtype in (torch.float32, torch.float64) else A.float()).double() ** 2
    total = s2.sum(-1, keepdim=True)
    cum = s2.cumsum(-1) / total.clamp_min(torch.finfo(torch.float64).tiny)
    rank = (cum < energy - _ENERGY_TOL).sum(-1) + 1
    return torch.where(total.squeeze(-1) > 0, rank, torch.zeros_like(rank))


def mass_columns(A: Float[Tensor, "... q k"], mass: float = 0.9) -> Int[Tensor, "..."]:
    """m*: the fewest key columns of ``A`` that together hold ``mass`` of its total attention (column sums)."""
    col = A.double().sum(-2).sort(-1, descending=True).values
    total = col.sum(-1, keepdim=True)
    cum = col.cumsum(-1) / total.clamp_min(torch.finfo(torch.float64).tiny)
    count = (cum < mass - _ENERGY_TOL).sum(-1) + 1
    return torch.where(total.squeeze(-1) > 0, count, torch.zeros_like(count))


@dataclass
class RankProfile:
    """Attention rank of every head of a model on some inputs.

    ``aggregation``: how the inputs were combined (:data:`AGGREGATIONS`). ``per_head [L, H]``: approximate rank
    (the rank of the input-averaged matrix for ``"matrix"``, else the mean over inputs of each input's rank).
    ``max_rank``/``mean_rank [L]``: max/mean over the heads of a layer: of ``per_head``, or, for ``"layer_rank"``,
    taken per input and then averaged over inputs, with their standard deviations over inputs in
    ``max_rank_sd``/``mean_rank_sd`` (None otherwise). ``mass_columns [L]``: m*, the mean over heads (and inputs)
    of the key columns holding 90% of the mass. ``lazy [L]``: the layers that ``lazy_rule`` flags. ``per_input
    [N, L, H]``: per-input ranks (None for ``"matrix"``).
    """

    per_head: np.ndarray
    max_rank: np.ndarray
    mean_rank: np.ndarray
    mass_columns: np.ndarray
    mass_per_head: np.ndarray
    lazy: np.ndarray
    lazy_rule: str
    per_input: np.ndarray | None = None
    meta: dict = field(default_factory=dict)
    definition: str = ""
    aggregation: str = "matrix"
    max_rank_sd: np.ndarray | None = None
    mean_rank_sd: np.ndarray | None = None

    @property
    def n_layers(self) -> int:
        return self.per_head.shape[0]

    def lazy_layers(self) -> list[int]:
        return [int(i) for i in np.flatnonzero(self.lazy)]

    def to_dataframe(self) -> pd.DataFrame:
        """One row per (layer, head), with the layer's statistics repeated on each of its rows."""
        L, H = self.per_head.shape
        layer, head = np.divmod(np.arange(L * H), H)
        return pd.DataFrame({
            "layer": layer, "head": head, "rank": self.per_head.ravel(), "mass_columns": self.mass_per_head.ravel(),
            "layer_max_rank": self.max_rank[layer], "layer_mean_rank": self.mean_rank[layer],
            "layer_mass_columns": self.mass_columns[layer], "lazy": self.lazy[layer],
        })

    def layer_dataframe(self) -> pd.DataFrame:
        """One row per layer, with the aggregation it shows (and the bands, for ``"layer_rank"``)."""
        bands = {} if self.max_rank_sd is None else {"max_rank_sd": self.max_rank_sd, "mean_rank_sd": self.mean_rank_sd}
        return pd.DataFrame({"layer": np.arange(self.n_layers), "max_rank": self.max_rank,
                             "mean_rank": self.mean_rank, **bands, "mass_columns": self.mass_columns,
                             "lazy": self.lazy, "aggregation": self.aggregation})

    def to_dict(self) -> dict:
        return {"per_head": self.per_head.tolist(), "max_rank": self.max_rank.tolist(),
                "mean_rank": self.mean_rank.tolist(), "mass_columns": self.mass_columns.tolist(),
                "lazy": self.lazy.tolist(), "lazy_rule": self.lazy_rule, "definition": self.definition,
                "aggregation": self.aggregation,
                "max_rank_sd": None if self.max_rank_sd is None else self.max_rank_sd.tolist(),
                "mean_rank_sd": None if self.mean_rank_sd is None else self.mean_rank_sd.tolist(), "meta": self.meta}


@keywords(RankSettings)  # the signature names the settings' fields taken as keywords
def attention_rank(
    model: HookedTransformer,
    inputs,
    *,
    settings: RankSettings | None = None,
    average: bool = True,
    max_len: int | None = None,
    batch_size: int = 8,
    progress: bool = True,
    **options,
) -> RankProfile:
    """Approximate attention rank of every head (hooks on ``hook_pattern`` only; no activation cache).

    ``inputs``: anything `lens_heads.data.inputs.tokenize_inputs` accepts (a token tensor [N, T], lists of token
    sequences of different lengths, strings, a Task). ``aggregation`` (:data:`AGGREGATIONS`, module docstring):
    ``"matrix"`` (``average=True``, the default): the rank of the mean matrix over inputs, all cut to the shortest
    input's length; ``"rank"`` (``average=False``): the rank of each input's T x T matrix (padding excluded),
    averaged over inputs; ``"layer_rank"``: each input's ranks, the layer's max/mean over heads per input, then
    averaged with a one-standard-deviation band (the paper's figures).

    ``settings`` (:class:`lens_heads.collapse.rank_settings.RankSettings`, or its fields as keywords laid over it:
    ``aggregation``, ``energy``, ``mass``, ``lazy_rank``): what is measured; ``meta["settings"]`` records it whole,
    its aggregation resolved.

    A layer is lazy when every head's rank is at most ``lazy_rank``. The default 2 counts a head whose attention
    is one column (a sink: rank 1) or a sink with a weak second pattern, and not uniform causal averaging, the
    attention of an untrained layer, whose rank at 90% energy is 5 for T = 64..128: a threshold of 5 or more would
    call every freshly initialised layer lazy.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InputError(f"attention_rank: batch_size must be a whole number >= 1, got {batch_size!r}")
    settings = laid_over(RankSettings, settings, options, argument="settings", what="rank settings")
    aggregation = check_aggregation(settings.aggregation, average)
    energy, mass, lazy_rank = settings.energy, settings.mass, settings.lazy_rank
    average = aggregation == "matrix"
    tokens, mask = tokenize_inputs(model, inputs, max_len=max_len)
    tokens, mask = tokens.to(model.cfg.device), mask.to(model.cfg.device)
    if average:
        length = int(mask.sum(1).min())
        tokens, mask = tokens[:, :length], mask[:, :length]
    check_attention_hooks(model, ["hook_pattern"], uses="attention rank", advice=what_still_works)
    ranks, masses, pattern_sum = _collect(model, tokens, mask, average=average, energy=energy, mass=mass,
                                          batch_size=batch_size, progress=progress)
    per_head, mass_per_head, per_input, layer_max, layer_mean, bands = _aggregate(
        aggregation, ranks, masses, pattern_sum, energy, mass)
    lengths, n = mask.sum(1).float(), tokens.shape[0]
    mode = AGGREGATIONS[aggregation]
    meta = {
        "model": getattr(model, "lens_heads_meta", {}).get("name", model.cfg.model_name),
        "n_inputs": n, "mean_length": float(lengths.mean()), "min_length": int(lengths.min()),
        "max_length": int(lengths.max()), "average": average, "aggregation": aggregation, "mode": mode,
        "energy": energy, "mass": mass,
        "settings": RankSettings(aggregation, energy, mass, lazy_rank).to_dict(),
    }
    return RankProfile(
        per_head=per_head, max_rank=layer_max, mean_rank=layer_mean,
        mass_columns=mass_per_head.mean(1), mass_per_head=mass_per_head,
        lazy=layer_max <= lazy_rank,
        lazy_rule=(f"lazy: the layer's max rank over heads, averaged over inputs, is <= {lazy_rank:g}"
                   if aggregation == "layer_rank" else f"lazy: every head of the layer has approximate rank <= "
                   f"{lazy_rank:g}") + f" ({energy:.0%} spectral energy; {mode})",
        per_input=per_input, meta=meta, aggregation=aggregation, **bands,
        definition=rank_definition(aggregation, energy, mass, n, int(lengths.max())),
    )


ROW_SUM_TOL = 0.05  # bfloat16 softmax rows sum to 1 within ~1e-2; a zeroed NaN row sums to 0


def _collect(model, tokens: Tensor, mask: Tensor, *, average: bool, energy: float, mass: float, batch_size: int,
             progress: bool) -> tuple[Tensor, Tensor, list]:
    """One pass over the inputs with hooks on ``hook_pattern``: per input, layer and head the rank and the columns
    holding ``mass`` (``average=False``), or per layer the sum of the patterns (``average=True``)."""
    n, L, H = tokens.shape[0], model.cfg.n_layers, model.cfg.n_heads
    ranks, masses = torch.zeros(n, L, H), torch.zeros(n, L, H)
    pattern_sum = [None] * L
    batch: dict = {}  # the rows of the batch in flight and their mask
    broken: list[tuple[int, int]] = []  # (input, layer) of the first pattern holding NaN or infinity

    def hook(pattern: Float[Tensor, "batch head q k"], hook):
        layer = hook.layer()
        rows, valid = batch["rows"], batch["mask"]
        pair = valid[:, None, :, None] & valid[:, None, None, :]
        # a real query's row sums to 1: TransformerLens writes a NaN softmax as zeros, so a row that does not is one
        row_sums = pattern.detach().double().sum(-1)
        bad = ((~torch.isfinite(pattern.detach()) & pair).flatten(1).any(1)
               | (((row_sums - 1).abs() > ROW_SUM_TOL) & valid[:, None, :]).flatten(1).any(1))
        if bool(bad.any()):
            if not broken:
                broken.append((int(rows[torch.nonzero(bad)[0, 0]]), layer))
            return
        # zero rows/columns of padding (where, not a product: a padded row may hold NaN): only zero singular values
        pattern = torch.where(pair, pattern.detach(), torch.zeros((), dtype=pattern.dtype, device=pattern.device))
        if average:  # every input is cut to the shortest, so every batch has all the columns
            s = pattern.double().sum(0)
            pattern_sum[layer] = s if pattern_sum[layer] is None else pattern_sum[layer] + s
        else:
            ranks[rows, layer] = approx_rank(pattern, energy).float().cpu()
            masses[rows, layer] = mass_columns(pattern, mass).float().cpu()

    hooks = [(get_act_name("pattern", layer), hook) for layer in range(L)]
    bar = tqdm(total=n, desc="attention rank", disable=not progress, unit="input")
    with torch.no_grad():
        for rows, used in longest_first(mask, batch_size):  # alike lengths together: little padding to decompose
            batch.update(rows=rows, mask=mask[rows, used])
            # attention_mask keeps padded keys out of softmax where the model supports it; right padding with
            # causal attention leaves the valid block unchanged either way.
            with model.hooks(fwd_hooks=hooks):
                run_to_resid(model, tokens[rows, used], batch["mask"].long(), stop=L)
            bar.update(len(rows))
            if broken:  # a NaN pattern read as a number would be rank 0: a "lazy" layer that is a broken one
                k, layer = broken[0]
                raise NonFiniteError(
                    f"attention rank: input {k}'s attention pattern at layer {layer} ({get_act_name('pattern', layer)}) "
                    f"is NaN or infinite, so no rank is computed; {where_nonfinite(model, tokens[k][mask[k]].tolist())}")
    bar.close()
    return ranks, masses, pattern_sum


def _aggregate(aggregation: str, ranks: Tensor, masses: Tensor, pattern_sum: list, energy: float, mass: float):
    """Per head and per layer from what the forward collected: the rank of the summed (mean) matrices, or the
    per-input ranks averaged; ``"layer_rank"`` takes the layer's statistic per input first and adds its bands."""
    bands = {}
    if aggregation == "matrix":
        mean_pattern = torch.stack(pattern_sum) / ranks.shape[0]  # [L, H, T, T]
        per_head = approx_rank(mean_pattern, energy).float().cpu().numpy()
        mass_per_head = mass_columns(mean_pattern, mass).float().cpu().numpy()
        per_input = None
    else:
        per_head = ranks.mean(0).numpy()
        mass_per_head = masses.mean(0).numpy()
        per_input = ranks.numpy().astype(np.int64)
    layer_max, layer_mean = per_head.max(1), per_head.mean(1)
    if aggregation == "layer_rank":  # the SVD per input, the layer statistic per input, then the mean over inputs
        assert per_input is not None  # set for every aggregation but "matrix"
        per_input_max, per_input_mean = per_input.max(2).astype(float), per_input.mean(2)
        layer_max, layer_mean = per_input_max.mean(0), per_input_mean.mean(0)
        ddof = 1 if ranks.shape[0] > 1 else 0
        bands = dict(max_rank_sd=per_input_max.std(0, ddof=ddof), mean_rank_sd=per_input_mean.std(0, ddof=ddof))
    return per_head, mass_per_head, per_input, layer_max, layer_mean, bands


def check_aggregation(aggregation: str | None, average: bool = True) -> str:
    """The aggregation named (or the one ``average`` stands for); an unknown name or a contradiction is refused."""
    if aggregation is None:
        return "matrix" if average else "rank"
    if aggregation not in AGGREGATIONS:
        raise InputError(f"attention_rank: unknown aggregation {aggregation!r}: choose one of "
                         f"{', '.join(AGGREGATIONS)}")
    if aggregation == "matrix" and not average:
        raise InputError("attention_rank: average=False contradicts aggregation='matrix' (the averaged matrix): give "
                         "one of them")
    return aggregation


def rank_definition(aggregation: str, energy: float, mass: float, n: int, length: int) -> str:
    """One sentence saying what a rank figure shows, its aggregation first, to print beside it."""
    how = {"matrix": f"of each head's attention matrix averaged over N={n} inputs of T<={length} tokens",
           "rank": f"of each input's attention matrix, averaged over N={n} inputs of T<={length} tokens",
           "layer_rank": f"of each input's attention matrix (N={n} inputs of T<={length} tokens)"}[aggregation]
    layer = ("max rank = max over the heads of a layer per input, then the mean over inputs (band: one standard "
             "deviation over inputs)" if aggregation == "layer_rank" else "max rank = max over the heads of a layer")
    return (f"aggregation {aggregation!r}: approximate rank = fewest singular values holding {energy:.0%} of the "
            f"squared spectrum, {how}; {layer}; m* = fewest key columns holding {mass:.0%} of the attention mass, "
            "mean over heads")
