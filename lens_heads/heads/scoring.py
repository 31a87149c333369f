"""Score every attention head of a model in one streaming forward pass.

Hooks on ``hook_v`` and on the layer's queries and keys hold on to the current layer's values and the source of
its attention pattern; the hook on ``hook_z`` reduces the layer to ``[batch, head, score]`` numbers and lets go.
The attention itself runs fused (:mod:`lens_heads.evaluation.fused_attention`) and the scores that read the pattern
take its rows' statistics from one more fused attention with its log-sum-exp (on the CPU), or recompute the pattern
``query_chunk`` rows at a time (:mod:`lens_heads.heads.attention_rows`), so no layer's whole
``[batch, head, query, key]`` pattern is ever held: memory grows linearly with the prompt. A layer that cannot run
fused (soft-capped, a TransformerBridge's) gives its ``hook_pattern`` instead, read by rows all the same.
Nothing is cached across layers, so memory does not grow with depth beyond the score tensor, and the pass skips the
unembedding (no logits are needed).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import pandas as pd
import torch
from jaxtyping import Bool, Float
from safetensors import safe_open
from safetensors.torch import save
from torch import Tensor
from tqdm.auto import tqdm

from lens_heads.data.inputs import Inputs, longest_first, tokenize_inputs
from lens_heads.data.items import Task
from lens_heads.data.rows import build_rows
from lens_heads.evaluation.batching import AUTO, first_size, halving
from lens_heads.evaluation.eval_settings import EvalSettings, eval_settings
from lens_heads.evaluation.fused_attention import fused_attention
from lens_heads.evaluation.packed_weights import packed_weights
from lens_heads.heads.attention_rows import DEFAULT_QUERY_CHUNK, check_query_chunk, pattern_source, rows_from
from lens_heads.heads.scores import (
    DIRECTION,
    EXTRA_SCORES,
    SCORE_NAMES,
    SCORES,
    Score,
    as_scores,
    scores_of_layer,
    what_still_works,
)
from lens_heads.models.backends import check_attention_hooks, run_to_resid
from lens_heads.models.capture import LayerCapture, check_hook_names
from lens_heads.models.loading import expand_kv, model_meta
from lens_heads.models.nonfinite import where_nonfinite
from lens_heads.plumbing import distributed
from lens_heads.plumbing.errors import InputError, NonFiniteError
from lens_heads.plumbing.io import atomic_write_bytes
from lens_heads.plumbing.values import keywords

if TYPE_CHECKING:  # HookedTransformer is TransformerLens 3.9 only
    from transformer_lens import HookedTransformer

DEFINITIONS = ("Sandoval-Segura et al., arXiv 2504.03889. first token = first non-padding position of the row "
               "(the BOS where the protocol adds one, else the first text token); "
               "last token = last non-padding position; means over non-padding positions, first token included; "
               "norms are L2 in the model's weight basis, head outputs before W_O unless marked (full); entropy in nats")


@dataclass
class HeadScores:
    """Scores of every (input, layer, head): ``values[input, layer, head, k]`` is score ``names[k]``."""

    values: Float[Tensor, "input layer head score"]
    names: list[str]
    direction: dict[str, str]  # inactive side ('<' or '>') of every score here, extras included
    meta: dict
    extra_values: Float[Tensor, "input layer head extra"] | None = None
    extra_names: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return self.values.shape[0]

    @property
    def all_names(self) -> list[str]:
        return list(self.names) + list(self.extra_names)

    def score(self, name: str) -> Float[Tensor, "input layer head"]:
        """The values of one score (one of ``names`` or ``extra_names``)."""
        if name in self.names:
            return self.values[..., self.names.index(name)]
        if name in self.extra_names:
            if self.extra_values is None:
                raise InputError(f"score {name!r} is in extra_names but there are no extra_values")
            return self.extra_values[..., self.extra_names.index(name)]
        raise InputError(f"no score {name!r} here: choose one of {self.all_names}")

    def mean(self, name: str) -> Float[Tensor, "layer head"]:
        """Mean over inputs of one score (the static, per-head view)."""
        return self.score(name).mean(0)

    def to_dataframe(self):
        """Tidy table: one row per (input, layer, head, score) with its value."""
        frames = []
        for name in self.all_names:
            x = self.score(name)
            n, L, H = x.shape
            idx = torch.cartesian_prod(torch.arange(n), torch.arange(L), torch.arange(H)).numpy()
            frames.append(pd.DataFrame({"input": idx[:, 0], "layer": idx[:, 1], "head": idx[:, 2], "score": name,
                                        "value": x.reshape(-1).double().numpy()}))
        df = pd.concat(frames, ignore_index=True)
        df["score"] = pd.Categorical(df["score"], categories=self.all_names)
        return df

    def save(self, path: str | Path) -> Path:
        """Write to one safetensors file (tensors + JSON metadata; no pickle), atomically."""
        tensors = {"values": self.values.contiguous()}
        if self.extra_values is not None:
            tensors["extra_values"] = self.extra_values.contiguous()
        header = {"names": self.names, "direction": self.direction, "meta": self.meta, "extra_names": self.extra_names}
        return atomic_write_bytes(path, save(tensors, metadata={"lens_heads": json.dumps(header, default=str)}))

    @classmethod
    def load(cls, path: str | Path) -> "HeadScores":
        with safe_open(str(path), framework="pt") as f:
            header = json.loads(f.metadata()["lens_heads"])
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        return cls(values=tensors["values"], names=header["names"], direction=header["direction"],
                   meta=header["meta"], extra_values=tensors.get("extra_values"), extra_names=header["extra_names"])


@keywords(EvalSettings)  # the signature names the settings' fields taken as keywords
def score_heads(
    model: HookedTransformer,
    inputs: Inputs,
    *,
    settings: EvalSettings | None = None,
    attention_mask: Bool[Tensor, "batch pos"] | None = None,
    progress: bool = True,
    extras: Sequence[Score | str] = (),
    hooks: Sequence[tuple] = (),
    max_len: int | None = None,
    query_chunk: int = DEFAULT_QUERY_CHUNK,
    **options,
) -> HeadScores:
    """The twelve head scores (``lens_heads.heads.scores.SCORE_NAMES``) of every head of ``model`` on every input.

    ``inputs``: strings, a Task, a token tensor or a list of token sequences (see ``tokenize_inputs``). A Task
    is scored on exactly the forward rows its evaluation runs under the settings' ``protocol`` and
    ``apply_chat_template`` (one input per row, e.g. one per choice for cloze tasks; ``meta["data"]["row_items"]``
    maps rows to items). ``attention_mask`` (with a token tensor only) marks real tokens; each row must be one
    contiguous run, so right and left padding both work, and padding never counts. ``extras`` adds scores kept
    apart from the twelve (names from ``EXTRA_NAMES`` or your own ``Score``s). ``hooks`` are extra TransformerLens
    ``(hook_name, fn)`` pairs run before the scoring hooks (e.g. to score an ablated model).

    ``settings`` (:class:`lens_heads.evaluation.eval_settings.EvalSettings`, or its fields as keywords laid over
    it): the pass reads ``batch_size``, ``protocol`` and ``apply_chat_template`` (it reads no choice);
    ``meta["settings"]`` records the value whole. Inputs are batched by length, so padding costs little; the result
    keeps the input order. ``batch_size="auto"``: the largest that fits (:mod:`lens_heads.evaluation.batching`). Under torchrun each rank scores a block of the inputs and every rank
    returns all the values (:mod:`lens_heads.plumbing.distributed`). Scores are computed in float32 whatever the
    model's dtype (their norms, entropies and means). A NaN or infinite score is refused
    (:class:`lens_heads.plumbing.errors.NonFiniteError`, naming the inputs, the first layer with one and the first
    hook point whose output went non-finite). ``query_chunk``: query rows of a layer's attention pattern held at
    once (memory per layer ``batch x head x query_chunk x key`` floats; the attention runs fused where the layer
    allows).
    """
    evaluation = eval_settings(settings, options)
    batch_size, protocol, apply_chat_template = (evaluation.batch_size, evaluation.protocol,
                                                 evaluation.apply_chat_template)
    call: dict[str, Any] = dict(settings=evaluation, attention_mask=attention_mask, progress=progress, extras=extras,
                                hooks=hooks, max_len=max_len, query_chunk=query_chunk)
    check_query_chunk(query_chunk)
    if distributed.sharding():
        return _score_shards(model, inputs, call)
    if batch_size == AUTO:
        start = first_size(model.cfg.device, _count(inputs), what="score")
        return halving(lambda size: score_heads(model, inputs, **{**call, "settings": evaluation.replace(
            batch_size=size)}), start, what="score")
    assert isinstance(batch_size, int)  # EvalSettings let only "auto" (returned above) or an int through
    check_hook_names(model, [h[0] for h in hooks])
    check_attention_hooks(model, advice=what_still_works)
    task_rows, tokens, mask = _rows_and_tokens(model, inputs, attention_mask, max_len=max_len, protocol=protocol,
                                               apply_chat_template=apply_chat_template)
    extras = as_scores(extras)
    values = _score_rows(model, tokens, mask, extras, hooks, batch_size=batch_size, progress=progress,
                         query_chunk=query_chunk)
    _refuse_nonfinite(model, values, tokens, mask, [*SCORE_NAMES, *(s.name for s in extras)])
    data = _describe(inputs, tokens.shape[0], int(mask.sum()), task_rows, protocol, apply_chat_template)
    meta = dict(model=model_meta(model), data=data, definitions=DEFINITIONS, settings=evaluation.to_dict(),
                batch_size=batch_size, query_chunk=query_chunk, user_hooks=_hook_labels(hooks))
    return _head_scores(values, extras, meta)


def _rows_and_tokens(model, inputs: Inputs, attention_mask, *, max_len: int | None, protocol: str,
                     apply_chat_template: bool | str) -> tuple[list | None, Tensor, Bool[Tensor, "b p"]]:
    """A Task's forward rows (None for other inputs), the tokens to score and the mask of their real tokens."""
    task_rows = build_rows(model, inputs, protocol=protocol, apply_chat_template=apply_chat_template) \
        if isinstance(inputs, Task) else None
    tokens, mask = tokenize_inputs(model, [row.tokens for row in task_rows] if task_rows else inputs,
                                   max_len=max_len)
    if attention_mask is not None:
        if not isinstance(inputs, Tensor):
            raise InputError("attention_mask goes with a token tensor; text and tasks are padded for you")
        if max_len is not None:
            attention_mask = attention_mask[..., :max_len]
        mask = _checked_mask(attention_mask, tokens.shape)
    return task_rows, tokens, mask


