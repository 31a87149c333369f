"""The ground-truth effect of every attention head on a task: what the task loses when that one head is removed.

Three ways to measure it, all through ``blocks.{l}.attn.hook_z`` at every position of every row the evaluator runs
(:func:`lens_heads.data.rows.build_rows`, so the same tokens are read as in an evaluation):

- ``"ablation"``: zero one head (:func:`lens_heads.ablation.hooks.zero_heads`) and evaluate the task again; one evaluation
  per head (layers x heads of them), each kept in ``out_dir`` so a killed run resumes from the finished heads.
- ``"mean"``: the same with the head's mean output over the task's prompts (:func:`lens_heads.ablation.hooks.mean_z`).
- ``"attribution"``: attribution patching, the first-order Taylor estimate of zeroing: the change of each choice's
  log-likelihood is ``(0 - z_h) . d logP(choice) / d z_h`` summed over positions, for every head at once from one
  forward and one backward pass per batch (one backward per choice where the choices share a row, as in MMLU's
  letter format).

Every method yields each choice's log-likelihood with the head removed (exactly, or linearised for attribution) and
reads the same three per-item metrics off it (:func:`lens_heads.evaluation.results.paired_values`):

    gold_logprob   change of the gold answer's log-likelihood (removed - intact; negative: the head helped)
    kl             KL(intact || removed) between the answer distributions (softmax over the choices' scores)
    accuracy       change of correctness (-1, 0 or +1 per item)

For attribution the KL is taken between the intact answer distribution and the one from the linearised scores: the
first-order term of KL itself is zero at the intact model, so linearising KL directly would say nothing; linearising
the choices' log-likelihoods keeps its leading (second-order) behaviour. A head's *size* is the mean over items of
the absolute per-item effect: 0 means the head changes nothing on these items; heads are ranked by it.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from safetensors import safe_open
from safetensors.torch import save
from torch import Tensor
from tqdm.auto import tqdm

from lens_heads.ablation.hooks import mean_z, zero_heads
from lens_heads.data.inputs import pad_id
from lens_heads.data.rows import build_rows
from lens_heads.evaluation.eval_settings import EvalSettings, eval_settings
from lens_heads.evaluation.evaluate import evaluate, evaluate_each
from lens_heads.evaluation.logprobs import batches, choice_chars, continuation_tokens, pad_rows, read_logprobs
from lens_heads.evaluation.results import Z95, EvalResult, ItemRecord, paired_values
from lens_heads.models.backends import get_act_name, run_to_resid
from lens_heads.models.loading import model_meta
from lens_heads.models.nonfinite import where_nonfinite
from lens_heads.plumbing.cache import claim_folder, load_keyed, save_keyed
from lens_heads.plumbing.errors import InputError, NonFiniteError
from lens_heads.plumbing.io import atomic_write_bytes
from lens_heads.plumbing.signals import stops_cleanly
from lens_heads.plumbing.values import keywords
from lens_heads.sweep.rankings import Ranking, ranking_sweep
from lens_heads.sweep.unit_store import run_fingerprint

METHODS = ("ablation", "attribution", "mean")
EFFECT_METRICS = ("gold_logprob", "kl", "accuracy")
CI_METHOD = "normal approximation over items, 95%"


@dataclass
class HeadEffects:
    """Per-item effect of removing each head: ``values[item, layer, head, k]`` is metric ``metrics[k]``.

    ``metric`` is the one :meth:`size`, :meth:`mean` and :meth:`order` use unless told otherwise."""

    values: Float[Tensor, "item layer head metric"]
    metrics: list[str]
    metric: str
    method: str
    item_ids: list[str]
    meta: dict

    def __len__(self) -> int:
        return self.values.shape[0]

    def effect(self, metric: str | None = None) -> Float[Tensor, "item layer head"]:
        """Per-item effects of one metric."""
        metric = metric or self.metric
        if metric not in self.metrics:
            raise InputError(f"no metric {metric!r} here: choose one of {self.metrics}")
        return self.values[..., self.metrics.index(metric)]

    def mean(self, metric: str | None = None) -> Float[Tensor, "layer head"]:
        """Mean (signed) effect over items."""
        return self.effect(metric).mean(0)

    def size(self, metric: str | None = None) -> Float[Tensor, "layer head"]:
        """Mean over items of the absolute effect: how much removing the head changes (0 = nothing)."""
        return self.effect(metric).abs().mean(0)

    def ci95(self, metric: str | None = None, *, absolute: bool = False) -> tuple[Tensor, Tensor]:
        """95% interval of :meth:`mean` (or of :meth:`size` with ``absolute=True``), normal approximation."""
        x = self.effect(metric)
        x = x.abs() if absolute else x
        n = x.shape[0]
        half = Z95 * x.std(0, correction=1) / math.sqrt(n) if n > 1 else torch.full_like(x[0], math.nan)
        return x.mean(0) - half, x.mean(0) + half

    def order(self, metric: str | None = None) -> list[tuple[int, int]]:
        """All ``(layer, head)`` pairs, smallest :meth:`size` first (ties in layer-head order)."""
        return _ascending(self.size(metric))

    def input_orders(self, metric: str | None = None) -> list[list[tuple[int, int]]]:
        """Per item, all ``(layer, head)`` pairs by that item's own absolute effect, smallest first (ties in
        layer-head order): the ranking a per-input pruning would follow."""
        return [_ascending(x) for x in self.effect(metric).abs()]

    def to_dataframe(self, per_item: bool = False):
        """One row per (layer, head, metric): mean with its interval, size with its interval, n. With
        ``per_item=True``, one row per (item, layer, head, metric) with its value."""
        n, L, H, _ = self.values.shape
        if per_item:
            idx = torch.cartesian_prod(torch.arange(n), torch.arange(L), torch.arange(H)).numpy()
            return pd.concat([pd.DataFrame({"item": [self.item_ids[i] for i in idx[:, 0]], "layer": idx[:, 1],
                                            "head": idx[:, 2], "metric": m,
                                            "value": self.effect(m).reshape(-1).numpy()}) for m in self.metrics],
                             ignore_index=True)
        rows = []
        for m in self.metrics:
            low, high = self.ci95(m)
            size_low, size_high = self.ci95(m, absolute=True)
            mean, size = self.mean(m), self.size(m)
            for layer in range(L):
                for head in range(H):
                    rows.append(dict(layer=layer, head=head, metric=m, method=self.method,
                                     mean=float(mean[layer, head]), ci_low=float(low[layer, head]),
                                     ci_high=float(high[layer, head]), size=float(size[layer, head]),
                                     size_ci_low=float(size_low[layer, head]),
                                     size_ci_high=float(size_high[layer, head]), n=n))
        return pd.DataFrame(rows)

    def save(self, path: str | Path) -> Path:
        """Write to one safetensors file (tensor + JSON metadata; no pickle), atomically."""
        header = dict(metrics=self.metrics, metric=self.metric, method=self.method, item_ids=self.item_ids,
                      meta=self.meta)
        return atomic_write_bytes(path, save({"values": self.values.contiguous()},
                                             metadata={"lens_heads": json.dumps(header, default=str)}))

    @classmethod
    def load(cls, path: str | Path) -> "HeadEffects":
        with safe_open(str(path), framework="pt") as f:
            header = json.loads(f.metadata()["lens_heads"])
            values = f.get_tensor("values")
        return cls(values=values, **header)


@keywords(EvalSettings)  # the signature names the settings' fields taken as keywords
@stops_cleanly("head effects")
def head_effects(model, task, *, method: str = "ablation", metric: str = "kl", out_dir=None,
                 settings: EvalSettings | None = None, progress: bool = True, **options) -> HeadEffects:
    """The effect of removing each head of ``model`` on ``task`` (see the module docstring for the methods and
    metrics; all three metrics are computed, ``metric`` is the one the result ranks heads by).

    ``out_dir`` (ablation and mean): each head's evaluation is written there as it finishes and reused on a rerun
    with the same model, items and settings. ``settings`` (:class:`lens_heads.evaluation.eval_settings.EvalSettings`,
    or its fields as keywords laid over it; ``meta["settings"]`` records it whole): ``primary``, the choice scoring
    (``"sum"``, ``"per_token"``, ``"per_char"``) behind accuracy and the answer distribution; ``protocol`` and
    ``apply_chat_template``, the forward rows, as in :func:`lens_heads.evaluation.evaluate`
    (:mod:`lens_heads.data.rows`); ``batch_size`` and ``attention``, how they run. Attribution keeps every layer's
    activations for the backward pass (memory ~ batch_size x length^2 x layers for the attention): give long
    few-shot prompts a small ``batch_size``."""
    if method not in METHODS:
        raise InputError(f"unknown method {method!r}: choose one of {METHODS}")
    if metric not in EFFECT_METRICS:
        raise InputError(f"unknown metric {metric!r}: choose one of {EFFECT_METRICS}")
    evaluation = eval_settings(settings, options)
    primary = evaluation.primary
    items = list(task)
    if not items:
        raise InputError("the task has no items: load it with a positive n (lens_heads.load_task(name, n=...))")
    if method == "attribution" and any(len(it.continuations) < 2 for it in items):
        raise InputError(f"method='attribution' linearises log-likelihoods, but {getattr(task, 'name', 'this task')} "
                         "has items with one continuation (LAMBADA, GSM8K: correct when it is the greedy answer), "
                         "whose accuracy cannot be linearised: use method='ablation' or 'mean'")
    if method == "attribution" and out_dir is not None:
        raise InputError("out_dir keeps the per-head evaluations of ablation and mean ablation; attribution runs in "
                         "one pass: keep its result with HeadEffects.save(path)")
    if model.tokenizer is None:
        raise InputError("this model has no tokenizer, and a text task needs one: load the model with its tokenizer "
                         "(tiny_model(tokenizer=...) for a toy model)")
    start = time.perf_counter()
    if method == "attribution":
        base, removed, stats = _attribution(model, task, settings=evaluation, progress=progress)
    else:
        base, removed, stats = _ablation(model, task, method=method, out_dir=out_dir, settings=evaluation,
                                         progress=progress)
    L, H = model.cfg.n_layers, model.cfg.n_heads
    values = torch.empty((len(items), L, H, len(EFFECT_METRICS)), dtype=torch.float64)
    for (layer, head), records in removed.items():
        per_item = paired_values(list(zip(records, base.items)), primary)
        values[:, layer, head] = torch.tensor(np.stack([per_item[m] for m in EFFECT_METRICS], axis=1))
    meta = dict(model=model_meta(model), task=task.meta() if hasattr(task, "meta") else {}, primary=primary,
                **evaluation.rows(), settings=evaluation.to_dict(),
                baseline=dict(accuracy=base.accuracy, ci95=list(base.ci95), n=base.n, chance=base.chance),
                batch_size=evaluation.batch_size, ci_method=CI_METHOD, wall_s=time.perf_counter() - start, **stats)
    return HeadEffects(values=values, metrics=list(EFFECT_METRICS), metric=metric, method=method,
                       item_ids=[it.id for it in items], meta=meta)


def _ascending(size: Float[Tensor, "layer head"]) -> list[tuple[int, int]]:
    flat = np.argsort(size.reshape(-1).numpy(), kind="stable")
    return [(int(i) // size.shape[1], int(i) % size.shape[1]) for i in flat]


# ---------------------------------------------------------------- ablation and mean ablation: one evaluation a head


@keywords(EvalSettings)  # the signature names the settings' fields taken as keywords
def task_means(model, task, *, settings: EvalSettings | None = None, **options) -> Float[Tensor, "layer head d_head"]:
    """Every head's mean ``hook_z`` over the positions of the rows an evaluation of ``task`` runs under ``settings``
    (or its fields as keywords: its ``protocol``, ``apply_chat_template`` and ``batch_size``; what mean ablation
    substitutes; :func:`lens_heads.ablation.hooks.mean_z`)."""
    evaluation = eval_settings(settings, options)
    rows = build_rows(model, list(task), **evaluation.rows())
    return mean_z(model, [row.tokens for row in rows], batch_size=_whole(evaluation.batch_size, "mean ablation"))


def _whole(batch_size: int | str, what: str) -> int:
    """A whole-number batch size: the passes that don't halve on out-of-memory refuse ``"auto"``."""
    if not isinstance(batch_size, int):
        raise InputError(f"{what} runs its own passes, which don't find a batch size: give batch_size a whole number")
    return batch_size


