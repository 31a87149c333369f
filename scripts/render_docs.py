"""Render README.md, docs/*.md and figures/README.md from the templates in docs/src/, every recorded number read
from its file.

    python scripts/render_docs.py          # write the pages
    python scripts/render_docs.py --check  # exit 1 with a diff where a committed page differs from its rendering

A template is Markdown with Jinja2 placeholders. Numbers come from the recorded files themselves (``figures/*.json``,
``figures/*.csv``, ``docs/records/*``) through the few helpers below, and every claim of a difference takes its
verdict and its words from the one calling rule (``lens_heads.stats.calling``), so a rerun that changes a record
changes the page, and a number edited by hand in a page fails ``--check`` (``tests/test_docs.py``).

A setting of the code (a preset, a default, a pin) is read from the code the same way, never typed: ``code`` gives the
object at ``"module:attribute"`` (call a dataclass for its defaults: ``code('lens_heads.training.config:
TrainConfig')().grad_clip``; an analysis script as ``"analyses/inheritune.py:PRESETS"``), ``code_text`` a value
written in a file Python does not import (``code_text('scripts/setup.sh', '"torch==([^"]+)"')``), ``default`` a
parameter's default (``default('lens_heads.collapse.rank_settings:RankSettings', 'energy')``).
"""

from __future__ import annotations

import argparse
import difflib
import functools
import gzip
import importlib
import importlib.util
import inspect
import json
import math
import os
import re
import statistics
import sys
from pathlib import Path
from typing import Any

import jinja2
import pandas as pd

from lens_heads.evaluation.evaluate import ACC_NORM
from lens_heads.heads.scores import SCORE_NAMES
from lens_heads.report import glossary
from lens_heads.stats import calling

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the helpers in scripts/pages, loaded as a test loads this
from pages import (  # noqa: E402, F401  (terms: the docs tests read it here)
    claims,
    contracts,
    imports,
    measures,
    terms,
    wrap,
)

ROOT = Path(__file__).resolve().parents[1]
SOURCES = "docs/src"
# page -> its template in docs/src
PAGES = {
    "README.md": "README.md.j2",
    "docs/protocol.md": "protocol.md.j2",
    "docs/results.md": "results.md.j2",
    "docs/heads.md": "heads.md.j2",
    "docs/layers.md": "layers.md.j2",
    "docs/smaller.md": "smaller.md.j2",
    "docs/inheritune.md": "inheritune.md.j2",
    "docs/gsm8k.md": "gsm8k.md.j2",
    "docs/report.md": "report.md.j2",
    "docs/performance.md": "performance.md.j2",
    "docs/gpu.md": "gpu.md.j2",
    "docs/architecture.md": "architecture.md.j2",
    "docs/faults.md": "faults.md.j2",
    "figures/README.md": "figures_README.md.j2",
    "docs/glossary.md": "glossary.md.j2",
    "docs/usage.md": "usage.md.j2",
}
# pages whose prose is wrapped at the code's line length after rendering (the others keep their template's lines)
WRAPPED = {"README.md", "docs/glossary.md", "docs/usage.md", "docs/results.md"}


def _number(value: Any) -> float:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return math.nan
    return float(value)


def num(value: Any, spec: str = ".2f") -> str:
    """One number; "–" where there is none (NaN, None)."""
    x = _number(value)
    return "–" if math.isnan(x) else f"{x:{spec}}"


def iv(value: Any, low: Any, high: Any, spec: str = ".2f", unit: str = "") -> str:
    """A number with its interval: ``x [lo, hi]`` (``unit`` after the number: ``25.0% [0.0, 28.3]``)."""
    return f"{num(value, spec)}{unit} [{num(low, spec)}, {num(high, spec)}]"


def ivc(row: dict, column: str, spec: str = ".2f", unit: str = "") -> str:
    """A table row's ``column`` with its interval (the columns ``<column>_low`` and ``<column>_high``)."""
    return iv(row[column], row[f"{column}_low"], row[f"{column}_high"], spec, unit)


