"""Each notebook runs top to bottom in a fresh kernel, is what make_notebooks.py generates, and calls the library
only (no function or class defined in a notebook: the logic lives in lens_heads)."""

import ast
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
sys.path.insert(0, str(NOTEBOOKS))
from make_notebooks import NOTEBOOKS as GENERATED  # noqa: E402


def test_committed_notebooks_match_the_generator():
    for name, cells in GENERATED.items():
        nb = nbformat.read(NOTEBOOKS / name, as_version=4)
        assert [c.source for c in nb.cells] == [c.source for c in cells], f"{name}: run notebooks/make_notebooks.py"


@pytest.mark.parametrize("name", sorted(GENERATED))
def test_notebook_calls_the_library_only(name):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            defs = [n for n in ast.walk(ast.parse(cell.source)) if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
            assert not defs, f"{name} defines {[d.name for d in defs]}: move that logic into lens_heads"


@pytest.mark.notebook  # slow (conftest): the source checks above are not
@pytest.mark.parametrize("name", sorted(GENERATED))
def test_notebook_runs_in_a_fresh_kernel(name, tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert errors == []
    last = [c for c in nb.cells if c.cell_type == "code"][-1]
    assert last.outputs, f"{name}: the last cell shows nothing"
