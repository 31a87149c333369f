"""The GPU recipe, measured: one prepared check of the evaluator, the scoring pass, a sweep unit, ``batch_size="auto"``
and torchrun on random-init models of real shapes, all side by side in one process.

    bash benchmarks/gather_gpu_wheels.sh                       # once, on a machine that reaches PyPI
    bash benchmarks/gpu_check.sh runs/gpu_check                # on the GPU machine (H200: a few minutes)
    python benchmarks/gpu_check.py runs/gpu_check --device cpu --smoke    # the same code on tiny shapes (CI)

Throughput does not depend on the weights' values, so each shape (SmolLM2-135M, Qwen2.5-0.5B, Llama-3.2-1B and
Qwen2.5-7B shapes) is a random-init Hugging Face model (SDPA attention) and a HookedTransformer holding the same weights (the
project's own conversion, ``lens_heads.models.loading.hooked_from_hf``), in bf16 on ``cuda`` by default. Its rows are
synthetic token ids with MMLU 5-shot row lengths, whole subjects at a time, the rows of a subject sharing as
many leading ids as the real rows do (its description and five shots: ``benchmarks/mmlu_row_lengths.json``, from the
real rows under SmolLM2's tokenizer; ``--record-lengths`` remakes it), run through the evaluator's own task and row
code, so that its shared prefixes run once as on real MMLU. Per shape:

1. ``batch_size="auto"``: the size it settles on for these rows and the peak GPU memory of that evaluation;
2. the evaluator (``lens_heads.evaluation.evaluate``, at that batch size) against Hugging Face SDPA on the same batches, the
   same weights and logits at the same read positions: tokens/s of each, and the largest log-likelihood difference;
3. the scoring pass (``lens_heads.score_heads``) and one threshold-zeroing sweep unit (``lens_heads.sweep.run.run_unit``,
   AHON (LN) at the threshold that zeroes 10% on the scoring pass): tokens/s;
4. the scoring pass against the evaluator's forward on long prompts (2,048 and 8,192 tokens; a sixteenth with
   ``--smoke``): tokens/s of each (``gpu_measure.long_prompt_rates``);
5. achieved FLOP/s (useful FLOPs, ``benchmarks/flops.py``) as a share of the dense matmul FLOP/s measured in the same
   run (best of a few 8192^3 matmuls in the check's dtype on a GPU, 1024^3 on the CPU).

Then training (``gpu_train``): the Inheritune presets' GPT-2 medium and XL shapes (the authors' GPT-2, random init, the
presets' micro-batch and bf16 autocast) for a few optimizer steps through ``lens_heads.training.loop.train`` beside a
plain PyTorch loop on the same model: tokens/s and training FLOP/s as shares of the matmul rate and of the vendor peak
(the share ``lens_heads.training.budget.projection_from_record`` projects Inheritune's GPU-hours from).

Every figure is set beside its target (:data:`TARGETS`, also in the record). The stacked sweep (several units' rows in
one batch, :func:`stacked_sweep_check`) is timed against the same units run one at a time on the first shape.

Then a sweep (baseline, random 10%, AHON (LN) 10%) on the first shape twice: in this process, and under
``torchrun --standalone --nproc_per_node=1``; their log-likelihoods must agree. Last, the paper's full experiment in
GPU-hours, each of its models at the evaluator's FLOP/s measured on the shape nearest its size
(``flops.paper_projection``). One table is printed and written, with every
figure, as ``gpu_check.json`` in the folder given.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from flops import matmul_flops_per_s, paper_projection
from gpu_measure import FRACTION, LONG_PROMPTS, SCORE, ShapeResult, logprobs_of, max_difference, measure_shape
from gpu_rows import check_lengths, mmlu_lengths, record_lengths, synthetic_task
from gpu_settings import GpuCheck
from gpu_shapes import SHAPES, build_pair
from gpu_train import TrainingResult, measure_training, with_shares
from lens_heads.plumbing.io import atomic_write_json
from lens_heads.plumbing.provenance import write_record
from lens_heads.sweep.run import run_sweep
from lens_heads.training.budget import GPU_PEAK_FLOPS
from timing import machine_line, parse_settings, timed

HERE = Path(__file__).resolve().parent
RESULT = "gpu_check.json"


# ---------------------------------------------------------------- torchrun


@dataclass
class TorchrunResult:
    """The same sweep in this process and under a 1-process torchrun: wall seconds and the largest difference."""

    shape: str
    units: int
    plain_s: float
    torchrun_s: float
    max_logprob_difference: float
    same_shares: bool
    error: str | None = None

    @property
    def equal(self) -> bool:
        return self.error is None and self.same_shares and self.max_logprob_difference <= 1e-6


def sweep_units(name: str, s: GpuCheck) -> list[dict]:
    """The check's sweep on shape ``name``: baseline, random and threshold at 10%; per unit its log-likelihoods
    and the share of heads it zeroed."""
    _, model = build_pair(name, s.shape(name), s.device, s.torch_dtype, s.seed)
    task = synthetic_task(check_lengths(min(s.n_rows, 32), s.smoke, s.seed), model.cfg.d_vocab, s.seed)
    sweep = run_sweep(model, task, scores=[SCORE], fractions=[FRACTION], static_scores=(), batch_size=8,
                      progress=False)
    return [dict(key=u.key, logprobs=logprobs_of(u.result), share=u.realised_fraction) for u in sweep.units]


def torchrun_check(s: GpuCheck) -> TorchrunResult:
    """:func:`sweep_units` here and in a ``torchrun --standalone --nproc_per_node=1`` worker; compared unit by unit."""
    name = s.shapes[0]
    plain = timed(lambda: sweep_units(name, s))
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        out = Path(tmp) / "worker.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
               str(Path(__file__).resolve()), "--worker-out", str(out), *s.flags()]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")])}
        start = time.perf_counter()
        error = _run_worker(cmd, env)
        wall = time.perf_counter() - start
        if error or not out.exists():
            return TorchrunResult(name, len(plain.out), plain.wall, wall, math.nan, False, error or "no output")
        worker = json.loads(out.read_text())
    diff = max(max_difference(a["logprobs"], b["logprobs"]) for a, b in zip(plain.out, worker))
    same = [a["key"] for a in plain.out] == [b["key"] for b in worker] and \
        all(a["share"] == b["share"] for a, b in zip(plain.out, worker))
    return TorchrunResult(name, len(plain.out), plain.wall, wall, diff, same)


def _run_worker(cmd: list[str], env: dict, timeout: float = 300) -> str | None:
    """Run the torchrun command; None when it succeeded, else what went wrong (the end of its output)."""
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"torchrun did not finish in {timeout:.0f} s"
    if done.returncode:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        return f"torchrun exited {done.returncode}: {' | '.join(tail)}"
    return None


def worker(s: GpuCheck) -> None:
    """The torchrun side of :func:`torchrun_check`: the sweep's units as JSON."""
    from lens_heads.plumbing import distributed

    units = sweep_units(s.shapes[0], s)
    if distributed.is_main():
        atomic_write_json(s.worker_out, units)


