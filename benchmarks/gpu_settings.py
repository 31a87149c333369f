"""What the GPU check runs (its command line), and its refusal of a device or dtype this machine can't measure."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gpu_rows import LENGTHS
from gpu_shapes import SHAPES, Shape, parse_shapes
from gpu_train import TIMED_STEPS, TRAIN_SHAPES, WARMUP_STEPS, TrainShape, parse_train_shapes
from lens_heads.models.loading import check_dtype_on
from lens_heads.plumbing.settings import option
from timing import repeats_option

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass(frozen=True)
class GpuCheck:
    """What the check runs; the hidden flag is what the torchrun worker is told."""

    out: str | None = option(None, "folder the table is written into (as gpu_check.json)", positional=True)
    device: str = option("cuda", "cuda (the recipe) or cpu (with --smoke: the plumbing only)")
    dtype: str | None = option(None, "weights and activations (default: bfloat16 on cuda, float32 on cpu)",
                               choices=tuple(DTYPES))
    shapes: tuple = option(tuple(SHAPES), "comma-separated shapes to check", parse=parse_shapes)
    train_shapes: tuple = option(tuple(TRAIN_SHAPES), "comma-separated GPT-2 shapes whose training rate is measured "
                                 "('' for none)", parse=parse_train_shapes)
    smoke: bool = option(False, "toy-size shapes and few rows (runs on a CPU in seconds; tested in CI)")
    rows: int | None = option(None, "MMLU-length rows per shape (default: 256 = auto's first try on a GPU; 8 with "
                                    "--smoke)", parse=int)
    repeats: int = repeats_option(2)
    seed: int = option(0, "weights' and rows' seed")
    record_lengths: bool = option(False, f"remake {LENGTHS.name} from real MMLU rows (development machine)")
    worker_out: str | None = option(None, "where the torchrun worker writes its sweep", hidden=True)

    def __post_init__(self):
        if self.record_lengths:
            return
        if self.out is None and not self.worker_out:
            raise ValueError("give the folder the table goes into, e.g. `gpu_check.py runs/gpu_check`")
        if self.rows is not None and self.rows < 1:
            raise ValueError(f"--rows must be at least 1, got {self.rows}")
        check_device(self.device, self.torch_dtype, self.dtype is not None)

    @property
    def torch_dtype(self) -> torch.dtype:
        if self.dtype is not None:
            return DTYPES[self.dtype]
        return torch.bfloat16 if self.device.startswith("cuda") else torch.float32

    @property
    def n_rows(self) -> int:
        return self.rows if self.rows is not None else (8 if self.smoke else 256)

    def shape(self, name: str) -> Shape:
        return SHAPES[name].smoke() if self.smoke else SHAPES[name]

    def train_shape(self, name: str) -> TrainShape:
        return TRAIN_SHAPES[name].smoke() if self.smoke else TRAIN_SHAPES[name]

    @property
    def train_steps(self) -> tuple[int, int]:
        """Warm-up (untimed) and timed optimizer steps of each training measurement."""
        return (1, 2) if self.smoke else (WARMUP_STEPS, TIMED_STEPS)

    def flags(self) -> list[str]:
        """The command-line flags that rebuild these settings (for the torchrun worker)."""
        return ["--device", self.device, "--dtype", str(self.torch_dtype).replace("torch.", ""), "--shapes",
                ",".join(self.shapes), "--rows", str(self.n_rows), "--seed", str(self.seed)] + \
            (["--smoke"] if self.smoke else [])


def check_device(device: str, dtype: torch.dtype, dtype_given: bool) -> None:
    """Refuse a device this machine lacks, and a dtype the device can't run or that would measure nothing useful."""
    kind = device.split(":")[0]
    if kind not in ("cuda", "cpu"):
        raise ValueError(f"--device {device}: use cuda (the recipe) or cpu (with --smoke)")
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: CUDA is not available on this machine (torch {torch.__version__}); run "
                         "the check on a GPU machine, or check its plumbing here with --device cpu --smoke")
    if kind == "cpu" and dtype != torch.float32 and dtype_given:
        raise ValueError(f"--dtype {str(dtype).replace('torch.', '')} on the CPU: CPUs emulate most reduced-precision "
                         "kernels, so it would time nothing the GPU recipe runs; use --dtype float32 (the default on "
                         "cpu) or --device cuda")
    if kind == "cuda":
        try:
            check_dtype_on(device, dtype)
        except ValueError as e:
            raise ValueError(f"--dtype {str(dtype).replace('torch.', '')}: {e}") from None