def _ablation(model, task, *, method: str, out_dir, settings: EvalSettings, progress: bool):
    means = task_means(model, task, settings=settings) if method == "mean" else None
    # what a stored head's numbers depend on (not the batch size or attention, float rounding apart)
    key = dict(method=method, primary=settings.primary, **settings.rows())
    if means is not None:  # the substituted values are part of what a stored head means
        key["means"] = hashlib.sha256(means.detach().cpu().float().numpy().tobytes()).hexdigest()[:16]
    fingerprint = run_fingerprint(model, task, **key)
    out = Path(out_dir) if out_dir is not None else None
    if out is not None:
        claim_folder(out, fingerprint, marker="effects.json")
    counts = dict(units_run=0, units_reused=0)

    def stored(name: str) -> EvalResult | None:
        found = load_keyed(out / f"{name}.json", dict(run=fingerprint, unit=name)) if out is not None else None
        counts["units_reused" if found is not None else "units_run"] += 1
        return None if found is None else EvalResult.from_dict(found)

    def store(name: str, result: EvalResult) -> None:
        if out is not None:
            save_keyed(out / f"{name}.json", dict(run=fingerprint, unit=name), result.to_dict())

    base = stored("baseline")
    if base is None:
        base = evaluate(model, task, settings=settings, progress=False)
        store("baseline", base)
    removed = {}
    ablation = "mean" if method == "mean" else "zero"
    bar = tqdm(total=model.cfg.n_layers * model.cfg.n_heads, desc=f"{method} of each head on "
               f"{getattr(task, 'name', 'task')}", unit="head", disable=not progress)
    for layer in range(model.cfg.n_layers):  # a layer's heads share the forward below it (evaluate_each)
        names = {head: f"L{layer:02d}H{head:02d}" for head in range(model.cfg.n_heads)}
        todo = []
        for head, name in names.items():
            found = stored(name)
            if found is None:
                todo.append(head)
            else:
                removed[(layer, head)] = found.items
        results = evaluate_each(model, task, [zero_heads([(layer, head)], ablation=ablation, means=means) for head in todo],
                                settings=settings, progress=False) if todo else []
        for head, result in zip(todo, results):
            store(names[head], result)
            removed[(layer, head)] = result.items
        bar.update(len(names))
    bar.close()
    return base, removed, dict(fingerprint=fingerprint, out_dir=str(out) if out else None, **counts)


