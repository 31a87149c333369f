"""Benchmark the two ways of measuring every head's effect on the embedded model, side by side in one process.

    python benchmarks/bench_effects.py --threads 1               # ARC-Easy and PIQA, 8 items each, ~10 min idle
    python benchmarks/bench_effects.py --threads 1 --write-docs  # the same, written into docs/records/benchmarks.md

Per task: ``attribution`` (``head_effects(method="attribution")``: one forward and one backward pass per batch, all
270 heads) against ablation two ways: ``separate``, ``--heads`` single-head ablations spread over the depth, one
full evaluation each (``evaluate``), and ``shared``, every head of ``--layers`` layers spread over the depth, a
layer's heads evaluated together on the forward below them (``evaluate_each``, what
``head_effects(method="ablation")`` runs); both projected to all heads plus the unablated baseline (a shared layer
costs in proportion to the blocks above it, so the first, middle and last layers average to the whole). Runs
alternate (A B C A B C ...) and medians are reported, in wall and in CPU seconds: on a shared machine the CPU
seconds of a one-thread run are the time it would take on an idle core. The last line sizes
``analyses/head_effects.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lens_heads import head_effects, load_model, load_task
from lens_heads.ablation.hooks import zero_heads
from lens_heads.evaluation.evaluate import evaluate, evaluate_each
from lens_heads.plumbing.settings import option
from timing import (
    Comparison,
    alternate,
    batch_size_option,
    load_average,
    parse_settings,
    print_machine,
    set_threads,
    threads_option,
    write_printed,
)

HEADING = "Head effects: attribution vs ablation"


@dataclass(frozen=True)
class EffectsBench(Comparison):
    """What the benchmark times."""

    tasks: tuple[str, ...] = option(("arc_easy", "piqa"), "tasks to time")
    n: int = option(8, "items per task")
    heads: int = option(5, "single-head ablations, one evaluation each, timed per repeat")
    layers: int = option(3, "layers whose heads are ablated together (evaluate_each) per repeat")
    batch_size: int = batch_size_option(16)
    threads: int | None = threads_option()



def spread_heads(n_layers: int, n_heads: int, count: int) -> list[tuple[int, int]]:
    """``count`` heads spread over the depth: early layers are no cheaper to ablate than late ones."""
    return [(int(round(i * (n_layers - 1) / max(count - 1, 1))), i % n_heads) for i in range(count)]


def time_task(model, name: str, picked: list[tuple[int, int]], layers: list[int], s: EffectsBench
              ) -> tuple[list[str], float]:
    """One task: attribution against the timed ablations, separate and shared; its printed lines and the projected
    CPU seconds per item of ablating every head as ``head_effects`` does."""
    L, H = model.cfg.n_layers, model.cfg.n_heads
    task = load_task(name, n=s.n, seed=0)
    r = alternate({
        "attribution": lambda: head_effects(model, task, method="attribution", batch_size=s.batch_size,
                                            progress=False),
        "separate": lambda: [evaluate(model, task, hooks=zero_heads([h]), batch_size=s.batch_size, progress=False)
                             for h in picked],
        "shared": lambda: [evaluate_each(model, task, [zero_heads([(layer, h)]) for h in range(H)],
                                         batch_size=s.batch_size, progress=False) for layer in layers]},
        s.repeats, keep=())
    attr = [r["attribution"].wall, r["attribution"].cpu]
    head = [r["separate"].wall / len(picked), r["separate"].cpu / len(picked)]
    separate = [(L * H + 1) * h for h in head]  # every head plus the unablated baseline
    shared = [L * t / len(layers) + h for t, h in zip((r["shared"].wall, r["shared"].cpu), head)]
    return [
        f"{name}, {len(task)} items (seed 0), batch size {s.batch_size}:",
        f"  attribution, all {L * H} heads: {attr[0]:7.1f} s wall, {attr[1]:7.1f} s CPU",
        f"  ablation, one evaluation a head ({len(picked)} timed: {picked}): {head[0]:6.1f} s wall, {head[1]:6.1f} s "
        f"CPU a head; all {L * H} + baseline (projected): {separate[0]:7.0f} s wall, {separate[1]:7.0f} s CPU",
        f"  ablation, a layer's heads on the shared forward (layers {layers} timed): all {L * H} + baseline "
        f"(projected): {shared[0]:7.0f} s wall, {shared[1]:7.0f} s CPU -> {separate[1] / shared[1]:.2f}x less CPU",
        f"  -> ablation (shared) costs {shared[1] / attr[1]:.0f}x attribution (CPU; {shared[0] / attr[0]:.0f}x wall)",
    ], shared[1] / len(task)


def main(argv=None) -> None:
    s = parse_settings(EffectsBench, argv, __doc__)
    set_threads(s.threads)
    started_load = load_average()
    model = load_model()
    picked = spread_heads(model.cfg.n_layers, model.cfg.n_heads, s.heads)
    layers = sorted({layer for layer, _ in spread_heads(model.cfg.n_layers, 1, s.layers)})
    lines, per_item = [], {}
    for name in s.tasks:
        task_lines, per_item[name] = time_task(model, name, picked, layers, s)
        print("\n".join(task_lines), flush=True)
        lines += task_lines
    hour = 3600 / sum(per_item.values())
    lines.append(f"ablation of every head costs {', '.join(f'{k} {v:.0f} s' for k, v in per_item.items())} of CPU "
                 f"per item: one hour of one core buys n = {hour:.0f} items of each task")
    print(lines[-1])
    machine = print_machine(started_load)
    if s.write_docs:
        write_printed(HEADING, f"python benchmarks/bench_effects.py --n {s.n} --heads {s.heads} --layers {s.layers} --repeats "
                      f"{s.repeats} --threads {torch.get_num_threads()} --write-docs", machine,
                      "; embedded SmolLM2-135M-Instruct, fp32, raw weight basis. Medians of alternating runs; CPU "
                      "seconds are what an idle core would take.", [lines])


if __name__ == "__main__":
    main()
