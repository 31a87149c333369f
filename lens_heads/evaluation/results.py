"""What an evaluation returns: each item's record, the accuracy with its interval, and the paired difference
between two evaluations of the same items.

Metrics: ``accuracy`` is the argmax of the *summed* log-likelihood (lm-eval's ``acc``; the primary metric by
default: on the embedded model it is the higher and the less length-biased of the two on ARC-Easy); the
per-token-normalised accuracy (log-likelihood / number of continuation tokens) and lm-eval's per-character
``acc_norm`` (log-likelihood / characters of the choice, the continuation without its leading space:
:func:`lens_heads.evaluation.logprobs.choice_chars`) are reported beside it (``accuracies``). For letter format and
WinoGrande all three coincide. ``accuracy`` is the mean over items, which for MMLU is the subject-size-weighted
accuracy (lm-eval's group score); ``macro_accuracy`` averages the subjects equally. An item with a single
continuation (LAMBADA, GSM8K's gold answer) is correct when that continuation is the greedy (argmax) token at every
one of its positions (lm-eval's ``is_greedy``); ``perplexity`` (exp of minus the mean summed log-likelihood of the
gold continuation, lm-eval's) and ``bits_per_byte`` (per item: -log2 P(gold continuation) / its UTF-8 bytes; then
the mean) sit beside it.
Intervals: Wilson score interval (95%) for an accuracy; normal approximation (mean +- 1.96 sd / sqrt(n)) for
paired differences on the same items.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Sequence

import numpy as np
import pandas as pd

from lens_heads.plumbing.errors import InputError

SCORINGS = ("sum", "per_token", "per_char")  # choice scorings: how a choice's log-likelihood is compared
Z95 = 1.959963984540054


@dataclass
class ItemRecord:
    """One item's outcome: per-choice summed log-likelihoods and the lengths that normalise them."""

    id: str
    gold: int
    logprobs: list[float]
    n_tokens: list[int]
    n_chars: list[int]  # per choice: its characters as lm-eval's acc_norm counts them (choice_chars)
    subject: str | None = None
    greedy: list[bool] = field(default_factory=list)  # per choice: every continuation token is the argmax
    n_bytes: list[int] = field(default_factory=list)  # per choice: UTF-8 bytes of the continuation

    def scores(self, scoring: str = "sum") -> np.ndarray:
        lp = np.asarray(self.logprobs, dtype=float)
        if scoring == "sum":
            return lp
        if scoring == "per_token":
            return lp / np.maximum(np.asarray(self.n_tokens), 1)
        if scoring == "per_char":
            return lp / np.maximum(np.asarray(self.n_chars), 1)
        raise InputError(f"unknown scoring {scoring!r}: choose one of {SCORINGS}")

    def chosen(self, scoring: str = "sum") -> int:
        return int(np.argmax(self.scores(scoring)))

    def correct(self, scoring: str = "sum") -> bool:
        """The argmax choice is gold; with a single continuation (nothing to choose from): it is greedy."""
        if len(self.logprobs) == 1:
            self.scores(scoring)  # still reject an unknown scoring
            return bool(self.greedy[0])
        return self.chosen(scoring) == self.gold

    @property
    def gold_bits_per_byte(self) -> float:
        """-log2 P(gold continuation) per UTF-8 byte of it."""
        return -self.gold_logprob / math.log(2) / max(self.n_bytes[self.gold], 1)

    @property
    def gold_logprob(self) -> float:
        return float(self.logprobs[self.gold])

    def answer_distribution(self, scoring: str = "sum") -> np.ndarray:
        """Softmax of the choice scores: the model's distribution over the answers."""
        s = self.scores(scoring)
        e = np.exp(s - s.max())
        return e / e.sum()


def check_primary(primary: str) -> None:
    """Refuse a scoring of the choices that :class:`ItemRecord` does not know."""
    if primary not in SCORINGS:
        raise InputError(f"primary must be one of {SCORINGS}, got {primary!r}")


