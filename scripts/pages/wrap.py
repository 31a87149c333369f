"""Prose in a rendered Markdown page wrapped at the code's line length, so that a diff of a page shows the sentence
that changed; tables, code blocks, headings, images and HTML keep their lines."""

from __future__ import annotations

import re
import textwrap

from pages.measures import _MOVING

WIDTH = 120
_KEEP = re.compile(r"^(\||#|!\[|<|\s{4}|```|---|\{)")
_ITEM = re.compile(r"^(\s*)([-*]|\d+\.) ")


def _wrap(lines: list[str], width: int) -> list[str]:
    first = lines[0]
    item = _ITEM.match(first)
    lead = item.group(0) if item else re.match(r"^\s*", first).group(0)
    rest = " " * len(lead) if item else lead
    text = " ".join(line.strip() for line in lines)
    if item:
        text = text[len(item.group(0).strip()):].strip()
    return textwrap.wrap(text, width, initial_indent=lead, subsequent_indent=rest, break_long_words=False,
                         break_on_hyphens=False) or [""]


def reflow(page: str, width: int = WIDTH) -> str:
    """``page`` with every paragraph and list item re-wrapped at ``width`` (a word longer than that keeps its
    line); everything else as it was. Text that moves with HEAD (``measures.moves_with_head``) is wrapped as one short
    word, so that the lines around it do not move when it does."""
    held: list[str] = []

    def hold(found: re.Match[str]) -> str:
        held.append(found.group(0))
        return f"\x00{len(held) - 1}\x00"

    page = _MOVING.sub(hold, page)
    out: list[str] = []
    block: list[str] = []
    fenced = False

    def flush() -> None:
        if block:
            out.extend(_wrap(block, width))
            block.clear()

    for line in page.split("\n"):
        if line.lstrip().startswith("```"):
            flush()
            fenced = not fenced
            out.append(line)
        elif fenced or not line.strip() or _KEEP.match(line):
            flush()
            out.append(line)
        elif _ITEM.match(line):
            flush()
            block.append(line)
        else:
            block.append(line)
    flush()
    return re.sub("\x00(\\d+)\x00", lambda found: held[int(found.group(1))], "\n".join(out))
