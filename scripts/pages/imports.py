"""The folders of ``lens_heads/`` as layers and the imports between them, read from the code: the layout diagram
of docs/architecture.md is drawn from this, so it cannot drift from the imports."""

from __future__ import annotations

import ast
from pathlib import Path


def _imported(source: str) -> set[str]:
    """The lens_heads modules a source imports (``from lens_heads.x import y`` gives ``lens_heads.x``)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lens_heads"):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("lens_heads")}
    return found


def folders(package: Path) -> list[str]:
    """The subpackages of ``package`` (the layers), by name."""
    return sorted(p.name for p in package.iterdir() if p.is_dir() and (p / "__init__.py").exists())


def modules(package: Path) -> dict[str, list[str]]:
    """Each folder's modules (file stems, ``__init__`` left out), sorted."""
    return {f: sorted(p.stem for p in (package / f).glob("*.py") if p.stem != "__init__") for f in folders(package)}


def folder_imports(package: Path) -> dict[str, set[str]]:
    """Each folder -> the other folders its modules import."""
    layers = set(folders(package))
    graph: dict[str, set[str]] = {f: set() for f in layers}
    for folder in layers:
        for path in (package / folder).glob("*.py"):
            for module in _imported(path.read_text(encoding="utf-8")):
                parts = module.split(".")
                if len(parts) > 1 and parts[1] in layers and parts[1] != folder:
                    graph[folder].add(parts[1])
    return graph


def layer_order(graph: dict[str, set[str]]) -> list[str]:
    """The folders bottom to top: each after every folder it imports (ties by name); a cycle is refused."""
    order: list[str] = []
    left = dict(graph)
    while left:
        ready = sorted(f for f, deps in left.items() if deps <= set(order))
        if not ready:
            raise ValueError(f"the folders {sorted(left)} import each other in a cycle: no layer order exists")
        order += ready
        for f in ready:
            del left[f]
    return order


def _reaches(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every folder ``start`` imports directly or through others."""
    seen: set[str] = set()
    todo = list(graph[start])
    while todo:
        f = todo.pop()
        if f not in seen:
            seen.add(f)
            todo += graph[f]
    return seen


def reduced(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The imports no longer path implies (the transitive reduction): an import of C by A is left out where A also
    imports a B that reaches C. Drawn, these are the arrows a reader needs; every folder still reaches what it
    imports."""
    return {f: {d for d in deps if not any(d in _reaches(graph, b) for b in deps - {d})} for f, deps in graph.items()}


def mermaid(graph: dict[str, set[str]]) -> str:
    """A Mermaid flowchart of the folders, bottom layer at the bottom, an arrow from each folder to each folder it
    imports that no longer path through the arrows implies (:func:`reduced`)."""
    order = layer_order(graph)
    arrows = reduced(graph)
    lines = ["flowchart BT"]
    lines += [f"    {f}[{f}/]" for f in order]
    lines += [f"    {f} --> {dep}" for f in reversed(order) for dep in sorted(arrows[f], key=order.index)]
    return "\n".join(lines)
