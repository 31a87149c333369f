"""``load_dataset`` of the stand-in: refuses, naming the real package."""


def load_dataset(*args, **kwargs):
    """Always raises: this is the GPU check's stand-in, not Hugging Face ``datasets``."""
    raise ImportError("this is the GPU check's stand-in for `datasets` (benchmarks/gpu_stubs): install the real "
                      "package (pip install datasets) to load datasets")
