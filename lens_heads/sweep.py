"""The inactive-heads sweep: how much accuracy each head score loses as it zeroes more heads, against random zeroing.

For each score and target fraction p (the paper's protocol, as its authors' code runs it):

1. **Thresholds** from the *unablated* pooled CDF of the score over exactly the forward rows the evaluation runs
   (``calibration="rows"``: for cloze tasks one row per choice, context + continuation), read by
   :func:`lens_heads.distributions.thresholds`; ``calibration="prompts"`` or given inputs stay available.
2. **Per-input threshold zeroing** (:func:`lens_heads.ablation.threshold_zeroing`) during a full evaluation of the
   task; the x axis is the *realised* share of heads zeroed (it can still miss p: later layers are scored on the
   ablated stream, and ties in a score make the CDF step).
3. **Random baseline**: each (row, layer, head) zeroed with probability p (one draw per question, shared by its
   choices). p = 0 is the unablated baseline, evaluated once and shared by all curves.
4. Optionally the **static pruning view**: rank heads by their mean score over the calibration inputs and zero the
   most inactive ``round(p x layers x heads)`` heads for every input, as removing them for good would.

Rows and tokens follow a named protocol (:mod:`lens_heads.rows`: ``"lm-eval"`` by default, ``"tl"``), recorded in
the result. Each finished (mode, score, fraction) unit is written at once to ``out_dir`` as JSON (atomic); a rerun
with the same model, data, protocol, seed and calibration skips the finished units. Headline numbers: "% of heads zeroable
within 1 point" (:func:`zeroable_within`, the authors' rule or the censored one) and the normalised AUC
(:func:`normalised_auc`), both on the realised-% axis, and the paper's Table 2 (:func:`table2`).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from lens_heads import distributed
from lens_heads.ablation import random_zeroing, static_zeroing, threshold_zeroing
from lens_heads.evaluate import EvalResult, evaluate, paired_difference
from lens_heads.io import atomic_write_json, slug
from lens_heads.rows import DEFAULT_PROTOCOL, check_protocol, context_tokens

DEFAULT_FRACTIONS = (0.0, 0.05, 0.10, 0.15, 0.20, 0.25, 0.30)
RANDOM = "random"
FORMAT_VERSION = 2


# ---------------------------------------------------------------- curve summaries (pure)


RULES = ("authors", "censored")


def zeroable_within(x: Sequence[float], y: Sequence[float], baseline: float, points: float = 1.0, *,
                    rule: str = "authors") -> float:
    """Share of heads zeroable before accuracy drops ``points`` below ``baseline``.

    ``x``: realised % of heads zeroed, ``y``: accuracy in % (same units as ``baseline`` and ``points``).

    - ``rule="authors"`` (the paper's Table 2, the authors' ``get_intersection``): walk the points in the order
      given (the sweep passes them by target fraction), and take the x of the last segment that crosses the line
      ``baseline - points`` (strict sign change, linearly interpolated) or the last point lying exactly on it;
      a curve that never meets the line gives 0.
    - ``rule="censored"``: points sorted by x; the x of the last downward crossing, interpolated; a curve that
      ends at or above the line gives its largest x, a lower bound ("≥ X%": :func:`ends_above` says when).
    """
    if rule == "authors":
        return _last_crossing(np.asarray(x, dtype=float), np.asarray(y, dtype=float) - (baseline - points))
    if rule != "censored":
        raise ValueError(f"unknown rule {rule!r}: choose 'authors' (the paper's: last crossing, 0 if none) or "
                         "'censored' (the measured range's end when the curve never drops, a lower bound)")
    x, y = _sorted_curve(x, y)
    line = baseline - points
    if y[-1] >= line:
        return float(x[-1])
    above = np.nonzero(y >= line)[0]
    if above.size == 0:  # below the line from the first point on
        return float(x[0])
    i = int(above[-1])  # last point at or above the line; every later point is below it
    return float(x[i] + (y[i] - line) / (y[i] - y[i + 1]) * (x[i + 1] - x[i]))


def ends_above(x: Sequence[float], y: Sequence[float], baseline: float, points: float = 1.0) -> bool:
    """Whether the curve ends at or above ``baseline - points``: its censored share is only a lower bound."""
    x, y = _sorted_curve(x, y)
    return bool(y[-1] >= baseline - points)


def _last_crossing(x: np.ndarray, d: np.ndarray) -> float:
    """The authors' rule on ``d = y - line``: the last sign change (interpolated) or zero, in the given order."""
    if x.shape != d.shape or x.size < 2:
        raise ValueError(f"a curve needs equally many x and y values (at least two), got {x.size} and {d.size}")
    last = x[0] if d[0] == 0 else None
    for i in range(x.size - 1):
        if d[i] * d[i + 1] < 0:
            last = x[i] + (0 - d[i]) * (x[i + 1] - x[i]) / (d[i + 1] - d[i])
        if d[i + 1] == 0:
            last = x[i + 1]
    return 0.0 if last is None else float(last)


