"""Benchmark the evaluator at the compute limit: every comparison runs in one process, alternating, on this machine.

    OMP_NUM_THREADS=2 python benchmarks/bench_fast_eval.py --write-docs      # ~5-10 min on 2 CPU cores

1. Attention: a plain forward (logits at every position, batch 1) over MMLU 5-shot prompts (the evaluator's rows:
   one per question) with TransformerLens eager attention, with :func:`lens_heads.evaluation.fused_attention.fused_attention`,
   with fused attention and :func:`lens_heads.evaluation.packed_weights.packed_weights`, with both and
   :func:`lens_heads.evaluation.fast_blocks.fast_blocks` (the evaluator's forward), and with the
   same weights in Hugging Face (SDPA and eager attention). Target: the evaluator's forward >= 0.8x HF SDPA
   throughput; fused logits within 1e-4 of eager.
2. Logits only where read: ``evaluate`` on ARC-Easy as it is (final norm + unembedding at the read positions)
   against the same evaluator computing the full logits at every position and then reading them. The
   log-likelihoods are asserted equal (to 1e-4). Target: >= 1.15x throughput.
3. Achieved FLOP/s of an evaluation, of the scoring pass (``score_heads``) and of the plain forwards above, as a
   fraction of this machine's dense fp32 matmul FLOP/s measured in the same process (best of a few 2048^3 matmuls).
   Useful FLOPs are counted from the config (the formula: ``benchmarks/flops.py``).
4. Scaling: the same sweep units (baseline, random p=0.1, threshold AHON (LN) at the calibrated 10% threshold) on
   the same ARC-Easy items with 1 process x 2 threads against 2 processes x 1 thread (two plain subprocesses, each
   evaluating half of the items with ``torch.set_num_threads(1)``; item-by-item log-likelihoods checked equal),
   and the paper's full experiment projected in GPU-hours from the measured FLOP/s fraction (assumptions printed).

``--write-docs`` writes the printed figures into docs/records/benchmarks.md under "Evaluator at the compute limit".
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from unittest import mock

import numpy as np
import torch

from flops import (
    EVALUATIONS_PER_MODEL,
    GPU_PEAK,
    MMLU_QUESTIONS,
    PAPER_MODELS_B,
    evaluation_flops,
    forward_flops,
    matmul_flops_per_s,
    projected_gpu_hours,
)
from lens_heads import load_model, load_task
from lens_heads.ablation.hooks import threshold_zeroing
from lens_heads.ablation.random_draws import random_zeroing
from lens_heads.data.inputs import tokenize_inputs
from lens_heads.data.rows import build_rows
from lens_heads.evaluation import passes
from lens_heads.evaluation.evaluate import evaluate
from lens_heads.evaluation.fast_blocks import fast_blocks
from lens_heads.evaluation.fused_attention import fused_attention
from lens_heads.evaluation.packed_weights import packed_weights
from lens_heads.heads.distributions import thresholds
from lens_heads.heads.scoring import score_heads
from lens_heads.models.embedded import embedded_model_folder
from lens_heads.plumbing.settings import option
from timing import (
    Comparison,
    alternate,
    load_average,
    parse_settings,
    print_machine,
    repeats_option,
    timed,
    write_printed,
)

HEADING = "Evaluator at the compute limit"


@dataclass(frozen=True)
class FastEvalBench(Comparison):
    """What the benchmark times; the hidden flags are what the scaling comparison passes to its worker
    processes."""

    mmlu_n: int = option(8, "MMLU 5-shot prompts for the attention comparison")
    arc_n: int = option(40, "ARC-Easy items for the evaluator comparisons")
    repeats: int = repeats_option(1)
    hf_eager: bool = option(False, "also time Hugging Face with eager attention")
    shard: int | None = option(None, "this worker's share of the items", parse=int, hidden=True)
    shards: int = option(2, "workers the items are shared among", hidden=True)
    threshold: float | None = option(None, "the calibrated threshold the workers zero at", parse=float, hidden=True)



# ---------------------------------------------------------------- the compared runs


@torch.no_grad()
def tl_logits(model, rows, fused: bool, packed: bool = False, fast: bool = False) -> list[torch.Tensor]:
    with fused_attention(model) if fused else contextlib.nullcontext(), \
            packed_weights(model) if packed else contextlib.nullcontext(), \
            fast_blocks(model) if fast else contextlib.nullcontext():
        return [model(torch.tensor([row.tokens]))[0] for row in rows]


@torch.no_grad()
def hf_logits(hf, rows) -> list[torch.Tensor]:
    return [hf(input_ids=torch.tensor([row.tokens]), use_cache=False).logits[0] for row in rows]


def read_from_full_logits(model, resid, batch, out, greedy) -> None:
    """The baseline reader: final norm, unembedding and log_softmax at every position, then the read ones (and
    whether each continuation is the greedy one, as the evaluator records)."""
    final = model.ln_final(resid) if model.cfg.normalization_type is not None else resid
    logp = torch.log_softmax(model.unembed(final).float(), dim=-1)
    for b, row in enumerate(batch):
        for choice, first, ids in row.reads:
            out[row.item][choice] = float(sum(logp[b, first + k, t] for k, t in enumerate(ids)))
            greedy[row.item][choice] = all(int(logp[b, first + k].argmax()) == t for k, t in enumerate(ids))


def sweep_units(model, threshold: float) -> dict:
    return {"baseline": lambda: [], "random p=0.1": lambda: [random_zeroing(model, 0.1, seed=0)],
            "threshold AHON (LN) 10%": lambda: [threshold_zeroing(model, "AHON (LN)", threshold)]}


def run_units(model, task, threshold: float, batch_size: int) -> dict[str, list[list[float]]]:
    return {name: [it.logprobs for it in evaluate(model, task, hooks=hooks(), batch_size=batch_size,
                                                  progress=False).items]
            for name, hooks in sweep_units(model, threshold).items()}


def worker(args) -> None:
    """One shard of the scaling comparison: items[shard::shards] of every unit, one thread; prints JSON."""
    torch.set_num_threads(1)
    model = load_model()
    task = load_task("arc_easy", n=args.arc_n, seed=0)
    shard = replace(task, items=list(task)[args.shard::args.shards])
    run = timed(lambda: run_units(model, shard, args.threshold, args.batch_size))
    print(json.dumps(dict(wall_s=run.wall, logprobs=run.out)))


def two_processes(args, threshold: float) -> tuple[float, float, dict]:
    """Two 1-thread subprocesses on interleaved halves: end-to-end wall (loading included), the slower shard's
    evaluation wall, and the log-likelihoods put back in item order."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--arc-n", str(args.arc_n), "--batch-size",
           str(args.batch_size), "--threshold", repr(threshold), "--shards", "2"]
    start = time.perf_counter()
    procs = [subprocess.Popen(cmd + ["--shard", str(k)], env=env, stdout=subprocess.PIPE, text=True)
             for k in range(2)]
    outs = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
    end_to_end = time.perf_counter() - start
    if any(p.returncode for p in procs):
        raise RuntimeError("a scaling worker failed: see its output above")
    merged = {}
    for name in outs[0]["logprobs"]:
        merged[name] = [None] * args.arc_n
        for k, out in enumerate(outs):
            merged[name][k::2] = out["logprobs"][name]
    return end_to_end, max(out["wall_s"] for out in outs), merged


