"""Synthetic sweeps whose true summaries are known: every item has two choices, gold first, and each curve's
ablation lowers the gold choice's log-likelihood by one of two levels at random."""

import numpy as np

from lens_heads.ablation.specs import RandomAblation, ThresholdAblation, Unablated
from lens_heads.evaluation.results import EvalResult, ItemRecord
from lens_heads.sweep.result import SweepResult, UnitResult

TARGETS = (0.1, 0.2, 0.3)
BASE = np.array([0.0, -1.0])  # every item: two choices, gold 0, answered right before any ablation


def kl_of(e: float) -> float:
    """KL(base || ablated) when the gold choice's log-likelihood drops by ``e``."""
    p = np.exp(BASE) / np.exp(BASE).sum()
    a = BASE - np.array([e, 0.0])
    q = np.exp(a) / np.exp(a).sum()
    return float(np.sum(p * np.log(p / q)))


def record(i: int, e: float) -> ItemRecord:
    return ItemRecord(id=f"q{i}", gold=0, logprobs=(BASE - np.array([e, 0.0])).tolist(), n_tokens=[1, 1],
                      n_chars=[1, 1], greedy=[True, False], n_bytes=[1, 1])


def spec_of(mode: str, score: str | None, p: float, threshold: float | None = None) -> dict:
    """The spec JSON of a synthetic unit: the baseline, a random ablation or a score's threshold ablation."""
    spec = (Unablated() if mode == "baseline" else RandomAblation(p) if mode == "random" else
            ThresholdAblation(score, p, threshold))
    return spec.to_dict()


def unit(mode, score, p, drops, zeroed=None, heads=10) -> UnitResult:
    result = EvalResult(task="synthetic", format="cloze", chance=0.5, items=[record(i, e) for i, e in enumerate(drops)])
    realised = p if zeroed is None else zeroed.sum() / (2 * len(drops) * heads)
    return UnitResult(spec=spec_of(mode, score, p), realised_fraction=float(realised),
                      result=result, item_zeroed=None if zeroed is None else [[2, int(z)] for z in zeroed])


def synthetic_sweep(rng, n, drop_levels: dict, zeroed=True, *, model="m", task="t", share_factor=None
                    ) -> SweepResult:
    """Per curve, the gold log-likelihood of each item drops by one of two levels at every point, chosen at
    random (probability 1/2 each): the curve's expected KL at a point is the mean of the two levels' KLs. Each
    item's zeroed triples (of 2 rows x 10 heads) are binomial at the target share times the curve's
    ``share_factor`` (default 1), so curves can realise different shares; ``zeroed=False``: units recorded
    without per-item counts, as old records are."""
    units = [unit("baseline", None, 0.0, np.zeros(n))]
    for p in TARGETS:
        for name, levels in drop_levels.items():
            drops = np.where(rng.random(n) < 0.5, levels[0], levels[1]) * p / 0.1
            share = min(1.0, p * (share_factor or {}).get(name, 1.0))
            counts = rng.binomial(20, share, n) if zeroed else None
            units.append(unit("random" if name == "random" else "threshold", name, p, drops, counts))
    return SweepResult(baseline=units[0].result, units=units,
                       meta=dict(scores=[s for s in drop_levels if s != "random"], fractions=[0.0, *TARGETS],
                                 fingerprint=dict(model=dict(name=model, n_layers=2, n_heads=5),
                                                  task=dict(task=task, n=n, seed=0))))
