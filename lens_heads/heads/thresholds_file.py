"""Thresholds in the format the inactive-heads authors released (their ``thresholds.json``), read and written.

Their file holds, per task and model, one list of seven thresholds per head score: the thresholds read off the
pooled CDF of the unablated scores at the target shares p = 0, 5, ..., 30% (the (1 - p) quantile for AWFT scores):

    {"mmlu": {"meta-llama_Llama-3.2-3B": {"Dormant": [t_0, t_5, ..., t_30], "HONOR": [...], ...}, ...}, ...}

Models are named by their Hugging Face id with "/" replaced by "_"; scores by the class names of their code, which
:data:`AUTHORS_NAMES` maps to the names used here ("HONOR" is AHON (LN), "FullHeadOutput" is AHON (full): the mean
over positions of the head's output norm after its slice of W_O). :func:`load_thresholds` reads one (task, model)
entry as :class:`Thresholds`; ``run_sweep(..., thresholds=...)`` zeroes heads at those thresholds instead of
calibrating its own, and refuses them for another model. :func:`save_thresholds` writes thresholds computed here
(:func:`lens_heads.heads.distributions.thresholds`, numpy's interpolated quantiles) in the same format.

The authors scored their models in bfloat16 with Hugging Face's raw weights; a threshold is only meaningful on
scores in the same basis, so a model loaded with TransformerLens weight processing is refused.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from lens_heads.heads.distributions import thresholds as cdf_thresholds
from lens_heads.heads.scores import get_score
from lens_heads.heads.scoring import HeadScores
from lens_heads.models.embedded import EMBEDDED
from lens_heads.models.loading import model_meta
from lens_heads.plumbing.errors import InputError
from lens_heads.plumbing.io import atomic_write_json

# The target shares of every list in the authors' file, in order.
AUTHORS_FRACTIONS = (0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3)
# The authors' score (class) names and the lens_heads score each one computes.
AUTHORS_NAMES = {
    "Dormant": "AWFT", "NormalizedDormant": "AWFT (LN)",
    "Entropy": "AEQD", "NormalizedEntropy": "AEQD (LN)",
    "ValueVectorMagnitudeFirstToken": "FTVVN", "ValueVectorMagnitudeNormalizedFirstToken": "FTVVN (LN)",
    "ValueVectorAvgMagnitude": "AVVN", "ValueVectorAvgNormalizedMagnitude": "AVVN (LN)",
    "HeadOutputMagnitudeLastToken": "LTHON", "HeadOutputMagnitudeNormalizedLastToken": "LTHON (LN)",
    "HeadOutputMagnitudeNormalizedHeadLastToken": "LTHON (HN)",
    "UnnormalizedHONOR": "AHON", "HONOR": "AHON (LN)",
    "FullHeadOutput": "AHON (full)", "FullHeadOutputNormalized": "AHON (full, LN)",
}
LENS_HEADS_NAMES = {ours: theirs for theirs, ours in AUTHORS_NAMES.items()}


@dataclass(frozen=True)
class Thresholds:
    """One (task, model) entry of an authors'-format thresholds file: ``values[score][i]`` is the threshold at
    target share ``fractions[i]``, scores named as in lens_heads."""

    model: str  # the file's model key: Hugging Face id with "/" -> "_"
    task: str
    fractions: tuple[float, ...]
    values: dict[str, tuple[float, ...]]
    source: str = ""

    @property
    def scores(self) -> list[str]:
        return list(self.values)

    def threshold(self, score: str, fraction: float) -> float:
        """The threshold of ``score`` at target share ``fraction``; a score or share the file lacks is refused."""
        if score not in self.values:
            raise InputError(f"the thresholds file ({self.describe()}) has no {score!r}: its scores are "
                             f"{', '.join(self.scores)}; sweep those, or calibrate on this model instead")
        index = [i for i, p in enumerate(self.fractions) if abs(p - fraction) < 1e-9]
        if not index:
            raise InputError(f"the thresholds file has no threshold at target share {fraction:g}: it has "
                             f"{', '.join(f'{p:g}' for p in self.fractions)}")
        return float(self.values[score][index[0]])

    def check_model(self, model) -> None:
        """Refuse thresholds made for another model (or on another weight basis) than ``model``."""
        key = model_key(model)
        if key.lower() != self.model.lower():
            raise InputError(f"these thresholds are for {self.model} ({self.task}), not for {key}: head scores "
                             "differ between models, so thresholds do not carry over. Load the file's entry for "
                             f"this model (load_thresholds(path, model={key!r})) or calibrate on it (leave "
                             "thresholds=None)")
        if str(model_meta(model).get("weight_basis", "")).startswith("processed"):
            raise InputError("the authors' thresholds are in the raw weight basis; this model was loaded with "
                             "weight processing, which changes the value and output norms: load it with "
                             "processing=False")

    def describe(self) -> str:
        return f"{self.task} / {self.model}" + (f" from {self.source}" if self.source else "")

    def digest(self) -> str:
        """A short hash of the thresholds (what a resumable run keys its stored units by)."""
        data = json.dumps([self.model, self.task, self.fractions, self.values], sort_keys=True)
        return hashlib.sha256(data.encode()).hexdigest()[:16]


def model_key(model) -> str:
    """The authors' name of a model: its Hugging Face id with "/" replaced by "_" (an embedded model by the id its
    weights come from). ``model``: a loaded model, a lens_heads model name, a Hugging Face id or a key already."""
    name = model if isinstance(model, str) else str(model_meta(model).get("name", ""))
    return EMBEDDED.get(name.lower(), {}).get("hf_name", name).replace("/", "_")


def load_thresholds(path: str | Path, model=None, *, task: str | None = None) -> Thresholds:
    """Read the thresholds of one ``task`` and ``model`` from an authors'-format ``thresholds.json``.

    ``model``: a Hugging Face id ("meta-llama/Llama-3.2-3B"), the file's key ("meta-llama_Llama-3.2-3B") or a loaded
    model; ``task``: a key of the file ("mmlu"). Either may be left out where the file holds only one. A model or
    task the file lacks, score names that are not the authors' (a file for another score set) or lists that are
    not one threshold per target share are refused, saying what the file holds.

    So are non-finite thresholds (``NaN``, ``Infinity``: JSON readers accept them) and lists that are not monotone
    in the target share. Monotone is how such a file is made: each list is read off one CDF at growing shares, so a
    larger share's threshold zeroes at least as many heads (it never falls for a '<' score, never rises for a '>'
    one: AWFT). A list that breaks this was reversed, shuffled or written for a score of the other direction, and
    a sweep on it would zero fewer heads at a larger share, so it is refused rather than warned about; a step back
    within rounding (relative 1e-6, float32 quantiles) passes."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig"))  # a byte-order mark, where an editor wrote one, dropped
    except FileNotFoundError:
        raise FileNotFoundError(f"load_thresholds: {path} does not exist: give the path of a thresholds.json") from None
    except UnicodeDecodeError:
        raise InputError(f"load_thresholds: {path} is not UTF-8 text: give an authors'-format thresholds.json") from None
    except json.JSONDecodeError as e:
        raise InputError(f"load_thresholds: {path} is not JSON ({e}): give an authors'-format thresholds.json")
    if not isinstance(data, dict) or not data or not all(isinstance(v, dict) for v in data.values()):
        raise InputError(f"load_thresholds: {path} is not in the authors' format {{task: {{model: {{score: "
                         "[7 thresholds]}}}}")
    task = _choose("task", task, list(data), path)
    key = _choose("model", None if model is None else model_key(model), list(data[task]), path)
    entry = data[task][key]
    unknown = [name for name in entry if name not in AUTHORS_NAMES]
    if unknown:
        raise InputError(f"load_thresholds: {path} ({task} / {key}) has scores {unknown} that are not the authors' "
                         f"score set ({', '.join(AUTHORS_NAMES)}): it was made for other scores")
    bad = [name for name, values in entry.items() if not isinstance(values, list) or len(values) !=
           len(AUTHORS_FRACTIONS) or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)]
    if bad:
        raise InputError(f"load_thresholds: {path} ({task} / {key}): {bad} do not hold one number per target share "
                         f"{list(AUTHORS_FRACTIONS)}")
    for name, values in entry.items():
        _check_list(values, name, f"load_thresholds: {path} ({task} / {key})")
    if model is not None and not isinstance(model, str):
        Thresholds(key, task, AUTHORS_FRACTIONS, {}).check_model(model)
    values = {AUTHORS_NAMES[name]: tuple(float(v) for v in values) for name, values in entry.items()}
    return Thresholds(model=key, task=task, fractions=AUTHORS_FRACTIONS, values=values, source=str(path))