@dataclass
class EvalResult:
    """Accuracy of a model (with hooks) on a task, with per-item records for paired comparisons."""

    task: str
    format: str
    items: list[ItemRecord]
    chance: float
    primary: str = "sum"
    meta: dict = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.items)

    @property
    def accuracy(self) -> float:
        """Primary accuracy (``self.primary`` scoring; mean over items = subject-weighted for MMLU)."""
        return self.accuracy_by(self.primary)

    def accuracy_by(self, scoring: str) -> float:
        return float(np.mean([it.correct(scoring) for it in self.items])) if self.items else float("nan")

    @property
    def accuracies(self) -> dict[str, float]:
        return {scoring: self.accuracy_by(scoring) for scoring in SCORINGS}

    @property
    def ci95(self) -> tuple[float, float]:
        """Wilson score 95% interval of the primary accuracy."""
        return wilson_interval(sum(it.correct(self.primary) for it in self.items), self.n)

    @property
    def perplexity(self) -> float:
        """exp(-mean gold log-likelihood) over items (lm-eval's ``perplexity`` for LAMBADA)."""
        return float(np.exp(-np.mean([it.gold_logprob for it in self.items]))) if self.items else float("nan")

    @property
    def bits_per_byte(self) -> float:
        """Mean over items of the gold continuation's bits per UTF-8 byte."""
        return float(np.mean([it.gold_bits_per_byte for it in self.items])) if self.items else float("nan")

    def subject_accuracy(self) -> dict[str, float]:
        by: dict[str, list[bool]] = {}
        for it in self.items:
            by.setdefault(it.subject or self.task, []).append(it.correct(self.primary))
        return {s: float(np.mean(v)) for s, v in sorted(by.items())}

    @property
    def macro_accuracy(self) -> float:
        """Unweighted mean of per-subject accuracies (equals ``accuracy`` for tasks without subjects)."""
        per = self.subject_accuracy()
        return float(np.mean(list(per.values()))) if per else float("nan")

    def summary(self) -> dict:
        low, high = self.ci95
        return dict(task=self.task, format=self.format, n=self.n, primary=self.primary, accuracy=self.accuracy,
                    ci_low=low, ci_high=high, ci_method="wilson 95%", chance=self.chance,
                    macro_accuracy=self.macro_accuracy, perplexity=self.perplexity, bits_per_byte=self.bits_per_byte,
                    **{f"accuracy_{metric}": acc for metric, acc in self.accuracies.items()})

    def to_dataframe(self):
        """One row per item: choice, gold, correctness, gold log-prob and per-choice log-probs."""
        return pd.DataFrame([dict(id=it.id, subject=it.subject, gold=it.gold, chosen=it.chosen(self.primary),
                                  correct=it.correct(self.primary), gold_logprob=it.gold_logprob,
                                  chosen_per_token=it.chosen("per_token"), chosen_per_char=it.chosen("per_char"),
                                  logprobs=list(it.logprobs), n_tokens=list(it.n_tokens)) for it in self.items])

    def to_dict(self) -> dict:
        return dict(task=self.task, format=self.format, chance=self.chance, primary=self.primary, meta=self.meta,
                    items=[asdict(it) for it in self.items])

    @classmethod
    def from_dict(cls, d: dict) -> "EvalResult":
        return cls(task=d["task"], format=d["format"], chance=d["chance"], primary=d["primary"], meta=d["meta"],
                   items=[ItemRecord(**it) for it in d["items"]])

    def __repr__(self) -> str:
        low, high = self.ci95
        return (f"EvalResult({self.task}: accuracy {self.accuracy:.3f} [{low:.3f}, {high:.3f}] on n={self.n}, "
                f"chance {self.chance:.3f})")


@dataclass(frozen=True)
class Estimate:
    """A mean with its 95% interval."""

    mean: float
    ci95: tuple[float, float]
    n: int


@dataclass(frozen=True)
class PairedDifference:
    """Ablated minus base on the same items: accuracy (``mean``, ``ci95``, in accuracy units, e.g. -0.01 = one
    point lower), and the low-variance companions: change of the gold answer's log-likelihood, and the KL divergence
    KL(base || ablated) between the two answer distributions (softmax over the choices' scores)."""

    mean: float
    ci95: tuple[float, float]
    n: int
    gold_logprob_change: Estimate
    kl: Estimate
    method: str = "normal approximation on paired per-item differences, 95%"

    def to_dict(self) -> dict:
        return dict(paired_diff=self.mean, paired_ci_low=self.ci95[0], paired_ci_high=self.ci95[1], n=self.n,
                    gold_logprob_change=self.gold_logprob_change.mean,
                    gold_logprob_ci_low=self.gold_logprob_change.ci95[0],
                    gold_logprob_ci_high=self.gold_logprob_change.ci95[1],
                    kl=self.kl.mean, kl_ci_low=self.kl.ci95[0], kl_ci_high=self.kl.ci95[1])


def paired_difference(ablated: EvalResult, base: EvalResult, *, scoring: str | None = None) -> PairedDifference:
    """Compare two evaluations of the same items (matched by item id)."""
    scoring = scoring or base.primary
    base_by_id = {it.id: it for it in base.items}
    if set(base_by_id) != {it.id for it in ablated.items}:
        raise InputError("paired_difference needs two evaluations of the same items: evaluate both on the same Task")
    values = paired_values([(it, base_by_id[it.id]) for it in ablated.items], scoring)
    acc = mean_ci(values["accuracy"])
    return PairedDifference(mean=acc.mean, ci95=acc.ci95, n=acc.n, gold_logprob_change=mean_ci(values["gold_logprob"]),
                            kl=mean_ci(values["kl"]))


def paired_values(pairs: Sequence[tuple["ItemRecord", "ItemRecord"]], scoring: str = "sum") -> dict[str, np.ndarray]:
    """Per item, for ``(ablated, base)`` record pairs: ``accuracy`` (correct ablated - correct base),
    ``gold_logprob`` (ablated - base log-likelihood of the gold answer) and ``kl`` (KL(base || ablated) between
    the answer distributions under the choice ``scoring``)."""
    return dict(
        accuracy=np.array([float(a.correct(scoring)) - float(b.correct(scoring)) for a, b in pairs]),
        gold_logprob=np.array([a.gold_logprob - b.gold_logprob for a, b in pairs]),
        kl=np.array([_kl(b.answer_distribution(scoring), a.answer_distribution(scoring)) for a, b in pairs]))


def wilson_interval(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for k successes in n trials."""
    if n == 0:
        return (float("nan"), float("nan"))
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def mean_ci(x: np.ndarray) -> Estimate:
    """The mean of per-item values with its 95% interval (normal approximation)."""
    n = len(x)
    if n == 0:
        return Estimate(float("nan"), (float("nan"), float("nan")), 0)
    mean = float(x.mean())
    half = Z95 * float(x.std(ddof=1)) / math.sqrt(n) if n > 1 else float("nan")
    return Estimate(mean, (mean - half, mean + half), n)


def _kl(p: np.ndarray, q: np.ndarray) -> float:
    p, q = np.clip(p, 1e-30, 1.0), np.clip(q, 1e-30, 1.0)
    return float(np.sum(p * (np.log(p) - np.log(q))))