def normalised_auc(x: Sequence[float], y: Sequence[float]) -> float:
    """Trapezoid integral of ``y`` over ``x`` divided by the x range (a mean accuracy over the swept range)."""
    x, y = _sorted_curve(x, y)
    width = x[-1] - x[0]
    if width <= 0:
        return float("nan")
    return float(np.sum((x[1:] - x[:-1]) * (y[1:] + y[:-1]) / 2) / width)


def _sorted_curve(x, y) -> tuple[np.ndarray, np.ndarray]:
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.shape != y.shape or x.size == 0:
        raise ValueError(f"a curve needs equally many x and y values (at least one), got {x.size} and {y.size}")
    order = np.argsort(x, kind="stable")
    return x[order], y[order]


# ---------------------------------------------------------------- results


@dataclass
class UnitResult:
    """One evaluated point of the sweep."""

    mode: str  # "baseline" | "threshold" | "random" | "static"
    score: str | None
    target_fraction: float
    threshold: float | None
    realised_fraction: float
    result: EvalResult
    head_share: list[list[float]] | None = None  # [layer][head]: share of inputs for which the head was zeroed
    wall_s: float = float("nan")

    @property
    def key(self) -> str:
        return unit_key(self.mode, self.score, self.target_fraction)

    def to_dict(self) -> dict:
        return dict(key=self.key, mode=self.mode, score=self.score, target_fraction=self.target_fraction,
                    threshold=self.threshold, realised_fraction=self.realised_fraction, wall_s=self.wall_s,
                    head_share=self.head_share, result=self.result.to_dict())

    @classmethod
    def from_dict(cls, d: dict) -> "UnitResult":
        return cls(mode=d["mode"], score=d["score"], target_fraction=d["target_fraction"], threshold=d["threshold"],
                   realised_fraction=d["realised_fraction"], result=EvalResult.from_dict(d["result"]),
                   head_share=d.get("head_share"), wall_s=d.get("wall_s") or float("nan"))


def unit_key(mode: str, score: str | None, fraction: float) -> str:
    return f"{mode}__{slug(score or 'none')}__{fraction:.4f}"