# ---------------------------------------------------------------- the table


@dataclass
class CheckResult:
    """The whole check: where it ran, the matmul reference, each shape, torchrun and the projection."""

    machine: str
    device: str
    dtype: str
    smoke: bool
    matmul_flops_per_s: float
    shapes: list[ShapeResult]
    torchrun: TorchrunResult
    mmlu_tokens_per_question: float
    projection: list[dict]  # per paper model: flops.paper_projection
    projected_gpu_hours: float
    wall_s: float
    stacked_sweep: dict = field(default_factory=dict)
    training: list[TrainingResult] = field(default_factory=list)
    targets: dict = field(default_factory=lambda: dict(TARGETS))


# ---------------------------------------------------------------- the stacked sweep

TARGETS = {  # issue 48's goals for a GPU run, each beside its measured row in the table
    "evaluator / HF SDPA (MMLU 5-shot rows)": ">= 1.5x",
    "scoring / evaluator (every prompt length)": ">= 0.5x",
    "threshold unit / evaluator": ">= 0.8x",
    "stacked sweep / units one at a time (135M shape)": ">= 3x units per second",
}


STACKED_SCORES = ("AHON (LN)", "AWFT", "LTHON (LN)", "AVVN (LN)")  # 4 scores x 3 shares: 12 threshold units
STACKED_FRACTIONS = (0.0, 0.1, 0.2, 0.3)


