"""Shared by the benchmark scripts: useful FLOPs counted from a model's config (the evaluator's paths:
:mod:`lens_heads.evaluation.flops`, re-exported here), the dense matmul FLOP/s they are read against, and the paper's
full experiment projected in GPU-hours from a measured rate."""

from __future__ import annotations

from typing import Sequence

import torch

from lens_heads.data.rows import build_rows
from lens_heads.evaluation.flops import (  # noqa: F401 (the scripts')
    forward_flops,
    path_flops,
    trunk_flops_per_token,
    whole_logits_flops,
)
from lens_heads.training.budget import nearest_shape
from timing import repeated

# The paper's 14 models (Llama-3.x 3B/8B, OLMo-2 7B base/SFT/DPO/Instruct, Qwen2.5 0.5B-14B), in billions of
# parameters; the split of the Llama and Qwen entries is our assumption (the spec names the families and range).
PAPER_MODELS_B = [3.2, 3.2, 8.0, 8.0, 7.3, 7.3, 7.3, 7.3, 0.49, 1.5, 3.1, 7.6, 7.6, 14.7]
MMLU_QUESTIONS = 14_042
EVALUATIONS_PER_MODEL = 12 * 6 + 6 + 1  # 12 scores x 6 fractions, random at 6 fractions, the baseline
GPU_PEAK = 989e12  # H100/H200 SXM dense bf16 tensor-core FLOP/s (vendor figure)


def evaluation_flops(model, task) -> float:
    """Useful FLOPs of ``lens_heads.evaluation.evaluate`` on ``task``: its rows whole, logits where it reads."""
    return path_flops(model, build_rows(model, list(task)))


def paper_flops(tokens_per_question: float) -> float:
    """FLOPs of the paper's experiment: 2 x params per token, one forward per question and evaluation (attention
    terms left out: ~1% at MMLU's length for 7B)."""
    return sum(model_flops(n, tokens_per_question) for n in PAPER_MODELS_B)


def model_flops(params_b: float, tokens_per_question: float) -> float:
    """FLOPs of one of the paper's models (``params_b`` billion parameters) over its evaluations, as
    :func:`paper_flops` counts them."""
    return 2 * params_b * 1e9 * tokens_per_question * MMLU_QUESTIONS * EVALUATIONS_PER_MODEL


def paper_projection(shapes: Sequence[dict], tokens_per_question: float) -> list[dict]:
    """The paper's experiment model by model at measured GPU rates: each model's FLOPs (:func:`model_flops`) over
    the evaluator's useful FLOP/s measured on the shape nearest it in parameters (by their ratio; ``shapes``: the
    GPU check's per-shape records, ``n_params`` and ``evaluator_flops_per_s``). A model larger than every shape takes
    the largest's rate, which small shapes fill worse: the hours are then an upper end. One row per model: its
    parameters (billions), FLOPs, the shape, that rate and the GPU-hours."""
    rows = []
    for params_b in PAPER_MODELS_B:
        near = nearest_shape(shapes, params_b * 1e9)
        flops = model_flops(params_b, tokens_per_question)
        rows.append(dict(params_b=params_b, flops=flops, shape=near["shape"], flops_per_s=near["evaluator_flops_per_s"],
                         gpu_hours=flops / near["evaluator_flops_per_s"] / 3600))
    return rows


def projected_gpu_hours(tokens_per_question: float, fraction_of_peak: float, peak: float = GPU_PEAK) -> float:
    """GPU-hours of the paper's experiment on GPUs of ``peak`` FLOP/s that reach ``fraction_of_peak`` of it."""
    return paper_flops(tokens_per_question) / (peak * fraction_of_peak) / 3600


def synchronize(device) -> None:
    """Wait for the device's queued kernels (a CUDA call returns before its kernel ends; timings must not)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def peak_memory_gib(device: str) -> float | None:
    """The most GPU memory allocated since the last :func:`reset_peak_memory` (None on the CPU)."""
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.startswith("cuda") else None


def reset_peak_memory(device: str) -> None:
    """Free the allocator's cached blocks and start counting the peak anew (nothing on the CPU)."""
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def matmul_flops_per_s(n: int = 2048, repeats: int = 5, *, device="cpu", dtype=torch.float32) -> float:
    """Best-of-``repeats`` FLOP/s of an n x n x n matmul (2 n^3 FLOPs) on ``device`` in ``dtype`` (on the CPU with
    the process's threads)."""
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randn(n, n, generator=gen).to(device=device, dtype=dtype) for _ in range(2))

    def run():
        a @ b
        synchronize(device)

    run()
    return 2.0 * n**3 / repeated(run, repeats).best