def pct(share: Any, spec: str = ".1f") -> str:
    """A share in [0, 1] as a percentage."""
    return f"{num(100 * _number(share), spec)}%"


def _is_cost(row: dict) -> bool:
    """A KL and a validation loss are costs (lower is better); accuracy, gold log-prob and shares zeroable are better
    higher. A record that states its direction (a ``higher_is_better`` column of True or False: a loss, steps to a
    loss) is taken at it."""
    stated = row.get("higher_is_better")
    if isinstance(stated, bool):
        return not stated
    return str(row.get("summary", row.get("metric", ""))).startswith(("kl", "val_loss"))


def _p_for_rule(row: dict) -> float:
    """The p-value the rule reads from a recorded comparison: its adjusted p where its table was adjusted, else its
    own."""
    adjusted = _number(row.get("p_adjusted"))
    return _number(row["p_value"]) if math.isnan(adjusted) else adjusted


def _rule_call(row: dict) -> str:
    """The calling rule on a recorded comparison, from its own interval and p-value (``calling.call``)."""
    return calling.call(_number(row["low"]), _number(row["high"]), _p_for_rule(row))


def _verdict_is_stale(row: dict) -> bool:
    """A recorded verdict the rule no longer gives: an uncalled verdict on either side that the other does not say (a
    called one is worded by its sides, so only its being called is compared)."""
    rule, written = _rule_call(row), str(row["verdict"])
    return (written in calling.UNCALLED or rule in calling.UNCALLED) and written != rule


def recorded(record: dict) -> str:
    """When and at which commit a record was made, and how far behind HEAD that commit is now, as far as it says
    (records older than ``provenance`` do not)."""
    made = record.get("provenance")
    if not made:
        return "recorded before records stated their commit"
    behind = measures.commits_behind(made["commit"], (), ROOT)
    distance = "a distance from HEAD this clone cannot count" if behind is None else f"{behind} commits behind HEAD"
    return (f"recorded {made['recorded_at'][:10]} at commit {made['commit'][:7]}, "
            f"{measures.moves_with_head(distance + ' when this page was rendered')}")


def glossary_link(name: str, where: str = "glossary.md", text: str | None = None) -> str:
    """A link to the glossary's entry for ``name`` (``where``: the glossary's path from the page), shown as ``text``
    (default: the term's name)."""
    return f"[{text or name}]({where}#{glossary.term(name).anchor})"


def upper_first(text: str) -> str:
    """A sentence's first letter in capitals (the calling rule's sentences start in lower case)."""
    return text[:1].upper() + text[1:]


def pct_iv(share: Any, low: Any, high: Any, spec: str = ".1f") -> str:
    """A share with its interval, in percent: ``52.0% [45.1, 58.8]``."""
    return f"{pct(share, spec)} [{num(100 * _number(low), spec)}, {num(100 * _number(high), spec)}]"