def max_difference(a: dict, b: dict) -> dict[str, float]:
    """Per unit, the largest difference between two runs' log-likelihoods (items have different numbers of
    choices: compared item by item)."""
    return {n: max(float(np.max(np.abs(np.asarray(x, float) - np.asarray(y, float)))) for x, y in zip(a[n], b[n]))
            for n in a}


# ---------------------------------------------------------------- the benchmark


def attention_comparison(model, hf: dict, s: FastEvalBench, peaks: list[float]) -> tuple[list[str], list]:
    """1. TL eager vs fused vs HF on MMLU prompts; appends the matmul FLOP/s measured after them to ``peaks``.
    Returns the printed lines and the evaluator's rows."""
    mmlu = load_task("mmlu", n=s.mmlu_n, seed=0)
    rows = build_rows(model, list(mmlu))
    lengths = [len(r.tokens) for r in rows]
    tokens = sum(lengths)
    r = alternate({"TL eager": lambda: tl_logits(model, rows, False), "TL fused": lambda: tl_logits(model, rows, True),
                   "TL fused+packed": lambda: tl_logits(model, rows, True, packed=True),
                   "TL fused+packed+fast": lambda: tl_logits(model, rows, True, packed=True, fast=True),
                   "HF SDPA": lambda: hf_logits(hf["sdpa"], rows),
                   **({"HF eager": lambda: hf_logits(hf["eager"], rows)} if s.hf_eager else {})}, s.repeats)
    peaks.append(matmul_flops_per_s())  # measured again: the neighbours' load varies
    peak = max(peaks)
    lines = [f"dense fp32 matmul (2048^3, best of 5, measured before and after the forwards): "
             f"{', '.join(f'{p / 1e9:.1f}' for p in peaks)} GFLOP/s; the higher is the reference"]
    flops = forward_flops(model.cfg, lengths, tokens)
    fused_vs_eager = max(float((a - b).abs().max()) for a, b in zip(r["TL fused"].out, r["TL eager"].out))
    packed_vs_fused = max(float((a - b).abs().max()) for a, b in zip(r["TL fused+packed"].out, r["TL fused"].out))
    tl_vs_hf = max(float((a - b).abs().max()) for a, b in zip(r["TL fused"].out, r["HF SDPA"].out))
    lines += ["", f"1. plain forward, logits at every position, batch 1: {len(rows)} MMLU 5-shot prompts (seed 0), "
                  f"{min(lengths)}-{max(lengths)} tokens, {tokens} in all"]
    for name, timing in r.items():
        t = timing.wall
        lines.append(f"  {name:15s} {t:6.1f} s  {tokens / t:6.0f} tok/s  {flops / t / 1e9:5.1f} GFLOP/s "
                     f"({100 * flops / t / peak:4.1f}% of matmul)")
    hf_sdpa, fused, eager = r["HF SDPA"].wall, r["TL fused"].wall, r["TL eager"].wall
    packed = r["TL fused+packed"].wall
    lines += [f"  -> TL fused+packed (the evaluator's forward) / HF SDPA throughput {hf_sdpa / packed:.2f}x (target >= "
              f"0.8x); TL fused / HF SDPA {hf_sdpa / fused:.2f}x; TL eager / HF SDPA {hf_sdpa / eager:.2f}x; fused vs "
              f"eager {eager / fused:.2f}x",
              f"  -> TL fused+packed+fast (the evaluator's forward with fast blocks) / HF SDPA throughput "
              f"{hf_sdpa / r['TL fused+packed+fast'].wall:.2f}x; max |logit difference| vs TL eager "
              f"{max(float((a - b).abs().max()) for a, b in zip(r['TL fused+packed+fast'].out, r['TL eager'].out)):.1e}",
              f"  max |logit difference|: TL fused vs TL eager {fused_vs_eager:.1e} (target <= 1e-4), "
              f"TL fused+packed vs TL fused {packed_vs_fused:.1e}, TL fused vs HF SDPA {tl_vs_hf:.1e}"]
    return lines, rows


