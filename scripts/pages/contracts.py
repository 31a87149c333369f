"""Measures of how readable the package's contracts are, read from a source tree (docs/architecture.md renders them
for the tree as it is and beside the record of the tree before the contracts issue):

- the lens_heads modules an entry module reaches by import (from ``lh.evaluate``'s module and ``lh.run_sweep``'s);
- the most parameters a function of the evaluator's modules takes (``evaluate`` to the forward and its fused
  attention, but the public front doors ``evaluate`` and ``evaluate_each``, and the attention forward the fused one
  stands in for, whose parameters are TransformerLens's);
- the largest function of the package, in lines;
- the hasattr/getattr calls that ask an object for an ablation's member by name (outside the interface's door);
- the public functions whose ``**options`` their signature does not name.

    python scripts/pages/contracts.py ROOT COMMIT > docs/records/contracts_before.json  # ROOT: a checkout of COMMIT
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

# each entry's module, where it is now first (before the sweep had its folder, run_sweep was experiments/sweep_run)
ENTRIES = {"evaluate": ("lens_heads.evaluation.evaluate",),
           "run_sweep": ("lens_heads.sweep.run", "lens_heads.experiments.sweep_run")}
# the modules lh.evaluate passes through to the forward and back: rows, hook sets, passes, shared prefixes, the
# fused blocks and attention, log-likelihoods
EVALUATOR = ("evaluation/evaluate.py", "evaluation/passes.py", "evaluation/hook_sets.py", "evaluation/prefix.py",
             "evaluation/fast_blocks.py", "evaluation/fused_attention.py", "evaluation/logprobs.py", "data/rows.py")
MEMBERS = ("hooks", "batch", "copies", "units", "reads_rows", "zeroed_by_input", "share_zeroed", "snapshot",
           "restore", "per_input", "counts_inputs")  # what an ablation object could be asked for by name
DOOR = "evaluation/ablation_interface.py"  # the one place that reads objects of other classes
FRONT_DOORS = ("evaluate", "evaluate_each")  # public: their keywords are the API (test_api_shape bounds them)
# stands in for TransformerLens's attention forward, so it takes that forward's parameters
TL_SIGNATURES = ("evaluation/fused_attention:_forward",)


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lens_heads."):
            found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("lens_heads.")}
    return found


def reached(package: Path, entry: str) -> list[str]:
    """The lens_heads modules ``entry`` reaches by import, itself included (package ``__init__`` files left out)."""
    def file_of(module: str) -> Path | None:
        path = package.parent / (module.replace(".", "/") + ".py")
        return path if path.exists() else None

    seen, todo = set(), [entry]
    while todo:
        module = todo.pop()
        path = file_of(module)
        if module in seen or path is None:
            continue
        seen.add(module)
        todo += sorted(_imports(path))
    return sorted(seen)


def _functions(tree: ast.Module):
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _n_parameters(fn) -> int:
    a = fn.args
    named = [*a.posonlyargs, *a.args, *a.kwonlyargs]
    return len([p for p in named if p.arg not in ("self", "cls")])


def widest_on_path(package: Path) -> tuple[str, int]:
    """The function of the evaluator's modules (but the public front doors) with the most parameters:
    ``(module:name, count)``."""
    found = [(f"{rel[:-3]}:{fn.name}", _n_parameters(fn)) for rel in EVALUATOR if (package / rel).exists()
             for fn in _functions(_tree(package / rel))
             if fn.name not in FRONT_DOORS and f"{rel[:-3]}:{fn.name}" not in TL_SIGNATURES]
    return max(found, key=lambda x: (x[1], x[0]))


def largest_function(package: Path) -> tuple[str, int]:
    """The package's longest function, ``(folder/module:name, lines)``."""
    found = [(f"{path.relative_to(package).with_suffix('')}:{fn.name}", fn.end_lineno - fn.lineno + 1)
             for path in sorted(package.rglob("*.py")) for fn in _functions(_tree(path))]
    return max(found, key=lambda x: (x[1], x[0]))


def ablation_probes(package: Path) -> list[str]:
    """Every hasattr/getattr that asks for an ablation's member by name, outside the interface's door."""
    found = []
    for path in sorted(package.rglob("*.py")):
        if path.relative_to(package).as_posix() == DOOR:
            continue
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                    node.func.id in ("hasattr", "getattr") and len(node.args) >= 2 and \
                    isinstance(node.args[1], ast.Constant) and node.args[1].value in MEMBERS:
                found.append(f"{path.relative_to(package).as_posix()}:{node.lineno}")
    return found


def hidden_options(package: Path) -> list[str]:
    """The public module-level functions that take ``**options`` and do not name them in a generated signature
    (``lens_heads.plumbing.values.keywords``)."""
    found = []
    for path in sorted(package.glob("*/*.py")):
        for fn in _tree(path).body:
            if isinstance(fn, ast.FunctionDef) and not fn.name.startswith("_") and fn.args.kwarg is not None \
                    and fn.args.kwarg.arg == "options" and not any(
                        isinstance(d, ast.Call) and getattr(d.func, "id", None) == "keywords"
                        for d in fn.decorator_list):
                found.append(f"{path.relative_to(package).with_suffix('').as_posix()}:{fn.name}")
    return found


def measure(root: Path) -> dict:
    """Every measure of the checkout at ``root``."""
    package = Path(root) / "lens_heads"
    probes = ablation_probes(package)
    def entry(modules: tuple[str, ...]) -> str:
        return next(m for m in modules if (package.parent / (m.replace(".", "/") + ".py")).exists())

    return dict(modules_reached={name: len(reached(package, entry(modules))) for name, modules in ENTRIES.items()},
                evaluator_modules=[rel[:-3] for rel in EVALUATOR if (package / rel).exists()],
                widest_on_path=list(widest_on_path(package)), largest_function=list(largest_function(package)),
                ablation_probes=len(probes), probe_files=len({p.split(":")[0] for p in probes}),
                hidden_options=len(hidden_options(package)))


if __name__ == "__main__":
    print(json.dumps(dict(commit=sys.argv[2], **measure(Path(sys.argv[1]))), indent=1))
