"""How :func:`lens_heads.experiments.compare_distributions.compare_distributions` compares score distributions, as
one frozen value: the views, the depth bins and head shares, the bootstrap and permutation settings, the CDF points.
Its fields as keywords stay the front door (:mod:`lens_heads.plumbing.values`); a comparison's
``meta["settings"]`` records it whole."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from lens_heads.plumbing.errors import InputError
from lens_heads.stats import inference

VIEWS = ("pooled", "depth", "layer", "head")
DEPTH_BINS = 3
SHARES = (0.1, 0.3)
CDF_POINTS = 200


@dataclass(frozen=True)
class DistributionSettings:
    """``views``: ``"auto"`` (pooled and depth for every pair, per layer and per head where the shapes allow) or some
    of :data:`VIEWS`. ``depth_bins``: equal thirds (by default) of the layers, compared across models of different
    depths. ``shares``: the most inactive shares of heads whose overlap is measured. ``n_resamples``: bootstrap
    replicates and permutations, seeded by ``seed``; ``confidence``: the intervals' level. ``cdf_points``: points
    of each quantile curve drawn."""

    views: tuple[str, ...] | str = "auto"
    depth_bins: int = DEPTH_BINS
    shares: tuple[float, ...] = SHARES
    n_resamples: int = inference.N_RESAMPLES
    seed: int = 0
    confidence: float = inference.CONFIDENCE
    cdf_points: int = CDF_POINTS

    def __post_init__(self):
        if self.views != "auto":
            views = (self.views,) if isinstance(self.views, str) else tuple(self.views)
            unknown = [v for v in views if v not in VIEWS]
            if unknown:
                raise InputError(f"unknown views {unknown}: choose from {VIEWS} or 'auto'")
            object.__setattr__(self, "views", views)
        for name in ("depth_bins", "n_resamples", "cdf_points", "seed"):
            value = getattr(self, name)
            least = 0 if name == "seed" else 2 if name == "cdf_points" else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise InputError(f"DistributionSettings({name}={value!r}): give a whole number >= {least}")
        if isinstance(self.confidence, bool) or not isinstance(self.confidence, (int, float)) \
                or not 0 < self.confidence < 1:
            raise InputError(f"DistributionSettings(confidence={self.confidence!r}): give a level in (0, 1), "
                             "e.g. 0.95 (not 95)")
        if isinstance(self.shares, (str, float, int)):
            raise InputError(f"DistributionSettings(shares={self.shares!r}): give a sequence of shares, e.g. (0.1, 0.3)")
        object.__setattr__(self, "shares", tuple(float(p) for p in self.shares))
        bad_shares = [p for p in self.shares if not 0 < p < 1]
        if bad_shares:
            raise InputError(f"shares must lie in (0, 1), got {bad_shares}")

    def to_dict(self) -> dict[str, Any]:
        """The settings as plain JSON values."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}
