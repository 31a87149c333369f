"""Write the notebooks of ``notebooks/`` from their cells (the .ipynb files are generated: edit the cells in
``cells_*.py``) and, with ``--execute``, run each in a fresh kernel on the embedded model and keep its outputs:

    OMP_NUM_THREADS=1 python notebooks/make_notebooks.py --execute      # what is committed
    python notebooks/make_notebooks.py                                   # the cells alone, no outputs
    OMP_NUM_THREADS=1 python notebooks/make_notebooks.py --execute --only 05_smaller_models.ipynb

Each notebook calls the library only and runs top to bottom in a few minutes on a CPU; its header ends with the
time this execution took (:mod:`executing`). ``tests/test_notebooks.py`` checks that the committed notebooks are
what this command makes from these cells and executes them again in CI.
"""

import argparse
import sys
import tempfile
from pathlib import Path

import nbformat
from nbformat.v4 import new_notebook

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from cells_harness import HARNESS  # noqa: E402
from cells_heads import ATTENTION_PATTERNS, EXPLORER_EFFECTS_TASK, INACTIVE_HEADS  # noqa: E402
from cells_layers import RANK_INHERITUNE, SMALLER_MODELS  # noqa: E402
from cells_stats import STATISTICS  # noqa: E402
from executing import add_static_images, execute, run_record, with_time_line  # noqa: E402

from lens_heads.plumbing.io import atomic_write_text  # noqa: E402

NOTEBOOKS = {
    "01_inactive_heads.ipynb": INACTIVE_HEADS,
    "02_rank_collapse_inheritune.ipynb": RANK_INHERITUNE,
    "03_attention_patterns.ipynb": ATTENTION_PATTERNS,
    "04_explorer_effects_custom_task.ipynb": EXPLORER_EFFECTS_TASK,
    "05_smaller_models.ipynb": SMALLER_MODELS,
    "06_statistics.ipynb": STATISTICS,
    "07_lm_evaluation_harness.ipynb": HARNESS,
}
RECORD_KEY = "lens_heads"  # notebook metadata: the execution the header's time line is rendered from


def build(name: str, record: dict | None = None) -> nbformat.NotebookNode:
    """The notebook ``name`` from its cells; with an execution ``record``, the header says how long it ran."""
    cells = [nbformat.from_dict(dict(c)) for c in NOTEBOOKS[name]]  # copies: the cells above stay as written
    metadata = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                "language_info": {"name": "python"}}
    if record is not None:
        cells[0].source = with_time_line(cells[0].source, record)
        metadata[RECORD_KEY] = record
    nb = new_notebook(cells=cells, metadata=metadata)
    for i, cell in enumerate(nb.cells):  # stable ids: regenerating gives the same file
        cell.id = f"{Path(name).stem[:2]}-{i:02d}"
    nbformat.validate(nb)
    return nb


def write(name: str, *, run: bool, folder: Path = HERE) -> Path:
    """Write the notebook ``name``; with ``run``, executed (outputs, figures' PNGs, the measured time)."""
    nb = build(name)
    if run:
        with tempfile.TemporaryDirectory() as tmp:
            seconds = execute(nb, tmp)
        executed = nb
        nb = build(name, run_record(seconds))
        for cell, ran in zip(nb.cells, executed.cells):
            if cell.cell_type == "code":
                cell.outputs, cell.execution_count = ran.outputs, ran.execution_count
        add_static_images(nb)
    path = folder / name
    atomic_write_text(path, nbformat.writes(nb))
    return path


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--execute", action="store_true", help="run each notebook and keep its outputs")
    parser.add_argument("--only", nargs="+", choices=sorted(NOTEBOOKS), help="these notebooks alone")
    args = parser.parse_args(argv)
    for name in args.only or NOTEBOOKS:
        path = write(name, run=args.execute)
        print(f"{path} ({path.stat().st_size / 1e3:.0f} kB)", flush=True)


if __name__ == "__main__":
    main()