class Records:
    """The recorded files under one root, read once each; a file missing there is read under ``fallback`` (a root
    holding a copy of some folders only, as the tests make, reads the others from the checkout)."""

    def __init__(self, root: Path, fallback: Path | None = None):
        self.root = root
        self.fallback = fallback

    def undated(self, folder: str = "figures") -> list[str]:
        """The JSON records in ``folder`` that carry no ``provenance`` block (made before records stated their
        date and commit)."""
        return sorted(p.name for p in (self.root / folder).glob("*.json")
                      if "provenance" not in self.record(f"{folder}/{p.name}"))

    def earlier_acc_norm(self, folder: str = "figures") -> list[dict]:
        """The unit files in ``folder`` with units whose ``acc_norm`` meta is not lm-eval's definition (units made
        before ``n_chars`` left out the continuation's leading space): name, such units and all units."""
        found = []
        for path in sorted((self.root / folder).glob("*_units.json.gz")):
            units = self.record(f"{folder}/{path.name}")["units"]
            earlier = sum(u.get("result", {}).get("meta", {}).get("acc_norm") != ACC_NORM for u in units)
            if earlier:
                found.append(dict(name=path.name.removesuffix("_units.json.gz"), earlier=earlier, units=len(units)))
        return found

    def stale_verdicts(self, folder: str = "figures") -> list[str]:
        """The CSVs in ``folder`` whose ``verdict`` column a row's own interval and p-value no longer give under the
        calling rule (written before the rule had "the two tests disagree"): the pages decide those again."""
        stale = []
        for path in sorted((self.root / folder).glob("*.csv")):
            rows = self.table(f"{folder}/{path.name}")
            if not rows or not {"verdict", "low", "high", "p_value"} <= rows[0].keys():
                continue
            if any(_verdict_is_stale(r) for r in rows):
                stale.append(path.name)
        return stale

    def path(self, name: str) -> Path:
        path = self.root / name
        if not path.exists() and self.fallback is not None:
            path = self.fallback / name
        if not path.exists():
            raise FileNotFoundError(f"a template reads {name}, which does not exist under {self.root}")
        return path

    def optional(self, name: str) -> Any:
        """A JSON record that may not have been made yet (another branch adds it): the record, or None, for a
        template to say it is not recorded."""
        try:
            return self.record(name)
        except FileNotFoundError:
            return None

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

    def rows(self, source: str | list[dict], **where: Any) -> list[dict]:
        """The rows whose columns equal ``where``, of a CSV record (by name) or of a list of a JSON record's rows."""
        table = self.table(source) if isinstance(source, str) else source
        return [r for r in table if all(str(r.get(k)) == str(v) for k, v in where.items())]

    def row(self, source: str | list[dict], **where: Any) -> dict:
        """The one row whose columns equal ``where`` (see :meth:`rows`)."""
        found = self.rows(source, **where)
        if len(found) != 1:
            name = source if isinstance(source, str) else "a JSON record's rows"
            raise LookupError(f"{name}: {len(found)} rows match {where}, expected one")
        return found[0]

    def table2(self, name: str = "figures/compare_table2.csv") -> list[dict]:
        """A recorded Table 2 as the calling rule reads it: one family, its p-values Benjamini-Hochberg adjusted within
        it and its verdicts decided from them (``lens_heads.sweep.table2.adjusted_within``; a record made before
        the table was adjusted is adjusted here)."""
        from lens_heads.sweep.table2 import adjusted_within

        return adjusted_within(pd.DataFrame(self.table(name))).to_dict("records")

    def tested(self, source: str | list[dict], **where: Any) -> dict:
        """The one comparison of a tests CSV (columns a, b, difference, low, high, p_value and p_adjusted where the
        table was adjusted) matching ``where``, its verdict decided again by the calling rule from the recorded
        interval and p-value (not read from the file: records older than the rule have other words)."""
        r = dict(self.row(source, **where))
        r["p_adjusted"] = _p_for_rule(r)
        stated = r.get("higher_is_better", False)
        # a record that leaves the direction empty compares settings: no side is better
        r["higher_is_better"] = None if stated is None or (isinstance(stated, float) and math.isnan(stated)) \
            else not _is_cost(r)
        r["verdict"] = calling.verdict(r["low"], r["high"], r["p_adjusted"], higher_is_better=r["higher_is_better"],
                                       a=str(r["a"]), b=str(r["b"]))
        # which side the rule calls better ("a", "b"), or the uncalled verdict itself
        r["winner"] = {f"{r['a']} better": "a", f"{r['b']} better": "b"}.get(r["verdict"], r["verdict"])
        return r

    def tested_all(self, source: str | list[dict], **where: Any) -> list[dict]:
        """Every comparison matching ``where``, each as :meth:`tested` gives it (a table's family stays whole: the
        adjusted p-values are the recorded ones)."""
        return [self.tested([r]) for r in self.rows(source, **where)]

    def called(self, source: str | list[dict], **where: Any) -> str:
        """The one comparison matching ``where`` of a table with no better direction (a change of setting, a distance
        against its null level), by the calling rule: ``"higher"``/``"lower"`` (the sign of its difference) or the
        uncalled verdict."""
        return _rule_call(self.row(source, **where))

    def said(self, source: str | list[dict], what: str, spec: str = ".2f", **where: Any) -> str:
        """That comparison in the calling rule's words (``calling.sentence``)."""
        r = self.tested(source, **where)
        return calling.sentence(r, what, spec, lower_is_better=r["higher_is_better"] is False)

    @functools.lru_cache(maxsize=None)
    def _log_sections(self, name: str) -> dict[str, str]:
        text = self.path(name).read_text(encoding="utf-8")
        parts = re.split(r"^## (.+)$", text, flags=re.M)
        return {heading.strip(): body for heading, body in zip(parts[1::2], parts[2::2])}

    def stamp(self, name: str, section: str) -> str:
        """When a ``## section`` of a Markdown log of runs was measured and how far its commit is behind HEAD, said the
        same way for every section (:func:`recorded`'s words): its first date and the first commit it names (``commit
        abc1234``, ``clone of main (abc1234)``, ``at abc1234``), or that it names none."""
        sections = self._log_sections(name)
        if section not in sections:
            raise LookupError(f"{name} has no section {section!r}")
        text = sections[section]
        date = re.search(r"\b(20\d\d-\d\d-\d\d)\b", text)
        commit = re.search(r"(?:commit|clone of main \(|\bat) ([0-9a-f]{7,40})\b", text)
        when = f"measured {date.group(1)}" if date else "measured on a date the log does not give"
        if not commit:
            return f"{when}, at a commit the log does not name (its distance from HEAD is unknown)"
        return recorded({"provenance": {"recorded_at": date.group(1) if date else "unknown date",
                                        "commit": commit.group(1)}}).replace("recorded", "measured", 1)

    def printed(self, name: str, section: str, around: str) -> str:
        """What a benchmark printed, from the ``## section`` of a Markdown log of runs: the token (a number, a date,
        a commit) at ``{}`` in the first place the text reads as ``around``, where ``{*}`` skips any text and a space
        matches any run of white space, e.g. ``"piqa, 8 items{*}ablation (shared) costs {}x"``."""
        sections = self._log_sections(name)
        if section not in sections:
            raise LookupError(f"{name} has no section {section!r}")
        pattern = "".join(
            r"([^\s;()\[\]]+?)" if piece == "{}" else r"[\s\S]*?" if piece == "{*}"
            else re.sub(r"(\\ )+", r"\\s+", re.escape(piece))
            for piece in re.split(r"(\{\*?\})", around) if piece)
        found = re.search(pattern + r"(?=[\s;,()\[\]*]|$)" if around.endswith("{}") else pattern, sections[section])
        if not found:
            raise LookupError(f"{name}, section {section!r}: nothing reads {around!r}")
        return found.group(1)


