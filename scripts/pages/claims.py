"""A paper's claim against what a record says: the status is read from the calling rule's verdicts of the
comparisons that test it, never typed, so a re-recording that flips a verdict changes the status."""

from __future__ import annotations

from collections.abc import Iterable

from lens_heads.stats import calling

REPRODUCED = "reproduced"
NOT_CALLED = "not called by the rule"
NOT_REPRODUCED = "not reproduced"
UNTESTABLE = "untestable at this scale"
NEEDS_GPU = "needs a GPU or weights not installable offline"
NOT_RECORDED = "not recorded"
NOT_COMPLETED = "not tested to completion"  # the run stopped before the claim's own end point (a depth cap, a budget)
STATUSES = (REPRODUCED, NOT_CALLED, NOT_REPRODUCED, UNTESTABLE, NEEDS_GPU, NOT_RECORDED, NOT_COMPLETED)


def claim_status(verdicts: Iterable[str], expected: Iterable[str] | str) -> str:
    """The status of a claim tested by one or more comparisons: ``verdicts`` are their calling-rule verdicts and
    ``expected`` the verdict the claim predicts for each (one for all, or one each). Reproduced where every
    comparison is called as the claim says, not reproduced where any is called the other way, else (some
    uncalled, none against) not called by the rule; no comparison at all is not recorded."""
    verdicts = [str(v) for v in verdicts]
    wanted = [expected] * len(verdicts) if isinstance(expected, str) else [str(e) for e in expected]
    if len(wanted) != len(verdicts):
        raise ValueError(f"{len(verdicts)} verdicts but {len(wanted)} expected verdicts: give one each or one for all")
    if not verdicts:
        return NOT_RECORDED
    if all(v == w for v, w in zip(verdicts, wanted)):
        return REPRODUCED
    if any(v not in calling.UNCALLED and v != w for v, w in zip(verdicts, wanted)):
        return NOT_REPRODUCED
    return NOT_CALLED


def untested(rows: Iterable[dict]) -> dict[str, int]:
    """Of comparisons with the rule's verdicts, those it could not test, counted by why (their note, else the missing
    test, in the calling rule's words)."""
    why: dict[str, int] = {}
    for r in rows:
        if r["verdict"] == calling.NOT_TESTED:
            reason = calling._untested_because(r)
            why[reason] = why.get(reason, 0) + 1
    return why


def claim_lists(table: str) -> dict[str, dict[str, list[str]]]:
    """The claims table (Markdown, as rendered) as three short lists for a reader, each claim once: "reproduced"
    (every row of the claim reproduced), "not reproduced" (some row not reproduced) and "open" (the rest), each list
    by status (an open claim whose rows differ is listed under each of their statuses)."""
    rows: dict[str, list[str]] = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if len(cells) < 3 or cells[2].strip("* ") not in STATUSES:
            continue
        rows.setdefault(cells[1], []).append(cells[2].strip("* "))
    out: dict[str, dict[str, list[str]]] = {"reproduced": {}, "not reproduced": {}, "open": {}}
    for claim, statuses in rows.items():
        group = "reproduced" if all(s == REPRODUCED for s in statuses) else \
            "not reproduced" if NOT_REPRODUCED in statuses else "open"
        # a claim not reproduced in one row is listed as not reproduced; an open one under each of its statuses
        for status in [NOT_REPRODUCED] if group == "not reproduced" else sorted(set(statuses), key=statuses.index):
            out[group].setdefault(status, []).append(claim)
    return out
