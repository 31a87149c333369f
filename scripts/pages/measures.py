"""Units and distances the pages state beside a recorded number."""

from __future__ import annotations

import math
import re
import subprocess
from pathlib import Path

KIB_PER_GIB = 1024 ** 2


def gib_from_kib(kib: int | str, spec: str = ".1f") -> str:
    """A size GNU time reports in KiB (``Maximum resident set size (kbytes)``) in GiB: ``"3.4 GiB"``."""
    return f"{int(kib) / KIB_PER_GIB:{spec}} GiB"


def floor_to(value: float, digits: int = 3) -> str:
    """``value`` rounded down at ``digits`` decimals: a lower bound shown as "x or more" stays a lower bound."""
    scaled = math.floor(float(value) * 10 ** digits + 1e-9)  # 1e-9: a value exactly at a digit stays there
    return f"{scaled / 10 ** digits:.{digits}f}"


def commits_since(commit: str, paths: tuple[str, ...], root: Path) -> int:
    """How many commits of HEAD's history after ``commit`` touch ``paths`` (``git rev-list --count C..HEAD --
    paths``): how far a recording made at ``commit`` is behind the code it measured. Counted over paths, not all
    commits, so that a commit of the pages alone does not make the page stale."""
    done = subprocess.run(["git", "rev-list", "--count", f"{commit}..HEAD", "--", *paths], cwd=root,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"git rev-list cannot count the commits since {commit[:7]} (a shallow clone? fetch the "
                           f"history with git fetch --unshallow): {done.stderr.strip()}")
    return int(done.stdout.strip())



def commits_behind(commit: str, paths: tuple[str, ...], root: Path) -> int | None:
    """:func:`commits_since`, or None where this clone cannot count them (a shallow clone without ``commit``): the
    distance is text that moves with HEAD, which the page check leaves out, so the pages still render there."""
    try:
        return commits_since(commit, paths, root)
    except RuntimeError:
        return None


# A distance from HEAD changes with every commit to the paths it counts, the commit that renders the page included, so
# the page check compares the page around it: the text between these marks (invisible in rendered Markdown).
_OPEN, _CLOSE = "<!-- moves with HEAD -->", "<!-- /moves with HEAD -->"
_MOVING = re.compile(re.escape(_OPEN) + r".*?" + re.escape(_CLOSE), re.S)


def moves_with_head(text: str) -> str:
    """``text`` marked as depending on the checkout's HEAD, not on a record: :func:`steady` leaves it out."""
    return f"{_OPEN}{text}{_CLOSE}"


def steady(page: str) -> str:
    """A page with the text that moves with HEAD left out: what the page check compares."""
    return _MOVING.sub(_OPEN + _CLOSE, page)