def _score_rows(model, tokens: Tensor, mask: Bool[Tensor, "b p"], extras: tuple[Score, ...],
                hooks: Sequence[tuple], *, batch_size: int, progress: bool, query_chunk: int
                ) -> Float[Tensor, "input layer head score"]:
    """Every score of every row, the twelve then ``extras``: batched longest first, returned in the rows' order."""
    scores = SCORES + extras
    cfg = model.cfg
    n, L, H = tokens.shape[0], cfg.n_layers, cfg.n_heads
    out = torch.empty((n, L, H, len(scores)), dtype=torch.float32)
    W_O = model.W_O.detach() if extras else None  # [layer, head, d_head, d_model]; only extras read it
    bar = tqdm(total=n, unit="input", desc=f"scoring {cfg.n_layers}x{cfg.n_heads} heads", disable=not progress)
    with torch.no_grad():
        for rows, used in longest_first(mask, batch_size):
            out[rows] = _score_batch(model, tokens[rows, used], mask[rows, used], scores, W_O, hooks, query_chunk)
            bar.update(len(rows))
    bar.close()
    return out


def _refuse_nonfinite(model, values: Float[Tensor, "input layer head score"], tokens: Tensor, mask: Tensor,
                      names: Sequence[str]) -> None:
    """A NaN or infinite score would become a threshold or a curve point: refuse, naming the inputs, the first
    layer with such a score and where the first input's forward went non-finite."""
    bad = ~torch.isfinite(values)
    if not bool(bad.any()):
        return
    inputs = torch.nonzero(bad.flatten(1).any(1))[:, 0].tolist()
    layer = int(torch.nonzero(bad.any(0).flatten(1).any(1))[0, 0])
    which = [name for k, name in enumerate(names) if bool(bad[..., k].any())]
    first = tokens[inputs[0]][mask[inputs[0]]].tolist()
    raise NonFiniteError(
        f"{int(bad.sum())} of {values.numel()} head scores are NaN or infinite ({', '.join(which)}), on "
        f"{len(inputs)} of {values.shape[0]} inputs (input {', '.join(map(str, inputs[:5]))}"
        f"{' ...' if len(inputs) > 5 else ''}), from layer {layer} on; on input {inputs[0]}, "
        f"{where_nonfinite(model, first)}. No score is kept from them")


