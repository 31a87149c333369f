"""The head explorer: one self-contained view of every attention head of a model on a few example prompts.

:func:`explore` computes what the view shows and returns an :class:`Explorer`: in Jupyter it renders inline
(``_repr_html_``; JupyterLab, VS Code notebooks), ``.save(path)`` writes a standalone page, ``.to_html()`` the
fragment the report embeds. The view: a [layer x head] heatmap of any score chosen from a menu (the twelve scores,
plus measured head effects where given); clicking a head shows its attention pattern on each prompt (the model's
own tokens as labels), its score on each prompt, its rank among the heads by every map, its effect where measured,
and its layer's attention rank. Offline: no server, no outside script (:mod:`lens_heads.viz.explorer_view`).

The data stay small: at most ``max_prompts`` prompts, each cut to its first ``max_tokens`` tokens (the view says
so), patterns stored as the causal lower triangle quantised to 1/255.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from lens_heads.collapse.rank import RankProfile, attention_rank
from lens_heads.data.inputs import tokenize_inputs
from lens_heads.data.items import Task
from lens_heads.experiments.effects import HeadEffects
from lens_heads.heads.scores import SCORE_NAMES, most_inactive
from lens_heads.heads.scoring import HeadScores, score_heads
from lens_heads.models.backends import get_act_name
from lens_heads.plumbing.errors import InputError
from lens_heads.plumbing.io import atomic_write_text
from lens_heads.viz.explorer_view import explorer_fragment, standalone_page

MAX_PROMPTS = 4
MAX_TOKENS = 40
LEVELS = 255  # pattern quantisation


@dataclass(frozen=True, repr=False)
class Explorer:
    """The explorer's data (plain JSON types) and its renderings."""

    data: dict

    def __repr__(self) -> str:  # short: a notebook shows it beside the view as the output's plain text
        d = self.data
        return (f"Explorer({d.get('model', '')}: {d['n_layers']} layers x {d['n_heads']} heads, "
                f"{len(d['prompts'])} prompt(s); maps {list(d['maps'])})")

    def to_html(self) -> str:
        """The HTML fragment (data block, markup, script) to place in a page or a notebook output."""
        return explorer_fragment(self.data)

    def _repr_html_(self) -> str:
        return self.to_html()

    def save(self, path: str | Path) -> Path:
        """A standalone HTML page holding the explorer (works offline)."""
        return atomic_write_text(Path(path), standalone_page(self.data))

    def pattern(self, prompt: int, layer: int, head: int) -> np.ndarray:
        """The stored (quantised) pattern of one head on one prompt, ``[query, key]``, as the view shows it."""
        p = self.data["prompts"][prompt]
        n, heads = len(p["tokens"]), self.data["n_heads"]
        tri = n * (n + 1) // 2
        raw = np.frombuffer(base64.b64decode(p["patterns"]), dtype=np.uint8)
        flat = raw[(layer * heads + head) * tri:(layer * heads + head + 1) * tri] / LEVELS
        out = np.zeros((n, n))
        out[np.tril_indices(n)] = flat
        return out


def explore(model, prompts_or_task, *, scores: HeadScores | None = None,
            effects: HeadEffects | dict | None = None, rank: RankProfile | dict | None = None,
            score: str = "AHON (LN)", max_prompts: int = MAX_PROMPTS, max_tokens: int = MAX_TOKENS) -> Explorer:
    """An interactive head explorer of ``model`` on example prompts (a string, a list of them, or a Task: its first
    items' prompts).

    ``scores`` (e.g. ``score_heads(model, task)``) sets the heatmap's means; by default they are the means over the
    shown prompts. ``effects``: a :class:`~lens_heads.experiments.effects.HeadEffects` (or a dict of label -> ``[layer, head]``
    array) added to the menu, and shown per head. ``rank``: the attention-rank profile to show (by default computed
    on the shown prompts). ``score`` is the map shown first. A prompt longer than the model's context is refused;
    prompts are cut to their first ``max_tokens`` tokens for the view."""
    prompts = _prompts(prompts_or_task, max_prompts)
    sequences, cut = _tokens(model, prompts, max_tokens)
    per_prompt = score_heads(model, sequences, progress=False)
    maps = _maps(scores or per_prompt, effects)
    if score not in maps:
        raise InputError(f"unknown score {score!r} for the explorer: choose one of {', '.join(maps)}")
    rank_from = "the shown prompts" if rank is None else _rank_source(rank)
    layer_rank = _layer_rank(rank if rank is not None else attention_rank(model, sequences, average=False,
                                                                           progress=False))
    data = dict(model=str(model.cfg.model_name), n_layers=model.cfg.n_layers, n_heads=model.cfg.n_heads,
                initial=score, maps=maps, score_names=list(SCORE_NAMES), max_tokens=max_tokens,
                scores_from="the shown prompts" if scores is None else _describe(scores),
                layer_rank=layer_rank, rank_from=rank_from,
                prompts=[_prompt_data(model, text, seq, was_cut, per_prompt.values[i])
                         for i, (text, seq, was_cut) in enumerate(zip(prompts, sequences, cut))])
    return Explorer(data)