@functools.lru_cache(maxsize=None)
def _script(path: str) -> Any:
    """A script of the checkout as a module, loaded as it runs (its folder on the path: it imports its neighbours by
    name) and registered under its name (its dataclasses look their module up)."""
    file = ROOT / path
    if str(file.parent) not in sys.path:
        sys.path.insert(0, str(file.parent))
    loaded = sys.modules.get(file.stem)
    if loaded is not None and Path(getattr(loaded, "__file__", "")).resolve() == file.resolve():
        return loaded
    spec = importlib.util.spec_from_file_location(file.stem, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[file.stem] = module
    spec.loader.exec_module(module)
    return module


def code(path: str) -> Any:
    """The object at ``"module:attribute.attribute"`` (``"lens_heads.training.distill:DistillConfig.distilbert"``),
    or at ``"folder/script.py:attribute"`` for a script of the checkout, imported: a preset or a default as the code
    holds it."""
    where, _, attributes = path.partition(":")
    obj = _script(where) if where.endswith(".py") else importlib.import_module(where)
    for name in attributes.split("."):
        obj = getattr(obj, name)
    return obj


def default(path: str, parameter: str) -> Any:
    """The default of ``parameter`` of the function (or class) at ``path``, found as :func:`code` finds it."""
    return inspect.signature(code(path)).parameters[parameter].default


def code_text(path: str, pattern: str) -> str:
    """The first group of the regular expression ``pattern`` (``^`` and ``$`` at each line) in a file of the
    checkout: a value written where Python does not import it (a pin in ``scripts/setup.sh``)."""
    found = re.search(pattern, (ROOT / path).read_text(encoding="utf-8"), flags=re.M)
    if not found:
        raise LookupError(f"{path}: nothing matches {pattern!r}")
    return found.group(1)


HELP_WIDTH = 100  # columns of the rendered --help (argparse reads COLUMNS)


def report_help() -> str:
    """``python -m lens_heads.report --help`` as a terminal HELP_WIDTH wide prints it."""
    from lens_heads.plumbing.settings import build_parser
    from lens_heads.report.__main__ import parser
    from lens_heads.report.config import PRESETS, ReportConfig

    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(HELP_WIDTH)
    try:
        return build_parser(ReportConfig, presets=PRESETS, parser=parser()).format_help().rstrip()
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before


def environment(root: Path = ROOT) -> jinja2.Environment:
    records = Records(root, fallback=None if root == ROOT else ROOT)
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(root / SOURCES), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True, autoescape=False,
                             extensions=["jinja2.ext.do"])
    env.globals.update(record=records.record, optional=records.optional, table=records.table, rows=records.rows, row=records.row,
                       tested=records.tested, table2_adjusted=records.table2, tested_all=records.tested_all, said=records.said, called=records.called, printed=records.printed, stamp=records.stamp,
                       undated=records.undated, earlier_acc_norm=records.earlier_acc_norm,
                       stale_verdicts=records.stale_verdicts,
                       num=num, iv=iv, ivc=ivc, pct=pct, pct_iv=pct_iv, calling_rule=calling.RULE, score_names=SCORE_NAMES,
                       report_help=report_help, median=statistics.median, recorded=recorded)
    env.globals.update(code=code, code_text=code_text, default=default, gl=glossary_link, glossary=glossary)
    package = root / "lens_heads" if (root / "lens_heads").exists() else ROOT / "lens_heads"
    env.globals.update(untested=claims.untested, NOT_TESTED=calling.NOT_TESTED, UNCALLED=calling.UNCALLED,
                       gib_from_kib=measures.gib_from_kib, moves_with_head=measures.moves_with_head, floor_to=measures.floor_to,
                       commits_since=lambda commit, *paths: measures.commits_behind(commit, paths, ROOT),
                       claim_status=claims.claim_status, claim_lists=claims.claim_lists, statuses=claims,
                       layer_diagram=lambda: imports.mermaid(imports.folder_imports(package)),
                       layer_imports=lambda: imports.folder_imports(package), layer_order=imports.layer_order,
                       layer_modules=lambda: imports.modules(package))
    env.globals.update(contracts_now=lambda: contracts.measure(package.parent))
    env.filters["upper_first"] = upper_first
    env.filters["multiply_100"] = lambda share: num(100 * _number(share), ".1f")  # a share as its percentage
    return env


def render(root: Path = ROOT) -> dict[str, str]:
    """Every page's rendering, by its path under the root."""
    env = environment(root)
    rendered = {page: env.get_template(template).render() for page, template in PAGES.items()}
    return {page: wrap.reflow(text) if page in WRAPPED else text for page, text in rendered.items()}


def differences(rendered: dict[str, str], committed_root: Path = ROOT) -> list[str]:
    """A unified diff per committed page that differs from its rendering (a missing page counts as empty), the text
    marked as moving with HEAD (``moves_with_head``) left out of the comparison."""
    out = []
    for page, text in rendered.items():
        path = committed_root / page
        committed = path.read_text(encoding="utf-8") if path.exists() else ""
        if measures.steady(committed) != measures.steady(text):  # a distance from HEAD moves with every commit
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