def _head_scores(values: Float[Tensor, "input layer head score"], extras: tuple[Score, ...], meta: dict) -> HeadScores:
    """The twelve scores and the extras of ``values`` apart, each with its inactive side."""
    return HeadScores(
        values=values[..., : len(SCORES)].clone(),
        names=list(SCORE_NAMES),
        direction={**DIRECTION, **{s.name: s.direction for s in extras}},
        meta=meta,
        extra_values=values[..., len(SCORES) :].clone() if extras else None,
        extra_names=[s.name for s in extras],
    )


def _hook_labels(hooks: Sequence[tuple]) -> list[str]:
    """The hook points of user hooks, as the metadata records them (a name, or the repr of a filter)."""
    return [h[0] if isinstance(h[0], str) else repr(h[0]) for h in hooks]


def _score_batch(model, tokens, mask, scores, W_O, user_hooks, query_chunk: int
                 ) -> Float[Tensor, "batch layer head score"]:
    cfg = model.cfg
    device = cfg.device
    mask_dev = mask.to(device)
    out = torch.empty((tokens.shape[0], cfg.n_layers, cfg.n_heads, len(scores)), dtype=torch.float32)
    causal = cfg.attention_dir == "causal"

    def reduce_layer(layer: int, z: Tensor, acts: dict[str, Tensor]) -> None:
        f32 = (lambda x: x.float()) if z.dtype != torch.float32 else (lambda x: x)
        v = expand_kv(acts["v"], cfg.n_heads)
        w = W_O[layer].float() if W_O is not None else None
        source = rows_from(model, layer, acts, mask_dev)
        pattern, query_keys = (f32(source), None) if isinstance(source, Tensor) else (None, source)
        out[:, layer] = scores_of_layer(pattern, f32(v), f32(z), mask_dev, scores, W_O=w, causal=causal,
                                        query_keys=query_keys, query_chunk=query_chunk).cpu()

    # a Score of the user's own that reads the pattern reads layer.pattern whole: those layers capture it
    whole = any("pattern" in s.reads for s in scores if s not in SCORES + EXTRA_SCORES)
    capture = LayerCapture(cfg.n_layers, reduce_layer,
                           lambda layer: ("v", "pattern") if whole else ("v", *pattern_source(model, layer)))
    padded = not bool(mask.all())
    left_tokenizer = model.tokenizer is not None and model.tokenizer.padding_side == "left"
    # Without padding, no mask is needed; a left-padding tokenizer would make TL guess one, so give it explicitly.
    attention_mask = mask_dev.long() if (padded or left_tokenizer) else None
    with fused_attention(model), packed_weights(model), model.hooks(fwd_hooks=list(user_hooks) + capture.hooks):
        run_to_resid(model, tokens.to(device), attention_mask, stop=cfg.n_layers)
    if capture.leftover():
        raise RuntimeError(f"hooks {capture.leftover()} fired without a hook_z after them: is this a standard "
                           "attention layer?")
    return out