def _check_list(values: list[float], name: str, where: str) -> None:
    """Refuse a score's thresholds that are not finite or not monotone in the target share (see load_thresholds)."""
    ours = AUTHORS_NAMES[name]
    non_finite = [p for p, v in zip(AUTHORS_FRACTIONS, values) if not math.isfinite(v)]
    if non_finite:
        raise InputError(f"{where}: {name!r} ({ours}) has non-finite thresholds (NaN or infinity) at target shares "
                         f"{non_finite}: {values}; regenerate the file (save_thresholds) from finite scores")
    direction = get_score(ours).direction
    sign = 1 if direction == "<" else -1  # '<': thresholds grow with the share; '>': they fall
    for (p, a), (q, b) in itertools.pairwise(zip(AUTHORS_FRACTIONS, values)):
        if sign * (b - a) < -1e-6 * max(abs(a), abs(b)):
            raise InputError(
                f"{where}: {name!r} ({ours}, inactive when {direction} threshold) must "
                f"{'not fall' if sign > 0 else 'not rise'} as the target share grows (a larger share zeroes more "
                f"heads), but goes from {a:g} at {p:g} to {b:g} at {q:g}: {values}. Was the list reversed or "
                "written for another score?")


def _choose(what: str, wanted: str | None, have: list[str], path: Path) -> str:
    if wanted is None:
        if len(have) == 1:
            return have[0]
        raise InputError(f"load_thresholds: {path} holds several {what}s ({', '.join(have)}): give {what}=")
    match = [h for h in have if h.lower() == wanted.lower()]
    if not match:
        raise InputError(f"load_thresholds: {path} has no {what} {wanted!r}; it holds {', '.join(have)}"
                         + (": thresholds of another model do not carry over, calibrate on yours instead"
                            if what == "model" else ""))
    return match[0]


def save_thresholds(path: str | Path, scores: HeadScores, *, task: str, model: str | None = None,
                    names: Sequence[str] | None = None) -> Path:
    """Write the thresholds of ``scores`` (every score that has an authors' name, or ``names``) at the authors'
    target shares to ``path`` in their format, under ``task`` and ``model`` (default: the scored model's key)."""
    names = [n for n in scores.all_names if n in LENS_HEADS_NAMES] if names is None else list(names)
    missing = [n for n in names if n not in LENS_HEADS_NAMES]
    if missing:
        raise InputError(f"save_thresholds: {missing} have no name in the authors' format; choose from "
                         f"{', '.join(LENS_HEADS_NAMES)}")
    key = model_key(model if model is not None else str(scores.meta.get("model", {}).get("name", "")))
    entry = {LENS_HEADS_NAMES[n]: [cdf_thresholds(scores, n, AUTHORS_FRACTIONS)[p] for p in AUTHORS_FRACTIONS]
             for n in names}
    return atomic_write_json(path, {task: {key: entry}})
