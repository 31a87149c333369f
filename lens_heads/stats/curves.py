"""Ablation curves and what is read off them: pure functions over ``x`` (realised % of heads ablated) and ``y``
(accuracy in %, or any metric), and the typed key that names a curve.

- :func:`zeroable_within`: % of heads ablatable before accuracy drops ``points`` below the baseline, by the authors'
  rule (the paper's Table 2) or the censored one; :func:`ends_above` says when the censored share is a lower bound.
- :func:`normalised_auc`: trapezoid area over the swept range divided by its width (a mean over the range).
- :func:`value_at`: the curve linearly interpolated at one share (NaN outside the measured range).
- :func:`table2_entry`: the paper's Table 2 cell, AWFT beside the best other curve.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from lens_heads.plumbing.errors import InputError

RULES = ("authors", "censored")  # how zeroable_within reads a crossing
CURVE_MODES = ("threshold", "random", "static", "per_input", "layers")
ALL = "all"  # every curve of a sweep, whatever chose its heads
SCORES_AND_RANDOM = "threshold+random"  # the paper's figure: every score's per-input curve and the random baseline
SELECTIONS = CURVE_MODES + (SCORES_AND_RANDOM, ALL)  # what a sweep's ``mode=`` selects: one mode, or one of these
RANDOM = "random"


def check_selection(selection: str) -> str:
    """``selection`` if it is one of :data:`SELECTIONS`, else a clear error."""
    if selection not in SELECTIONS:
        raise InputError(f"mode={selection!r}: choose a curve mode {CURVE_MODES}, {SCORES_AND_RANDOM!r} (the score "
                         f"curves and random, the paper's figure) or {ALL!r}")
    return selection


def selects(selection: str, mode: str) -> bool:
    """Whether a curve of ``mode`` is among the curves ``selection`` (checked by :func:`check_selection`) names."""
    return selection == ALL or mode == selection or (selection == SCORES_AND_RANDOM and mode in ("threshold", RANDOM))


@dataclass(frozen=True, order=True)
class CurveKey:
    """Which curve: how heads were chosen (``mode``: ``"threshold"`` per input by a score, ``"random"``,
    ``"static"`` a fixed set for every input, ``"per_input"`` each input's own set from its own ranking,
    ``"layers"`` whole layers removed) and the bare score name that chose them (``None`` for random; any name for
    a set ranked otherwise, such as an oracle; for removed layers, the ranking and the part,
    :class:`lens_heads.ablation.specs.LayerRemoval`)."""

    mode: str
    score: str | None = None

    def __post_init__(self):
        if self.mode not in CURVE_MODES:
            raise InputError(f"curve mode must be one of {CURVE_MODES}, got {self.mode!r}")

    @property
    def name(self) -> str:
        """The score column of a curve table: the bare score name, ``"random"`` for the random curve."""
        return RANDOM if self.mode == "random" else str(self.score)

    @property
    def label(self) -> str:
        """The display name: ``"AHON (LN)"``, ``"random"``, ``"AHON (LN) (static)"``, ``"attribution (per
        input)"``."""
        return {"static": f"{self.name} (static)", "per_input": f"{self.name} (per input)"}.get(self.mode, self.name)


