"""Training compute of a GPT-2 (or Llama-shaped) stage: FLOPs counted from the model's shape and the tokens it trained on,
and its GPU-hours at a share of a GPU's peak: the training share a GPU check measured (:func:`projection_from_record`)
or, where it recorded none, the share its evaluator reached on the measured model nearest in size, assumed for
training and said so (:func:`evaluator_share`).

A multiply-add is 2 FLOPs. Per token of a window of T tokens, a forward costs

    trunk:      2 * n_layers * (4 * d_model * n_heads * d_head + 2 * d_model * d_mlp)   (Q, K, V, O and the MLP;
                with grouped K/V heads and a gated MLP: 2 * d_model * (n_heads + n_kv_heads) * d_head and
                3 * d_model * d_mlp)
    attention:  2 * n_layers * n_heads * d_head * (T + 1)     (causal QK^T and AV: T (T + 1) / 2 pairs a head)
    logits:     2 * d_model * d_vocab

(the same count as the benchmarks' evaluation FLOPs; LayerNorms, softmax and embedding lookups are left out, a few
percent). Training is forward and backward, 3 x the forward (Kaplan et al. 2020, "Scaling laws for neural language
models"). Distillation adds the teacher's forward on every training token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence, TypeGuard

from lens_heads.evaluation.flops import trunk_flops_per_token
from lens_heads.plumbing.errors import InputError

# H100/H200 SXM dense bf16 tensor-core peak (vendor figure): the peak GPU-hours are projected against
GPU_PEAK_FLOPS = 989e12


def weights(cfg) -> float:
    """The model's weights: the trunk's products (:func:`trunk_flops_per_token` / 2) and the token embedding."""
    return trunk_flops_per_token(cfg) / 2 + cfg.d_model * cfg.d_vocab


def forward_flops_per_token(cfg, seq_len: int) -> float:
    """FLOPs of one token's forward through a GPT-2 of config ``cfg`` (n_layers, d_model, n_heads, d_head, d_mlp,
    d_vocab) in windows of ``seq_len`` tokens."""
    trunk = trunk_flops_per_token(cfg)
    attention = 2.0 * cfg.n_layers * cfg.n_heads * cfg.d_head * (seq_len + 1)
    return trunk + attention + 2.0 * cfg.d_model * cfg.d_vocab


def training_flops(cfg, tokens: int, seq_len: int) -> float:
    """FLOPs of training on ``tokens`` tokens: forward and backward, 3 x the forward."""
    return 3.0 * forward_flops_per_token(cfg, seq_len) * tokens


def teacher_flops(cfg, tokens: int, seq_len: int) -> float:
    """FLOPs of a teacher's forward on ``tokens`` training tokens (distillation)."""
    return forward_flops_per_token(cfg, seq_len) * tokens


@dataclass(frozen=True)
class GPUProjection:
    """GPU-hours for ``flops`` at ``fraction`` of a ``peak`` FLOP/s; ``source`` says where the fraction comes from
    and ``measured`` whether a GPU measured it."""

    flops: float
    peak: float
    fraction: float
    source: str
    measured: bool = False

    @property
    def gpu_hours(self) -> float:
        return self.flops / (self.peak * self.fraction) / 3600

    def describe(self) -> str:
        return (f"{self.flops:.3g} FLOPs / ({self.peak / 1e12:,.0f} TFLOP/s x {self.fraction:.1%}) / 3600 = "
                f"{self.gpu_hours:,.0f} GPU-hours ({self.source})")


def measured_training_share(record: dict[str, Any] | None, shape: str,
                            peak: float = GPU_PEAK_FLOPS) -> tuple[float, str] | None:
    """The share of ``peak`` that lens_heads' training loop reached on ``shape`` in a GPU check's record
    (``benchmarks/gpu_check.py``'s ``gpu_check.json``: a training row's ``loop_flops_per_s`` / ``peak``; at the vendor
    peak, the row's ``loop_share_of_peak``), and where it was measured ("measured on <GPU> <date>"). None where the
    record has no such GPU measurement: no record, a CPU or ``--smoke`` run, no row of that shape, a row that failed
    or a share outside (0, 1]."""
    if not from_a_gpu(record):
        return None
    row = next((r for r in record.get("training", []) if r.get("shape") == shape and not r.get("error")), None)
    share = None if row is None else share_of_peak(row.get("loop_flops_per_s"), peak)
    if row is None or share is None:
        return None
    return share, f"measured on {row.get('device_name', 'a GPU')} {recorded_on(record)}"


