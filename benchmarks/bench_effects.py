"""Benchmark the two ways of measuring every head's effect on the embedded model, side by side in one process.

    python benchmarks/bench_effects.py --threads 1               # ARC-Easy and PIQA, 8 items each, ~10 min idle
    python benchmarks/bench_effects.py --threads 1 --write-docs  # the same, written into docs/benchmarks.md

Per task: ``attribution`` (``head_effects(method="attribution")``: one forward and one backward pass per batch, all
270 heads) against ``ablation`` timed on ``--heads`` single-head ablations (one evaluation each, exactly what
``head_effects(method="ablation")`` runs per head) and projected to all heads plus the unablated baseline. Runs
alternate (A B A B ...) and medians are reported, in wall and in CPU seconds: on a shared machine the CPU seconds
of a one-thread run are the time it would take on an idle core. The last line sizes ``analyses/head_effects.py``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from lens_heads import head_effects, load_model, load_task
from lens_heads.ablation import zero_heads
from lens_heads.evaluate import evaluate

from docs_section import machine_line, write_section

HEADING = "Head effects: attribution vs ablation"


def timed(fn) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", default="arc_easy,piqa")
    ap.add_argument("--n", type=int, default=8, help="items per task (default 8)")
    ap.add_argument("--heads", type=int, default=5, help="single-head ablations timed per repeat (default 5)")
    ap.add_argument("--repeats", type=int, default=2, help="alternating repetitions (default 2)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--write-docs", action="store_true", help="write the figures into docs/benchmarks.md")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    started_load = os.getloadavg()[0]
    model = load_model()
    L, H = model.cfg.n_layers, model.cfg.n_heads
    # heads spread over the depth: early layers are no cheaper to ablate than late ones, but say which were timed
    picked = [(int(round(i * (L - 1) / max(args.heads - 1, 1))), i % H) for i in range(args.heads)]
    lines, per_item = [], {}
    for name in [t for t in args.tasks.split(",") if t]:
        task = load_task(name, n=args.n, seed=0)
        times = {"attribution": [], "ablation": []}
        for _ in range(args.repeats):
            times["attribution"].append(timed(lambda: head_effects(model, task, method="attribution",
                                                                   batch_size=args.batch_size, progress=False)))
            times["ablation"].append(timed(lambda: [evaluate(model, task, hooks=zero_heads([h]),
                                                             batch_size=args.batch_size, progress=False)
                                                    for h in picked]))
        attr = [statistics.median(t[k] for t in times["attribution"]) for k in (0, 1)]
        head = [statistics.median(t[k] for t in times["ablation"]) / len(picked) for k in (0, 1)]
        full = [(L * H + 1) * h for h in head]  # every head plus the unablated baseline
        per_item[name] = full[1] / len(task)
        lines += [
            f"{name}, {len(task)} items (seed 0), batch size {args.batch_size}:",
            f"  attribution, all {L * H} heads: {attr[0]:7.1f} s wall, {attr[1]:7.1f} s CPU",
            f"  ablation, one head ({len(picked)} timed: {picked}): {head[0]:6.1f} s wall, {head[1]:6.1f} s CPU",
            f"  ablation, all {L * H} heads + baseline (projected): {full[0]:7.0f} s wall, {full[1]:7.0f} s CPU",
            f"  -> ablation costs {full[1] / attr[1]:.0f}x attribution (CPU; {full[0] / attr[0]:.0f}x wall)",
        ]
        print("\n".join(lines[-5:]), flush=True)
    hour = 3600 / sum(per_item.values())
    lines.append(f"ablation of every head costs {', '.join(f'{k} {v:.0f} s' for k, v in per_item.items())} of CPU "
                 f"per item: one hour of one core buys n = {hour:.0f} items of each task")
    print(lines[-1])
    machine = machine_line(started_load)
    print(f"machine: {machine}")
    if args.write_docs:
        write_section(HEADING, "\n".join([
            f"`python benchmarks/bench_effects.py --n {args.n} --heads {args.heads} --repeats {args.repeats} "
            f"--threads {torch.get_num_threads()} --write-docs` ({machine}); embedded SmolLM2-135M-Instruct, fp32, "
            "raw weight basis. Medians of alternating runs; CPU seconds are what an idle core would take.", "",
            "```", *lines, "```"]))


if __name__ == "__main__":
    main()