def zeroable_within(x: np.ndarray | Sequence[float], y: np.ndarray | Sequence[float], baseline: float,
                    points: float = 1.0, *, rule: str = "authors") -> float:
    """Share of heads zeroable before accuracy drops ``points`` below ``baseline``.

    ``x``: realised % of heads zeroed, ``y``: accuracy in % (same units as ``baseline`` and ``points``).

    - ``rule="authors"`` (the paper's Table 2, the authors' ``get_intersection``): walk the points in order of x
      (the realised share, as the authors' notebook sorts them; ties keep the order given), and take the x of the
      last segment that crosses the line ``baseline - points`` (strict sign change, linearly interpolated) or the
      last point lying exactly on it; a curve that never meets the line gives 0.
    - ``rule="censored"``: points sorted by x; the x of the last downward crossing, interpolated; a curve that
      ends at or above the line gives its largest x, a lower bound ("≥ X%": :func:`ends_above` says when).
    """
    if rule not in RULES:
        raise InputError(f"unknown rule {rule!r}: choose 'authors' (the paper's: last crossing, 0 if none) or "
                         "'censored' (the measured range's end when the curve never drops, a lower bound)")
    if rule == "authors":
        x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
        if x.shape != y.shape or x.size < 2:
            raise InputError(f"a curve needs equally many x and y values (at least two), got {x.size} and {y.size}")
        x, y = sorted_curve(x, y)
        return _last_crossing(x, y - (baseline - points))
    x, y = sorted_curve(x, y)
    line = baseline - points
    if y[-1] >= line:
        return float(x[-1])
    above = np.nonzero(y >= line)[0]
    if above.size == 0:  # below the line from the first point on
        return float(x[0])
    i = int(above[-1])  # last point at or above the line; every later point is below it
    return float(x[i] + (y[i] - line) / (y[i] - y[i + 1]) * (x[i + 1] - x[i]))


def ends_above(x: np.ndarray | Sequence[float], y: np.ndarray | Sequence[float], baseline: float,
               points: float = 1.0) -> bool:
    """Whether the curve ends at or above ``baseline - points``: its censored share is only a lower bound."""
    x, y = sorted_curve(x, y)
    return bool(y[-1] >= baseline - points)


def _last_crossing(x: np.ndarray, d: np.ndarray) -> float:
    """The authors' rule on ``d = y - line``: the last sign change (interpolated) or zero, in the given order."""
    last = x[0] if d[0] == 0 else None
    for i in range(x.size - 1):
        if d[i] * d[i + 1] < 0:
            last = x[i] + (0 - d[i]) * (x[i + 1] - x[i]) / (d[i + 1] - d[i])
        if d[i + 1] == 0:
            last = x[i + 1]
    return 0.0 if last is None else float(last)


def normalised_auc(x: np.ndarray | Sequence[float], y: np.ndarray | Sequence[float]) -> float:
    """Trapezoid integral of ``y`` over ``x`` divided by the x range (a mean accuracy over the swept range)."""
    x, y = sorted_curve(x, y)
    width = x[-1] - x[0]
    if width <= 0:
        return float("nan")
    return float(np.sum((x[1:] - x[:-1]) * (y[1:] + y[:-1]) / 2) / width)


def check_share(share, where: str) -> None:
    """A share of heads is a fraction in [0, 1] everywhere lens_heads takes one; percent appears only in column
    names, figure axes and the curves' x values (realised % zeroed)."""
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 <= share <= 1:
        raise InputError(f"{where}: a share of heads is a fraction in [0, 1] (0.1 for 10%), got {share!r}")


def value_at(x: np.ndarray | Sequence[float], y: np.ndarray | Sequence[float], share: float) -> float:
    """``y`` linearly interpolated at ``x = share``; NaN where the curve doesn't reach it (never extrapolated)."""
    x, y = sorted_curve(x, y)
    return float(np.interp(share, x, y)) if x[0] <= share <= x[-1] else float("nan")


def sorted_curve(x, y) -> tuple[np.ndarray, np.ndarray]:
    """The points as float arrays sorted by ``x`` (stable: ties keep their order)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.shape != y.shape or x.size == 0:
        raise InputError(f"a curve needs equally many x and y values (at least one), got {x.size} and {y.size}")
    order = np.argsort(x, kind="stable")
    return x[order], y[order]


def table2_entry(shares: Mapping[str, float], reference: str = "AWFT") -> dict:
    """The paper's Table 2 cell from each curve's % zeroable (authors' rule): ``reference``'s share beside the
    best of every other curve (the first listed among equals)."""
    others = {s: v for s, v in shares.items() if s != reference}
    if not others:
        raise InputError(f"Table 2 compares {reference} with other curves: this sweep has no curve besides "
                         f"{reference}")
    best = max(others, key=lambda s: others[s])
    return dict(awft_pct=shares.get(reference, float("nan")), best_score=best, best_pct=others[best])
