"""The public API's shape: every namespace says what it exports, and no public function takes more than eight named
parameters besides its settings value (``settings``, a sweep's ``plan``) and ``progress``; longer lists become a
frozen value whose fields stay keywords (:mod:`lens_heads.plumbing.values`)."""

import inspect
import types

import pytest

import lens_heads as lh

MAX_PARAMETERS = 8
VALUES = ("settings", "plan", "progress")  # the settings values a function takes whole, and its progress bar


def namespaces() -> dict[str, types.ModuleType]:
    """``lh`` and the namespaces it exports (``lh.train``, ``lh.corpus``, ...)."""
    found = {"lh": lh}
    found.update({f"lh.{name}": getattr(lh, name) for name in lh.__all__
                  if isinstance(getattr(lh, name), types.ModuleType)})
    return found


def public_callables():
    for label, module in namespaces().items():
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isfunction(obj) or (inspect.isbuiltin(obj) and callable(obj)):
                yield f"{label}.{name}", obj


def named_parameters(function) -> list[str]:
    """The parameters a caller names (not ``*args``/``**options``, not the settings values)."""
    return [p.name for p in inspect.signature(function).parameters.values()
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name not in VALUES]


@pytest.mark.parametrize("label", sorted(namespaces()))
def test_every_namespace_lists_its_exports_and_only_its_own(label):
    module = namespaces()[label]
    assert hasattr(module, "__all__"), f"{label} has no __all__: list the names it exports"
    missing = [name for name in module.__all__ if not hasattr(module, name)]
    assert not missing, f"{label}.__all__ names {missing}, which it lacks"
    objects = {name: getattr(module, name) for name in module.__all__}
    foreign = [name for name, obj in objects.items() if (inspect.isclass(obj) or inspect.isfunction(obj)) and
               not obj.__module__.startswith("lens_heads")]  # e.g. dataclasses.dataclass, imported to be used
    assert not foreign, f"{label} exports {foreign}, which belong to other libraries"


def test_no_public_function_takes_more_than_eight_named_parameters():
    long = {label: len(named_parameters(f)) for label, f in public_callables()
            if len(named_parameters(f)) > MAX_PARAMETERS}
    assert not long, f"give these a settings value (lens_heads.plumbing.values): {long}"


def test_the_rule_counts_what_a_caller_names():
    def wide(a, b, c, d, e, f, g, h, i, *args, settings=None, progress=True, **options):
        pass

    def narrow(a, b, c, d, e, f, g, h, *, plan=None, settings=None, progress=True, **options):
        pass

    assert len(named_parameters(wide)) == 9 and len(named_parameters(narrow)) == 8
    assert len(named_parameters(lh.run_sweep)) <= MAX_PARAMETERS
    assert "plan" in inspect.signature(lh.run_sweep).parameters