@dataclass
class SweepResult:
    """All units of a sweep. Accuracy and realised fractions are in [0, 1] in the table; the curve summaries
    (``zeroable_within``, ``normalised_auc``) speak percent, as the paper does."""

    baseline: EvalResult
    units: list[UnitResult]
    meta: dict = field(default_factory=dict)

    def curves(self, mode: str = "threshold") -> dict[str, list[UnitResult]]:
        """Per score (``"random"`` for the random baseline), its units sorted by realised share, starting with the
        shared unablated baseline at 0."""
        base = next(u for u in self.units if u.mode == "baseline")
        out: dict[str, list[UnitResult]] = {}
        for u in self.units:
            if u.mode == mode or (mode == "threshold" and u.mode == "random"):
                out.setdefault(RANDOM if u.mode == "random" else u.score, [base]).append(u)
        order = [s for s in self.meta.get("scores", []) if s in out] + [s for s in out if s not in self.meta.get(
            "scores", []) and s != RANDOM] + ([RANDOM] if RANDOM in out else [])
        return {s: sorted(out[s], key=lambda u: (u.realised_fraction, u.target_fraction)) for s in order}

    def zeroable_within(self, points: float = 1.0, *, mode: str = "threshold", rule: str = "authors"
                        ) -> dict[str, float]:
        """Per score (and ``"random"``): % of heads zeroable within ``points`` accuracy points of the baseline, by
        ``rule`` (:func:`zeroable_within`; the authors' rule walks each curve in order of target fraction)."""
        base = 100 * self.baseline.accuracy
        return {s: zeroable_within(*self._curve(self._ordered(us, rule), "accuracy"), base, points, rule=rule)
                for s, us in self.curves(mode).items()}

    def ends_above(self, points: float = 1.0, *, mode: str = "threshold") -> dict[str, bool]:
        """Per score: whether its curve ends at or above ``baseline - points`` (its censored share is "≥")."""
        base = 100 * self.baseline.accuracy
        return {s: ends_above(*self._curve(us, "accuracy"), base, points) for s, us in self.curves(mode).items()}

    def table2(self, points: float = 1.0) -> dict:
        """The paper's Table 2 entry for this model and task: % zeroable within ``points`` (authors' rule) of AWFT
        beside the best of every other curve, random included."""
        shares = self.zeroable_within(points, rule="authors")
        others = {s: v for s, v in shares.items() if s != "AWFT"}
        if not others:
            raise ValueError("Table 2 compares AWFT with other curves: this sweep has no curve besides AWFT")
        best = max(others, key=lambda s: others[s])
        fp = self.meta.get("fingerprint", {})
        return dict(model=fp.get("model", {}).get("name"), task=fp.get("task", {}).get("task"),
                    awft_pct=shares.get("AWFT", float("nan")), best_score=best, best_pct=others[best])

    @staticmethod
    def _ordered(units: list[UnitResult], rule: str) -> list[UnitResult]:
        return sorted(units, key=lambda u: u.target_fraction) if rule == "authors" else units

    def normalised_auc(self, *, mode: str = "threshold", metric: str = "accuracy") -> dict[str, float]:
        """Per score (and ``"random"``): normalised AUC over realised % zeroed of accuracy (%, the paper's
        ranking, higher is better) or, with ``metric="kl"``, of the paired KL(unablated || ablated) of the answer
        distributions (nats, lower is better: a low-variance companion where accuracy differences are noise)."""
        return {s: normalised_auc(*self._curve(us, metric)) for s, us in self.curves(mode).items()}

    def at_share(self, share: float, *, metric: str = "kl", mode: str = "threshold") -> dict[str, float]:
        """Per score: ``metric`` (``"accuracy"`` in %, or the paired ``"kl"``) linearly interpolated at ``share`` %
        of heads zeroed, NaN where the curve doesn't reach that share. Curves end at different realised shares, and
        an AUC normalised over a shorter range looks better: this compares the scores at the same share."""
        out = {}
        for s, us in self.curves(mode).items():
            x, y = _sorted_curve(*self._curve(us, metric))
            out[s] = float(np.interp(share, x, y)) if x[0] <= share <= x[-1] else float("nan")
        return out

    def _curve(self, units: list[UnitResult], metric: str) -> tuple[list[float], list[float]]:
        """x = realised % zeroed, y = ``metric`` of each unit."""
        return [100 * u.realised_fraction for u in units], [self._metric(u, metric) for u in units]

    def _metric(self, u: UnitResult, metric: str) -> float:
        if metric == "accuracy":
            return 100 * u.result.accuracy
        if metric == "kl":
            return paired_difference(u.result, self.baseline).kl.mean
        raise ValueError(f"metric must be 'accuracy' or 'kl', got {metric!r}")

    def to_dataframe(self):
        """One row per curve point: the baseline appears at fraction 0 of every curve. ``score`` names the curve
        (``"random"``; static pruning curves are ``"<score> (static)"``); paired columns compare with the
        baseline on the same items; ``gold_logprob_change`` and ``kl`` are the low-variance companions."""
        import pandas as pd

        rows = []
        for mode in ("threshold", "static"):
            for score, units in self.curves(mode).items():
                label = f"{score} (static)" if mode == "static" else score
                rows += [self._row(label, u) for u in units]
        return pd.DataFrame(rows)

    def _row(self, label: str, u: UnitResult) -> dict:
        r = u.result
        low, high = r.ci95
        pd_ = paired_difference(r, self.baseline)
        return dict(score=label, mode=u.mode,
                    target_fraction=u.target_fraction, threshold=u.threshold, realised_fraction=u.realised_fraction,
                    accuracy=r.accuracy, ci_low=low, ci_high=high,
                    paired_diff=pd_.mean, paired_low=pd_.ci95[0], paired_high=pd_.ci95[1],
                    gold_logprob_change=pd_.gold_logprob_change.mean,
                    gold_logprob_low=pd_.gold_logprob_change.ci95[0], gold_logprob_high=pd_.gold_logprob_change.ci95[1],
                    kl=pd_.kl.mean, kl_low=pd_.kl.ci95[0], kl_high=pd_.kl.ci95[1],
                    **{f"accuracy_{m}": a for m, a in r.accuracies.items()}, n=r.n, chance=r.chance)

    def summary(self, points: float = 1.0, share: float = 10.0):
        """Per score (random included), ranked by the paper's accuracy AUC: % zeroable within ``points`` by the
        authors' rule and by the censored rule (with whether the curve never dropped, so that share is "≥"), the
        normalised AUC of accuracy and its rank, the normalised AUC of the paired KL and its rank, and the KL at
        ``share`` % zeroed (:meth:`at_share`)."""
        import pandas as pd

        zeroable, auc, kl = self.zeroable_within(points), self.normalised_auc(), self.normalised_auc(metric="kl")
        censored, above = self.zeroable_within(points, rule="censored"), self.ends_above(points)
        kl_at = self.at_share(share)
        ranking = sorted(auc, key=lambda s: -auc[s] if not math.isnan(auc[s]) else math.inf)
        kl_ranking = sorted(kl, key=lambda s: kl[s] if not math.isnan(kl[s]) else math.inf)
        return pd.DataFrame([{"score": s, f"zeroable_within_{points:g}_point_pct": zeroable[s],
                              f"zeroable_within_{points:g}_point_censored_pct": censored[s],
                              "never_drops": above[s],
                              "normalised_auc_pct": auc[s], "auc_rank": ranking.index(s) + 1,
                              "normalised_auc_kl": kl[s], "kl_rank": kl_ranking.index(s) + 1,
                              f"kl_at_{share:g}pct": kl_at[s]} for s in ranking])


