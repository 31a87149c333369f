"""Command-line flags derived from a settings dataclass: defaults, then a preset, then explicit flags."""

from dataclasses import dataclass

import pytest

from lens_heads.plumbing.settings import from_args, option


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 <= value < 1:
        raise ValueError(f"a fraction lies in [0, 1), got {text!r}")
    return value


@dataclass(frozen=True)
class Demo:
    model: str = option("tiny", "model name", positional=True)
    n: int = option(40, "items")
    fractions: tuple[float, ...] = option((0.0, 0.1), "shares")
    target: float = option(0.5, "a fraction", parse=_fraction)
    protocol: str = option("lm-eval", "rows", choices=("lm-eval", "tl"))
    png: bool = option(True, "write PNG")
    note: dict = option(cli=False, default_factory=dict)


PRESETS = {"quick": dict(n=8, fractions=(0.0, 0.3))}


def test_defaults_preset_and_explicit_flags():
    assert from_args(Demo, [], presets=PRESETS) == Demo()
    assert from_args(Demo, ["--quick"], presets=PRESETS) == Demo(n=8, fractions=(0.0, 0.3))
    got = from_args(Demo, ["gpt2", "--quick", "--n", "3", "--no-png", "--fractions", "0,.2,.25"], presets=PRESETS)
    assert got == Demo(model="gpt2", n=3, fractions=(0.0, 0.2, 0.25), png=False)


def test_bad_values_are_one_line_errors(capsys):
    for argv in (["--target", "2"], ["--protocol", "hf"], ["--n", "many"], ["--note", "x"]):
        with pytest.raises(SystemExit):
            from_args(Demo, argv)
    assert "a fraction lies in [0, 1)" in capsys.readouterr().err


@dataclass(frozen=True)
class Paths:
    paths: tuple[str, ...] = option((), "files", positional=True)
    n: int = option(200, "items", aliases=("--items",))

    def __post_init__(self):
        if len(self.paths) == 1:
            raise ValueError("give no path or at least two")


def test_positional_values_aliases_and_refused_combinations(capsys):
    assert from_args(Paths, []) == Paths((), 200)
    assert from_args(Paths, ["a.json", "b.json", "--items", "5"]) == Paths(("a.json", "b.json"), 5)
    assert from_args(Paths, ["--n", "7"]).n == 7
    with pytest.raises(SystemExit) as exit_:
        from_args(Paths, ["a.json"])
    assert exit_.value.code == 2 and "give no path or at least two" in capsys.readouterr().err


@dataclass(frozen=True)
class Negative:
    no_png: bool = option(False, "HTML only")
    png_scale: bool = option(True, "scale")


def test_a_field_named_no_x_is_switched_on_by_its_flag():
    assert from_args(Negative, ["--no-png"]) == Negative(no_png=True)
    assert from_args(Negative, []) == Negative(no_png=False)
    assert from_args(Negative, ["--no-png-scale"]).png_scale is False


def test_hidden_flags_parse_but_stay_out_of_the_help():
    from lens_heads.plumbing.settings import build_parser

    @dataclass(frozen=True)
    class Worker:
        n: int = option(4, "items")
        shard: int | None = option(None, "which half", parse=int, hidden=True)

    assert from_args(Worker, ["--shard", "1"]) == Worker(shard=1)
    text = build_parser(Worker).format_help()
    assert "--n" in text and "--shard" not in text
