"""Benchmark shared prefixes computed once against the row-by-row evaluator, side by side in one process.

    OMP_NUM_THREADS=1 python benchmarks/bench_prefix.py --threads 1              # ~10 min on a loaded 2-core machine
    OMP_NUM_THREADS=1 python benchmarks/bench_prefix.py --threads 1 --write-docs # the same, into docs/records/benchmarks.md

1. The evaluator (``evaluate``, unablated) on ARC-Easy, MMLU 5-shot and HellaSwag, with shared prefixes (the
   default) and row by row (``evaluate_each(..., _shared_prefixes=False)``), alternating: forward tokens (real, and
   padded), wall and CPU seconds, the largest log-likelihood difference, and achieved FLOP/s per CPU second as a
   share of this machine's dense fp32 matmul FLOP/s per CPU second (useful FLOPs of the tokens each path runs:
   ``benchmarks/flops.py``'s formula, a suffix attending to its prefix's keys counted as such; CPU seconds because
   other jobs load the machine: with one thread they are what an idle core would take). MMLU takes ``--mmlu-per-subject`` questions of each of
   the first ``--mmlu-subjects`` subjects (a full MMLU run has ~250 questions a subject, so it shares more).
2. Head effects: every head of ``--layers`` layers spread over the depth ablated on the shared forward
   (``evaluate_each`` with one ``zero_heads`` set per head, what ``head_effects(method="ablation")`` runs) on
   ARC-Easy, both paths, projected to all heads plus the baseline as ``bench_effects.py`` does.

``--model``: another model than the embedded one, e.g. ``gpt2-medium`` (learned positions) from the hub cache that
``benchmarks/gpt2_medium_cache.py`` writes (``HF_HUB_CACHE=/tmp/hf-cache HF_HUB_OFFLINE=1``); its block has a heading of
its own.

``--lm-eval``: lm-evaluation-harness 0.4.5's HF backend (``HFLM.loglikelihood``, batch size ``--batch-size``) on
the same items joins each alternation (install it as ``analyses/lm_eval_agreement.py`` says and put it on
``PYTHONPATH``); its forward rows are the row path's (``lens_heads.data.rows`` lays them out as lm-eval does).

The forward-token reduction does not depend on the machine's load; the times do: every block says the load.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import torch

import timing
from bench_effects import spread_heads
from flops import path_flops
from lens_heads import load_model, load_task
from lens_heads.ablation.hooks import zero_heads
from lens_heads.data.rows import build_rows
from lens_heads.evaluation.evaluate import evaluate_each
from lens_heads.models.embedded import embedded_model_folder
from lens_heads.plumbing.settings import option

HEADING = "Shared prefixes computed once"
LM_EVAL_HEADING = "Shared prefixes computed once, against lm-eval's HF backend"
ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class PrefixBench(timing.Comparison):
    """What the benchmark times."""

    arc_n: int = option(40, "ARC-Easy items")
    hellaswag_n: int = option(20, "HellaSwag items")
    mmlu_subjects: int = option(2, "MMLU subjects (the first ones)")
    repeats: int = timing.repeats_option(1)
    batch_size: int = timing.batch_size_option(8)
    mmlu_per_subject: int = option(8, "MMLU 5-shot questions per subject")
    effects_n: int = option(20, "ARC-Easy items for the head effects")
    layers: int = option(3, "layers whose heads are ablated (head effects)")
    lm_eval: bool = option(False, "also time lm-eval's HF backend on the same items (the embedded model only)")
    model: str | None = option(None, "model to time (None: the embedded one)")
    threads: int | None = timing.threads_option()


def mmlu_task(subjects: int, per_subject: int):
    """The first ``per_subject`` test questions of each of the first ``subjects`` MMLU subjects, 5-shot."""
    task = load_task("mmlu", n=None, seed=0)
    names = sorted({it.subject for it in task})[:subjects]
    return replace(task, items=[it for s in names for it in [x for x in task if x.subject == s][:per_subject]])


def matmul_cpu_flops(n: int = 2048, repeats: int = 5) -> float:
    """Best-of-``repeats`` FLOP/s of an n^3 fp32 matmul per CPU second of this process: on a machine that other jobs
    load, CPU seconds (not wall) are what an idle core would take, so the evaluations are read against the same."""
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randn(n, n, generator=gen) for _ in range(2))
    a @ b
    return 2.0 * n**3 / min(timing.repeated(lambda: a @ b, repeats).cpus)


def lm_eval_side(batch_size: int):
    """(lm-eval's HFLM on the embedded model, the function that scores a task with it) from
    ``analyses/lm_eval_agreement.py``."""
    spec = importlib.util.spec_from_file_location("lm_eval_agreement", ROOT / "analyses" / "lm_eval_agreement.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    lm = module.import_hflm()(pretrained=str(embedded_model_folder()), device="cpu", dtype="float32",
                              batch_size=batch_size)
    return lambda task: module.lm_eval_logprobs(lm, task, False)


def lm_eval_lines(r: dict, shared) -> list[str]:
    """lm-eval's timing and its agreement with the shared-prefix path."""
    theirs = r["lm-eval"].out
    diff = max(abs(a - b) for x, y in zip(shared.items, theirs) for a, b in zip(x.logprobs, y))
    return [f"  {'lm-eval HFLM':16s} {shared.meta['row_tokens']:6d} tokens (its rows)        "
            f"{r['lm-eval'].wall:6.1f} s wall {r['lm-eval'].cpu:6.1f} s CPU",
            f"  -> shared prefixes vs lm-eval: {r['lm-eval'].wall / r['shared'].wall:.2f}x wall, "
            f"{r['lm-eval'].cpu / r['shared'].cpu:.2f}x CPU (row path: {r['lm-eval'].cpu / r['row'].cpu:.2f}x CPU); "
            f"max |log-likelihood difference| {diff:.1e}"]


def time_evaluator(model, name: str, task, s: PrefixBench, peak: float, lm_eval=None) -> list[str]:
    """Both paths (and lm-eval, when given) on one task, alternating: tokens, times, agreement and FLOP/s share."""
    def run(shared):
        return evaluate_each(model, task, [[]], batch_size=s.batch_size, progress=False,
                                           _shared_prefixes=shared)[0]
    load = timing.load_average()
    compared = {"row": lambda: run(False), "shared": lambda: run(True)}
    if lm_eval is not None:
        compared["lm-eval"] = lambda: lm_eval(task)
    r = timing.alternate(compared, s.repeats)
    row, shared = r["row"].out, r["shared"].out
    diff = max(abs(a - b) for x, y in zip(row.items, shared.items) for a, b in zip(x.logprobs, y.logprobs))
    size = max(abs(a) for x in row.items for a in x.logprobs)
    lines = [f"{name}, {len(task)} items, {row.meta['rows']} rows, batch size {s.batch_size} "
             f"(load average {load:.1f} before, {timing.load_average():.1f} after):"]
    for label, res, took, shared_path in (("row by row", row, r["row"], False),
                                           ("shared prefixes", shared, r["shared"], True)):
        flops = path_flops(model, build_rows(model, list(task)), s.batch_size if shared_path else None)
        lines.append(f"  {label:16s} {res.meta['forward_tokens']:6d} tokens ({res.meta['padded_tokens']:6d} padded) "
                     f"{took.wall:6.1f} s wall {took.cpu:6.1f} s CPU  {flops / 1e9:7.1f} GFLOP "
                     f"{flops / took.cpu / 1e9:5.1f} GFLOP/s per CPU s = {flops / took.cpu / peak:5.1%} of matmul")
    lines.append(f"  -> {row.meta['forward_tokens'] / shared.meta['forward_tokens']:.2f}x fewer forward tokens, "
                 f"{r['row'].wall / r['shared'].wall:.2f}x wall, {r['row'].cpu / r['shared'].cpu:.2f}x CPU; "
                 f"max |log-likelihood difference| {diff:.1e} (largest |log-likelihood| {size:.0f})")
    return lines + (lm_eval_lines(r, shared) if lm_eval is not None else [])


def time_effects(model, s: PrefixBench) -> list[str]:
    """Every head of a few layers on the shared forward, both paths, projected to all heads + the baseline."""
    L, H = model.cfg.n_layers, model.cfg.n_heads
    task = load_task("arc_easy", n=s.effects_n, seed=0)
    layers = sorted({layer for layer, _ in spread_heads(L, 1, s.layers)})
    def run(shared):
        return [evaluate_each(model, task, [zero_heads([(layer, h)]) for h in range(H)],
                                            batch_size=s.batch_size, progress=False, _shared_prefixes=shared)
                              for layer in layers]
    def base(shared):
        return evaluate_each(model, task, [[]], batch_size=s.batch_size, progress=False,
                                            _shared_prefixes=shared)
    load = timing.load_average()
    r = timing.alternate({"row": lambda: run(False), "shared": lambda: run(True), "row base": lambda: base(False),
                   "shared base": lambda: base(True)}, s.repeats, keep=())
    lines = [f"head effects, ARC-Easy {len(task)} items (seed 0), every head of layers {layers}, batch size "
             f"{s.batch_size} (load average {load:.1f} before, {timing.load_average():.1f} after):"]
    projected = {}
    for label in ("row", "shared"):
        projected[label] = L * r[label].cpu / len(layers) + r[f"{label} base"].cpu  # + the unablated baseline
        lines.append(f"  {label:7s} {r[label].wall:6.1f} s wall {r[label].cpu:6.1f} s CPU timed; all {L * H} heads "
                     f"+ baseline (projected): {projected[label]:6.0f} s CPU = {projected[label] / len(task):5.1f} s "
                     "CPU per item")
    lines.append(f"  -> shared prefixes {projected['row'] / projected['shared']:.2f}x less CPU "
                 f"({r['row'].wall / r['shared'].wall:.2f}x wall, layers only); recorded before (bench_effects, 8 items): 108 s "
                 "CPU per item")
    return lines


def main(argv=None) -> None:
    s = timing.parse_settings(PrefixBench, argv, __doc__)
    timing.set_threads(s.threads)
    started_load = timing.load_average()
    if s.lm_eval and s.model is not None:
        raise SystemExit("--lm-eval times lm-eval on the embedded model only: leave out --model")
    torch.set_grad_enabled(False)
    model = load_model() if s.model is None else load_model(s.model)
    timed_model = "embedded SmolLM2-135M-Instruct" if s.model is None else s.model
    peak = matmul_cpu_flops()
    blocks = [[f"dense fp32 matmul (2048^3, best of 5, per CPU second): {peak / 1e9:.1f} GFLOP/s"]]
    tasks = [("arc_easy", load_task("arc_easy", n=s.arc_n, seed=0)),
             ("mmlu 5-shot", mmlu_task(s.mmlu_subjects, s.mmlu_per_subject)),
             ("hellaswag", load_task("hellaswag", n=s.hellaswag_n, seed=0))]
    lm_eval = lm_eval_side(s.batch_size) if s.lm_eval else None
    for name, task in tasks:
        blocks.append(time_evaluator(model, name, task, s, peak, lm_eval))
        print("\n".join(blocks[-1]), flush=True)
    if s.layers:
        blocks.append(time_effects(model, s))
        print("\n".join(blocks[-1]), flush=True)
    machine = timing.print_machine(started_load)
    if s.write_docs:
        heading = LM_EVAL_HEADING if s.lm_eval else HEADING if s.model is None else f"{HEADING}: {s.model}"
        timing.write_printed(heading, f"python benchmarks/bench_prefix.py {'' if s.model is None else f'--model {s.model} '}--arc-n {s.arc_n} --hellaswag-n {s.hellaswag_n} "
                      f"--mmlu-subjects {s.mmlu_subjects} --mmlu-per-subject {s.mmlu_per_subject} --effects-n "
                      f"{s.effects_n} --layers {s.layers} --repeats {s.repeats} --threads {torch.get_num_threads()} "
                      f"{'--lm-eval ' if s.lm_eval else ''}--write-docs", machine, f"; {timed_model}, fp32. Medians of alternating "
                      "runs; the machine was shared with other jobs, so read the token counts and the ratios.",
                      [[line for line in block] for block in blocks])


if __name__ == "__main__":
    main()
