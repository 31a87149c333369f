"""Where a page first names each glossary term, and whether that first use links to the term's entry: a reader
meets no word the page has not linked to its definition."""

from __future__ import annotations

import re
from dataclasses import dataclass

from lens_heads.report.glossary import TERMS, Term

_LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]*)\)")
_CODE = re.compile(r"`[^`\n]*`")


@dataclass(frozen=True)
class FirstUse:
    term: str
    linked: bool
    context: str


def prose(page: str) -> str:
    """The page's text a reader reads as words: fenced code, inline code, headings, images, HTML comments and link
    targets blanked out (kept as spaces, so positions and link texts stay)."""
    out, fenced = [], False
    for line in page.split("\n"):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            out.append("")
            continue
        if fenced or line.startswith("#") or line.startswith("!["):
            out.append("")
            continue
        out.append(line)
    text = "\n".join(out)
    text = re.sub(r"<!--.*?-->", lambda m: " " * len(m.group(0)), text, flags=re.S)
    return _CODE.sub(lambda m: " " * len(m.group(0)), text)


def first_uses(page: str, glossary: str = "glossary.md", terms: tuple[Term, ...] = TERMS) -> list[FirstUse]:
    """Each term the page names, at its first use: whether that use sits in the text of a link to
    ``<glossary>#<the term's anchor>``."""
    text = prose(page)
    links = [(m.start(1), m.end(1), m.group(2)) for m in _LINK.finditer(text)]
    # a link's target is not prose: blank it so that a term in a URL is not a use
    for m in reversed(list(_LINK.finditer(text))):
        text = text[:m.start(2)] + " " * (m.end(2) - m.start(2)) + text[m.end(2):]
    found = []
    for term in terms:
        target = f"{glossary}#{term.anchor}"

        def inside(m: re.Match[str], where: str) -> bool:
            return any(a <= m.start() and m.end() <= b and where in url for a, b, url in links)

        # a term in the text of a link to another page is that page's title, not a use
        uses = [m for m in term.regex.finditer(text) if not inside(m, "") or inside(m, glossary)]
        if not uses:
            continue
        m = uses[0]
        linked = inside(m, target)
        found.append(FirstUse(term.name, linked, text[max(0, m.start() - 60):m.end() + 20].replace("\n", " ")))
    return found


def unlinked(page: str, glossary: str = "glossary.md") -> list[FirstUse]:
    """The terms whose first use on the page is not a link to their entry."""
    return [u for u in first_uses(page, glossary) if not u.linked]
