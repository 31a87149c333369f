"""Benchmark the evaluator and the sweep on the embedded model, each against its baseline in the same process.

    python benchmarks/bench_evaluate.py                    # ~5-10 min on 2 CPU cores
    python benchmarks/bench_evaluate.py --mmlu-n 8 --arc-n 40 --write-docs

1. MMLU letter format (5-shot): ``lens_heads.evaluation.evaluate`` (one forward per question, four letters read at the last
   position, rows batched) against a per-choice loop (one forward of context + letter per choice, as a harness
   without shared-context requests runs it): forward tokens and wall time. Target: >= 3x fewer tokens.
2. The sweep's cost: one unablated ARC-Easy evaluation against one with per-input threshold zeroing and one with
   random zeroing, plus the calibration scoring pass; the full 12-score x 7-fraction sweep (72 threshold units,
   6 random units, the baseline and the calibration) in units of one unablated evaluation.

Timings alternate the compared runs (A B A B ...) and report medians, so a neighbour's load hits both alike.
``--write-docs`` puts the figures into docs/records/benchmarks.md under "Evaluation and sweep" (that section only).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lens_heads import load_model, load_task
from lens_heads.ablation.hooks import threshold_zeroing
from lens_heads.ablation.random_draws import random_zeroing
from lens_heads.evaluation.evaluate import evaluate
from lens_heads.heads.distributions import thresholds
from lens_heads.heads.scoring import score_heads
from lens_heads.plumbing.settings import option
from lens_heads.sweep.plan import DEFAULT_FRACTIONS
from timing import (
    Comparison,
    alternate,
    load_average,
    parse_settings,
    print_machine,
    set_threads,
    threads_option,
    timed,
    write_printed,
)

HEADING = "Evaluation and sweep"


@dataclass(frozen=True)
class EvaluateBench(Comparison):
    """What the benchmark times."""

    mmlu_n: int = option(6, "MMLU 5-shot questions")
    arc_n: int = option(32, "ARC-Easy items for the sweep cost")
    threads: int | None = threads_option()



def per_choice_loop(model, task) -> dict:
    """The baseline: each choice is its own forward pass of context + continuation, full logits."""
    tokens, correct = 0, 0
    with torch.no_grad():
        for item in task:
            scores = []
            for context, continuation in zip(item.contexts, item.continuations):
                ctx = model.to_tokens(context, prepend_bos=True)[0]
                cont = model.to_tokens(continuation, prepend_bos=False)[0]
                row = torch.cat([ctx, cont])[None]
                logp = torch.log_softmax(model(row)[0], dim=-1)
                scores.append(sum(logp[len(ctx) - 1 + k, t].item() for k, t in enumerate(cont.tolist())))
                tokens += row.shape[1]
            correct += int(max(range(len(scores)), key=scores.__getitem__) == item.gold)
    return dict(tokens=tokens, accuracy=correct / len(task))


def mmlu_comparison(model, s: EvaluateBench) -> list[str]:
    """1. MMLU letter format: one forward per question against one per choice."""
    mmlu = load_task("mmlu", n=s.mmlu_n, seed=0)
    r = alternate({"evaluator": lambda: evaluate(model, mmlu, batch_size=s.batch_size, progress=False),
                   "loop": lambda: per_choice_loop(model, mmlu)}, s.repeats)
    ev, loop = r["evaluator"].out, r["loop"].out
    ev_tokens = ev.meta["forward_tokens"]
    return [
        f"MMLU 5-shot letter format, {len(mmlu)} questions (seed 0), batch size {s.batch_size}:",
        f"  evaluator      {ev_tokens:7d} forward tokens ({ev.meta['padded_tokens']} incl. padding), "
        f"{r['evaluator'].wall:6.1f} s, accuracy {ev.accuracy:.3f}",
        f"  per-choice loop {loop['tokens']:6d} forward tokens, {r['loop'].wall:6.1f} s, "
        f"accuracy {loop['accuracy']:.3f}",
        f"  -> {loop['tokens'] / ev_tokens:.2f}x fewer tokens (target >= 3x), "
        f"{r['loop'].wall / r['evaluator'].wall:.2f}x less wall time",
    ]


def sweep_cost(model, s: EvaluateBench) -> list[str]:
    """2. The sweep's cost in units of one unablated evaluation."""
    arc = load_task("arc_easy", n=s.arc_n, seed=0)
    calib = timed(lambda: score_heads(model, arc, batch_size=s.batch_size, progress=False))
    thr = thresholds(calib.out, "AHON (LN)", [0.1])[0.1]
    shares = {}

    def run_with(make):
        def run():
            zeroing = make()
            out = evaluate(model, arc, hooks=[zeroing], batch_size=s.batch_size, progress=False)
            shares[zeroing.description] = zeroing.share_zeroed()
            return out
        return run

    r = alternate({"plain": lambda: evaluate(model, arc, batch_size=s.batch_size, progress=False),
                   "threshold": run_with(lambda: threshold_zeroing(model, "AHON (LN)", thr)),
                   "random": run_with(lambda: random_zeroing(model, 0.1, 0))}, s.repeats)
    base = r["plain"].wall
    thr_ratio, rnd_ratio, calib_ratio = r["threshold"].wall / base, r["random"].wall / base, calib.walls[0] / base
    n_fractions = len(DEFAULT_FRACTIONS) - 1
    full = 1 + calib_ratio + 12 * n_fractions * thr_ratio + n_fractions * rnd_ratio
    return [
        f"ARC-Easy, {len(arc)} items (seed 0), batch size {s.batch_size}; one unablated evaluation "
        f"{base:.1f} s ({base / len(arc):.2f} s/item):",
        f"  threshold zeroing (AHON (LN), p=.1, realised {100 * list(shares.values())[0]:.1f}%): "
        f"{thr_ratio:.2f}x one unablated evaluation",
        f"  random zeroing (p=.1): {rnd_ratio:.2f}x; calibration scoring pass on the prompts: {calib_ratio:.2f}x",
        f"  -> full sweep (12 scores x {n_fractions} fractions + {n_fractions} random + baseline + calibration) "
        f"= {full:.0f}x one unablated evaluation (at this machine's speed, ~{full * base / len(arc) / 60:.1f} min "
        f"per ARC-Easy item in the sample)",
    ]


def main(argv=None) -> None:
    s = parse_settings(EvaluateBench, argv, __doc__)
    set_threads(s.threads)
    started_load = load_average()
    model = load_model()
    mmlu_lines = mmlu_comparison(model, s)
    print("\n".join(mmlu_lines))
    sweep_lines = sweep_cost(model, s)
    print("\n".join(sweep_lines))
    machine = print_machine(started_load)
    if s.write_docs:
        write_printed(HEADING, f"python benchmarks/bench_evaluate.py --mmlu-n {s.mmlu_n} --arc-n {s.arc_n} "
                      f"--repeats {s.repeats} --write-docs", machine, "; embedded SmolLM2-135M-Instruct, fp32, raw "
                      "weight basis. Wall times are medians of alternating runs (A B A B ...).",
                      [mmlu_lines, sweep_lines])


if __name__ == "__main__":
    main()