def _checked_mask(attention_mask: Tensor, shape) -> Bool[Tensor, "b p"]:
    mask = torch.as_tensor(attention_mask).bool().cpu()
    if mask.ndim == 1:
        mask = mask[None]
    if tuple(mask.shape) != tuple(shape):
        raise InputError(f"attention_mask has shape {tuple(mask.shape)} but the tokens have {tuple(shape)}")
    count = mask.sum(1)
    if not bool((count > 0).all()):
        raise InputError("attention_mask has a row with no real tokens: drop that input")
    first = mask.int().argmax(1)
    last = mask.shape[1] - 1 - mask.flip(1).int().argmax(1)
    if not bool((last - first + 1 == count).all()):
        raise InputError("attention_mask rows must be one contiguous run of real tokens (right or left padding)")
    return mask


def _describe(inputs, n: int, n_tokens: int, rows, protocol: str, apply_chat_template: bool | str) -> dict:
    if isinstance(inputs, Task):
        return {**inputs.meta(), "n_rows": n, "n_tokens": n_tokens, "protocol": protocol,
                "apply_chat_template": apply_chat_template, "row_items": [row.item for row in rows]}
    kind = "token tensor" if isinstance(inputs, Tensor) else (
        "strings" if isinstance(inputs, str) or all(isinstance(x, str) for x in inputs) else "token sequences")
    return {"kind": kind, "n": n, "n_tokens": n_tokens}


