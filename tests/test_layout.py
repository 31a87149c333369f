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
LAYERS = ("plumbing", "stats", "data", "models", "evaluation", "heads", "ablation", "collapse", "training", "sweep", "experiments",
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
        if init.parent.name == "training":  # the namespace lh.training: its imports and __all__, nothing else
            assert all(isinstance(node, ast.ImportFrom) or _is_docstring_or_all(node) for node in body), init
            continue
        assert all(isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) for node in body), init


def _is_docstring_or_all(node: ast.stmt) -> bool:
    return (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)) or (
        isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["__all__"])


def test_the_training_namespace_shadows_none_of_its_modules():
    """A name of ``lh.training`` that is also a module of the folder would hide the module from attribute access
    (``lens_heads.training.NAME`` would be the name, not the module)."""
    import lens_heads.training

    modules = {p.stem for p in (PACKAGE / "training").glob("*.py")}
    assert not modules & set(lens_heads.training.__all__)
    assert all(vars(lens_heads.training)[name].__name__ == f"lens_heads.training.{name}"
               for name in modules - {"__init__"} if name in vars(lens_heads.training))


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


def _package_sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _relative_imports(source: str) -> list[int]:
    """The lines of ``source`` that import relatively (``from . import x``, ``from .items import Item``)."""
    return [node.lineno for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ImportFrom) and node.level]


def test_no_relative_imports():
    """Every import names its module in full (``from lens_heads.data.items import Item``), so the checks above see
    it: a relative import would slip past them."""
    assert _relative_imports("import os\nfrom . import x\nfrom ..data.items import Item\n") == [2, 3]
    relative = [f"{path.relative_to(ROOT)}:{line}" for path in _package_sources()
                for line in _relative_imports(path.read_text())]
    assert not relative, f"write these imports in full (from lens_heads.<layer>.<module> import ...): {relative}"


def test_no_module_imports_the_top_level_package():
    """Inside the package a module imports from the module that defines a name, never through ``lens_heads``
    itself (whose names come from every layer, so the import would hide which layer it reaches)."""
    through_top = [f"{path.relative_to(ROOT)}:{node.lineno}" for path in PACKAGE.glob("*/*.py")
                   for node in ast.walk(ast.parse(path.read_text()))
                   if isinstance(node, ast.ImportFrom) and node.module == "lens_heads"
                   or isinstance(node, ast.Import) and any(a.name == "lens_heads" for a in node.names)]
    assert not through_top, f"import these from their own module: {through_top}"


MODULE_PATH = re.compile(r"^lens_heads(\.\w+)+(:\w+)?$")


@pytest.mark.parametrize("path", sorted(PACKAGE.glob("*/*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_string_names_a_module_above(path):
    """A string that is a module's path (``"lens_heads.harness.tasks:lm_eval_task"``, for importlib) is an import
    the checks above do not see: it must go downward too (a layer above registers itself instead)."""
    own = path.parent.name
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and MODULE_PATH.match(node.value):
            layer = _layer(node.value.split(":")[0])
            if layer is not None:
                assert LAYERS.index(layer) <= LAYERS.index(own), \
                    f"{path.relative_to(ROOT)} names {node.value} from above"


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` (a list of nodes, the first repeated at the end), or None."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return path[path.index(node):] + [node]
        if node in done:
            return None
        for nxt in sorted(graph.get(node, ())):
            found = visit(nxt, path + [node])
            if found:
                return found
        done.add(node)
        return None

    for start in sorted(graph):
        found = visit(start, [])
        if found:
            return found
    return None


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


@pytest.mark.parametrize("layer", LAYERS)
def test_no_import_cycle_inside_a_folder(layer):
    """The modules of one folder import each other in one direction, type hints included (a reader follows those
    too): no circle, however it is tied."""
    modules = {p.stem: p for p in (PACKAGE / layer).glob("*.py") if p.stem != "__init__"}
    graph = {name: {m.split(".")[2] for m in _imports(path.read_text())
                    if m.count(".") >= 2 and m.split(".")[1] == layer and m.split(".")[2] in modules} - {name}
             for name, path in modules.items()}
    assert _cycle(graph) is None, f"{layer}/: {' -> '.join(_cycle(graph) or [])}"