def stacked_sweep_check(s: GpuCheck) -> dict:
    """The stacked sweep's units per second against running its units one at a time, on the first shape
    (``bench_stacked.compare_units``: the same threshold units, ``stack`` per forward on a GPU, 4 with ``--smoke``;
    the calibration scored once beforehand, so that only the units are timed; their records compared)."""
    from bench_stacked import compare_units
    from lens_heads.heads.scoring import score_heads

    name = s.shapes[0]
    _, model = build_pair(name, s.shape(name), s.device, s.torch_dtype, s.seed)
    task = synthetic_task(check_lengths(min(s.n_rows, 32), s.smoke, s.seed), model.cfg.d_vocab, s.seed)
    scores = score_heads(model, task, batch_size="auto", progress=False)  # the calibration, untimed
    stack = 4 if s.smoke or not s.device.startswith("cuda") else 16
    compared = compare_units(model, task, stack=stack, scores=list(STACKED_SCORES), fractions=STACKED_FRACTIONS,
                             calibration=scores, static_scores=(), random_baseline=False, batch_size="auto", seed=s.seed)
    return dict(shape=name, measured=True, **compared)


ROWS = [  # (label, a ShapeResult and the matmul FLOP/s as text)
    ("parameters", lambda r, peak: f"{r.n_params / 1e6:,.1f}M"),
    ("rows / tokens", lambda r, peak: f"{r.rows} / {r.tokens}"),
    ('batch_size="auto" chose', lambda r, peak: str(r.auto_batch_size)),
    ("peak memory of that evaluation", lambda r, peak: "-" if r.auto_peak_memory_gib is None
     else f"{r.auto_peak_memory_gib:.1f} GiB"),
    ("evaluator forward tokens / row tokens", lambda r, peak: f"{r.forward_tokens_share:.0%}"),
    ("evaluator tokens/s", lambda r, peak: f"{r.evaluator_tokens_per_s:,.0f}"),
    ("HF SDPA tokens/s", lambda r, peak: f"{r.hf_sdpa_tokens_per_s:,.0f}"),
    ("evaluator / HF SDPA", lambda r, peak: f"{r.evaluator_vs_hf:.2f}x"),
    ("max |log-likelihood difference|", lambda r, peak: f"{r.max_logprob_difference:.1e}"),
    ("scoring pass tokens/s", lambda r, peak: f"{r.scoring_tokens_per_s:,.0f}"),
    (f"threshold unit ({SCORE} {FRACTION:.0%}) tokens/s", lambda r, peak: f"{r.threshold_unit_tokens_per_s:,.0f}"),
    ("threshold unit: heads zeroed", lambda r, peak: f"{r.threshold_unit_share_zeroed:.1%}"),
    ("threshold unit / evaluator", lambda r, peak: f"{r.threshold_unit_tokens_per_s / r.evaluator_tokens_per_s:.2f}x"),
    *((f"scoring / evaluator, {n:,}-token prompts", lambda r, peak, i=i: _long(r, i, "ratio"))
      for i, n in enumerate(LONG_PROMPTS)),
    *((f"scoring FLOP/s / matmul, {n:,}-token prompts", lambda r, peak, i=i: _long(r, i, "share", peak))
      for i, n in enumerate(LONG_PROMPTS)),
    ("evaluator FLOP/s / matmul", lambda r, peak: f"{r.evaluator_flops_per_s / peak:.1%}"),
    ("HF SDPA FLOP/s / matmul", lambda r, peak: f"{r.hf_sdpa_flops_per_s / peak:.1%}"),
    ("scoring pass FLOP/s / matmul", lambda r, peak: f"{r.scoring_flops_per_s / peak:.1%}"),
    ("threshold unit FLOP/s / matmul", lambda r, peak: f"{r.threshold_unit_flops_per_s / peak:.1%}"),
]


