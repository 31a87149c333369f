"""Heal a pruned model: drop whole blocks (:func:`lens_heads.ablation.prune.prune`, ``part="block"``), reload the
exported folder as a lens_heads model and continue training it with :func:`lens_heads.training.loop.train`.

The arms a healing comparison needs are sets of blocks to drop: the lazy layers, the lowest Block Influence, random
layers, and Inheritune's truncation (the first layers kept, the last dropped: :func:`truncation`). Every arm drops
the same number of blocks and trains with one :class:`~lens_heads.training.config.TrainConfig`, so the arms have the
same size and see the same steps, tokens and batches (the batch of a step depends on the config's seed only).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from lens_heads.ablation.prune import RECORD, prune
from lens_heads.ablation.removed_layers import check_layers
from lens_heads.experiments.layer_ranking import LayerScores
from lens_heads.models.loading import load_model
from lens_heads.plumbing.errors import InputError
from lens_heads.training.config import TrainConfig
from lens_heads.training.loop import TrainResult, train

ARMS = ("lazy", "block_influence", "random", "inheritune")  # what removal_arms returns, in this order


def truncation(n_layers: int, depth: int) -> tuple[int, ...]:
    """The blocks Inheritune's truncation drops to keep the first ``depth`` of ``n_layers``: the last ones."""
    if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth < n_layers:
        raise InputError(f"depth={depth!r}: keep from 1 to {n_layers - 1} of the {n_layers} layers")
    return tuple(range(depth, n_layers))


def removal_arms(scores: LayerScores, k: int | None = None, *, seed: int = 0) -> dict[str, tuple[int, ...]]:
    """The blocks each arm drops, ``k`` of them (default: as many as there are lazy layers): the lazy layers
    (lowest Block Influence first where there are more than ``k``), the ``k`` lowest Block Influence, ``k``
    random layers (seeded) and Inheritune's truncation to ``n_layers - k`` (:func:`truncation`)."""
    lazy = [int(i) for i in np.flatnonzero(np.asarray(scores.lazy, dtype=bool))]
    n = scores.n_layers
    k = len(lazy) if k is None else k
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k < n:
        raise InputError(f"k={k!r}: give a number of blocks to remove from 1 to {n - 1}")
    if len(lazy) < k:
        raise InputError(f"the model has {len(lazy)} lazy layer(s) {lazy}, fewer than k={k}: give k <= {len(lazy)}")
    by_influence = scores.order("Block Influence")
    lazy_first = [layer for layer in by_influence if layer in lazy][:k]
    random = np.random.default_rng(seed).choice(n, size=k, replace=False)
    return {"lazy": tuple(sorted(lazy_first)), "block_influence": tuple(sorted(by_influence[:k])),
            "random": tuple(sorted(int(i) for i in random)), "inheritune": truncation(n, n - k)}


@dataclass
class Healed:
    """A pruned model after healing: the lens_heads ``model`` (trained in place), its training ``result``
    (``history`` from step 0, the pruned model before any step), the ``removed`` blocks (the original model's
    numbering) and the exported ``folder`` it was loaded from."""

    model: Any
    result: TrainResult
    removed: tuple[int, ...]
    folder: Path

    def budget(self) -> dict:
        """What the arm cost: steps, tokens seen and parameters (equal across arms of one comparison)."""
        return {"steps": self.result.steps, "tokens_seen": self.result.tokens_seen,
                "n_params": self.result.meta["n_params"], "n_layers": self.result.meta["n_layers"]}


def heal(model, layers: Sequence[int], corpus, config: TrainConfig, *, out_dir: str | Path, device=None,
         dtype=None, progress: bool = True) -> Healed:
    """Drop the blocks ``layers`` of ``model`` (a raw-basis model from :func:`lens_heads.load_model`, or a Hugging
    Face folder), export it to ``out_dir/pruned``, load it back and train it on ``corpus`` with ``config``
    (checkpoints in ``out_dir/train``: an interrupted arm resumes, a finished one only reloads its weights)."""
    n_layers = model.cfg.n_layers if hasattr(model, "cfg") else None
    layers = tuple(int(i) for i in layers)
    if not layers:
        raise InputError("heal needs blocks to drop: layers=[...] (e.g. removal_arms(scores)['lazy'])")
    if n_layers is not None:
        layers = tuple(check_layers(layers, n_layers))
    out = Path(out_dir)
    folder = out / "pruned"
    record = folder / RECORD
    if record.exists() and tuple(json.loads(record.read_text())["layers"]) != layers:
        raise InputError(f"{folder} holds a model pruned of other blocks: give each arm its own out_dir")
    if not record.exists():
        prune(model, layers=layers, part="block").save(folder, overwrite=True)
    healed = load_model(str(folder), device=device, dtype=dtype)
    result = train(healed, corpus, config, out_dir=out / "train", progress=progress, desc=f"heal -{list(layers)}")
    return Healed(model=healed, result=result, removed=layers, folder=folder)
