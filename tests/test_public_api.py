"""The public API: every exported name once, grouped names reachable, and every ``lh.X`` / ``lens_heads.x.y`` that
the README, the docs, the notebooks and the library's own messages send a user to resolves."""

import importlib
import re
from pathlib import Path

import pytest

import lens_heads as lh

ROOT = Path(__file__).resolve().parents[1]
DOTTED = re.compile(r"(?<![\w/.])(lh|lens_heads)((?:\.[A-Za-z_]\w*)+)")


def resolve(dotted: str):
    """The object a dotted name names: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


def documented_names() -> dict[str, str]:
    """Every dotted lens_heads name in the docs, notebooks and library sources, with where it was first seen."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "notebooks" / "make_notebooks.py",
             *sorted((ROOT / "lens_heads").rglob("*.py"))]
    names: dict[str, str] = {}
    for path in files:
        for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for prefix, rest in DOTTED.findall(line):
                rest = rest.rstrip(".")
                if rest.split(".")[-1] in {"py", "md", "json", "csv", "html", "png"}:  # a file name, not a name
                    continue
                names.setdefault("lens_heads" + rest, f"{path.relative_to(ROOT)}:{line_no}")
    return names


def test_every_exported_name_is_listed_once_and_resolves():
    assert len(lh.__all__) == len(set(lh.__all__)), sorted(n for n in lh.__all__ if lh.__all__.count(n) > 1)
    for name in lh.__all__:
        assert getattr(lh, name) is not None, name


def test_every_name_the_docs_and_messages_use_resolves():
    names = documented_names()
    assert len(names) > 50  # the scan reads what it should
    missing = {}
    for name, where in names.items():
        try:
            resolve(name)
        except (AttributeError, ModuleNotFoundError) as e:
            missing[name] = f"{where}: {e}"
    assert not missing, missing


def test_the_collapse_side_is_grouped_in_namespaces_and_old_names_say_where_they_went():
    assert lh.inheritune.run_inheritune.__module__ == "lens_heads.growth.inheritune_run"
    assert lh.training.train.__module__ == "lens_heads.training.loop"
    assert lh.training.TrainConfig.__module__ == "lens_heads.training.config"
    assert callable(lh.gpt2.gpt2_model) and callable(lh.corpus.load_corpus)
    with pytest.raises(AttributeError, match=r"use lens_heads.inheritune.run_inheritune"):
        lh.run_inheritune  # noqa: B018
    with pytest.raises(AttributeError, match=r"use lens_heads.training.TrainConfig"):
        lh.TrainConfig  # noqa: B018
    with pytest.raises(AttributeError, match=r"train was renamed: the namespace is lens_heads.training; the loop is "
                                             r"lens_heads.training.train"):
        lh.train  # noqa: B018
    with pytest.raises(AttributeError, match="has no attribute 'nonsense'"):
        lh.nonsense  # noqa: B018
    collapse_side = {"run_inheritune", "InherituneConfig", "TrainConfig", "gpt2_model", "load_corpus", "stack", "grow"}
    assert not collapse_side & set(lh.__all__)
