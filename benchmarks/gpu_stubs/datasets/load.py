"""``load_dataset`` of the stand-in: refuses, naming the real package."""


def load_dataset(*args, **kwargs):
    """Always raises: this is the GPU check's stand-in, not Hugging Face ``datasets``."""
    _refuse()


def load_from_disk(*args, **kwargs):
    """Always raises, as :func:`load_dataset` (lens_heads.data.benchmark_files imports it)."""
    _refuse()


def _refuse():
    raise ImportError("this is the GPU check's stand-in for `datasets` (benchmarks/gpu_stubs): install the real "
                      "package (pip install datasets) to load datasets")