def _long(r: ShapeResult, i: int, what: str, peak: float = 1.0) -> str:
    if i >= len(r.long_prompts):
        return "-"
    row = r.long_prompts[i]
    if what == "ratio":
        return f"{row['scoring_tokens_per_s'] / row['evaluator_tokens_per_s']:.2f}x"
    return f"{row['scoring_flops_per_s'] / peak:.1%}"


def table(result: CheckResult) -> str:
    """The printed table: one column per shape, then torchrun and the projection."""
    heads = [r.shape + (" (smoke)" if result.smoke else "") for r in result.shapes]
    width = max(len(label) for label, _ in ROWS)
    cells = [[show(r, result.matmul_flops_per_s) for r in result.shapes] for _, show in ROWS]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(heads)]
    def line(label, values):
        return f"{label:<{width}}  " + "  ".join(f"{v:>{w}}" for v, w in zip(values, widths))
    t = result.torchrun
    verdict = f"error: {t.error}" if t.error else (
        f"{'equal' if t.equal else 'DIFFERENT'} (max |difference| {t.max_logprob_difference:.1e}, shares "
        f"{'equal' if t.same_shares else 'differ'})")
    return "\n".join([
        f"GPU check: {result.machine}; {result.device}, {result.dtype}",
        f"dense matmul reference (the higher of before and after the shapes): "
        f"{result.matmul_flops_per_s / 1e12:.2f} TFLOP/s", "",
        line("", heads), *(line(label, row) for (label, _), row in zip(ROWS, cells)), "",
        f"torchrun --nproc_per_node=1 sweep ({t.units} units, {t.shape}) vs the same sweep in this process: "
        f"{verdict}; {t.torchrun_s:.1f} s (start-up and imports included) vs {t.plain_s:.1f} s",
        _stacked_line(result.stacked_sweep), *training_table(result.training, result.smoke),
        "targets: " + "; ".join(f"{k} {v}" for k, v in result.targets.items()),
        f"paper's experiment, each model at the evaluator's rate on the shape nearest its size: "
        f"{result.projected_gpu_hours:,.0f} GPU-hours = "
        + " + ".join(f"{r['flops']:.2g} / {r['flops_per_s']:.2g}" for r in result.projection)
        + f" FLOPs / (FLOP/s) / 3600 ({result.mmlu_tokens_per_question:.0f} tokens per MMLU question; "
        "flops.paper_projection)",
        f"wall time of the check: {result.wall_s:.0f} s"])


TRAINING_ROWS = [  # (label, a TrainingResult as text)
    ("parameters", lambda r: f"{r.n_params / 1e6:,.1f}M"),
    ("micro-batch x accumulation x tokens", lambda r: f"{r.micro_batch} x {r.grad_accum} x {r.seq_len:,}"),
    ("bf16 autocast", lambda r: "yes" if r.amp else "no (CPU)"),
    ("training FLOPs a step", lambda r: f"{r.flops_per_step:.3g}"),
    ("lens_heads loop tokens/s", lambda r: f"{r.loop_tokens_per_s:,.0f}"),
    ("plain PyTorch loop tokens/s", lambda r: f"{r.plain_tokens_per_s:,.0f}"),
    ("lens_heads loop / plain", lambda r: f"{r.loop_vs_plain:.2f}x"),
    ("loop FLOP/s / matmul", lambda r: _share(r.loop_share_of_matmul)),
    ("loop FLOP/s / vendor peak", lambda r: _share(r.loop_share_of_peak)),
    ("plain FLOP/s / matmul", lambda r: _share(r.plain_share_of_matmul)),
    ("plain FLOP/s / vendor peak", lambda r: _share(r.plain_share_of_peak)),
    ("peak memory", lambda r: "-" if r.peak_memory_gib is None else f"{r.peak_memory_gib:.1f} GiB"),
]