def from_a_gpu(record: dict[str, Any] | None) -> TypeGuard[dict[str, Any]]:
    """Whether a GPU check's record measured a GPU: a record, of a CUDA device, not a ``--smoke`` run."""
    return record is not None and not record.get("smoke") and str(record.get("device", "")).startswith("cuda")


def share_of_peak(rate: Any, peak: float) -> float | None:
    """``rate`` (FLOP/s) as a share of ``peak``; None where it is not a number or the share is outside (0, 1]."""
    share = rate / peak if isinstance(rate, (int, float)) else math.nan
    return float(share) if math.isfinite(share) and 0 < share <= 1 else None


def recorded_on(record: dict[str, Any]) -> str:
    """The date a record was made: its provenance's, else the first field of its machine line (older records)."""
    when = (record.get("provenance") or {}).get("recorded_at") or str(record.get("machine", "")).split(";")[0]
    return when[:10] or "(undated)"


def evaluator_share(record: dict[str, Any] | None, n_params: float,
                    peak: float = GPU_PEAK_FLOPS) -> tuple[float, str] | None:
    """Where a GPU check recorded no training rate: the share of ``peak`` its evaluator's forward reached
    (``evaluator_flops_per_s`` of a ``shapes`` row) on the measured model nearest ``n_params`` weights (by ratio), and
    a source that says it is assumed for training, which runs a backward pass too. None where the record has no such
    GPU measurement."""
    if not from_a_gpu(record):
        return None
    rows = [r for r in record.get("shapes", []) if isinstance(r.get("n_params"), (int, float)) and r["n_params"] > 0
            and share_of_peak(r.get("evaluator_flops_per_s"), peak) is not None]
    if not rows:
        return None
    row = nearest_shape(rows, n_params)
    return float(row["evaluator_flops_per_s"] / peak), (
        f"assumed: the share lens_heads' evaluator reached on {row['shape']} ({row['n_params'] / 1e9:.2g}B weights, "
        f"the measured model nearest this one's {n_params / 1e9:.2g}B), measured {recorded_on(record)}")


def nearest_shape(shapes: Sequence[dict[str, Any]], n_params: float) -> dict[str, Any]:
    """The GPU check's model row (``n_params`` each) nearest ``n_params`` weights by their ratio."""
    return min(shapes, key=lambda r: abs(math.log(r["n_params"] / n_params)))


def projection_from_record(flops: float, record: dict[str, Any] | None, shape: str, *, n_params: float,
                           peak: float = GPU_PEAK_FLOPS) -> GPUProjection:
    """GPU-hours of ``flops`` of training at the share of ``peak`` a GPU check measured for ``shape``
    (:func:`measured_training_share`; ``measured=True``: the hours are ``flops`` over the measured FLOP/s), else at
    its evaluator's share on the model nearest ``n_params`` weights (:func:`evaluator_share`, ``measured=False``);
    an InputError where the record has neither."""
    measured = measured_training_share(record, shape, peak)
    if measured is not None:
        fraction, source = measured
        return GPUProjection(flops, peak, fraction, source, measured=True)
    assumed = evaluator_share(record, n_params, peak)
    if assumed is None:
        raise InputError(f"no GPU rate to project {shape}'s GPU-hours from: the GPU check's record has neither a "
                         "training rate of this shape nor an evaluator rate on a GPU; give the share of peak you "
                         "expect with --gpu-fraction, or a record of benchmarks/gpu_check.py run on a GPU")
    return GPUProjection(flops, peak, *assumed)