def logits_where_read(model, arc, s: FastEvalBench) -> tuple[list[str], float]:
    """2. The evaluator as it is against the same evaluator reading from full logits; the lines and the former's
    wall seconds."""

    def full_logits():
        # the forward passes look the reader up in their own module
        with mock.patch.object(passes, "record_logprobs", read_from_full_logits):
            return evaluate(model, arc, batch_size=s.batch_size, progress=False)

    r = alternate({"read": lambda: evaluate(model, arc, batch_size=s.batch_size, progress=False),
                   "full": full_logits}, s.repeats)
    (t_read, read), (t_full, full) = (r["read"].wall, r["read"].out), (r["full"].wall, r["full"].out)
    difference = max(abs(a - b) for x, y in zip(read.items, full.items) for a, b in zip(x.logprobs, y.logprobs))
    assert difference < 1e-4, f"reading at the read positions changed a log-likelihood by {difference}"
    return [f"2. evaluator on ARC-Easy, {len(arc)} items (seed 0, {read.meta['rows']} rows, "
            f"{read.meta['forward_tokens']} tokens), batch size {s.batch_size}, fused attention:",
            f"  logits at the read positions {t_read:6.1f} s; full logits at every position {t_full:6.1f} s "
            f"-> {t_full / t_read:.2f}x throughput (target >= 1.15x); max |log-likelihood difference| "
            f"{difference:.1e}"], t_read


def achieved_flops(model, arc, s: FastEvalBench, t_read: float, peak: float) -> tuple[list[str], object, float]:
    """3. FLOP/s of the evaluation (timed in step 2) and of the scoring pass; the lines, the scores (the sweep's
    calibration) and the evaluation's fraction of the matmul FLOP/s."""
    eval_flops = evaluation_flops(model, arc)
    scoring = timed(lambda: score_heads(model, arc, batch_size=s.batch_size, progress=False))
    t_score = scoring.wall
    _, mask = tokenize_inputs(model, arc)
    score_flops = forward_flops(model.cfg, mask.sum(1).tolist(), 0)
    return ["3. achieved FLOP/s (useful FLOPs, formula in the script's docstring) / dense matmul FLOP/s:",
            f"  evaluation (above, fused, logits where read): {eval_flops / 1e9:7.1f} GFLOP in {t_read:5.1f} s = "
            f"{eval_flops / t_read / 1e9:5.1f} GFLOP/s = {100 * eval_flops / t_read / peak:4.1f}%",
            f"  scoring pass (score_heads, eager attention, on the same rows): {score_flops / 1e9:7.1f} "
            f"GFLOP in {t_score:5.1f} s = {score_flops / t_score / 1e9:5.1f} GFLOP/s = "
            f"{100 * score_flops / t_score / peak:4.1f}%"], scoring.out, eval_flops / t_read / peak