def _share(x: float) -> str:
    return f"{x:.1%}" if x >= 1e-3 else f"{x:.1e}"  # a CPU's share of a GPU's peak would print as 0.0%


def training_table(rows: list[TrainingResult], smoke: bool) -> list[str]:
    """The training block of the table: one column per GPT-2 shape; a shape that failed says why."""
    if not rows:
        return ["training: not measured (--train-shapes '')"]
    first = rows[0]
    heads = [r.shape + (" (smoke)" if smoke else "") for r in rows]
    cells = [["-" if r.error else show(r) for r in rows] for _, show in TRAINING_ROWS]
    width = max(len(label) for label, _ in TRAINING_ROWS)
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(heads)]

    def line(label, values):
        return f"{label:<{width}}  " + "  ".join(f"{v:>{w}}" for v, w in zip(values, widths))
    return ["", f"training ({first.device_name}; warm-up steps untimed: {first.warmup_steps}, timed: {first.timed_steps}; vendor peak {GPU_PEAK_FLOPS / 1e12:,.0f} TFLOP/s; FLOPs: lens_heads.training.budget."
            "training_flops):", line("", heads), *(line(label, row) for (label, _), row in zip(TRAINING_ROWS, cells)),
            *(f"training {r.shape}: {r.error}" for r in rows if r.error), ""]


def _stacked_line(st: dict) -> str:
    if not st.get("measured"):
        return f"stacked sweep ({st.get('shape')}): NOT MEASURED: {st.get('why')}"
    return (f"stacked sweep ({st['shape']}, {st['units']} units, {st['stack']} per forward): "
            f"{st['stacked']['units_per_s']:.2f} vs {st['one']['units_per_s']:.2f} units/s one at a time, "
            f"{st['wall_ratio']:.2f}x; predictions equal {st['predictions_equal']}/{st['predictions']}, max "
            f"|log-likelihood difference| {st['max_abs_loglik_diff']:.1e}, shares {'equal' if st['shares_equal'] else 'DIFFER'}")


# ---------------------------------------------------------------- the check


def run_check(s: GpuCheck) -> CheckResult:
    """Every measurement of the module docstring, in one process (plus the torchrun worker)."""
    start = time.perf_counter()
    big = s.device.startswith("cuda")

    def matmul() -> float:
        return matmul_flops_per_s(8192 if big else 1024, 10 if big else 3, device=s.device, dtype=s.torch_dtype)

    before = matmul()
    shapes = [measure_shape(name, s) for name in s.shapes]
    training = [measure_training(name, s.train_shape(name), s.device, s.seed, s.train_steps) for name in s.train_shapes]
    peak = max(before, matmul())  # measured again: a clock that throttles or a busy neighbour shows here
    training = [with_shares(row, peak) for row in training]
    torchrun = torchrun_check(s)
    stacked = stacked_sweep_check(s)
    mean_tokens = float(np.mean(mmlu_lengths()))
    # matched by the shapes' real sizes, also where --smoke ran them at toy size
    projection = paper_projection([dict(asdict(r), n_params=SHAPES[r.shape].n_params()) for r in shapes], mean_tokens)
    gpu = f"; {torch.cuda.get_device_name(s.device)}" if big else ""
    return CheckResult(machine=machine_line() + gpu, device=s.device, dtype=str(s.torch_dtype).replace("torch.", ""),
                       smoke=s.smoke, matmul_flops_per_s=peak, shapes=shapes, torchrun=torchrun,
                       mmlu_tokens_per_question=mean_tokens, projection=projection,
                       projected_gpu_hours=sum(r["gpu_hours"] for r in projection),
                       wall_s=time.perf_counter() - start, stacked_sweep=stacked, training=training)


def main(argv=None) -> CheckResult | None:
    s = parse_settings(GpuCheck, argv, __doc__)
    if s.record_lengths:
        return record_lengths()
    if s.worker_out:
        return worker(s)
    result = run_check(s)
    text = table(result)
    print(text)
    path = write_record(Path(s.out) / RESULT, dict(asdict(result), table=text.splitlines()))
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
