"""Command-line settings: one dataclass describes a command; its flags, defaults, help and presets derive from it.

As in nanoGPT's ``train.py``, a run is its settings plus overrides: a named preset (``--quick``) overrides the
defaults, and flags given on the command line override both. Each field of the dataclass becomes ``--field-name``
(``positional=True`` makes it an optional positional argument, or, for a tuple field, any number of them;
``aliases`` adds other spellings of the flag); a tuple field reads a comma-separated list; a bool field gets
``--name/--no-name`` (one named ``no_x`` only ``--no-x``). A ``__post_init__`` that refuses a combination of values
with a ``ValueError`` gives argparse's usage error. Field metadata, set with :func:`option`, holds the help text, the
parser of the text (which raises ``ValueError`` or ``argparse.ArgumentTypeError`` with a message saying what to
pass), choices and the metavar; ``hidden=True`` keeps a flag out of ``--help`` (one a script passes to its own
worker processes). Used by the report, the analyses and the benchmarks.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Callable, Mapping, Sequence

from lens_heads.plumbing.errors import InputError


def option(default: Any = dataclasses.MISSING, help: str = "", *, parse: Callable[[str], Any] | None = None,
           choices: Sequence[str] | None = None, metavar: str | None = None, positional: bool = False,
           cli: bool = True, default_factory: Any = dataclasses.MISSING, aliases: Sequence[str] = (), hidden: bool = False) -> Any:
    """A dataclass field with what its command-line flag needs (``cli=False``: settable from Python only)."""
    meta = dict(help=help, parse=parse, choices=choices, metavar=metavar, positional=positional, cli=cli,
                aliases=tuple(aliases), hidden=hidden)
    return dataclasses.field(default=default, default_factory=default_factory, metadata=meta)


def default_of(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def _parser_for(default: Any, parse: Callable | None) -> Callable[[str], Any]:
    if parse is not None:
        return parse
    if isinstance(default, tuple):
        item = type(default[0]) if default else str
        return lambda text: tuple(item(t.strip()) for t in text.split(",") if t.strip())
    if default is None or isinstance(default, str):
        return str
    return type(default)


def _checked(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """Turn a ValueError of ``parse`` into argparse's one-line usage error."""
    def run(text: str):
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    run.__name__ = getattr(parse, "__name__", "value")
    return run


def build_parser(cls, *, presets: Mapping[str, Mapping[str, Any]] | None = None,
                 parser: argparse.ArgumentParser | None = None, **parser_kwargs) -> argparse.ArgumentParser:
    """The argparse parser of the settings dataclass ``cls`` (flags left unset are absent from the namespace)."""
    p = parser or argparse.ArgumentParser(argument_default=argparse.SUPPRESS, **parser_kwargs)
    p.argument_default = argparse.SUPPRESS
    for name, overrides in (presets or {}).items():  # ``--quick`` selects the preset named "quick"
        p.add_argument("--" + name.replace("_", "-"), dest="preset", action="store_const", const=name,
                       help=f"preset: {_describe(overrides)} (flags given explicitly still win)")
    for f in dataclasses.fields(cls):
        meta = f.metadata
        if not meta.get("cli", True) or not f.init:
            continue
        default = default_of(f)
        help_text = f"{meta.get('help', '')} (default: {_show(default)})".strip()
        kwargs: dict[str, Any] = dict(help=argparse.SUPPRESS if meta.get("hidden") else help_text.replace("%", "%%"),
                                      default=argparse.SUPPRESS)
        if meta.get("choices"):
            kwargs["choices"] = list(meta["choices"])
        if meta.get("metavar"):
            kwargs["metavar"] = meta["metavar"]
        if meta.get("positional") and isinstance(default, tuple):  # several values, one per argument
            item = meta.get("parse") or (type(default[0]) if default else str)
            p.add_argument(f.name, nargs="*", type=_checked(item), **kwargs)
        elif meta.get("positional"):
            p.add_argument(f.name, nargs="?", type=_checked(_parser_for(default, meta.get("parse"))), **kwargs)
        elif isinstance(default, bool) and f.name.startswith("no_"):  # argparse reads --no-x as "x off"
            p.add_argument("--" + f.name.replace("_", "-"), action="store_const", const=not default, **kwargs)
        elif isinstance(default, bool):
            p.add_argument("--" + f.name.replace("_", "-"), action=argparse.BooleanOptionalAction, **kwargs)
        else:
            p.add_argument("--" + f.name.replace("_", "-"), *meta.get("aliases", ()), dest=f.name,
                           type=_checked(_parser_for(default, meta.get("parse"))), **kwargs)
    return p


def from_args(cls, argv: Sequence[str] | None = None, *, presets: Mapping[str, Mapping[str, Any]] | None = None,
              parser: argparse.ArgumentParser | None = None, **parser_kwargs):
    """Settings from the command line: the dataclass's defaults, then the preset, then the flags given."""
    parser = build_parser(cls, presets=presets, parser=parser, **parser_kwargs)
    args: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in vars(parser.parse_args(argv)).items()}
    preset = dict((presets or {}).get(args.pop("preset", None), {}))
    try:
        return cls(**{**preset, **args})
    except ValueError as error:  # a combination the settings refuse (their __post_init__)
        parser.error(str(error))


def checked_fields(settings) -> dict[str, Any]:
    """The values of ``settings`` (a settings dataclass built in Python, not from the command line) as its flags
    would read them: each field with a parser or choices is checked the way its flag is, so a bad value gets the
    flag's message, prefixed with the field's name. Returns the parsed values (a list becomes a tuple, a parser's
    normalisation applies); raises ``ValueError``."""
    out = {}
    for f in dataclasses.fields(settings):
        value, meta = getattr(settings, f.name), f.metadata
        if isinstance(value, list):
            value = tuple(value)
        default = default_of(f)
        try:
            if meta.get("choices") and value not in meta["choices"] and not (value is None and default is None):
                raise InputError(f"choose one of {', '.join(map(str, meta['choices']))}, got {value!r}")
            if meta.get("parse") and value not in (None, ()) and value != default:
                text = ",".join(map(str, value)) if isinstance(value, tuple) else value
                if isinstance(text, bool) or not isinstance(text, (str, int, float)):
                    raise InputError(f"expected {type(default).__name__}, got {value!r}")
                value = meta["parse"](str(text))
            elif isinstance(default, bool) and not isinstance(value, bool):
                raise InputError(f"expected True or False, got {value!r}")
            elif type(default) in (int, float) and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise InputError(f"expected a number, got {value!r}")
        except (ValueError, argparse.ArgumentTypeError) as e:
            raise InputError(f"{type(settings).__name__}({f.name}=...): {e}") from None
        out[f.name] = value
    return out


def _show(value: Any) -> str:
    if isinstance(value, tuple):
        return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value) or "none"
    return str(value)


def _describe(overrides: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={_show(v)}" for k, v in overrides.items())
