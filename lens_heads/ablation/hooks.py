"""Ablate attention heads through ``hook_z``: a static set, per-input thresholds on a head score, random draws
(:mod:`lens_heads.ablation.random_draws`), or each input's own set.

Every ablation replaces a head's output ``z`` (``blocks.{l}.attn.hook_z``, before ``W_O``) with zeros (or with its
mean over calibration data), so the head's contribution ``z_h @ W_O[h]`` leaves the residual stream; ``b_O`` stays.

Hooks are TransformerLens ``(hook_name, fn)`` pairs. Modes that decide per input are :class:`HeadAblation`
objects: their ``.hooks`` go wherever hooks go (``model.run_with_hooks``, ``model.hooks(...)``,
:func:`lens_heads.evaluation.evaluate`), and they count what they ablated (``share_zeroed()``). The caller says, per batch,
which inputs its rows are and which positions are real: ``with ablation.batch(attention_mask, first=i):
model(tokens)`` (rows are inputs ``i, i+1, ...``) or ``batch(attention_mask, inputs=[...])`` (one id per row; the
evaluator does this for you). Outside such a block every position counts, and the random mode refuses to run (it
draws per input, so it must know which input each row is).

Shared prefixes (:mod:`lens_heads.evaluation.prefix`): each hook says whether its action at a position depends on the rest of
the row (``prefix_scope``): static zeroing, mean ablation and :func:`zero_heads` act alike on every row (``"any"``),
random (drawn per input) and per-input zeroing alike on the rows of one input (``"item"``), and the threshold zeroing
(which decides from the whole row) and random zeroing drawn per row (each row its own heads) on one row only (None),
so the evaluator runs them row by row.

Composition: hooks on the same hook point run in the order given. List an ablation before scoring hooks to score the
ablated output; two ablations compose (a head ablated by either stays ablated).
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterable, Iterator, Sequence

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from lens_heads.data.inputs import tokenize_inputs
from lens_heads.evaluation.ablation_interface import HookFn, HookPair, UnitAblation
from lens_heads.evaluation.fused_attention import fused_attention
from lens_heads.evaluation.packed_weights import packed_weights
from lens_heads.evaluation.prefix import mark
from lens_heads.heads.attention_rows import DEFAULT_QUERY_CHUNK, check_query_chunk, pattern_source, rows_from
from lens_heads.heads.scores import EXTRA_NAMES, SCORE_NAMES, get_score, inactive, scores_of_layer, what_still_works
from lens_heads.models.backends import check_attention_hooks, get_act_name
from lens_heads.models.capture import LayerCapture
from lens_heads.models.loading import expand_kv
from lens_heads.models.nonfinite import where_nonfinite
from lens_heads.plumbing.errors import InputError, NonFiniteError

Rule = Callable[[int, Float[Tensor, "batch pos head d_head"], dict], Bool[Tensor, "batch head"]]
ABLATIONS = ("zero", "mean")  # what replaces an ablated head's z: zeros, or its mean (mean_z)
DRAWS = ("per_item", "per_row")  # random zeroing: one draw for all rows of an input, or one for every forward row


def zero_heads(
    heads: Iterable[tuple[int, int]],
    *,
    ablation: str = "zero",
    means: Float[Tensor, "layer head d_head"] | None = None,
) -> list[HookPair]:
    """Hooks that zero (``ablation="zero"``) or mean-ablate (``ablation="mean"``, needs ``means`` from :func:`mean_z`) a
    fixed set of ``(layer, head)`` pairs at every position of every input. One hook per affected layer."""
    _check_ablation(ablation, means)
    by_layer: dict[int, list[int]] = {}
    for layer, head in heads:
        if int(layer) < 0 or int(head) < 0:
            raise InputError(f"zero_heads: (layer, head) = ({layer}, {head}) is negative: give indices from 0")
        by_layer.setdefault(int(layer), []).append(int(head))

    def make(layer: int, chosen: list[int]) -> HookFn:
        def hook(z: Float[Tensor, "batch pos head d_head"], hook=None) -> Tensor:
            if max(chosen) >= z.shape[2]:
                raise InputError(f"zero_heads: layer {layer} has {z.shape[2]} heads, so heads {sorted(chosen)} "
                                 f"include some it does not have: give heads 0..{z.shape[2] - 1}")
            ablate = torch.zeros(z.shape[2], dtype=torch.bool, device=z.device)
            ablate[chosen] = True
            return _replace(z, ablate.expand(z.shape[0], -1), None if means is None else means[layer])

        return hook

    return [(get_act_name("z", layer), mark(make(layer, chosen), "any")) for layer, chosen in sorted(by_layer.items())]


class HeadAblation(UnitAblation):
    """Hooks that zero or mean-ablate (``ablation``), in every layer, the heads a rule picks for each input, and count
    what they ablated (an :class:`~lens_heads.evaluation.ablation_interface.Ablation` that is told each batch).

    Built by :func:`static_zeroing`, :func:`threshold_zeroing` or
    :func:`~lens_heads.ablation.random_draws.random_zeroing`. ``rule(layer, z, acts)`` returns ``Bool[batch, head]``
    (True = ablate); ``acts`` holds the layer's captured ``pattern``/``v`` (when the rule needs them), the batch's
    ``mask`` and the ``inputs`` (input ids of the batch rows, None outside :meth:`batch`) and the ``rows`` (each
    row's key among the rows of its input, where the caller gave them).
    ``prefix_scope``: over which rows the rule decides alike at every position, so that a shared prefix may be
    computed once for them (``"any"``, ``"item"``; None: it reads the whole row or draws per row, see
    :mod:`lens_heads.evaluation.prefix`). ``reads_rows``: the rule needs the rows' keys (the evaluator passes them).
    ``cache_exact``: the rule's heads for a row do not change as its sequence grows (a fixed set per input: static,
    per-input sets, random draws), so generation may keep a key/value cache; a threshold zeroing decides from the
    whole sequence, and is not.
    """

    per_input = True  # the rule decides per input, and what it ablates is counted per input
    counts_inputs = True

    def __init__(self, n_layers: int, n_heads: int, rule: Rule, *, description: str,
                 capture: Sequence[str] | Callable[[int], Sequence[str]] = (),
                 ablation: str = "zero", means: Tensor | None = None, prefix_scope: str | None = None,
                 reads_rows: bool = False, cache_exact: bool = False):
        _check_ablation(ablation, means)
        self.prefix_scope = prefix_scope
        self.cache_exact = cache_exact
        self.reads_rows = reads_rows  # the rule tells the rows of one input apart: the evaluator passes rows=
        self.n_layers, self.n_heads = n_layers, n_heads
        self.description = description
        self.ablation, self.means = ablation, means
        self._rule = rule
        self._capture = LayerCapture(n_layers, self.ablate, capture)
        self._mask: Tensor | None = None
        self._inputs: Tensor | int | None = None
        self._rows: Tensor | None = None
        self._counting = True
        self.reset()

    # ------------------------------------------------------------ what the caller sees

    @property
    def hooks(self) -> list[HookPair]:
        """TransformerLens ``(hook_name, fn)`` pairs: each layer's captures, then its ``hook_z``."""
        return self._capture.hooks

    @contextlib.contextmanager
    def batch(self, attention_mask: Bool[Tensor, "batch pos"] | None = None, *, first: int | None = None,
              inputs: Int[Tensor, "batch"] | Sequence[int] | None = None,
              rows: Int[Tensor, "batch"] | Sequence[int] | None = None,
              count: bool = True) -> Iterator["HeadAblation"]:
        """Tell the hooks, for the forward passes inside the block, which positions are real (``attention_mask``;
        None: all) and which input each batch row is: ``first`` (rows are inputs ``first, first+1, ...``) or
        ``inputs`` (one id per row; the random mode draws per input, so rows of the same input, e.g. the choices of
        one question, get the same draw). Give exactly one of ``first`` and ``inputs``. ``rows``: one key per row
        telling the rows of one input apart (the evaluator gives each row's first choice), for a random draw per
        row. ``count=False``: what the block ablates is not counted (a shared prefix, whose rows are counted in
        their own forwards)."""
        if (first is None) == (inputs is None):
            raise InputError("HeadAblation.batch() needs the batch's first input index (first=) or one input id per "
                             "row (inputs=), not both")
        self._mask = None if attention_mask is None else attention_mask.bool()
        self._inputs = (torch.as_tensor(inputs, dtype=torch.long).reshape(-1) if inputs is not None else
                        None if first is None else int(first))
        self._rows = None if rows is None else torch.as_tensor(rows, dtype=torch.long).reshape(-1)
        self._counting = count
        try:
            yield self
        finally:
            self._mask, self._inputs, self._rows, self._counting = None, None, None, True

    def reset(self) -> None:
        """Forget what was counted so far."""
        self._zeroed: list[list[Tensor]] = [[] for _ in range(self.n_layers)]
        self._zeroed_inputs: list[Tensor | None] = []  # per batch counted in layer 0: its input ids (None: unknown)

    def snapshot(self) -> list[int]:
        """How many batches each layer has counted: :meth:`restore` forgets what came after (a failed attempt)."""
        return [len(rows) for rows in self._zeroed]

    def restore(self, snapshot: list[int]) -> None:
        self._zeroed = [rows[:n] for rows, n in zip(self._zeroed, snapshot)]
        self._zeroed_inputs = self._zeroed_inputs[:snapshot[0]]

    def zeroed(self) -> Bool[Tensor, "input layer head"]:
        """Which heads were ablated for each input row seen since the last :meth:`reset`, in order of arrival."""
        if not self._zeroed[0]:
            return torch.zeros(0, self.n_layers, self.n_heads, dtype=torch.bool)
        return torch.stack([torch.cat(rows) for rows in self._zeroed], dim=1)

    def share_zeroed(self) -> float:
        """Realised share of heads ablated: ablated (input, head) pairs / (inputs x heads), averaged over layers."""
        counts = [sum(int(m.sum()) for m in rows) for rows in self._zeroed]
        seen = [sum(m.shape[0] for m in rows) for rows in self._zeroed]
        if not all(seen):
            return float("nan")
        return sum(c / (s * self.n_heads) for c, s in zip(counts, seen)) / self.n_layers

    def zeroed_by_input(self) -> dict[int, tuple[int, int]]:
        """Per input id: (rows counted, (layer, head) pairs ablated over those rows). The realised share of any
        subset of inputs is its summed pairs / (its rows x layers x heads), which is what a bootstrap over items
        resamples. Empty where the batches were not told their inputs."""
        if not self._zeroed[0] or any(ids is None for ids in self._zeroed_inputs):
            return {}
        ids = torch.cat([ids for ids in self._zeroed_inputs if ids is not None])
        pairs = self.zeroed().flatten(1).sum(1)
        out: dict[int, tuple[int, int]] = {}
        for i, n in zip(ids.tolist(), pairs.tolist()):
            rows, total = out.get(i, (0, 0))
            out[i] = (rows + 1, total + int(n))
        return out

    def __repr__(self) -> str:
        return f"HeadAblation({self.description}, ablation={self.ablation!r})"

    # ------------------------------------------------------------ the hooks

    def captures(self, layer: int) -> tuple[str, ...]:
        """The activations (``get_act_name`` names) layer ``layer``'s rule reads, captured before its ``hook_z``."""
        return tuple(self._capture.capture(layer))

    def ablate(self, layer: int, z: Float[Tensor, "batch pos head d_head"], acts: dict) -> Tensor:
        """Layer ``layer``'s ``hook_z``: the rule's heads of ``z`` ablated (and counted), ``acts`` the layer's
        captures (:meth:`captures`) for the same rows."""
        acts["mask"] = self._batch_mask(z)
        acts["inputs"] = self._batch_inputs(z)
        acts["rows"] = self._batch_rows(z)
        ablate = self._rule(layer, z, acts).to(torch.bool)
        if ablate.shape != (z.shape[0], self.n_heads):
            raise RuntimeError(f"ablation rule returned shape {tuple(ablate.shape)}, expected "
                               f"{(z.shape[0], self.n_heads)}")
        if self._counting:
            self._count(layer, ablate, acts["inputs"])
        if not ablate.any():
            return z
        return _replace(z, ablate.to(z.device), None if self.means is None else self.means[layer])

    def _count(self, layer: int, ablate: Tensor, inputs: Tensor | None) -> None:
        self._zeroed[layer].append(ablate.detach().cpu())
        if layer == 0:
            self._zeroed_inputs.append(None if inputs is None else inputs.detach().cpu())

    def _batch_mask(self, z: Tensor) -> Bool[Tensor, "batch pos"]:
        if self._mask is None:
            return torch.ones(z.shape[:2], dtype=torch.bool, device=z.device)
        if tuple(self._mask.shape) != tuple(z.shape[:2]):
            raise InputError(f"the attention mask given to HeadAblation.batch() has shape {tuple(self._mask.shape)} "
                             f"but the forward pass has [batch, pos] = {tuple(z.shape[:2])}: pass the mask of the "
                             "tokens being run")
        return self._mask.to(z.device)

    def _batch_inputs(self, z: Tensor) -> Int[Tensor, "batch"] | None:
        if isinstance(self._inputs, int):
            return torch.arange(self._inputs, self._inputs + z.shape[0])
        if self._inputs is not None and self._inputs.numel() != z.shape[0]:
            raise InputError(f"HeadAblation.batch() was given {self._inputs.numel()} input ids for a batch of "
                             f"{z.shape[0]} rows")
        return self._inputs

    def _batch_rows(self, z: Tensor) -> Int[Tensor, "batch"] | None:
        if self._rows is not None and self._rows.numel() != z.shape[0]:
            raise InputError(f"HeadAblation.batch() was given {self._rows.numel()} row keys for a batch of "
                             f"{z.shape[0]} rows")
        return self._rows


