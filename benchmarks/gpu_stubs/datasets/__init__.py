"""A stand-in for Hugging Face ``datasets`` on the GPU check's machine, put on the path only where the real package
is missing (``benchmarks/gpu_check.sh``).

TransformerLens 3.9 imports ``datasets`` when it is imported (its dataset helpers), and ``datasets`` needs pyarrow,
whose wheel alone is about 40 MiB: with the working tree it would not fit the 64 MiB the GPU machine receives. The
check never loads a dataset; anything here that is called says so.
"""

from datasets.load import load_dataset, load_from_disk

__all__ = ["load_dataset", "load_from_disk"]
