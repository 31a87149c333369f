"""The folders are the layers of the layout (docs/architecture.md): a module imports only from its own folder or a folder below
it, and the app (``lens_heads.report``) is used by nobody but its command line and its tests."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "lens_heads"
# bottom to top, as the layout section of docs/architecture.md draws them
LAYERS = ("plumbing", "stats", "data", "models", "evaluation", "heads", "ablation", "collapse", "training", "experiments",
          "growth", "viz", "harness", "report")


def _imports(source: str) -> list[str]:
    """Every lens_heads module a source imports (``from lens_heads.x import y`` gives ``lens_heads.x`` and, when
    ``y`` is a module, ``lens_heads.x.y``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lens_heads"):
            found += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("lens_heads")]
    return found


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def test_the_layers_are_the_folders():
    folders = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    assert folders == sorted(LAYERS)
    loose = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert loose == [], f"modules outside the layer folders: {loose}"


@pytest.mark.parametrize("path", sorted(PACKAGE.glob("*/*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_only_go_downward(path):
    own = path.parent.name
    for module in _imports(path.read_text()):
        layer = _layer(module)
        if layer is not None:
            assert LAYERS.index(layer) <= LAYERS.index(own), f"{path.relative_to(ROOT)} imports {module} from above"


def test_subpackage_inits_hold_no_code():
    for init in PACKAGE.glob("*/__init__.py"):
        body = ast.parse(init.read_text()).body
        if init.parent.name in ("report", "harness"):
            continue  # the app's package and the lm-eval model's: their entry points
        assert all(isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) for node in body), init


def test_only_the_command_line_and_tests_use_the_app():
    users = [p for p in [*PACKAGE.glob("*/*.py"), *ROOT.glob("analyses/*.py"), *ROOT.glob("benchmarks/*.py"),
                         *ROOT.glob("notebooks/*.py")] if p.parent.name != "report"]
    for path in users:
        assert not [m for m in _imports(path.read_text()) if m.startswith("lens_heads.report")], path
    for notebook in ROOT.glob("notebooks/*.ipynb"):
        code = "\n".join("".join(c["source"]) for c in json.loads(notebook.read_text())["cells"]
                         if c["cell_type"] == "code")
        assert not re.search(r"^\s*(from|import) lens_heads\.report", code, re.M), notebook


def test_every_analysis_is_a_script_that_imports_no_neighbour():
    """``analyses/`` holds scripts only, each run as ``python analyses/NAME.py`` and importing the library: what
    several scripts share lives in ``lens_heads`` (a neighbour imported by bare name needs ``analyses/`` on
    ``sys.path``)."""
    scripts = sorted(ROOT.glob("analyses/*.py"))
    names = {p.stem for p in scripts}
    for path in scripts:
        source = path.read_text()
        assert re.search(r'^if __name__ == "__main__":', source, re.M), f"{path.name} is not a script"
        for node in ast.walk(ast.parse(source)):
            imported = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            assert not [m for m in imported if m.split(".")[0] in names | {"analyses"}], \
                f"{path.name} imports {imported} from analyses/: move what scripts share into lens_heads"
        assert "sys.path" not in source, path.name


def test_the_layout_names_every_module():
    layout = (ROOT / "docs" / "architecture.md").read_text().split("## Layout", 1)[1].split("\n## ", 1)[0]
    for layer in LAYERS:
        line_block = re.search(rf"^  {layer}/(.*?)(?=^  \w+/|^```)", layout, re.M | re.S)
        assert line_block, f"the layout in docs/architecture.md has no {layer}/"
        for module in sorted(p.stem for p in (PACKAGE / layer).glob("*.py") if p.stem != "__init__"):
            assert re.search(rf"\b{module}\b", line_block.group(1)), \
                f"{layer}/{module}.py is not in the layout in docs/architecture.md"


def test_every_lens_heads_import_names_something_that_exists():
    """``from lens_heads import x`` takes a public name or a layer folder; a dotted import names a module there."""
    import importlib.util

    import lens_heads

    sources = [*ROOT.glob("tests/*.py"), *ROOT.glob("analyses/*.py"), *ROOT.glob("benchmarks/*.py"),
               *ROOT.glob("notebooks/*.py"), *PACKAGE.rglob("*.py")]
    for path in sources:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "lens_heads":
                for alias in node.names:
                    assert alias.name in lens_heads.__all__ or alias.name in LAYERS, f"{path}: lens_heads.{alias.name}"
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lens_heads."):
                assert importlib.util.find_spec(node.module) is not None, f"{path}: {node.module}"