# ---------------------------------------------------------------- attribution patching: one backward a batch


def _attribution(model, task, *, settings: EvalSettings, progress: bool):
    """Intact log-likelihoods and, per head, their linearised values with the head zeroed."""
    items = list(task)
    L, H = model.cfg.n_layers, model.cfg.n_heads
    rows = build_rows(model, items, **settings.rows())
    batch_size = _whole(settings.batch_size, "attribution")
    n_choices = max(len(it.continuations) for it in items)
    n_tokens = continuation_tokens(items, rows)
    logprobs = torch.full((len(items), n_choices), math.nan, dtype=torch.float64)
    change = torch.zeros((len(items), n_choices, L, H), dtype=torch.float64)
    pad = pad_id(model)
    order = sorted(rows, key=lambda r: -len(r.tokens))
    stats = dict(forward_passes=0, backward_passes=0)
    bar = tqdm(total=len(rows), desc=f"attribution on {getattr(task, 'name', 'task')}", unit="row",
               disable=not progress, leave=False)
    for batch in batches(order, batch_size):
        owners, values, backward_passes = _attribute_batch(model, batch, pad, change)
        stats["forward_passes"] += 1
        stats["backward_passes"] += backward_passes
        for (item, choice), value in zip(owners, values.tolist()):
            logprobs[item, choice] = value
        bar.update(len(batch))
    bar.close()
    base = EvalResult(task=getattr(task, "name", "task"), format=getattr(task, "format", "?"), primary=settings.primary,
                      chance=float(getattr(task, "chance", math.nan)), items=_records_from_logprobs(items, logprobs, n_tokens))
    real = torch.tensor([[c < len(it.continuations) for c in range(n_choices)] for it in items])  # others: NaN
    if not bool(torch.isfinite(logprobs[real]).all() and torch.isfinite(change[real]).all()):
        raise NonFiniteError(f"attribution on {base.task}: log-likelihoods or their gradients are NaN or infinite, "
                             f"so no effect is computed; {where_nonfinite(model, rows[0].tokens)}")
    removed = {(layer, head): _records_from_logprobs(items, logprobs + change[..., layer, head], n_tokens)
               for layer in range(L) for head in range(H)}
    return base, removed, stats


