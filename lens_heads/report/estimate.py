"""How long a report will take, told when it starts: from the model's FLOPs per token and the rate the first stage
(the head scores: one pass over the task's rows) measured on this machine, and which ``--quick``, ``--n``,
``--scores`` or ``--fractions`` choice would fit in about ten minutes. It changes nothing the run computes.

Each later stage is counted in passes over the task's rows: the ablation sweep is ``1 + (fractions - 1) x (scores + 1)``
evaluations per task, the head effects a forward and a backward (``ATTRIBUTION_PASSES``), the whole layers
``len(LAYER_COUNTS) x (len(LAYER_RANKINGS) + 1)`` evaluations and a Block Influence pass, the rank profile one forward
of ``rank_n`` prompts; the attention patterns, explorer and comparison are left out (seconds). A FLOP of an
evaluation runs faster than one of the scoring pass, which hooks every head (``EVALUATION_SPEEDUP``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, cast

from lens_heads.report.config import QUICK, ReportConfig
from lens_heads.report.layer_stages import LAYER_COUNTS, LAYER_RANKINGS
from lens_heads.training.budget import trunk_flops_per_token

LONG_RUN_SECONDS = 600.0  # past this the run says so when it starts
ATTRIBUTION_PASSES = 3.0  # a forward and a backward pass (the backward about twice the forward's FLOPs)
# Seconds per FLOP of the scoring pass over an evaluation's: on the embedded model's default report the scores took
# 12 s for one pass over the rows, the sweep 220 s for 40 evaluations of the same rows (5.5 s each).
EVALUATION_SPEEDUP = 2.0


def rows_flops(cfg, lengths: list[int]) -> float:
    """FLOPs of one forward over rows of ``lengths`` tokens: the trunk's weights, causal attention and the logits at
    every position (TransformerLens computes them all)."""
    tokens = float(sum(lengths))
    attention = 2.0 * cfg.n_layers * cfg.n_heads * cfg.d_head * sum(n * (n + 1) for n in lengths)
    return trunk_flops_per_token(cfg) * tokens + attention + 2.0 * cfg.d_model * cfg.d_vocab * tokens


def evaluation_passes(config: ReportConfig, n_tasks: int) -> float:
    """Evaluation passes over one task's ``config.n`` items after the scores (the module's docstring)."""
    sweep = 1 + (len(config.fractions) - 1) * (len(config.scores) + 1)
    passes = n_tasks * sweep + config.rank_n / config.n
    if not config.quick:
        passes += n_tasks * ATTRIBUTION_PASSES + len(LAYER_COUNTS) * (len(LAYER_RANKINGS) + 1) + 1
    return passes


@dataclass(frozen=True)
class Estimate:
    """The whole run's expected seconds from the first stage's measured rate, and the choices that fit the limit
    (each a flag and its expected seconds)."""

    seconds: float
    flops_per_second: float
    choices: tuple[tuple[str, float], ...]

    @property
    def long(self) -> bool:
        return self.seconds > LONG_RUN_SECONDS

    def message(self) -> str:
        text = (f"this run is expected to take about {self.seconds / 60:.0f} min on this machine (the head scores ran "
                f"at {self.flops_per_second / 1e9:.1f} GFLOP/s; the later stages are counted in passes over the same "
                f"rows)")
        if not self.long:
            return text + "."
        fits = "; ".join(f"{flag} (about {seconds / 60:.0f} min)" for flag, seconds in self.choices)
        return (f"{text}, more than {LONG_RUN_SECONDS / 60:.0f} min. "
                + (f"To finish within about {LONG_RUN_SECONDS / 60:.0f} min, stop it (Ctrl-C; finished stages are "
                   f"kept) and rerun with one of: {fits}." if fits else
                   "No single --quick, --n, --scores or --fractions choice brings it under that: combine them."))


def estimate(config: ReportConfig, n_tasks: int, cfg, row_lengths: list[int], n_items: int,
             scores_seconds: float) -> Estimate:
    """The run's expected seconds for ``config`` with ``n_tasks`` tasks, from the scores stage's ``scores_seconds``
    over the first task's forward rows (``row_lengths`` tokens each, for its ``n_items`` items)."""
    flops = rows_flops(cfg, row_lengths)
    per_item, rate = flops / n_items, flops / max(scores_seconds, 1e-6)

    def seconds(c: ReportConfig) -> float:
        scoring = n_tasks * c.n * per_item / rate
        return scoring + evaluation_passes(c, n_tasks) * c.n * per_item / (rate * EVALUATION_SPEEDUP)

    whole = seconds(config)
    choices: list[tuple[str, float]] = []
    quick = replace(config, **cast(dict[str, Any], QUICK))
    if seconds(quick) <= LONG_RUN_SECONDS:
        choices.append(("--quick", seconds(quick)))
    n = max((k for k in range(1, config.n) if seconds(replace(config, n=k)) <= LONG_RUN_SECONDS), default=None)
    if n is not None:
        choices.append((f"--n {n}", seconds(replace(config, n=n))))
    k = max((k for k in range(1, len(config.scores)) if seconds(replace(config, scores=config.scores[:k]))
             <= LONG_RUN_SECONDS), default=None)
    if k is not None:
        choices.append((f"--scores '{','.join(config.scores[:k])}'", seconds(replace(config, scores=config.scores[:k]))))
    shares = [f for f in config.fractions if f > 0]
    for m in range(len(shares) - 1, 0, -1):  # fewer fractions, the largest kept, the others evenly among the given
        kept = tuple(sorted({0.0, *(shares[round(i * (len(shares) - 1) / m)] for i in range(1, m + 1))}))
        if len(kept) - 1 == m and seconds(replace(config, fractions=kept)) <= LONG_RUN_SECONDS:
            choices.append((f"--fractions {','.join(f'{f:g}' for f in kept)}", seconds(replace(config, fractions=kept))))
            break
    return Estimate(whole, rate, tuple(choices))