def table2(sweeps: Sequence[SweepResult], points: float = 1.0):
    """The paper's Table 2 over several sweeps (models x tasks): per sweep, AWFT's % zeroable within ``points``
    beside the best other curve's (random included), authors' rule."""
    import pandas as pd

    rows = [sweep.table2(points) for sweep in sweeps]
    keys = [(r["model"], r["task"]) for r in rows]
    if len(set(keys)) != len(keys):
        raise ValueError(f"two sweeps of the same model and task in {keys}: give one sweep per (model, task)")
    return pd.DataFrame(rows)


# ---------------------------------------------------------------- the sweep

CALIBRATIONS = ("rows", "prompts")


@distributed.local()  # each unit is evaluated whole by the worker that owns it
def run_sweep(model, task, *, scores: Sequence[str] | None = None, fractions: Sequence[float] = DEFAULT_FRACTIONS,
              calibration="rows", out_dir=None, seed: int = 0, batch_size: int | str = 8,
              random_baseline: bool = True, static_scores: Sequence[str] = (), progress: bool = True,
              primary: str = "sum", protocol: str = DEFAULT_PROTOCOL,
              apply_chat_template: bool = False) -> SweepResult | None:
    """Evaluate ``task`` with heads zeroed per input by each score at each target fraction, plus the random
    baseline (``random_baseline``) and the static pruning view for ``static_scores``.

    ``calibration``: where thresholds and static rankings come from: ``"rows"`` (the authors' protocol: an
    unablated scoring pass over exactly the forward rows the evaluation runs), ``"prompts"`` (each item's context
    alone, as its rows begin), a :class:`lens_heads.head_scores.HeadScores` already computed, or any inputs
    ``score_heads`` accepts. ``protocol``/``apply_chat_template``: the evaluation's rows (:mod:`lens_heads.rows`).
    ``out_dir``: where each finished unit is written (and found again on a rerun). ``seed``: the random baseline's.
    ``batch_size``: rows per forward pass, or ``"auto"``.

    Several workers (:mod:`lens_heads.distributed`) share the units: torchrun ranks gather them all, so every rank
    returns the whole result (only rank 0 should write it); the tasks of a job array each run their share into the
    shared ``out_dir`` and return None unless every unit is finished there, and a plain run afterwards merges them.
    """
    from tqdm.auto import tqdm

    from lens_heads.scores import SCORE_NAMES

    scores = list(SCORE_NAMES if scores is None else scores)
    unknown = [s for s in list(scores) + list(static_scores) if s not in SCORE_NAMES]
    if unknown:
        raise ValueError(f"unknown scores {unknown}: choose from {SCORE_NAMES}")
    fractions = sorted({float(p) for p in fractions} | {0.0})
    if any(not 0.0 <= p < 1.0 for p in fractions):
        raise ValueError(f"target fractions must lie in [0, 1), got {fractions}")
    out = Path(out_dir) if out_dir is not None else None
    check_protocol(protocol)
    if isinstance(calibration, str) and calibration not in CALIBRATIONS:
        raise ValueError(f"unknown calibration {calibration!r}: choose 'rows' (the evaluated rows, the paper's), "
                         "'prompts', a HeadScores, or inputs to score")
    fingerprint = _fingerprint(model, task, seed, primary, calibration, protocol, apply_chat_template)
    distributed.check_agree(fingerprint, "sweep fingerprint (model, data, seed, scoring, calibration)")
    workers = distributed.unit_workers()
    progress = progress and distributed.is_main()
    if out is not None:
        claim_folder(out, fingerprint)

    plan = [("baseline", None, 0.0)]
    for p in fractions[1:]:
        plan += [("random", None, p)] if random_baseline else []
        plan += [("threshold", s, p) for s in scores]
        plan += [("static", s, p) for s in static_scores]
    done = {key: unit for key, unit in _load_units(out, fingerprint).items()} if out is not None else {}
    mine = set(workers.share(len(plan)))
    pending = [u for i, u in enumerate(plan) if unit_key(*u) not in done and i in mine]

    calib = _Calibration(model, task, calibration, out, fingerprint, batch_size, progress,
                         dict(protocol=protocol, apply_chat_template=apply_chat_template)) if any(
        mode in ("threshold", "static") for mode, _, _ in pending) else None
    units: dict[str, UnitResult] = {}
    bar = tqdm(plan, desc=f"sweep {getattr(task, 'name', '')} units", unit="unit", disable=not progress)
    for index, (mode, score, p) in enumerate(bar):
        key = unit_key(mode, score, p)
        if key in done:
            units[key] = done[key]
            continue
        if index not in mine:
            continue
        bar.set_postfix_str(f"{mode} {score or ''} {p:g}".replace("  ", " "))
        zeroing, threshold = None, None
        if mode == "threshold":
            threshold = calib.threshold(score, p)
            zeroing = threshold_zeroing(model, score, threshold)
        elif mode == "random":
            zeroing = random_zeroing(model, p, seed)
        elif mode == "static":
            zeroing = static_zeroing(model, calib.most_inactive(score, p))
        start = time.perf_counter()
        result = evaluate(model, task, hooks=[zeroing] if zeroing else [], batch_size=batch_size,
                          progress=progress, primary=primary, protocol=protocol,
                          apply_chat_template=apply_chat_template)
        unit = UnitResult(mode=mode, score=score, target_fraction=p, threshold=threshold,
                          realised_fraction=zeroing.share_zeroed() if zeroing else 0.0, result=result,
                          head_share=zeroing.zeroed().float().mean(0).tolist() if zeroing else None,
                          wall_s=time.perf_counter() - start)
        units[key] = unit
        if out is not None:
            atomic_write_json(out / f"{key}.json", {"fingerprint": fingerprint, **unit.to_dict()})
    bar.close()
    gathered = distributed.all_gather((units, len(pending)))
    units = {key: unit for part, _ in gathered for key, unit in part.items()}
    n_run = sum(n for _, n in gathered)
    if out is not None and len(units) < len(plan):  # a job array task: the others may have finished meanwhile
        units = {**_load_units(out, fingerprint), **units}
    if len(units) < len(plan):
        return None
    ordered = [units[unit_key(*u)] for u in plan]
    meta = dict(fingerprint=fingerprint, protocol=protocol, apply_chat_template=apply_chat_template,
                fractions=fractions, scores=scores, static_scores=list(static_scores),
                random_baseline=random_baseline, seed=seed, batch_size=batch_size, out_dir=str(out) if out else None,
                calibration=calib.describe() if calib else _stored_calibration(out),
                units_reused=len(plan) - n_run, units_run=n_run, workers=workers.to_dict())
    return SweepResult(baseline=ordered[0].result, units=ordered, meta=meta)


