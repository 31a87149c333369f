"""How long a report will take, told when it starts: from the rate the first stage (the head scores) measured on
this machine, and which ``--quick``, ``--n``, ``--scores`` or ``--fractions`` choice would fit in ten minutes even where
the estimate falls as short as its stated ``ERROR`` allows.
It changes nothing the run computes.

The head scores are one hooked forward over the task's rows, logits at every position: their useful FLOPs
(:func:`lens_heads.evaluation.flops.whole_logits_flops`) over their seconds are the rate. Each later stage is counted in
forwards over the same rows, each of one of three kinds, priced at the useful FLOPs that kind runs over the rate times
``SPEED`` (how many times faster than the scoring pass the later forwards run a FLOP):

- ``"shared"``: evaluations whose hooks let the rows share prefixes: the sweep's unablated baseline and its random
  units (drawn per item), each removal of whole layers. They run the shared path's FLOPs
  (:func:`lens_heads.evaluation.flops.path_flops`) where the model's attention allows it
  (:func:`lens_heads.evaluation.passes.shares_prefixes`), else whole rows'.
- ``"rows"``: the sweep's threshold-zeroing units, which decide per row: whole rows, logits where read.
- ``"hooked"``: forwards whose hooks read activations, logits at every position: the head effects (a forward and a
  backward, ``ATTRIBUTION_PASSES``), the layers' Block Influence and per-layer scores, and the rank profile's
  ``rank_n`` prompts.

The attention patterns, explorer and comparison are left out (seconds). ``SPEED`` is one number for every model
and machine; once the first later stage has run, :func:`revised` tells the time left at the pace that stage ran
against its own estimate (:meth:`Work.stage_seconds`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, cast

from lens_heads.data.rows import Row
from lens_heads.evaluation.flops import path_flops, whole_logits_flops
from lens_heads.evaluation.passes import shares_prefixes
from lens_heads.report.config import QUICK, ReportConfig
from lens_heads.report.layer_stages import LAYER_COUNTS, LAYER_RANKINGS

LONG_RUN_SECONDS = 600.0  # a run expected to take longer says so when it starts, and what would fit
ERROR = 0.4  # how far from a timed default-size run's own time its estimate may be (tests/test_report_live.py)
ATTRIBUTION_PASSES = 3.0  # a forward and a backward pass (the backward about twice the forward's FLOPs)
LAYER_HOOKED_PASSES = 2.0  # the layers' Block Influence over the rows, attention rank twice over the shorter prompts
# A FLOP of the later stages' forwards against one of the scoring pass, which hooks every head: fitted to the timed
# report runs of docs/records/report_live.json (the embedded model and gpt2-medium's shape, whose scoring passes are
# dearer and cheaper per FLOP), each of whose estimate tests/test_report_live.py holds within ERROR of its own time.
SPEED = 1.9


@dataclass(frozen=True)
class Passes:
    """Forwards over one task's rows after the scores, by kind (the module's docstring)."""

    shared: float
    rows: float
    hooked: float


def stage_passes(config: ReportConfig, n_tasks: int) -> dict[str, Passes]:
    """The forwards of each of ``config``'s later stages (by stage kind, every task's together), in passes over one
    task's ``config.n`` items (the rank profile's ``rank_n`` prompts of the first task as a share of a pass)."""
    later_fractions = len(config.fractions) - 1
    # the sweep: the baseline, random zeroing at each fraction, each score's thresholds at each fraction
    out = {"ablation": Passes(n_tasks * (1 + later_fractions), n_tasks * later_fractions * len(config.scores), 0.0),
           "rank": Passes(0.0, 0.0, config.rank_n / config.n)}
    if not config.quick:
        out["effects"] = Passes(0.0, 0.0, n_tasks * ATTRIBUTION_PASSES)
        out["layers"] = Passes(len(LAYER_COUNTS) * (len(LAYER_RANKINGS) + 1), 0.0, LAYER_HOOKED_PASSES)
    return out


def passes(config: ReportConfig, n_tasks: int) -> Passes:
    """The forwards of ``config``'s later stages over ``n_tasks`` tasks, all stages together
    (:func:`stage_passes`)."""
    each = stage_passes(config, n_tasks).values()
    return Passes(*(sum(getattr(p, kind) for p in each) for kind in ("shared", "rows", "hooked")))


@dataclass(frozen=True)
class Work:
    """One task's rows measured once: each kind's useful FLOPs per item, the scoring pass's rate, and the seconds
    the run took before its scores (loading the data and the model)."""

    flops_per_item: dict[str, float]
    flops_per_second: float
    fixed_seconds: float = 0.0

    @classmethod
    def from_dict(cls, d: dict) -> "Work":
        """The work an :meth:`Estimate.to_dict` kept (a run's results.json ``"estimate"``)."""
        return cls(dict(d["flops_per_item"]), float(d["flops_per_second"]), float(d.get("fixed_seconds", 0.0)))

    def seconds(self, config: ReportConfig, n_tasks: int) -> float:
        """The whole run's expected seconds: the loading, the scores on every task, then the later stages'
        forwards."""
        scores = config.n * n_tasks * self.flops_per_item["hooked"] / self.flops_per_second
        return self.fixed_seconds + scores + sum(self.stage_seconds(config, n_tasks).values())

    def stage_seconds(self, config: ReportConfig, n_tasks: int) -> dict[str, float]:
        """Each later stage's expected seconds (by stage kind, every task's together)."""
        return {stage: config.n * sum(getattr(p, kind) * flops for kind, flops in self.flops_per_item.items())
                / SPEED / self.flops_per_second for stage, p in stage_passes(config, n_tasks).items()}


def revised(work: Work, config: ReportConfig, n_tasks: int, stage: str, seconds: float,
            done: set[str]) -> tuple[float, float]:
    """After one task's run of ``stage`` took ``seconds``: how many times the estimate from ``work`` that took, and
    the seconds left for the later stages not in ``done`` (by kind; ``stage`` itself on its other tasks) at that
    pace. The forwards' speed against the scoring pass's (``SPEED``) differs by model and machine; the first later
    stage measures it."""
    each = work.stage_seconds(config, n_tasks)
    pace = seconds / (each[stage] / n_tasks)
    left = sum(s for kind, s in each.items() if kind not in done and kind != stage) + each[stage] * (n_tasks - 1) / n_tasks
    return pace, pace * left


def longest(seconds: float) -> float:
    """The longest a run estimated at ``seconds`` takes within the estimate's stated ``ERROR`` (an estimate at most
    ``ERROR`` of the run's own time short of it)."""
    return seconds / (1.0 - ERROR)


def measured(model, rows: list[Row], n_items: int, scores_seconds: float, batch_size: int,
             attention: str = "fused", fixed_seconds: float = 0.0) -> Work:
    """The kinds' FLOPs per item of ``rows`` (``n_items`` items) and the rate of the scoring pass that took
    ``scores_seconds`` over them, after ``fixed_seconds`` of loading."""
    scoring = whole_logits_flops(model, rows)
    whole = path_flops(model, rows)
    shared = path_flops(model, rows, batch_size) if shares_prefixes(model, attention) else whole
    return Work({"shared": shared / n_items, "rows": whole / n_items, "hooked": scoring / n_items},
                scoring / max(scores_seconds, 1e-6), fixed_seconds)


@dataclass(frozen=True)
class Estimate:
    """The whole run's expected seconds from the first stage's measured rate, and the choices that fit the limit
    (each a flag and its expected seconds)."""

    seconds: float
    work: Work
    choices: tuple[tuple[str, float], ...]

    @property
    def flops_per_second(self) -> float:
        return self.work.flops_per_second

    @property
    def long(self) -> bool:
        return self.seconds > LONG_RUN_SECONDS

    def to_dict(self) -> dict:
        """What results.json keeps of it: the seconds and message, and the measured work they came from."""
        return {"seconds": round(self.seconds, 1), "message": self.message(),
                "flops_per_item": {kind: float(f) for kind, f in self.work.flops_per_item.items()},
                "flops_per_second": float(self.work.flops_per_second),
                "fixed_seconds": round(self.work.fixed_seconds, 2)}

    def message(self) -> str:
        text = (f"this run is expected to take about {self.seconds / 60:.0f} min on this machine (the head scores ran "
                f"at {self.flops_per_second / 1e9:.1f} GFLOP/s; the later stages are counted in forwards over the "
                f"same rows)")
        if not self.long:
            return text + "."
        fits = "; ".join(f"{flag} (about {seconds / 60:.0f} min, at most {longest(seconds) / 60:.0f})"
                         for flag, seconds in self.choices)
        limit = f"{LONG_RUN_SECONDS / 60:.0f} min"
        return (f"{text}, more than {limit}. "
                + (f"To finish within {limit} even where this estimate falls {100 * ERROR:.0f}% short, stop it "
                   f"(Ctrl-C; finished stages are kept) and rerun with one of: {fits}." if fits else
                   "No single --quick, --n, --scores or --fractions choice brings it under that: combine them."))


def estimate(config: ReportConfig, n_tasks: int, work: Work) -> Estimate:
    """The run's expected seconds for ``config`` with ``n_tasks`` tasks from the first task's measured ``work``
    (:func:`measured`), and the choices that would fit :data:`LONG_RUN_SECONDS` even at their :func:`longest`."""
    def seconds(c: ReportConfig) -> float:
        return work.seconds(c, n_tasks)

    def fits(c: ReportConfig) -> bool:
        return longest(seconds(c)) <= LONG_RUN_SECONDS

    choices: list[tuple[str, float]] = []
    quick = replace(config, **cast(dict[str, Any], QUICK))
    if fits(quick):
        choices.append(("--quick", seconds(quick)))
    n = max((k for k in range(1, config.n) if fits(replace(config, n=k))), default=None)
    if n is not None:
        choices.append((f"--n {n}", seconds(replace(config, n=n))))
    k = max((k for k in range(1, len(config.scores)) if fits(replace(config, scores=config.scores[:k]))),
            default=None)
    if k is not None:
        choices.append((f"--scores '{','.join(config.scores[:k])}'", seconds(replace(config, scores=config.scores[:k]))))
    shares = [f for f in config.fractions if f > 0]
    for m in range(len(shares) - 1, 0, -1):  # fewer fractions, the largest kept, the others evenly among the given
        kept = tuple(sorted({0.0, *(shares[round(i * (len(shares) - 1) / m)] for i in range(1, m + 1))}))
        if len(kept) - 1 == m and fits(replace(config, fractions=kept)):
            choices.append((f"--fractions {','.join(f'{f:g}' for f in kept)}", seconds(replace(config, fractions=kept))))
            break
    return Estimate(seconds(config), work, tuple(choices))