# ---------------------------------------------------------------- the three modes


def static_zeroing(model, heads: Iterable[tuple[int, int]], *, ablation: str = "zero",
                   means: Tensor | None = None) -> HeadAblation:
    """Ablate a fixed set of ``(layer, head)`` pairs for every input, counting the share like the other modes
    (the static pruning view: what removing these heads for good would do)."""
    check_attention_hooks(model, ["hook_z"], uses="zeroing heads", advice=what_still_works)
    chosen = _head_mask(model, heads)

    def rule(layer: int, z: Tensor, acts: dict) -> Tensor:
        return chosen[layer].to(z.device).expand(z.shape[0], -1)

    return HeadAblation(model.cfg.n_layers, model.cfg.n_heads, rule, description=f"static: {int(chosen.sum())} heads",
                        ablation=ablation, means=means, prefix_scope="any", cache_exact=True)


def input_zeroing(model, heads_by_input: Sequence[Iterable[tuple[int, int]]], *, ablation: str = "zero",
                  means: Tensor | None = None) -> HeadAblation:
    """Ablate, for input ``i``, its own fixed set ``heads_by_input[i]`` of ``(layer, head)`` pairs (the front of a
    per-input ranking, such as each input's own attribution). Input ids come from :meth:`HeadAblation.batch` (the
    evaluator passes item indices, so every row of a question loses the same heads)."""
    check_attention_hooks(model, ["hook_z"], uses="zeroing heads", advice=what_still_works)
    if len(heads_by_input) == 0:
        raise InputError("input_zeroing: heads_by_input is empty: give one head set per input of the task")
    chosen = torch.stack([_head_mask(model, heads) for heads in heads_by_input])  # [input, layer, head]

    def rule(layer: int, z: Tensor, acts: dict) -> Tensor:
        ids = acts["inputs"]
        if ids is None:
            raise InputError("per-input zeroing reads which input each row is: run the forward inside "
                             "`with ablation.batch(attention_mask, inputs=...)`, or use evaluate()")
        if int(ids.min()) < 0 or int(ids.max()) >= chosen.shape[0]:
            raise InputError(f"input {int(ids.max())} has no head set: heads_by_input holds {chosen.shape[0]}, give "
                             "one per input of the evaluated task")
        return chosen[ids.cpu(), layer].to(z.device)

    return HeadAblation(model.cfg.n_layers, model.cfg.n_heads, rule, ablation=ablation, means=means, prefix_scope="item",
                        description=f"per input: {chosen.shape[0]} head sets", cache_exact=True)