class _Calibration:
    """Thresholds and static rankings from the unablated scores; kept in ``out_dir/calibration.json`` so a resumed
    sweep uses exactly the thresholds of the first run without scoring again."""

    def __init__(self, model, task, calibration, out: Path | None, fingerprint: dict, batch_size: int,
                 progress: bool, rows: dict):
        self._model, self._task, self._calibration, self._rows = model, task, calibration, rows
        self._batch_size, self._progress = batch_size, progress
        self._fingerprint = fingerprint
        self._path = out / "calibration.json" if out is not None else None
        self._scores = None
        self._stored = read_json(self._path) if self._path is not None and self._path.exists() else None
        if self._stored and self._stored.get("fingerprint") != fingerprint:
            self._stored = None

    def _head_scores(self):
        if self._scores is None:
            from lens_heads.head_scores import HeadScores, score_heads

            source = self._calibration
            if isinstance(source, HeadScores):
                self._scores = source
                return source
            if source == "rows":
                source = self._task
            elif source == "prompts":
                source = [context_tokens(self._model, item, **self._rows) for item in self._task]
            self._scores = score_heads(self._model, source, batch_size=self._batch_size, progress=self._progress,
                                       **self._rows)
        return self._scores

    def _lookup(self, kind: str, score: str, p: float, compute):
        key = f"{score}|{p:.6f}"
        if self._stored and key in self._stored.get(kind, {}):
            return self._stored[kind][key]
        value = compute()
        if self._stored is None:
            self._stored = {"fingerprint": self._fingerprint, "inputs": None, "thresholds": {}, "static_heads": {}}
        self._stored.setdefault(kind, {})[key] = value
        self._stored["inputs"] = self.describe()
        if self._path is not None:
            atomic_write_json(self._path, self._stored)
        return value

    def threshold(self, score: str, p: float) -> float:
        from lens_heads.distributions import thresholds

        return float(self._lookup("thresholds", score, p, lambda: thresholds(self._head_scores(), score, [p])[p]))

    def most_inactive(self, score: str, p: float) -> list[tuple[int, int]]:
        def compute():
            hs = self._head_scores()
            mean = hs.mean(score).double()  # [layer, head]
            n_layers, n_heads = mean.shape
            k = int(round(p * n_layers * n_heads))
            order = np.argsort((mean if hs.direction[score] == "<" else -mean).reshape(-1).numpy(), kind="stable")
            return [[int(i // n_heads), int(i % n_heads)] for i in order[:k]]

        return [tuple(h) for h in self._lookup("static_heads", score, p, compute)]

    def describe(self) -> dict:
        if self._scores is not None:
            return {"data": self._scores.meta.get("data"), "n_inputs": len(self._scores)}
        if self._stored and self._stored.get("inputs"):
            return self._stored["inputs"]
        return {"source": _calibration_id(self._calibration)}


def _fingerprint(model, task, seed: int, primary: str, calibration, protocol: str, apply_chat_template: bool
                 ) -> dict:
    return run_fingerprint(model, task, seed=seed, primary=primary, calibration=_calibration_id(calibration),
                           protocol=protocol, apply_chat_template=apply_chat_template)


def run_fingerprint(model, task, **settings) -> dict:
    """What must match for a stored unit of a resumable run to be reused: model, data (item ids) and ``settings``
    (plain JSON values: seed, scoring, calibration, rows, ...)."""
    from lens_heads.models import model_meta

    m = model_meta(model)
    ids = hashlib.sha256("\n".join(item.id for item in task).encode()).hexdigest()[:16]
    meta = task.meta() if hasattr(task, "meta") else {}
    return dict(version=FORMAT_VERSION,
                model={k: m.get(k) for k in ("name", "source", "weight_basis", "dtype", "n_layers", "n_heads",
                                             "n_kv_heads", "d_model", "d_head")},
                task={k: meta.get(k) for k in ("task", "split", "shots", "format", "n", "seed")}, item_ids=ids,
                **settings)


def _calibration_id(calibration) -> str:
    if isinstance(calibration, str) and calibration in CALIBRATIONS:
        return {"rows": "evaluated rows", "prompts": "item prompts"}[calibration]
    values = getattr(calibration, "values", None)
    if values is not None:  # a HeadScores: its numbers are its identity
        return "scores " + hashlib.sha256(values.detach().cpu().float().numpy().tobytes()).hexdigest()[:16]
    return "inputs " + hashlib.sha256(repr(calibration).encode()).hexdigest()[:16]


def claim_folder(out: Path, fingerprint: dict, marker: str = "sweep.json") -> None:
    """Mark ``out`` as the folder of the run ``fingerprint`` (in ``out/marker``), or refuse a folder that holds
    another configuration's run."""
    path = out / marker
    if path.exists():
        stored = read_json(path)
        if stored and stored.get("fingerprint") != fingerprint:
            raise ValueError(f"{out} holds a run of another configuration "
                             f"({_diff(stored['fingerprint'], fingerprint)}): pass a new out_dir, or delete the folder "
                             "to start over")
        return
    atomic_write_json(path, {"fingerprint": fingerprint})


def _diff(a: dict, b: dict) -> str:
    keys = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    return "differs in " + ", ".join(keys) if keys else "same"


def _load_units(out: Path, fingerprint: dict) -> dict[str, UnitResult]:
    units = {}
    for path in sorted(out.glob("*__*__*.json")):
        d = read_json(path)
        if d and d.get("fingerprint") == fingerprint:
            unit = UnitResult.from_dict(d)
            units[unit.key] = unit
    return units


def _stored_calibration(out: Path | None) -> dict | None:
    path = out / "calibration.json" if out is not None else None
    d = read_json(path) if path is not None and path.exists() else None
    return d.get("inputs") if d else None


def read_json(path: Path) -> dict | None:
    """A stored unit's JSON, or None where it can't be read (the unit is then run again)."""
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None  # a unit that can't be read is run again


def load_sweep(out_dir) -> SweepResult:
    """The sweep kept in a ``run_sweep`` output folder, read back without a model: every unit whose fingerprint
    matches the folder's ``sweep.json`` (a sweep interrupted midway gives the units it finished)."""
    from lens_heads.scores import SCORE_NAMES

    out = Path(out_dir)
    stored = read_json(out / "sweep.json") if (out / "sweep.json").exists() else None
    if not stored or "fingerprint" not in stored:
        raise FileNotFoundError(f"{out} holds no sweep (no readable sweep.json): give the out_dir of run_sweep")
    fingerprint = stored["fingerprint"]
    units = list(_load_units(out, fingerprint).values())
    base = [u for u in units if u.mode == "baseline"]
    if not base:
        raise ValueError(f"{out} has no finished baseline unit yet: rerun run_sweep with out_dir={str(out)!r}")
    modes = ("baseline", "random", "threshold", "static")
    rank = {s: i for i, s in enumerate(SCORE_NAMES)}
    units.sort(key=lambda u: (u.target_fraction, modes.index(u.mode), rank.get(u.score, -1)))
    scores = sorted({u.score for u in units if u.mode == "threshold"}, key=lambda s: rank.get(s, len(rank)))
    static = sorted({u.score for u in units if u.mode == "static"}, key=lambda s: rank.get(s, len(rank)))
    meta = dict(fingerprint=fingerprint, fractions=sorted({u.target_fraction for u in units}), scores=scores,
                static_scores=static, random_baseline=any(u.mode == "random" for u in units),
                seed=fingerprint.get("seed"), out_dir=str(out), calibration=_stored_calibration(out),
                units_reused=len(units), units_run=0)
    return SweepResult(baseline=base[0].result, units=units, meta=meta)