def scaling(model, arc, s: FastEvalBench, calib, mean_tokens: float, fraction: float) -> list[str]:
    """4. 1 process x N threads against 2 processes x 1 thread, and the paper's experiment in GPU-hours."""
    threshold = thresholds(calib, "AHON (LN)", [0.1])[0.1]
    threads = torch.get_num_threads()
    one = timed(lambda: run_units(model, arc, threshold, s.batch_size))
    t_one, single = one.wall, one.out
    end_to_end, t_shard, sharded = two_processes(s, threshold)
    differences = max_difference(single, sharded)
    # random zeroing draws by item index within the evaluated task, so a half of the task draws other heads
    same = max(d for name, d in differences.items() if not name.startswith("random"))
    assert same < 1e-4, f"the sharded run changed a log-likelihood by {same}"
    gpu_hours = projected_gpu_hours(mean_tokens, fraction)
    return [f"4. scaling, {len(sweep_units(model, threshold))} sweep units on the {len(arc)} ARC-Easy items:",
            f"  1 process x {threads} threads: {t_one:6.1f} s",
            f"  2 processes x 1 thread: {t_shard:6.1f} s evaluating (slower shard), {end_to_end:6.1f} s end to end "
            f"with model loading; max |log-likelihood difference| vs 1 process {same:.1e} (baseline, threshold; "
            "random zeroing draws by item index within the task a process evaluates, so the halves draw other "
            "heads: same work, other draws)",
            f"  -> 2x1 / 1x{threads} throughput: {t_one / t_shard:.2f}x evaluating, {t_one / end_to_end:.2f}x "
            "end to end",
            f"  paper's full experiment: {len(PAPER_MODELS_B)} models ({sum(PAPER_MODELS_B):.0f}B parameters in "
            f"all) x {MMLU_QUESTIONS:,} MMLU 5-shot questions x {EVALUATIONS_PER_MODEL} evaluations (12 scores x 6 "
            f"fractions + 6 random + baseline), one forward of {mean_tokens:.0f} tokens per question (mean of the "
            f"sample above), 2 x params FLOPs per token (attention terms left out: ~1% at this length for 7B): "
            f"{gpu_hours:,.0f} GPU-hours on H100/H200-class GPUs at {GPU_PEAK / 1e12:.0f} TFLOP/s bf16 peak, "
            f"assuming they reach the same {100 * fraction:.0f}% of peak that the evaluation reaches here "
            f"({gpu_hours / len(PAPER_MODELS_B):,.0f} per model on average; calibration passes add ~1/79)"]


def load_models(hf_eager: bool) -> tuple:
    """The embedded model in TransformerLens and, from the same weights, in Hugging Face (SDPA, and eager)."""
    from transformers import AutoModelForCausalLM

    model = load_model()
    folder = embedded_model_folder()
    hf = {impl: AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation=impl).eval()
          for impl in ("sdpa", "eager")[:2 if hf_eager else 1]}
    return model, hf


def main(argv=None) -> None:
    s = parse_settings(FastEvalBench, argv, __doc__)
    if s.shard is not None:
        return worker(s)
    started_load = load_average()
    model, hf = load_models(s.hf_eager)
    peaks = [matmul_flops_per_s()]
    lines, rows = attention_comparison(model, hf, s, peaks)
    print("\n".join(lines))
    arc = load_task("arc_easy", n=s.arc_n, seed=0)
    lines2, t_read = logits_where_read(model, arc, s)
    print("\n".join(lines2))
    lines3, calib, fraction = achieved_flops(model, arc, s, t_read, max(peaks))
    print("\n".join(lines3))
    mean_tokens = sum(len(row.tokens) for row in rows) / len(rows)
    lines4 = scaling(model, arc, s, calib, mean_tokens, fraction)
    print("\n".join(lines4))
    machine = print_machine(started_load)
    if s.write_docs:
        write_printed(HEADING, f"OMP_NUM_THREADS=2 python benchmarks/bench_fast_eval.py --mmlu-n {s.mmlu_n} "
                      f"--arc-n {s.arc_n} --repeats {s.repeats}{' --hf-eager' * s.hf_eager} --write-docs", machine,
                      "; embedded SmolLM2-135M-Instruct, fp32, raw weight basis; absolute times vary with the machine "
                      "and its load, so read the ratios.", [lines, lines2, lines3, lines4])


if __name__ == "__main__":
    main()