def _head_mask(model, heads: Iterable[tuple[int, int]]) -> Bool[Tensor, "layer head"]:
    """``heads`` marked in a [layer, head] mask, refusing any head the model does not have."""
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    chosen = torch.zeros(n_layers, n_heads, dtype=torch.bool)
    for layer, head in heads:
        if not (0 <= layer < n_layers and 0 <= head < n_heads):
            raise InputError(f"head ({layer}, {head}) is outside the model's {n_layers} layers x {n_heads} heads")
        chosen[layer, head] = True
    return chosen


def threshold_zeroing(model, score_name: str, threshold: float, *, ablation: str = "zero",
                      means: Tensor | None = None, query_chunk: int = DEFAULT_QUERY_CHUNK) -> HeadAblation:
    """The paper's per-input zeroing: in each layer, inside the same forward pass, compute ``score_name`` (one of
    the twelve, or an extra such as LTHON (HN) or the full-head-output AHON (full)) for every head of every input
    from that layer's attention pattern, ``hook_v`` (KV-expanded) and ``hook_z`` (capturing only
    those the score reads; the pattern is read ``query_chunk`` rows at a time from the layer's queries and keys
    where the layer can run fused, :mod:`lens_heads.heads.attention_rows`, so the attention stays fused and no layer's
    whole pattern is held), and ablate
    the heads whose score crosses ``threshold`` on the inactive side (``>`` for AWFT scores, ``<`` otherwise;
    strict), at all positions. Later layers are therefore scored on the already-ablated stream. Only non-padding
    positions count (give the mask with :meth:`HeadAblation.batch`). The decision reads the whole row, so the
    evaluator runs this mode row by row: it never computes a shared prefix once (``prefix_scope`` None,
    :mod:`lens_heads.evaluation.prefix`)."""

    if score_name not in SCORE_NAMES + EXTRA_NAMES:
        raise InputError(f"unknown score {score_name!r}: choose one of {SCORE_NAMES + EXTRA_NAMES}")
    score = get_score(score_name)
    direction, n_heads = score.direction, model.cfg.n_heads
    threshold = float(threshold)
    check_query_chunk(query_chunk)
    capture = tuple(name for name in ("v", "pattern") if name in score.reads)
    # the full-head-output scores measure z through the head's slice of W_O: [layer, head, d_head, d_model]
    W_O = model.W_O.detach() if score_name in EXTRA_NAMES else None
    check_attention_hooks(model, ["hook_z", *(f"hook_{name}" for name in capture)], uses=f"zeroing by {score_name}",
                          advice=what_still_works)

    def captured(layer: int) -> tuple[str, ...]:
        return tuple(x for name in capture for x in (pattern_source(model, layer) if name == "pattern" else (name,)))

    def rule(layer: int, z: Tensor, acts: dict) -> Tensor:
        if any(name not in acts for name in captured(layer)):
            raise RuntimeError(f"layer {layer}: hook_{'/hook_'.join(captured(layer))} were not captured before "
                               "hook_z; pass all of HeadAblation.hooks to the model")
        # float32 as in score_heads, so thresholds read off its CDF mean the same here
        v = expand_kv(acts["v"], n_heads).float() if "v" in acts else None
        source = rows_from(model, layer, acts, acts["mask"]) if "pattern" in capture else None
        pattern, query_keys = (source.float(), None) if isinstance(source, Tensor) else (None, source)
        w = W_O[layer].to(z.device).float() if W_O is not None else None
        scores = scores_of_layer(pattern, v, z.float(), acts["mask"], [score], W_O=w, query_keys=query_keys,
                                 query_chunk=query_chunk)[..., 0]
        return inactive(scores, direction, threshold)

    return HeadAblation(model.cfg.n_layers, n_heads, rule, capture=captured, ablation=ablation, means=means,
                        description=f"threshold: {score_name} {direction} {threshold:.6g}",
                        cache_exact=False)  # it decides from the whole sequence, which grows at every step


