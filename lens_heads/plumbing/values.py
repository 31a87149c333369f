"""Settings as values with keywords as the front door: a function takes one frozen dataclass (``settings=``,
``plan=``) and also its fields as keyword arguments, laid over the value (``evaluate(model, task, batch_size=4)`` is
``evaluate(model, task, settings=EvalSettings(batch_size=4))``). One rule for every such value."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, TypeVar

from lens_heads.plumbing.errors import InputError

V = TypeVar("V")
F = TypeVar("F", bound=Callable[..., Any])


def laid_over(cls: type[V], value: V | None, options: dict[str, Any] | None, *, argument: str, what: str,
              take: bool = False) -> V:
    """``value`` (default: ``cls()``) with the keyword ``options`` that name its fields laid over it (checked as a
    new value is). A ``value`` of another type is refused, naming ``argument``. ``take``: those keywords are removed
    from ``options`` and the others left to another value's reader; otherwise an option that is not a field is
    refused by name (``what`` says what the fields are: ``"evaluation settings"``)."""
    if value is not None and not isinstance(value, cls):
        raise InputError(f"{argument} takes a{'n' if cls.__name__[0] in 'AEIOU' else ''} {cls.__name__}, got "
                         f"{value!r}: write {argument}=lens_heads.{cls.__name__}(...), or pass its fields as keywords")
    fields = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    options = {} if options is None else options
    if not take:
        unknown = sorted(set(options) - set(fields))
        if unknown:
            raise InputError(f"unknown setting{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}: the {what} "
                             f"are {', '.join(fields)} (lens_heads.{cls.__name__})")
    mine = {name: (options.pop(name) if take else options[name]) for name in fields if name in options}
    base = value if value is not None else cls()
    return dataclasses.replace(base, **mine) if mine else base  # type: ignore[type-var]


def keywords(*values: type) -> Callable[[F], F]:
    """Name a function's ``**options`` in its signature: the fields of each settings value it lays them over, in
    order, keyword-only, each shown with the value's default (given a ``settings=``/``plan=`` value, an omitted
    keyword keeps that value's field). ``help()``, IDEs and the API reference then list what the call accepts; the
    function itself is unchanged, and ``__value_fields__`` says which parameters are the values' fields."""

    def name_them(fn: F) -> F:
        signature = inspect.signature(fn)
        own = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
        named = {p.name for p in own}
        fields = []
        for cls in values:
            for f in dataclasses.fields(cls):  # type: ignore[arg-type]
                if f.name in named:
                    continue
                named.add(f.name)
                default = f.default if f.default is not dataclasses.MISSING else (
                    f.default_factory() if f.default_factory is not dataclasses.MISSING else inspect.Parameter.empty)
                fields.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=default,
                                                annotation=f.type))
        fn.__signature__ = signature.replace(parameters=own + fields)  # type: ignore[attr-defined]
        fn.__value_fields__ = tuple(p.name for p in fields)  # type: ignore[attr-defined]
        return fn

    return name_them
