"""How :func:`lens_heads.collapse.rank.attention_rank` measures attention rank, as one frozen value: the aggregation
over inputs, the spectral energy and attention mass, and the rank at or below which a layer is lazy. Its fields as
keywords stay the front door (:mod:`lens_heads.plumbing.values`); a profile's ``meta["settings"]`` records it
whole."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from lens_heads.plumbing.errors import InputError

AGGREGATIONS = {
    "matrix": "rank of each head's attention matrix averaged over the inputs",
    "rank": "each input's rank, averaged over the inputs per head",
    "layer_rank": "each input's rank; the layer's max/mean over heads per input, averaged over the inputs "
                  "(band: one standard deviation over the inputs)",
}


@dataclass(frozen=True)
class RankSettings:
    """``aggregation``: one of :data:`AGGREGATIONS` (None: the one ``attention_rank``'s ``average`` stands for).
    ``energy``: the share of spectral energy the approximate rank keeps. ``mass``: the share of attention mass whose
    fewest key columns are counted. ``lazy_rank``: a layer is lazy when its heads' ranks are at most this."""

    aggregation: str | None = None
    energy: float = 0.9
    mass: float = 0.9
    lazy_rank: float = 2.0

    def __post_init__(self):
        if self.aggregation is not None and self.aggregation not in AGGREGATIONS:
            raise InputError(f"attention_rank: unknown aggregation {self.aggregation!r}: choose one of "
                             f"{', '.join(AGGREGATIONS)}")
        for name in ("energy", "mass"):
            if not 0 < getattr(self, name) <= 1:
                raise InputError(f"attention_rank: {name} must lie in (0, 1], got {getattr(self, name)!r}")

    def to_dict(self) -> dict[str, Any]:
        """The settings as plain JSON values."""
        return dataclasses.asdict(self)