# ---------------------------------------------------------------- mean ablation


@torch.no_grad()
def mean_z(model, inputs, *, attention_mask: Tensor | None = None, batch_size: int = 8,
           progress: bool = False) -> Float[Tensor, "layer head d_head"]:
    """Mean of every head's ``hook_z`` over the non-padding positions of calibration ``inputs`` (what
    ``ablation="mean"`` substitutes). ``inputs``: strings, a Task (its prompts) or a token tensor."""

    if attention_mask is None:
        tokens, mask = tokenize_inputs(model, inputs)
    else:
        tokens, mask = inputs, attention_mask.bool()
    cfg = model.cfg
    total = torch.zeros(cfg.n_layers, cfg.n_heads, cfg.d_head, dtype=torch.float64)
    count = 0

    def make(layer: int) -> HookFn:
        def hook(z: Tensor, hook=None) -> None:
            keep = batch_mask.to(z.device)[:, :, None, None]
            total[layer] += (z * keep).sum(dim=(0, 1)).double().cpu()

        return hook

    hooks = [(get_act_name("z", layer), make(layer)) for layer in range(cfg.n_layers)]
    with fused_attention(model), packed_weights(model):  # only hook_z is read
        for start in tqdm(range(0, tokens.shape[0], batch_size), desc="mean z", disable=not progress, leave=False):
            batch_tokens, batch_mask = tokens[start:start + batch_size], mask[start:start + batch_size]
            model.run_with_hooks(batch_tokens.to(cfg.device), attention_mask=batch_mask.to(cfg.device).long(),
                                 fwd_hooks=hooks, return_type=None)
            count += int(batch_mask.sum())
    if not bool(torch.isfinite(total).all()):  # a NaN mean would be substituted into every ablated head
        layer = int(torch.nonzero((~torch.isfinite(total)).flatten(1).any(1))[0, 0])
        raise NonFiniteError(f"mean_z: the mean of layer {layer}'s hook_z is NaN or infinite, so no mean is kept; "
                             f"on input 0, {where_nonfinite(model, tokens[0][mask[0]].tolist())}")
    return (total / max(count, 1)).to(cfg.dtype)


# ---------------------------------------------------------------- helpers


def _replace(z: Float[Tensor, "batch pos head d_head"], ablate: Bool[Tensor, "batch head"],
             mean: Float[Tensor, "head d_head"] | None) -> Tensor:
    """Out of place (so gradients and other hooks see a consistent graph)."""
    where = ablate[:, None, :, None]
    if mean is None:
        return z * ~where
    return torch.where(where, mean.to(z.device, z.dtype)[None, None], z)


def _check_ablation(ablation: str, means: Tensor | None) -> None:
    if ablation not in ABLATIONS:
        raise InputError(f"ablation must be one of {ABLATIONS}, got {ablation!r}")
    if ablation == "mean" and means is None:
        raise InputError("ablation='mean' needs means=[layer, head, d_head]: compute them with "
                         "lens_heads.ablation.hooks.mean_z(model, calibration_inputs)")
    if ablation == "zero" and means is not None:
        raise InputError("means were given with ablation='zero': pass ablation='mean' to mean-ablate")
