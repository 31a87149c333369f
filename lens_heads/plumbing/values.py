"""Settings as values with keywords as the front door: a function takes one frozen dataclass (``settings=``,
``plan=``) and also its fields as keyword arguments, laid over the value (``evaluate(model, task, batch_size=4)`` is
``evaluate(model, task, settings=EvalSettings(batch_size=4))``). One rule for every such value."""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from lens_heads.plumbing.errors import InputError

V = TypeVar("V")


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
