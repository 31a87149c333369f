"""A sweep's calibration: thresholds and static head sets from the unablated scores, computed once and kept with the
run, so a resumed sweep zeroes at exactly the thresholds of its first run."""

from __future__ import annotations

import hashlib

from lens_heads.ablation.specs import ScoreCalibration
from lens_heads.data.rows import context_tokens
from lens_heads.evaluation.eval_settings import EvalSettings
from lens_heads.heads.distributions import pooled_cdf
from lens_heads.heads.scoring import HeadScores, score_heads
from lens_heads.plumbing.cache import load_keyed, save_keyed
from lens_heads.sweep.result import calibration_key
from lens_heads.sweep.unit_store import UnitStore

CALIBRATIONS = ("rows", "prompts")


class Calibration:
    """Thresholds and static head sets from the unablated scores (:class:`ScoreCalibration`), computed on first
    need and kept in ``out_dir/calibration.json`` under the run's fingerprint, so a resumed sweep uses exactly the
    thresholds of the first run without scoring again."""

    def __init__(self, model, task, calibration, store: UnitStore, settings: EvalSettings, progress: bool,
                 extras=(), thresholds=None):
        self._model, self._task, self._calibration, self._settings = model, task, calibration, settings
        self._extras, self._thresholds, self._progress = list(extras), thresholds, progress
        self._fingerprint = store.fingerprint
        self._path = store.out / "calibration.json" if store.out is not None else None
        self._scores = None
        self._stored = load_keyed(self._path, self._fingerprint) if self._path is not None else None

    def _head_scores(self):
        if self._scores is None:
            source = self._calibration
            if isinstance(source, HeadScores):
                self._scores = source
                return source
            if source == "rows":
                source = self._task
            elif source == "prompts":
                source = [context_tokens(self._model, item, **self._settings.rows()) for item in self._task]
            self._scores = score_heads(self._model, source, settings=self._settings, progress=self._progress,
                                       extras=self._extras)
        return self._scores

    def _lookup(self, kind: str, score: str, p: float, compute):
        key = calibration_key(score, p)
        if self._stored and key in self._stored.get(kind, {}):
            return self._stored[kind][key]
        value = compute()
        if self._stored is None:
            self._stored = {"inputs": None, "thresholds": {}, "static_heads": {}}
        self._stored.setdefault(kind, {})[key] = value
        self._stored["inputs"] = self.describe()
        if self._path is not None:
            save_keyed(self._path, self._fingerprint, self._stored)
        return value

    def threshold(self, score: str, p: float) -> float:
        if self._thresholds is not None:  # given (the authors' file): nothing to calibrate
            return self._thresholds.threshold(score, p)
        return float(self._lookup("thresholds", score, p,
                                  lambda: ScoreCalibration(self._head_scores()).threshold(score, p)))

    def unablated_share(self, score: str, p: float) -> float:
        """The share of (row, layer, head) values the threshold for ``p`` puts on the inactive side of the
        unablated scores: what ties alone leave of the target, before the ablation's cascade."""
        return float(self._lookup("unablated_shares", score, p, lambda: pooled_cdf(
            self._head_scores(), score).inactive_fraction(self.threshold(score, p))))

    def most_inactive(self, score: str, p: float) -> list[tuple[int, int]]:
        heads = self._lookup("static_heads", score, p, lambda: [
            list(h) for h in ScoreCalibration(self._head_scores()).most_inactive(score, p)])
        return [tuple(h) for h in heads]

    def describe(self) -> dict:
        if self._scores is not None:
            return {"data": self._scores.meta.get("data"), "n_inputs": len(self._scores)}
        if self._stored and self._stored.get("inputs"):
            return self._stored["inputs"]
        return {"source": calibration_id(self._calibration)}


def calibration_id(calibration) -> str:
    if isinstance(calibration, str) and calibration in CALIBRATIONS:
        return {"rows": "evaluated rows", "prompts": "item prompts"}[calibration]
    values = getattr(calibration, "values", None)
    if values is not None:  # a HeadScores: its numbers are its identity
        return "scores " + hashlib.sha256(values.detach().cpu().float().numpy().tobytes()).hexdigest()[:16]
    return "inputs " + hashlib.sha256(repr(calibration).encode()).hexdigest()[:16]