def _attribute_batch(model, batch: list, pad: int, change: Float[Tensor, "item choice layer head"]
                     ) -> tuple[list[tuple[int, int]], Tensor, int]:
    """One forward pass over a batch of rows and one backward pass per read slot: each head's linearised change of
    every read log-likelihood lands in ``change``; returns the reads' (item, choice), their log-likelihoods and
    the number of backward passes."""
    L = model.cfg.n_layers
    device = model.cfg.device
    tokens, mask = pad_rows(batch, pad)
    mask = mask.to(device)
    taps, hooks = _zero_taps(L)
    with torch.enable_grad(), model.hooks(fwd_hooks=hooks):
        resid = run_to_resid(model, tokens.to(device), mask.long(), stop=L)
        values, owners = read_logprobs(model, resid, batch)
        row_of = {(row.item, choice): b for b, row in enumerate(batch) for choice, _, _ in row.reads}
        slot_of = {(row.item, choice): s for row in batch for s, (choice, _, _) in enumerate(row.reads)}
        # one backward per read slot: rows never attend to each other, so the gradient of a sum over rows
        # is each row's own gradient in that row
        slots = max(len(row.reads) for row in batch)
        for slot in range(slots):
            picked = [k for k, owner in enumerate(owners) if slot_of[owner] == slot]
            grads = torch.autograd.grad(values[picked].sum(), [zero for _, zero in taps],
                                        retain_graph=slot < slots - 1)
            reads = [owners[k] for k in picked]
            _record_changes(change, taps, grads, mask, reads, [row_of[read] for read in reads])
    return owners, values.detach().cpu(), slots


