"""Distances between two empirical distributions whose values belong to items: Wasserstein-1 and the
Kolmogorov-Smirnov statistic, for many reweightings of the items at once.

A bootstrap over items gives each item a count (how often a replicate drew it) and a permutation test swaps each
item's values between the two sides; both are reweightings of one fixed set of values. :class:`PooledValues` sorts
the values of both sides once, and :meth:`PooledValues.distances` evaluates the weighted empirical CDFs of every
reweighting in one vectorised pass. ``scipy.stats.wasserstein_distance`` and ``ks_2samp`` compute the same numbers
for one pair of samples at a time (``tests/test_compare_distributions.py`` holds this to them and to a hand
computation); thousands of replicates of a few hundred thousand values need the vectorised form.

With weighted CDFs ``F_a`` and ``F_b`` over the sorted values ``x``: W1 = sum over gaps of ``|F_a - F_b| * dx`` (the
area between the CDFs) and KS = max over distinct values of ``|F_a - F_b|``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Union

import numpy as np
from jaxtyping import Bool, Float, Int

from lens_heads.plumbing.errors import InputError

CHUNK_VALUES = 4_000_000  # replicate x value cells per vectorised step (~32 MB per float64 array)
Weights = Union[float, np.ndarray]  # [replicate, item], [1, item] or a scalar


@dataclass(frozen=True)
class PooledValues:
    """The values of several sides (e.g. models), each value owned by an item, sorted together once."""

    x: np.ndarray  # [value], sorted
    side: np.ndarray  # [value]: the sample each value comes from
    item: np.ndarray  # [value]: the item each value belongs to
    n_items: int

    @classmethod
    def of(cls, samples: list[tuple[np.ndarray, np.ndarray]], n_items: int) -> "PooledValues":
        """``samples[s]`` is side ``s``: (values, the item of each value), items numbered ``0..n_items-1``."""
        if len(samples) < 2:
            raise InputError("a distance needs two samples")
        xs, sides, items = [], [], []
        for s, (values, owner) in enumerate(samples):
            values, owner = np.asarray(values, dtype=float).reshape(-1), np.asarray(owner).reshape(-1)
            if values.size == 0:
                raise InputError(f"sample {s} has no values")
            if values.shape != owner.shape:
                raise InputError(f"sample {s}: {values.size} values but {owner.size} item numbers")
            if not np.isfinite(values).all():
                raise InputError(f"sample {s} has {int((~np.isfinite(values)).sum())} non-finite values; drop those "
                                 "inputs first")
            if owner.min() < 0 or owner.max() >= n_items:
                raise InputError(f"sample {s}: item numbers must lie in 0..{n_items - 1}")
            xs.append(values)
            sides.append(np.full(values.size, s))
            items.append(owner.astype(np.int64))
        x, side, item = np.concatenate(xs), np.concatenate(sides), np.concatenate(items)
        order = np.argsort(x, kind="stable")
        return cls(x[order], side[order], item[order], n_items)

    def distances(self, weights: Mapping[int, tuple[Weights, Weights]]
                  ) -> tuple[Float[np.ndarray, "k"], Float[np.ndarray, "k"]]:
        """(W1, KS) between two weighted samples A and B, one per replicate: ``weights[s] = (to_a, to_b)`` gives each
        value of side ``s`` and item ``i`` the weight ``to_a[r, i]`` in A and ``to_b[r, i]`` in B (a scalar: the same
        for every item and replicate). Sides not named weigh nothing. Side 0 against side 1 on the items as they
        are: ``{0: (1, 0), 1: (0, 1)}``; a bootstrap replicate gives both the item counts; a permutation that
        swaps item ``i``'s values between the sides gives side 0 ``(1 - f, f)`` and side 1 ``(f, 1 - f)``."""
        slots = list(weights)
        keep = np.isin(self.side, slots)
        x = self.x[keep]
        # each kept value reads one column of a [replicate, slot x item] matrix of signed, normalised weights
        slot_of = np.zeros(int(self.side.max()) + 1, dtype=np.int64)
        slot_of[slots] = np.arange(len(slots))
        column = slot_of[self.side[keep]] * self.n_items + self.item[keep]
        n_cols = len(slots) * self.n_items
        per_column = np.bincount(column, minlength=n_cols).astype(float)  # values per (side, item)
        ties = x[1:] == x[:-1]
        last = np.append(~ties, True)  # the last of each run of equal values: where a CDF's step is read
        dx = np.diff(x)
        arrays = [tuple(np.atleast_2d(np.asarray(w, dtype=float)) for w in weights[s]) for s in slots]
        n_rep = max(w.shape[0] for pair in arrays for w in pair)
        for pair in arrays:
            for w in pair:
                if w.shape[0] not in (1, n_rep) or w.shape[1] not in (1, self.n_items):
                    raise InputError(f"weights must be [replicate, item] ({n_rep} x {self.n_items}), [1, item] or "
                                     f"scalars, got {w.shape}")
        w1, ks = np.empty(n_rep), np.empty(n_rep)
        step = max(1, CHUNK_VALUES // max(x.size, 1))
        for start in range(0, n_rep, step):
            rows = min(step, n_rep - start)
            to_a, to_b = (np.concatenate([np.broadcast_to(pair[j] if pair[j].shape[0] == 1 else
                                                          pair[j][start:start + rows], (rows, self.n_items))
                                          for pair in arrays], axis=1) for j in (0, 1))
            total_a, total_b = to_a @ per_column, to_b @ per_column
            if (total_a <= 0).any() or (total_b <= 0).any():
                raise InputError("a replicate left one sample without weight: give each sample positive weight")
            signed = to_a / total_a[:, None] - to_b / total_b[:, None]
            gap = np.cumsum(signed[:, column], axis=1)  # F_a - F_b after each sorted value
            np.abs(gap, out=gap)
            w1[start:start + rows] = gap[:, :-1] @ dx
            ks[start:start + rows] = (gap if not ties.any() else gap[:, last]).max(1)
        return w1, ks


def counts(idx: Int[np.ndarray, "replicate draw"], n_items: int) -> Int[np.ndarray, "replicate item"]:
    """How often each item was drawn in each bootstrap replicate (``idx[r]``: replicate ``r``'s drawn items)."""
    idx = np.atleast_2d(idx)
    offsets = idx + n_items * np.arange(idx.shape[0])[:, None]
    return np.bincount(offsets.reshape(-1), minlength=n_items * idx.shape[0]).reshape(idx.shape[0], n_items)


def swap_draws(n_items: int, n_resamples: int, seed: int) -> Bool[np.ndarray, "replicate item"]:
    """Random swaps of a paired permutation test over items: ``[r, i]`` says whether permutation ``r`` exchanges
    item ``i``'s values between the two sides (each with probability 1/2, independently, seeded)."""
    if n_resamples < 1:
        raise InputError(f"n_resamples must be at least 1, got {n_resamples}")
    return np.random.default_rng(seed).random((n_resamples, n_items)) < 0.5


def greater_p_value(observed: float, null: Float[np.ndarray, "k"]) -> float:
    """One-sided Monte Carlo p-value of a statistic that is large under the alternative: ``(1 + #{null >=
    observed}) / (1 + permutations)``, counting nulls within float rounding of ``observed`` as reaching it (as
    ``scipy.stats.permutation_test`` does). ``scipy.stats.permutation_test`` takes one statistic per call; the
    distances of every view come from one pass over the sorted values, so their permutations are drawn here."""
    null = np.asarray(null, dtype=float)
    reach = null >= observed - 1e-12 * max(abs(observed), 1.0)
    return float((1 + reach.sum()) / (1 + null.size))


def replicate_swaps(idx: Int[np.ndarray, "replicate draw"], seed: int) -> Float[np.ndarray, "replicate item"]:
    """One random swap per bootstrap replicate, over items (1.0: the item's values change sides, every copy of it
    alike, so that the swapped replicate is a permutation of that replicate's data): drawn from a generator seeded
    by ``seed`` and the replicate's draw itself, so the same replicate gets the same swap however the replicates
    are batched."""
    idx = np.atleast_2d(idx)
    n_items = idx.shape[1]
    out = np.empty(idx.shape)
    for r, row in enumerate(idx):
        out[r] = np.random.default_rng(np.random.SeedSequence([int(seed), *row.tolist()])).random(n_items) < 0.5
    return out
