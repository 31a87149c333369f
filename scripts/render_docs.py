"""Render README.md and docs/*.md from the templates in docs/src/, every recorded number read from its file.

    python scripts/render_docs.py          # write the pages
    python scripts/render_docs.py --check  # exit 1 with a diff where a committed page differs from its rendering

A template is Markdown with Jinja2 placeholders. Numbers come from the recorded files themselves (``figures/*.json``,
``figures/*.csv``, ``docs/records/*``) through the few helpers below, and every claim of a difference takes its
verdict and its words from the one calling rule (``lens_heads.stats.calling``), so a rerun that changes a record
changes the page, and a number edited by hand in a page fails ``--check`` (``tests/test_docs.py``).
"""

from __future__ import annotations

import argparse
import difflib
import functools
import gzip
import json
import math
import os
import re
import sys
from pathlib import Path
from typing import Any

import jinja2
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
SOURCES = "docs/src"
# page -> its template in docs/src
PAGES = {
    "README.md": "README.md.j2",
}


def _number(value: Any) -> float:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return math.nan
    return float(value)


def num(value: Any, spec: str = ".2f") -> str:
    """One number; "–" where there is none (NaN, None)."""
    x = _number(value)
    return "–" if math.isnan(x) else f"{x:{spec}}"


def iv(value: Any, low: Any, high: Any, spec: str = ".2f") -> str:
    """A number with its interval: ``x [lo, hi]``."""
    return f"{num(value, spec)} [{num(low, spec)}, {num(high, spec)}]"


def pct(share: Any, spec: str = ".1f") -> str:
    """A share in [0, 1] as a percentage."""
    return f"{num(100 * _number(share), spec)}%"


def pct_iv(share: Any, low: Any, high: Any, spec: str = ".1f") -> str:
    """A share with its interval, in percent: ``52.0% [45.1, 58.8]``."""
    return f"{pct(share, spec)} [{num(100 * _number(low), spec)}, {num(100 * _number(high), spec)}]"


class Records:
    """The recorded files under one root, read once each."""

    def __init__(self, root: Path):
        self.root = root

    def path(self, name: str) -> Path:
        path = self.root / name
        if not path.exists():
            raise FileNotFoundError(f"a template reads {name}, which does not exist under {self.root}")
        return path

    @functools.lru_cache(maxsize=None)
    def record(self, name: str) -> Any:
        """A JSON record (``.json`` or ``.json.gz``)."""
        path = self.path(name)
        opener = gzip.open if name.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as f:
            return json.load(f)

    @functools.lru_cache(maxsize=None)
    def table(self, name: str) -> list[dict]:
        """A CSV record, one dict a row."""
        return pd.read_csv(self.path(name), keep_default_na=False, na_values=[""]).to_dict("records")

    def rows(self, name: str, **where: Any) -> list[dict]:
        """The rows of a CSV record whose columns equal ``where``."""
        return [r for r in self.table(name) if all(str(r.get(k)) == str(v) for k, v in where.items())]

    def row(self, name: str, **where: Any) -> dict:
        """The one row of a CSV record whose columns equal ``where``."""
        found = self.rows(name, **where)
        if len(found) != 1:
            raise LookupError(f"{name}: {len(found)} rows match {where}, expected one")
        return found[0]

    @functools.lru_cache(maxsize=None)
    def _log_sections(self, name: str) -> dict[str, str]:
        text = self.path(name).read_text(encoding="utf-8")
        parts = re.split(r"^## (.+)$", text, flags=re.M)
        return {heading.strip(): body for heading, body in zip(parts[1::2], parts[2::2])}

    def printed(self, name: str, section: str, pattern: str, group: int = 1) -> str:
        """What a benchmark printed: ``pattern``'s group in the ``## section`` of a Markdown log of runs."""
        sections = self._log_sections(name)
        if section not in sections:
            raise LookupError(f"{name} has no section {section!r}")
        found = re.search(pattern, sections[section])
        if not found:
            raise LookupError(f"{name}, section {section!r}: nothing matches {pattern!r}")
        return found.group(group)


def environment(root: Path = ROOT) -> jinja2.Environment:
    records = Records(root)
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(root / SOURCES), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True, autoescape=False)
    env.globals.update(record=records.record, table=records.table, rows=records.rows, row=records.row,
                       printed=records.printed, num=num, iv=iv, pct=pct, pct_iv=pct_iv)
    return env


def render(root: Path = ROOT) -> dict[str, str]:
    """Every page's rendering, by its path under the root."""
    env = environment(root)
    return {page: env.get_template(template).render() for page, template in PAGES.items()}


def differences(rendered: dict[str, str], committed_root: Path = ROOT) -> list[str]:
    """A unified diff per committed page that differs from its rendering (a missing page counts as empty)."""
    out = []
    for page, text in rendered.items():
        path = committed_root / page
        committed = path.read_text(encoding="utf-8") if path.exists() else ""
        if committed != text:
            out.append("".join(difflib.unified_diff(committed.splitlines(True), text.splitlines(True),
                                                    f"{page} (committed)", f"{page} (rendered)")))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python scripts/render_docs.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 with a diff where a committed page differs from its rendering")
    args = p.parse_args(argv)
    os.chdir(ROOT)
    rendered = render(ROOT)
    if args.check:
        diffs = differences(rendered)
        for diff in diffs:
            sys.stdout.write(diff)
        if diffs:
            print(f"\n{len(diffs)} page(s) differ from their rendering: edit docs/src/, not the page, and run "
                  "python scripts/render_docs.py", file=sys.stderr)
        return 1 if diffs else 0
    for page, text in rendered.items():
        (ROOT / page).write_text(text, encoding="utf-8")
    print(f"rendered {len(rendered)} page(s): {', '.join(rendered)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