# ---------------------------------------------------------------- under torchrun


def _score_shards(model, inputs: Inputs, settings: dict) -> HeadScores:
    """``score_heads`` on this rank's block of the inputs; the blocks' values gathered in order on every rank."""
    n = _count(inputs)
    mask = settings["attention_mask"]
    distributed.check_agree(dict(model={k: v for k, v in model_meta(model).items() if k != "source"},
                                 inputs=_digest(inputs), n=n, mask=None if mask is None else _digest(mask),
                                 **settings["settings"].to_dict(), max_len=settings["max_len"],
                                 extras=[getattr(e, "name", e) for e in settings["extras"]],
                                 hooks=_hook_labels(settings["hooks"])),
                            "model, inputs and settings of the scoring pass")
    mine = distributed.block(n, distributed.rank(), distributed.world_size())
    local = None
    if len(mine):
        with distributed.local():
            local = score_heads(model, _take(inputs, mine), **{
                **settings, "attention_mask": None if mask is None else torch.as_tensor(mask)[mine.start:mine.stop],
                "progress": settings["progress"] and distributed.is_main()})
    parts = [p for p in distributed.all_gather(None if local is None else (mine.start, local)) if p is not None]
    blocks = [scores for _, scores in parts]
    first = blocks[0]
    data = {**first.meta["data"], "n_tokens": sum(s.meta["data"]["n_tokens"] for s in blocks)}
    if isinstance(inputs, Task):  # a Task's rows: count them, and map them to the task's item numbers
        data.update(inputs.meta(), n_rows=sum(len(s) for s in blocks), n_tokens=data["n_tokens"],
                    row_items=[start + item for start, s in parts for item in s.meta["data"]["row_items"]])
    else:
        data["n"] = sum(len(s) for s in blocks)
    return HeadScores(values=torch.cat([s.values for s in blocks]), names=first.names, direction=first.direction,
                      meta={**first.meta, "data": data, "ranks": distributed.world_size()},
                      extra_values=None if first.extra_values is None else torch.cat([s.extra_values for s in blocks]),
                      extra_names=first.extra_names)


def _count(inputs: Inputs) -> int:
    if isinstance(inputs, str):
        return 1
    if isinstance(inputs, Tensor):
        return 1 if inputs.ndim == 1 else inputs.shape[0]
    return len(inputs)


def _take(inputs: Inputs, rows: range) -> Inputs:
    if isinstance(inputs, str) or (isinstance(inputs, Tensor) and inputs.ndim == 1):
        return inputs
    if isinstance(inputs, Task):
        return replace(inputs, items=inputs.items[rows.start:rows.stop])
    return inputs[rows.start:rows.stop]


def _digest(inputs: Inputs) -> str:
    if isinstance(inputs, Tensor):
        data = inputs.detach().cpu().long().numpy().tobytes()
    elif isinstance(inputs, Task):
        data = "\n".join(item.id for item in inputs).encode()
    else:
        data = repr([x if isinstance(x, str) else [int(t) for t in x] for x in
                     ([inputs] if isinstance(inputs, str) else inputs)]).encode()
    return hashlib.sha256(data).hexdigest()[:16]