def _layer_rank(rank: RankProfile | dict) -> dict:
    """max, mean and lazy per layer, from a RankProfile or its ``to_dict()``."""
    get: Callable[[str], Any] = rank.get if isinstance(rank, dict) else lambda key: getattr(rank, key)
    return dict(max=_plain(get("max_rank")), mean=_plain(get("mean_rank")),
                lazy=[bool(x) for x in np.asarray(get("lazy"))])


def _rank_source(rank) -> str:
    inputs = rank.get("inputs", {}) if isinstance(rank, dict) else {}
    return f"{inputs['n']} {inputs.get('task', '')} prompts" if "n" in inputs else "the given profile"


def _prompts(prompts_or_task, max_prompts: int) -> list[str]:
    if max_prompts < 1:
        raise InputError(f"max_prompts must be at least 1, got {max_prompts}")
    if isinstance(prompts_or_task, str):
        prompts = [prompts_or_task]
    elif isinstance(prompts_or_task, Task):
        prompts = [item.prompt for item in prompts_or_task.items]
    else:
        prompts = list(prompts_or_task)
    if not prompts or not all(isinstance(p, str) and p.strip() for p in prompts):
        raise InputError("explore needs example prompts: a non-empty string, a list of them, or a Task")
    return prompts[:max_prompts]


def _tokens(model, prompts: list[str], max_tokens: int) -> tuple[list[torch.Tensor], list[bool]]:
    """Each prompt's tokens as the scoring pass reads them (a prompt over the context is an error there), cut to
    ``max_tokens``."""
    if max_tokens < 2:
        raise InputError(f"max_tokens must be at least 2, got {max_tokens}")
    tokens, mask = tokenize_inputs(model, prompts)
    full = [tokens[i, : int(mask[i].sum())] for i in range(len(prompts))]
    return [s[:max_tokens] for s in full], [len(s) > max_tokens for s in full]


def _maps(scores: HeadScores, effects) -> dict:
    """Every menu entry: per-head values, the inactive side, and each head's rank (1 = most inactive)."""
    entries = {name: (scores.mean(name).numpy(), scores.direction[name], "score") for name in scores.names}
    if isinstance(effects, HeadEffects):
        label = f"effect: {effects.metric} when zeroed ({effects.method})"
        effects = {label: effects.size().numpy()}
    for label, values in (effects or {}).items():
        entries[label] = (np.asarray(values, dtype=float), "<", "effect")
    return {name: dict(values=_plain(v), direction=d, kind=kind, rank=_ranks(v, d).tolist())
            for name, (v, d, kind) in entries.items()}


def _ranks(values: np.ndarray, direction: str) -> np.ndarray:
    order = most_inactive(torch.as_tensor(values), direction, values.size)
    ranks = np.zeros(values.shape, dtype=int)
    for position, (layer, head) in enumerate(order, start=1):
        ranks[layer, head] = position
    return ranks


@torch.no_grad()
def _prompt_data(model, text: str, tokens: torch.Tensor, cut: bool, values: torch.Tensor) -> dict:
    """One prompt: its text, token labels, every head's pattern (lower triangle, quantised) and scores."""
    names = {get_act_name("pattern", layer) for layer in range(model.cfg.n_layers)}
    _, cache = model.run_with_cache(tokens[None].to(model.cfg.device), names_filter=lambda n: n in names)
    n = len(tokens)
    rows, cols = np.tril_indices(n)
    stacked = torch.stack([cache[get_act_name("pattern", layer)][0] for layer in range(model.cfg.n_layers)])
    tri = stacked.float().cpu().numpy()[:, :, rows, cols]  # [layer, head, n(n+1)/2]
    quantised = np.clip(np.rint(tri * LEVELS), 0, LEVELS).astype(np.uint8)
    return dict(text=text, tokens=list(model.to_str_tokens(tokens)), truncated=cut,
                patterns=base64.b64encode(quantised.tobytes()).decode("ascii"),
                scores=_plain(values.numpy()))  # [layer, head, score]


def _plain(values: np.ndarray) -> list:
    """Nested lists of rounded floats, None where not finite (JSON has no NaN)."""
    values = np.asarray(values, dtype=float)
    # numpy's stubs leave None out of where's arguments; an object array with None is what JSON needs here
    return np.where(np.isfinite(values), np.round(values, 6), None).tolist()  # type: ignore[call-overload]


def _describe(scores: HeadScores) -> str:
    data = scores.meta.get("data", {}) if isinstance(scores.meta, dict) else {}
    what = data.get("task") or "inputs"
    return f"{len(scores)} {what} rows" if data else f"{len(scores)} inputs"