def _zero_taps(n_layers: int) -> tuple[list, list]:
    """Hooks that add to every layer's ``z`` a zero that requires grad, and the ``(z, zero)`` of each layer they
    fill in on the forward pass."""
    taps: list = [None] * n_layers

    def tap(layer: int):
        def hook(z: Tensor, hook=None) -> Tensor:
            # z + 0: the gradient with respect to the zero is d metric / d z, through every later layer
            zero = torch.zeros_like(z, requires_grad=True)
            taps[layer] = (z.detach(), zero)
            return z + zero

        return hook

    return taps, [(get_act_name("z", l), tap(l)) for l in range(n_layers)]


def _record_changes(change: Float[Tensor, "item choice layer head"], taps: list, grads, mask: Tensor,
                    reads: list[tuple[int, int]], batch_rows: list[int]) -> None:
    """Into ``change[item, choice, layer]``: each read's first-order change from zeroing each head of the layer,
    minus z . d logprob / d z summed over its row's real positions."""
    for layer, ((z, _), grad) in enumerate(zip(taps, grads)):
        per_row = -torch.einsum("bphd,bphd,bp->bh", z.double(), grad.double(), mask.double())
        for (item, choice), b in zip(reads, batch_rows):
            change[item, choice, layer] = per_row[b].cpu()


def _records_from_logprobs(items, logprobs: Tensor, n_tokens: list[list[int]]) -> list[ItemRecord]:
    """Item records from ``[item, choice]`` log-likelihoods (NaN past an item's last choice)."""
    return [ItemRecord(id=it.id, gold=int(it.gold), logprobs=logprobs[i, :len(it.continuations)].tolist(),
                       n_tokens=n_tokens[i], n_chars=[choice_chars(x) for x in it.continuations], subject=it.subject)
            for i, it in enumerate(items)]


# ---------------------------------------------------------------- the oracle: static zeroing in the order of effect


@keywords(EvalSettings)  # the signature names the settings' fields taken as keywords
def oracle_sweep(model, task, order: list[tuple[int, int]], *, fractions=(0.0, 0.05, 0.10, 0.15, 0.20, 0.25, 0.30),
                 label: str = "oracle", out_dir=None, settings: EvalSettings | None = None, progress: bool = True,
                 **options):
    """Zero the first ``round(p x heads)`` heads of ``order`` (e.g. :meth:`HeadEffects.order`, smallest effect
    first) for every input of ``task`` at each fraction ``p``: the best a fixed per-head ranking can do where
    ``task`` holds the items that ranked the heads, and an honest reference on other items. Returns a
    :class:`lens_heads.sweep.result.SweepResult` whose static curve is named ``label``; with ``out_dir`` each fraction is
    kept and reused like the sweep's units. ``settings`` and ``options``: :func:`lens_heads.evaluation.evaluate`'s."""
    order = [(int(layer), int(head)) for layer, head in order]
    # the order keys the run, as it did before rankings shared this sweep: stored oracle units stay valid
    return ranking_sweep(model, task, [Ranking(label, order=tuple(order))], fractions=fractions, out_dir=out_dir,
                         marker="oracle.json", key=dict(oracle_order=[list(h) for h in order]), settings=settings,
                         progress=progress, **options)
