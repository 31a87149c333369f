"""Benchmark the evaluator and the sweep on the embedded model, each against its baseline in the same process.

    python benchmarks/bench_evaluate.py                    # ~5-10 min on 2 CPU cores
    python benchmarks/bench_evaluate.py --mmlu-n 8 --arc-n 40 --write-docs

1. MMLU letter format (5-shot): ``lens_heads.evaluation.evaluate`` (one forward per question, four letters read at the last
   position, rows batched) against a per-choice loop (one forward of context + letter per choice, as a harness
   without shared-context requests runs it): forward tokens and wall time. Target: >= 3x fewer tokens.
2. The sweep's cost: one unablated ARC-Easy evaluation against the same rows run row by row, per-input threshold
   zeroing by a score of the head's output (AHON (LN)) and by one of its attention pattern (AWFT), and random
   zeroing, plus the calibration scoring pass; the full 12-score x 7-fraction sweep (72 threshold units, 6 random
   units, the baseline and the calibration) in units of one unablated evaluation, the threshold units stacked as
   the sweep runs them. Target (issue #58): a threshold unit at most 1.25x an unablated evaluation.
3. How much of the prefix sharing an exact threshold zeroing could keep: each row of the same ARC-Easy items run
   alone under the zeroing, and per shared prefix, layer by layer, how many different histories of zeroed heads its
   rows have. A forward that shared each prefix until its rows' decisions part, and forked it there, would still run
   the prefix once per history: its tokens, counted so, are a floor on any exact sharing of the zeroing's prefixes.

Timings alternate the compared runs (A B A B ...) and report medians, so a neighbour's load hits both alike.
``--write-docs`` puts the figures into docs/records/benchmarks.md under "Evaluation and sweep" (that section only).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from lens_heads import load_model, load_task
from lens_heads.ablation.hooks import threshold_zeroing
from lens_heads.ablation.random_draws import random_zeroing
from lens_heads.ablation.stacked import stack_ablations
from lens_heads.data.rows import build_rows
from lens_heads.evaluation.evaluate import evaluate, evaluate_each
from lens_heads.evaluation.passes import evaluator_forward
from lens_heads.evaluation.prefix import group_rows, plan_groups
from lens_heads.heads.distributions import thresholds
from lens_heads.heads.scoring import score_heads
from lens_heads.plumbing.settings import option
from lens_heads.sweep.plan import DEFAULT_FRACTIONS
from lens_heads.sweep.run import DEFAULT_STACK
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
THRESHOLD_SCORES = ("AHON (LN)", "AWFT")  # a score of the head's output (fused attention) and one of its pattern


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
    """2. The sweep's cost in units of one unablated evaluation, and a threshold unit's against the same rows run row
    by row (the path its decision, which reads the whole row, keeps it on), alone and stacked as the sweep runs it.
    3. The floor on what an exact sharing of its prefixes could cost (:func:`sharing_floor`)."""
    arc = load_task("arc_easy", n=s.arc_n, seed=0)
    calib = timed(lambda: score_heads(model, arc, batch_size=s.batch_size, progress=False))
    cuts = {name: thresholds(calib.out, name, DEFAULT_FRACTIONS[1:]) for name in THRESHOLD_SCORES}
    chosen = {name: cuts[name][0.1] for name in THRESHOLD_SCORES}
    # the sweep's stack: its first DEFAULT_STACK threshold units of these scores, in plan order (score by fraction)
    stack = [(name, p, cuts[name][p]) for p in DEFAULT_FRACTIONS[1:] for name in THRESHOLD_SCORES][:DEFAULT_STACK]
    shares = {}

    def run_with(make):
        def run():
            zeroing = make()
            out = evaluate(model, arc, hooks=[zeroing], batch_size=s.batch_size, progress=False)
            shares[zeroing.description] = zeroing.share_zeroed()
            return out
        return run

    def stacked():
        units = [threshold_zeroing(model, name, value) for name, _, value in stack]
        return evaluate_each(model, arc, [stack_ablations(units)], batch_size=s.batch_size, progress=False)

    runs = {"plain": lambda: evaluate(model, arc, batch_size=s.batch_size, progress=False),
            "rows": lambda: evaluate_each(model, arc, [[]], batch_size=s.batch_size, progress=False,
                                          _shared_prefixes=False)[0],
            **{name: run_with(lambda name=name: threshold_zeroing(model, name, chosen[name])) for name in chosen},
            "stacked": stacked,
            # the stacked forward holds len(stack) units' batches: the unablated evaluation given as many rows a forward
            "plain_wide": lambda: evaluate(model, arc, batch_size=s.batch_size * len(stack), progress=False),
            "random": run_with(lambda: random_zeroing(model, 0.1, 0))}
    r = alternate(runs, s.repeats)
    base, rows = r["plain"].wall, r["rows"].wall
    thr_ratios = {name: r[name].wall / base for name in chosen}
    stacked_ratio = r["stacked"].wall / len(stack) / base
    rnd_ratio, calib_ratio = r["random"].wall / base, calib.walls[0] / base
    n_fractions = len(DEFAULT_FRACTIONS) - 1
    full = 1 + calib_ratio + 12 * n_fractions * stacked_ratio + n_fractions * rnd_ratio
    realised = list(shares.values())
    floor = sharing_floor(model, arc, chosen, s.batch_size)
    return [
        f"ARC-Easy, {len(arc)} items (seed 0), batch size {s.batch_size}; one unablated evaluation "
        f"{base:.1f} s ({base / len(arc):.2f} s/item), shared prefixes computed once:",
        f"  the same unablated rows run row by row (the path a threshold zeroing takes): {rows / base:.2f}x",
        *[f"  threshold zeroing ({name}, p=.1, realised {100 * realised[i]:.1f}%): {thr_ratios[name]:.2f}x one "
          f"unablated evaluation, {r[name].wall / rows:.2f}x the unablated rows row by row"
          for i, name in enumerate(chosen)],
        f"  threshold units stacked {len(stack)} per forward as the sweep runs them "
        f"({', '.join(f'{name} p={p:g}' for name, p, _ in stack)}): {stacked_ratio:.2f}x one unablated "
        f"evaluation a unit, {stacked_ratio * base / rows:.2f}x the unablated rows row by row; the unablated "
        f"evaluation at batch size {s.batch_size * len(stack)} (as many rows a forward): {r['plain_wide'].wall / base:.2f}x",
        f"  random zeroing (p=.1): {rnd_ratio:.2f}x; calibration scoring pass on the rows: {calib_ratio:.2f}x",
        f"  -> full sweep (12 scores x {n_fractions} fractions at the stacked units' cost + {n_fractions} "
        f"random + baseline + calibration) = {full:.0f}x one unablated evaluation (at this machine's speed, "
        f"~{full * base / len(arc) / 60:.1f} min per ARC-Easy item in the sample)",
        *floor,
    ]


def sharing_floor(model, task, chosen: dict[str, float], batch_size: int) -> list[str]:
    """3. Per threshold zeroing in ``chosen``: each row of ``task`` run alone under it, and per prefix the unablated
    evaluation shares (its grouping, ``plan_groups``), the distinct histories of zeroed heads among the prefix's rows
    before each layer (rows with one history share the prefix's state there, rows with two cannot). The floor:
    every prefix run once per history, layer by layer, plus every suffix once, in tokens, against the unablated
    evaluation's prefix-once tokens and the row-by-row path's."""
    rows = build_rows(model, task)
    groups = plan_groups(rows, "any", group_rows(batch_size))
    n_layers = model.cfg.n_layers
    suffix = sum(len(r.tokens) for g in groups for r in g.rows)
    shared = suffix + sum(len(g.prefix) for g in groups)
    whole = suffix + sum(len(g.prefix) * len(g.rows) for g in groups)
    out = [f"  sharing floor: {len(rows)} rows in {sum(1 for g in groups if g.prefix)} shared prefixes; tokens: "
           f"unablated (each prefix once) {shared}, row by row {whole} ({whole / shared:.2f}x)"]
    for name, value in chosen.items():
        zeroing = threshold_zeroing(model, name, value)
        forked, parted = 0.0, []
        with torch.no_grad(), evaluator_forward(model):
            for g in groups:
                if not g.prefix:
                    continue
                histories = []
                for row in g.rows:
                    with zeroing.batch(None, first=0), model.hooks(fwd_hooks=zeroing.hooks):
                        model(torch.tensor([g.prefix + row.tokens], device=model.cfg.device), return_type=None)
                    histories.append(zeroing.zeroed()[-1])  # [layer, head]
                    zeroing.reset()
                distinct = [len({tuple(h[:layer].flatten().tolist()) for h in histories}) for layer in
                            range(n_layers)]
                forked += len(g.prefix) * float(np.mean(distinct))
                if len(g.rows) > 1:
                    parted.append(next((layer - 1 for layer, d in enumerate(distinct) if d > 1), n_layers))
        floor = suffix + forked
        out.append(f"  sharing floor ({name}, p=.1): rows of one prefix first zero different heads at layer "
                   f"{np.median(parted):.0f} of {n_layers} (median over {len(parted)} prefixes; {sum(p == n_layers for p in parted)} "
                   f"share every layer's prefix state); forking each prefix where its rows part runs {floor:.0f} tokens, "
                   f"{floor / shared:.2f}x the unablated evaluation's (row by row {whole / shared:.2f}x)")
    return out


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
